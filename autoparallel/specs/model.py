"""The architecture of a decoder-only transformer, with Megatron-LM's argument names.

One ModelSpec feeds both the cost model (shapes and parameter counts) and the built-in
transformer (``autoparallel.model``), so the two can never disagree about what a layer is.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from autoparallel.specs.finetune import Finetune
from autoparallel.specs.names import check_name

# Megatron-LM's --hybrid-layer-pattern symbols that the cost model prices, one block per layer.
HYBRID_LAYER_KINDS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}

# Megatron warns below FP32 routing from 32 experts on ("Consider enabling moe_router_dtype"); the
# exports then pass --moe-router-dtype fp32 and the cost model prices the router that way.
FP32_ROUTER_FROM_EXPERTS = 32

Activation = Literal["gelu", "swiglu", "squared_relu"]
Normalization = Literal["layernorm", "rmsnorm"]
# "none": no position embedding at all (Megatron-LM --position-embedding-type none; hybrid Mamba models).
PositionEmbedding = Literal["learned_absolute", "rope", "none"]
RouterScore = Literal["softmax", "sigmoid"]  # --moe-router-score-function
RouterDtype = Literal["fp32", "bf16"]  # --moe-router-dtype (bf16: Megatron-Core's default, the params' dtype)
SoftmaxType = Literal["vanilla", "off-by-one", "learnable"]  # --softmax-type (learnable: attention sinks)
# Megatron-LM's --tokenizer-type names the exports use; the file-based ones need a path.
TokenizerType = Literal["NullTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer",
                        "GPTSentencePieceTokenizer"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    num_query_groups: int | None = None  # KV heads; None means multi-head attention
    activation: Activation = "gelu"
    normalization: Normalization = "layernorm"
    tie_embeddings: bool = False
    kv_channels: int | None = None  # head dim; None means hidden_size / heads
    # What the exports need to build exactly this model in Megatron-LM / NeMo (not priced: the
    # cost model's shapes do not depend on them). Defaults are Megatron-LM's own.
    position_embedding_type: PositionEmbedding = "learned_absolute"
    rotary_base: int = 10000
    rotary_percent: float = 1.0  # share of each head's dims that RoPE rotates (Nemotron-4: 0.5)
    rope_scaling_factor: float | None = None  # Llama 3.1's long-context RoPE scaling (--use-rope-scaling)
    # Priced for a MoE model's routed experts only (Megatron-Core adds their FC2 bias eagerly:
    # layer_time.expert_bias_time); every other Linear's bias TransformerEngine fuses into its GEMM.
    add_bias_linear: bool = True
    layernorm_zero_centered_gamma: bool = False  # "LayerNorm1p" (--apply-layernorm-1p)
    norm_epsilon: float = 1e-5
    tokenizer_type: TokenizerType = "NullTokenizer"
    tokenizer_model: str = ""  # Hugging Face repo id for HuggingFaceTokenizer; files are placeholders
    # Megatron-LM's dropout probabilities (its defaults). They decide whether dropout masks are
    # among the saved activations; the built-in transformer itself trains without dropout.
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # Mixture of experts, Megatron-LM's arguments (num_experts None: a dense model).
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # one routed expert's FFN; None means ffn_hidden_size
    # All shared experts' FFN together (num_shared_experts x each one's size); None: no shared expert.
    moe_shared_expert_intermediate_size: int | None = None
    # Which layers are MoE (--moe-layer-freq): every N-th layer from the first (an int), or
    # Megatron's pattern expression of 0 (dense) and 1 (MoE) per layer, e.g. "([0]*3+[1]*58)".
    # The dense layers' MLP has ffn_hidden_size.
    moe_layer_freq: int | str = 1
    # Tokens an expert takes, as a multiple of its even share (--moe-expert-capacity-factor);
    # None: dropless routing, every token reaches its top-k experts however unbalanced.
    moe_expert_capacity_factor: float | None = None
    # --moe-router-force-load-balancing: route uniformly at random (Megatron's benchmarking switch;
    # NVIDIA's published MoE throughputs use it), so no EP rank waits for a busier one.
    moe_router_force_load_balancing: bool = False
    # Group-limited ("node-limited") routing (--moe-router-num-groups, --moe-router-group-topk):
    # the experts form num_groups groups and each token picks its experts from its group_topk best
    # groups (DeepSeek-V3: 8 groups, top 4, so a token reaches at most 4 nodes under EP64).
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    # Multi-token prediction (--mtp-num-layers): extra transformer layers on the last pipeline
    # stage, each predicting one more token with its own output pass (DeepSeek-V3: 1).
    mtp_num_layers: int = 0
    # The router as the model was trained (export only, not priced; Megatron-LM's defaults):
    # score function, the aux-loss-free expert bias (--moe-router-enable-expert-bias, sigmoid
    # only) and the factor the routed experts' weights are scaled by (HF routed_scaling_factor).
    moe_router_score_function: RouterScore = "softmax"
    moe_router_enable_expert_bias: bool = False
    moe_router_topk_scaling_factor: float | None = None
    # The router's precision as the model's published recipe runs it (priced: the router's GEMM
    # and the routing probabilities' passes); unset, FP32 from FP32_ROUTER_FROM_EXPERTS experts on.
    moe_router_dtype: RouterDtype | None = None
    # The gated activation's variant (Megatron-LM --quick-geglu; TransformerConfig's
    # activation_func_clamp_value, no flag. GPT-OSS: a quick-GELU GLU, sigmoid(1.702 x), both halves
    # clamped to 7): activation "swiglu" stands for any GLU (three matrices). Priced: Megatron-Core
    # clamps a quick-GEGLU's input eagerly, outside its fused kernel (layer_time.glu_clamp_time);
    # SwiGLU's clamp is fused.
    quick_geglu: bool = False
    activation_func_clamp_value: float | None = None
    # Attention variants (Megatron-LM's defaults): a norm on the queries and keys (--qk-layernorm;
    # under MLA the norms of the query and KV latents), sliding-window attention (--window-size
    # LEFT,RIGHT as flash-attention counts it, on every layer or on all but every
    # --window-attn-skip-freq-th one) and the softmax (--softmax-type). Exported, not priced, except
    # that a softmax with sinks changes how context parallelism runs (``softmax_sinks``).
    qk_layernorm: bool = False
    window_size: tuple[int, ...] | None = None
    window_attn_skip_freq: int | None = None
    softmax_type: SoftmaxType = "vanilla"
    # Multi-latent attention (DeepSeek-V2/V3; --multi-latent-attention and its ranks, with
    # Megatron-LM's defaults): queries through a rank-q_lora_rank bottleneck (None: a full-rank
    # query projection), keys and values through one of kv_lora_rank; each head's query/key has
    # qk_head_dim dims plus qk_pos_emb_head_dim rotary ones (the rotary key shared by all heads),
    # its value v_head_dim.
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # YaRN of multi-latent attention (export only, not priced): --rotary-scaling-factor, --mscale
    # and --mscale-all-dim with Megatron-LM's argument defaults; the original context and the
    # beta_fast / beta_slow ramp with MLATransformerConfig's (Megatron-LM has no flag for them).
    rotary_scaling_factor: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    original_max_position_embeddings: int = 4096
    # The factor Megatron-Core multiplies a GQA attention's RoPE cos and sin by: YaRN's concentration
    # factor where Megatron-Bridge builds YaRN on GQA attention (GPT-OSS: position_embedding_type "yarn",
    # yarn_mscale None, so 0.1 ln(yarn_rotary_scaling_factor) + 1; core_v0.16.0
    # megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py _yarn_get_concentration_factor);
    # 1 for plain RoPE. TransformerEngine's fused RoPE takes no such factor, so any other value runs
    # Megatron-Core's unfused RoPE (priced: layer_time.unfused_rope_time). Not exported: Megatron-LM
    # builds YaRN only with multi-latent attention.
    rope_concentration: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # A hybrid Mamba-Transformer model (Megatron-LM --hybrid-layer-pattern, Nemotron-H / Nemotron 3):
    # one symbol per layer, each layer one block: M a Mamba-2 mixer, * self-attention, - an MLP of
    # ffn_hidden_size, E a MoE block (no attention beside it). None: every layer is attention plus an
    # MLP or MoE block (moe_layer_freq). The pattern's length is num_layers.
    hybrid_layer_pattern: str | None = None
    # The Mamba-2 mixer (Megatron-Core MambaMixer's fields and defaults): heads of mamba_head_dim
    # channels (None: 2 x hidden_size / mamba_head_dim, Mamba-2's expand of 2), the SSM state size,
    # the B/C groups and the causal convolution's width.
    mamba_num_heads: int | None = None
    mamba_head_dim: int = 64
    mamba_state_dim: int = 128
    mamba_num_groups: int = 8
    mamba_conv_kernel: int = 4
    # LatentMoE (--moe-latent-size; Nemotron 3 Super / Ultra): the routed experts work in a
    # moe_latent_size-wide space, entered and left through a projection from and to the hidden size.
    moe_latent_size: int | None = None
    # A hybrid model's multi-token-prediction block: the layer pattern of one MTP depth (Megatron-LM's
    # pattern after "/" in --hybrid-layer-pattern, repeated mtp_num_layers times; Megatron-Bridge's
    # mtp_hybrid_override_pattern; Nemotron 3 Super / Ultra: "*E"). Needed with mtp_num_layers.
    mtp_layer_pattern: str | None = None
    # DeepSeek-V4's hybrid attention (Megatron-Core's experimental ``dsv4_hybrid`` variant, Megatron-Bridge
    # ``DeepSeekV4Bridge.provider_bridge``): one compression ratio per decoder layer and MTP layer
    # (``csa_compress_ratios``; 0: a sliding window of csa_window_size keys only, 4: Compressed Sparse
    # Attention, the window plus the dsa_indexer_topk compressed keys a DSA indexer of
    # dsa_indexer_n_heads x dsa_indexer_head_dim picks, 128: the window plus every 128-token compressed
    # key), one KV head of v_head_dim (its keys' last qk_pos_emb_head_dim dims rotary), queries through
    # q_lora_rank, the output through o_groups low-rank groups of o_lora_rank. None: not DeepSeek-V4.
    csa_compress_ratios: tuple[int, ...] | None = None
    csa_window_size: int = 128
    # The same dsa_indexer_* without csa_compress_ratios: DeepSeek Sparse Attention uncompressed on every
    # layer of a standard MLA model (Megatron-Core's ``dsa`` variant; GLM-5, DeepSeek-V3.2): each query
    # attends the indexer's dsa_indexer_topk keys of its causal context (``is_dsa``).
    dsa_indexer_n_heads: int | None = None
    dsa_indexer_head_dim: int | None = None
    dsa_indexer_topk: int | None = None
    o_groups: int | None = None
    o_lora_rank: int | None = None
    # Hyper-Connections (mHC, Megatron-Core ``num_residual_streams``): the residual stream is hc_mult
    # streams of hidden_size, mixed before and after each block (1: a plain residual). Its Sinkhorn
    # iterations (``mhc_sinkhorn_iterations``) are export-only.
    hc_mult: int = 1
    mhc_sinkhorn_iterations: int = 20
    # Hash-routed MoE (Megatron-Bridge ``moe_n_hash_layers``): the first this-many layers route each token
    # by a fixed vocabulary -> experts table, not by the router's scores.
    moe_n_hash_layers: int = 0
    # The global batch size the model was published with; the search keeps it fixed by default.
    global_batch_size: int | None = None
    # Positions the model serves (Megatron-LM's --max-position-embeddings; HF's
    # max_position_embeddings): the serving context. None means seq_length.
    max_position_embeddings: int | None = None
    # A fine-tuning run (full SFT or LoRA, packed sequences); None: pre-training.
    finetune: Finetune | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""

    # the counts that must be >= 1 where set (not fields: no annotation); ``io.from_dict`` quotes
    # 1..MAX_COUNT for them (as ``Plan.POSITIVE_KEYS``)
    POSITIVE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
                     "seq_length", "num_query_groups", "kv_channels", "num_experts", "moe_ffn_hidden_size",
                     "moe_shared_expert_intermediate_size", "global_batch_size", "max_position_embeddings",
                     "mamba_num_heads", "moe_latent_size", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
                     "mamba_conv_kernel", "hc_mult")

    def __post_init__(self) -> None:
        check_name(self.name)
        for key in self.POSITIVE_KEYS:
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value}")
        if self.is_moe and not 1 <= self.moe_router_topk <= self.num_experts:
            raise ValueError(f"moe_router_topk must be in 1..num_experts={self.num_experts}, "
                             f"got {self.moe_router_topk}")
        if not 0.0 < self.rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent must be in (0, 1], got {self.rotary_percent}")
        if self.tokenizer_type == "HuggingFaceTokenizer" and not self.tokenizer_model:
            raise ValueError("tokenizer_type HuggingFaceTokenizer needs tokenizer_model (a Hugging Face repo id)")
        for key in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{key} must be in [0, 1), got {getattr(self, key)}")
        if self.num_attention_heads % self.query_groups:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_query_groups={self.query_groups}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}; set kv_channels")
        if self.multi_latent_attention and self.query_groups != self.num_attention_heads:
            raise ValueError("multi-latent attention has no query groups (Megatron-LM: MLA and GQA "
                             f"are exclusive); drop num_query_groups={self.num_query_groups}")
        if self.is_moe:
            if not 1 <= self.moe_router_topk <= self.num_experts:
                raise ValueError(f"moe_router_topk must be in 1..num_experts={self.num_experts}, "
                                 f"got {self.moe_router_topk}")
            if self.moe_expert_capacity_factor is not None and self.moe_expert_capacity_factor <= 0:
                raise ValueError(f"moe_expert_capacity_factor must be positive (or left out for "
                                 f"dropless routing), got {self.moe_expert_capacity_factor}")
            self.moe_layer_pattern  # noqa: B018 (raises if the pattern is not one of 0/1 per layer)
            groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
            if (groups is None) != (group_topk is None):
                raise ValueError("moe_router_num_groups and moe_router_group_topk go together (group-limited "
                                 f"routing), got {groups} and {group_topk}")
            if groups is not None and (groups < 1 or self.num_experts % groups or not 1 <= group_topk <= groups):
                raise ValueError(f"moe_router_num_groups={groups} must divide num_experts={self.num_experts} and "
                                 f"moe_router_group_topk={group_topk} be in 1..{groups}")
        if self.mtp_num_layers < 0:
            raise ValueError(f"mtp_num_layers must be 0 or more, got {self.mtp_num_layers}")
        self._check_hybrid()
        self._check_dsv4()
        if self.finetune and (self.finetune.document_tokens or 0) > self.seq_length:
            raise ValueError(f"finetune.document_tokens {self.finetune.document_tokens} is longer than the packed "
                             f"sequence (seq_length {self.seq_length})")
        self._check_export_fields()

    def _check_hybrid(self) -> None:
        if self.moe_latent_size is not None and not self.is_moe:
            raise ValueError("moe_latent_size is the routed experts' width: it needs num_experts")
        pattern = self.hybrid_layer_pattern
        if self.mtp_layer_pattern is not None:
            if pattern is None or not self.mtp_num_layers:
                raise ValueError("mtp_layer_pattern is a hybrid model's MTP block: it needs hybrid_layer_pattern "
                                 "and mtp_num_layers")
            if not self.mtp_layer_pattern or set(self.mtp_layer_pattern) - set(HYBRID_LAYER_KINDS):
                raise ValueError(f"mtp_layer_pattern {self.mtp_layer_pattern!r} must be layers of "
                                 f"{', '.join(HYBRID_LAYER_KINDS)}")
        if pattern is None:
            return
        unknown = sorted(set(pattern) - set(HYBRID_LAYER_KINDS))
        if unknown:
            raise ValueError(f"hybrid_layer_pattern {pattern!r} has {', '.join(map(repr, unknown))}: the priced "
                             "layers are M (Mamba-2), * (attention), - (MLP) and E (MoE); pipeline stage "
                             "marks | and MTP patterns / are not taken (set mtp_num_layers and mtp_layer_pattern)")
        if len(pattern) != self.num_layers:
            raise ValueError(f"hybrid_layer_pattern has {len(pattern)} layers but num_layers is {self.num_layers}")
        if ("E" in pattern) != self.is_moe:
            raise ValueError("hybrid_layer_pattern has MoE layers (E) but no num_experts" if "E" in pattern else
                             "num_experts is set but hybrid_layer_pattern has no MoE layer (E)")
        if "M" in pattern and self.mamba_heads % self.mamba_num_groups:
            raise ValueError(f"mamba_num_heads={self.mamba_heads} is not a multiple of "
                             f"mamba_num_groups={self.mamba_num_groups} (Megatron-Core MambaMixer)")

    def _check_dsv4(self) -> None:
        """DeepSeek-V4's fields: the ratios Megatron-Bridge's FLOP count accepts (0, 4, 128), one per
        decoder and MTP layer, the indexer wherever a ratio-4 layer is, MLA around it."""
        if self.moe_n_hash_layers < 0:
            raise ValueError(f"moe_n_hash_layers must be 0 or more, got {self.moe_n_hash_layers}")
        ratios = self.csa_compress_ratios
        if ratios is None:
            if self.o_groups:
                raise ValueError("o_groups is DeepSeek-V4 attention: it needs csa_compress_ratios")
            indexer = (self.dsa_indexer_n_heads, self.dsa_indexer_head_dim, self.dsa_indexer_topk)
            if any(indexer) and not (all(indexer) and self.multi_latent_attention):
                raise ValueError("dsa_indexer_* without csa_compress_ratios is DeepSeek Sparse Attention on every "
                                 "layer (GLM-5): it needs multi_latent_attention and all three of n_heads, "
                                 "head_dim and topk")
            return
        if not self.multi_latent_attention or self.q_lora_rank is None or not (self.o_groups and self.o_lora_rank):
            raise ValueError("csa_compress_ratios (DeepSeek-V4 attention) needs multi_latent_attention, q_lora_rank, "
                             "o_groups and o_lora_rank")
        if self.is_hybrid:
            raise ValueError("csa_compress_ratios and hybrid_layer_pattern do not go together")
        if len(ratios) != self.num_layers + self.mtp_num_layers or set(ratios) - {0, 4, 128}:
            raise ValueError(f"csa_compress_ratios must hold one of 0, 4, 128 per decoder and MTP layer "
                             f"({self.num_layers} + {self.mtp_num_layers}), got {len(ratios)}: {list(ratios)}")
        if 4 in ratios and not (self.dsa_indexer_n_heads and self.dsa_indexer_head_dim and self.dsa_indexer_topk):
            raise ValueError("ratio-4 (Compressed Sparse Attention) layers need dsa_indexer_n_heads, "
                             "dsa_indexer_head_dim and dsa_indexer_topk")
        if self.num_attention_heads * self.v_head_dim % self.o_groups:
            raise ValueError(f"o_groups={self.o_groups} must divide the heads' output "
                             f"{self.num_attention_heads} x {self.v_head_dim}")

    def _check_export_fields(self) -> None:
        """The export-only fields, refused where Megatron-LM would refuse the model (its
        validate_args and TransformerConfig.__post_init__ messages quoted)."""
        if self.mtp_num_layers and self.position_embedding_type not in ("rope", "none"):
            raise ValueError("Multi-Token Prediction (MTP) is not supported with "
                             f"{self.position_embedding_type} position embedding type (Megatron-LM: rope or none)")
        if self.moe_router_enable_expert_bias and self.moe_router_score_function != "sigmoid":
            raise ValueError("Expert bias for aux-loss-free routing only supports sigmoid score function "
                             "(Megatron-LM); set moe_router_score_function: sigmoid")
        if self.moe_router_topk_scaling_factor is not None and self.moe_router_topk_scaling_factor <= 0:
            raise ValueError(f"moe_router_topk_scaling_factor must be positive (or left out), "
                             f"got {self.moe_router_topk_scaling_factor}")
        if self.quick_geglu and self.activation != "swiglu":
            raise ValueError("quick_geglu is a gated activation: set activation: swiglu (the GLU's three matrices)")
        if self.activation_func_clamp_value is not None and not (
                self.activation_func_clamp_value > 0 and math.isfinite(self.activation_func_clamp_value)):
            raise ValueError("activation_func_clamp_value must be finite and greater than zero (as Megatron-LM "
                             f"checks SwiGLU's), got {self.activation_func_clamp_value}")
        if self.window_size is not None and len(self.window_size) != 2:
            raise ValueError(f"window_size is (left, right) as --window-size takes it, got {list(self.window_size)}")
        if self.window_attn_skip_freq is not None and (self.window_size is None or self.window_attn_skip_freq < 1):
            raise ValueError("window_attn_skip_freq needs window_size and must be a positive integer, got "
                             f"{self.window_attn_skip_freq}")
        yarn = {"rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0,
                "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
        changed = [k for k, default in yarn.items() if getattr(self, k) != default]
        if changed and not self.multi_latent_attention:
            raise ValueError(f"{', '.join(changed)}: Megatron-LM applies YaRN only to multi-latent attention "
                             "(\"Common attention only support rope_type='rope'\")")
        if not (self.rope_concentration > 0 and math.isfinite(self.rope_concentration)):
            raise ValueError(f"rope_concentration must be finite and greater than zero, got {self.rope_concentration}")
        if self.rotary_scaling_factor <= 0 or self.original_max_position_embeddings < 1:
            raise ValueError("rotary_scaling_factor and original_max_position_embeddings must be positive")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def context_length(self) -> int:
        """The longest sequence the model handles: its position range where given, else its
        training length."""
        return self.max_position_embeddings or self.seq_length

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def softmax_sinks(self) -> bool:
        """Attention with a softmax offset per head (``--softmax-type`` off-by-one or learnable:
        GPT-OSS's sinks). TransformerEngine runs it in cuDNN's fused attention (cuDNN >= 9.13.1) or
        its unfused attention, never in FlashAttention, and under context parallelism only through
        the all-to-all CP (``cp_comm_type='a2a'``): TE v2.9-v2.17
        ``attention/dot_product_attention/utils.py`` get_attention_backend, "Filter: Softmax type"."""
        return self.softmax_type != "vanilla"

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU has three FFN matrices (gate, up, down) instead of two."""
        return self.activation == "swiglu"

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_expert_ffn_hidden_size(self) -> int:
        return self.moe_shared_expert_intermediate_size or 0

    # The layer pattern and parameter counts below are cached_property: a frozen spec's, computed on
    # first use (a serving fit reads them ~10^6 times); ``dataclasses.replace`` makes a spec anew.
    @cached_property
    def moe_layer_pattern(self) -> tuple[int, ...]:
        """1 for each MoE layer, 0 for each dense one (Megatron-LM's ``moe_layer_pattern``);
        all 0 for a dense model."""
        if self.is_hybrid:
            return tuple(int(kind == "E") for kind in self.hybrid_layer_pattern)
        if not self.is_moe:
            return (0,) * self.num_layers
        return moe_layer_pattern(self.moe_layer_freq, self.num_layers)

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def is_hybrid(self) -> bool:
        """A hybrid Mamba-Transformer: each layer is one block, as ``hybrid_layer_pattern`` says."""
        return self.hybrid_layer_pattern is not None

    @cached_property
    def layer_kind_counts(self) -> dict[str, int]:
        """How many layers of each kind: for a hybrid model its pattern's symbols (M, *, -, E);
        otherwise "dense" (attention + MLP) and "moe" (attention + MoE) layers."""
        if self.is_hybrid:
            return {kind: self.hybrid_layer_pattern.count(kind) for kind in HYBRID_LAYER_KINDS}
        return {"dense": self.num_dense_layers, "moe": self.num_moe_layers}

    # The Mamba-2 mixer's shapes (Megatron-Core MambaMixer): d_inner channels in heads of
    # mamba_head_dim; in_proj makes z and x (d_inner each), B and C (groups x state each) and dt
    # (one per head); the causal conv1d runs over x, B and C.
    @property
    def mamba_heads(self) -> int:
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_in_proj_width(self) -> int:
        return 2 * self.mamba_inner + 2 * self.mamba_num_groups * self.mamba_state_dim + self.mamba_heads

    @property
    def mamba_conv_channels(self) -> int:
        return self.mamba_inner + 2 * self.mamba_num_groups * self.mamba_state_dim

    # Attention shapes: per-head dims of queries/keys and of values (MLA gives them apart).
    @property
    def qk_dim(self) -> int:
        return self.qk_head_dim + self.qk_pos_emb_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def is_dsv4(self) -> bool:
        """DeepSeek-V4's hybrid attention, Hyper-Connections and hash routing (``csa_compress_ratios``)."""
        return self.csa_compress_ratios is not None

    @property
    def is_dsa(self) -> bool:
        """DeepSeek Sparse Attention on every layer of a standard MLA model (dsa_indexer_* without
        csa_compress_ratios: GLM-5)."""
        return self.dsa_indexer_topk is not None and not self.is_dsv4

    @cached_property
    def dsv4_decoder_ratios(self) -> tuple[int, ...]:
        """The decoder layers' compression ratios (the MTP layers' left out)."""
        return tuple(self.csa_compress_ratios[:self.num_layers])

    @cached_property
    def dsv4_ratio_classes(self) -> tuple[int, ...]:
        """The decoder layers' distinct compression ratios, the costliest first (4: CSA and its indexer,
        128, 0: the window alone): the kinds a pipeline stage counts (``pipeline.stage_kind_counts``)."""
        return tuple(r for r in (4, 128, 0) if r in self.dsv4_decoder_ratios)

    def dsv4_uniform(self, ratio: int) -> ModelSpec:
        """This model with every decoder layer at ``ratio`` (the MTP layers' kept): one ratio class's
        layer, priced apart for the stages that hold it (``layer_time.Layers.on``)."""
        mtp = tuple(self.csa_compress_ratios[self.num_layers:])
        return dataclasses.replace(self, csa_compress_ratios=(ratio,) * self.num_layers + mtp)

    # Parameter counts: Megatron-LM's theoretical_memory_usage.py accounting, less norms and
    # biases (< 0.1 %, left out as in Narayanan et al.), plus the router (h x experts per MoE
    # layer), which that accounting leaves out; tests/test_moe_specs.py checks the identity.
    @property
    def dsa_indexer_params(self) -> int:
        """One DSA layer's lightning indexer (Megatron-Core ``dsa`` variant, as Megatron-Bridge 067f987df0
        ``flop_utils.py`` counts indexer_projection_size): queries from the q latent to heads x head_dim,
        one key of head_dim from the hidden state, the per-head weights from the hidden state."""
        if not self.is_dsa:
            return 0
        heads, dim = self.dsa_indexer_n_heads, self.dsa_indexer_head_dim
        return (self.q_lora_rank or self.hidden_size) * heads * dim + self.hidden_size * (dim + heads)

    def csa_extra_params(self, ratio: int) -> int:
        """One DeepSeek-V4 layer's compressor and indexer weights beside its projections (the
        checkpoint's ``attn.compressor.{wkv,wgate}`` of h x 2d on ratio-4 layers, where windows overlap,
        h x d on ratio-128 ones; the ratio-4 layers' ``attn.indexer``: its own compressor of h x 2
        index_head_dim twice, ``wq_b`` q_lora_rank -> heads x head_dim and ``weights_proj`` h -> heads),
        as Megatron-Bridge 067f987df0 ``flop_utils.py`` counts them (main_compressor_term, indexer_term)."""
        h, d = self.hidden_size, self.v_head_dim
        if ratio == 4:
            heads, dim = self.dsa_indexer_n_heads, self.dsa_indexer_head_dim
            return 2 * h * 2 * d + 2 * h * 2 * dim + self.q_lora_rank * heads * dim + h * heads
        return 2 * h * d if ratio == 128 else 0

    @property
    def hyper_connection_params(self) -> int:
        """One layer's mHC weights: for each of its two blocks a map from the hc_mult streams to the
        pre, post and residual mixing weights (hc_mult^2 + 2 hc_mult outputs; ``hc_attn_fn`` /
        ``hc_ffn_fn`` [24, 4 x hidden] at hc_mult 4). Zero without mHC."""
        m = self.hc_mult
        return 0 if m == 1 else 2 * (m * m + 2 * m) * m * self.hidden_size

    @cached_property
    def attention_params(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_dsv4:
            # wq_a, wkv (mla_down_params), wq_b (mla_up_params), the grouped low-rank output (wo_a: each
            # group's heads x d / o_groups -> o_lora_rank; wo_b: o_groups x o_lora_rank -> h), the layers'
            # mean compressor / indexer weights (csa_extra_params) and mHC's.
            extra = sum(self.csa_extra_params(r) for r in self.dsv4_decoder_ratios) // self.num_layers
            output = heads * self.v_head_dim * self.o_lora_rank + self.o_groups * self.o_lora_rank * h
            return self.mla_down_params + self.mla_up_params + output + extra + self.hyper_connection_params
        if self.multi_latent_attention:
            return self.mla_down_params + self.mla_up_params + heads * self.v_head_dim * h + self.dsa_indexer_params
        q_out = heads * self.head_dim
        kv_out = 2 * self.query_groups * self.head_dim
        return h * (q_out + kv_out) + q_out * h

    @property
    def mla_down_params(self) -> int:
        """MLA's down projections (hidden -> q / kv latents and the shared rotary key): Megatron
        keeps them whole on every TP rank (TE parallel_mode "duplicated")."""
        if not self.multi_latent_attention:
            return 0
        if self.is_dsv4:  # wq_a and wkv, DeepSeek-V4's one KV head of v_head_dim (keys and values)
            return self.hidden_size * (self.q_lora_rank + self.v_head_dim)
        return self.hidden_size * ((self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_pos_emb_head_dim)

    @property
    def mla_up_params(self) -> int:
        """MLA's up projections (latents -> per-head queries, keys and values), TP-sharded; a
        model without a query latent projects queries from the hidden state at full rank."""
        heads = self.num_attention_heads
        q_in = self.q_lora_rank or self.hidden_size
        if self.is_dsv4:  # wq_b only: keys and values come whole from wkv
            return q_in * heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return (q_in * heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
                + self.kv_lora_rank * heads * (self.qk_head_dim + self.v_head_dim))

    def mlp_params(self, ffn: int, width: int | None = None) -> int:
        """An MLP of ``ffn`` hidden units on ``width`` (default hidden_size) inputs and outputs."""
        return (3 if self.gated_mlp else 2) * (width or self.hidden_size) * ffn

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP (on the latent width under LatentMoE)."""
        return self.mlp_params(self.expert_ffn_hidden_size, self.moe_latent_size)

    @property
    def latent_projection_params(self) -> int:
        """LatentMoE's projections from the hidden size to the experts' latent width and back."""
        return 2 * self.hidden_size * (self.moe_latent_size or 0)

    @property
    def mamba_params(self) -> int:
        """A Mamba-2 mixer: in_proj, the conv1d's kernel and out_proj (its per-head A, D and dt
        bias and the gated norm left out, as norms and biases are)."""
        return (self.hidden_size * self.mamba_in_proj_width + self.mamba_conv_kernel * self.mamba_conv_channels
                + self.mamba_inner * self.hidden_size)

    @property
    def shared_expert_params(self) -> int:
        return self.mlp_params(self.shared_expert_ffn_hidden_size)

    @property
    def router_params(self) -> int:
        return self.hidden_size * (self.num_experts or 0)

    @property
    def moe_router_fp32(self) -> bool:
        """Routed in FP32 (``--moe-router-dtype fp32``): as the model states (``moe_router_dtype``),
        else as the exports ask from ``FP32_ROUTER_FROM_EXPERTS`` experts on."""
        if self.moe_router_dtype is not None:
            return self.moe_router_dtype == "fp32"
        return (self.num_experts or 0) >= FP32_ROUTER_FROM_EXPERTS

    @property
    def dense_layer_params(self) -> int:
        """A dense layer: attention and an MLP of ffn_hidden_size."""
        return self.attention_params + self.mlp_params(self.ffn_hidden_size)

    def moe_block_params(self, experts: int) -> int:
        """A MoE block with ``experts`` routed experts, the shared experts, the router and the
        latent projections."""
        return (experts * self.expert_params + self.shared_expert_params + self.router_params
                + self.latent_projection_params)

    @property
    def moe_layer_params(self) -> int:
        """A MoE layer: attention, every routed expert, the shared experts and the router."""
        return self.attention_params + self.moe_block_params(self.num_experts or 0)

    @property
    def active_moe_layer_params(self) -> int:
        """The weights one token passes through in a MoE layer: its top-k experts."""
        return self.attention_params + self.moe_block_params(self.moe_router_topk)

    def kind_params(self, active: bool = False) -> dict[str, int]:
        """One layer's parameters by kind (``layer_kind_counts``' keys); ``active``: only the
        weights a token passes through (its top-k experts)."""
        experts = self.moe_router_topk if active else (self.num_experts or 0)
        if self.is_hybrid:
            return {"M": self.mamba_params, "*": self.attention_params,
                    "-": self.mlp_params(self.ffn_hidden_size), "E": self.moe_block_params(experts)}
        return {"dense": self.dense_layer_params, "moe": self.attention_params + self.moe_block_params(experts)}

    def _all_layer_params(self, active: bool) -> int:
        params = self.kind_params(active)
        return sum(count * params[kind] for kind, count in self.layer_kind_counts.items())

    @cached_property
    def layer_params(self) -> int:
        """All parameters of one layer, averaged over the layers (every expert for MoE)."""
        return self._all_layer_params(active=False) // self.num_layers

    @cached_property
    def active_layer_params(self) -> int:
        """Parameters one token passes through in one layer, averaged over the layers."""
        return self._all_layer_params(active=True) // self.num_layers

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_parameters(self) -> int:
        output = 0 if self.tie_embeddings else self.embedding_params
        return self._all_layer_params(active=False) + self.embedding_params + output

    @property
    def num_active_parameters(self) -> int:
        output = 0 if self.tie_embeddings else self.embedding_params
        return self._all_layer_params(active=True) + self.embedding_params + output


def moe_layer_pattern(freq: int | str, num_layers: int) -> tuple[int, ...]:
    """Megatron-LM's ``--moe-layer-freq`` as one 0/1 per layer: an int N makes every N-th layer
    (from the first) MoE; a string is an int or a list expression of 0s and 1s such as
    ``([0]*3+[1]*58)`` (evaluated without ``eval``: lists, ints, + and * only). The expression
    describes ``num_layers`` layers, so no list or count in it may exceed that: ``[1]*10**12``
    is refused before it is built, not after memory runs out."""
    if isinstance(freq, str) and freq.strip().lstrip("-").isdigit():
        freq = int(freq)
    if isinstance(freq, int):
        if freq < 1:
            raise ValueError(f"moe_layer_freq must be a positive integer or a pattern, got {freq}")
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    try:
        pattern = _list_expression(ast.parse(freq.strip(), mode="eval").body, max(num_layers, 1))
    except _TooLong as exc:
        raise ValueError(f"moe_layer_freq {freq!r} {exc} for {num_layers} layers") from None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        raise ValueError(f"moe_layer_freq {freq!r} is not a pattern of 0s and 1s such as "
                         f"\"([0]*3+[1]*58)\" ({exc})") from None
    if not isinstance(pattern, list) or any(v not in (0, 1) for v in pattern):
        raise ValueError(f"moe_layer_freq {freq!r} must give a list of 0s and 1s, got {pattern!r}")
    if len(pattern) != num_layers:
        raise ValueError(f"moe_layer_freq {freq!r} has {len(pattern)} entries for {num_layers} layers")
    return tuple(pattern)


class _TooLong(ValueError):
    """A list expression that asks for more entries (or a larger count) than the layers."""


def _list_expression(node: ast.AST, limit: int):
    """Evaluate a list expression: integer literals, list displays, + and *; every integer and
    every list at most ``limit`` (the layer count)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if not 0 <= node.value <= limit:
            raise _TooLong(f"has a count of {node.value}")
        return node.value
    if isinstance(node, ast.List):
        if len(node.elts) > limit:
            raise _TooLong(f"has {len(node.elts)} entries")
        return [_list_expression(e, limit) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _list_expression(node.left, limit), _list_expression(node.right, limit)
        if isinstance(node.op, ast.Add):
            if not (isinstance(left, list) and isinstance(right, list)):
                raise TypeError("+ joins two lists")
            if len(left) + len(right) > limit:
                raise _TooLong(f"has {len(left) + len(right)} entries")
            return left + right
        if isinstance(left, list) == isinstance(right, list):
            raise TypeError("* repeats a list an integer number of times")
        items, times = (left, right) if isinstance(left, list) else (right, left)
        if len(items) * max(times, 0) > limit:
            raise _TooLong(f"has {len(items) * times} entries")
        return items * times
    raise ValueError(f"unsupported element {ast.dump(node)[:40]}")
