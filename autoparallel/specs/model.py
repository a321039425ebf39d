"""The architecture of a decoder-only transformer, with Megatron-LM's argument names.

One ModelSpec feeds both the cost model (shapes and parameter counts) and the built-in
transformer (``autoparallel.model``), so the two can never disagree about what a layer is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Activation = Literal["gelu", "swiglu", "squared_relu"]
Normalization = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned_absolute", "rope"]
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
    add_bias_linear: bool = True
    layernorm_zero_centered_gamma: bool = False  # "LayerNorm1p" (--apply-layernorm-1p)
    norm_epsilon: float = 1e-5
    tokenizer_type: TokenizerType = "NullTokenizer"
    tokenizer_model: str = ""  # Hugging Face repo id for HuggingFaceTokenizer; files are placeholders
    # Megatron-LM's dropout probabilities (its defaults). They decide whether dropout masks are
    # among the saved activations; the built-in transformer itself trains without dropout.
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # Mixture of experts (all None / 0 for a dense model).
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_ffn: int = 0
    # The global batch size the model was published with; the search keeps it fixed by default.
    global_batch_size: int | None = None
    # Positions the model serves (Megatron-LM's --max-position-embeddings; HF's
    # max_position_embeddings): the serving context. None means seq_length.
    max_position_embeddings: int | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        positive = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                    "vocab_size", "seq_length")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("num_query_groups", "kv_channels", "num_experts", "moe_ffn_hidden_size",
                    "global_batch_size", "max_position_embeddings"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key} must be a positive integer (or left out), got {getattr(self, key)}")
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
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU has three FFN matrices (gate, up, down) instead of two."""
        return self.activation == "swiglu"

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    # Parameter counts (biases and norms are < 0.1 % and left out, as in Narayanan et al.).
    @property
    def attention_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q_out = self.num_attention_heads * d
        kv_out = 2 * self.query_groups * d
        return h * (q_out + kv_out) + q_out * h

    def mlp_params(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    @property
    def dense_mlp_params(self) -> int:
        """Parameters of the MLP of a dense layer, or of one routed expert for MoE."""
        return self.mlp_params(self.expert_ffn_hidden_size if self.is_moe else self.ffn_hidden_size)

    @property
    def layer_params(self) -> int:
        """All parameters of one layer (every expert for MoE)."""
        if not self.is_moe:
            return self.attention_params + self.dense_mlp_params
        experts = self.num_experts * self.dense_mlp_params
        shared = self.mlp_params(self.moe_shared_expert_ffn) if self.moe_shared_expert_ffn else 0
        router = self.hidden_size * self.num_experts
        return self.attention_params + experts + shared + router

    @property
    def active_layer_params(self) -> int:
        """Parameters one token passes through in one layer (top-k experts for MoE)."""
        if not self.is_moe:
            return self.layer_params
        shared = self.mlp_params(self.moe_shared_expert_ffn) if self.moe_shared_expert_ffn else 0
        return self.attention_params + self.moe_router_topk * self.dense_mlp_params + shared

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_parameters(self) -> int:
        output = 0 if self.tie_embeddings else self.embedding_params
        return self.num_layers * self.layer_params + self.embedding_params + output

    @property
    def num_active_parameters(self) -> int:
        output = 0 if self.tie_embeddings else self.embedding_params
        return self.num_layers * self.active_layer_params + self.embedding_params + output
