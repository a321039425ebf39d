"""One forward pass of a serving engine, its memory, and static batching (pure numpy).

A serving engine runs the model as a sequence of forward passes ("iterations"). One pass of one
pipeline stage over ``tokens`` tokens costs, per layer and GPU (``stage_pass``):

- **compute**: Linear GEMMs, 2 FLOPs per active parameter per token (over ``tp``), at a
  size-dependent fraction of the BF16 / FP8 peak (small GEMMs starve the GPU, as in training);
  plus the attention core (prefill: 2·s²·heads·head_dim per sequence, causal; decode:
  4·ctx·heads·head_dim per token);
- **memory**: every weight of the layer shard is read once per pass, and every cached K/V a
  decoding sequence attends to (KV cache = 2·layers·kv_heads·head_dim·bytes per token, KV heads
  sharded by ``tp`` and replicated where ``tp`` exceeds them) at an achieved fraction of HBM
  bandwidth: once per KV head (TensorRT-LLM's XQA kernel), or once per query head where the
  engine's decode kernel is the masked-MHA fallback (``decode_kv_reads``: TensorRT-LLM 0.10
  outside XQA's group-8, head-128/256 shapes);
- each kernel is bound by its own FLOPs or bytes, combined by a smooth roofline
  ``(c^k + m^k)^(1/k)`` (``k`` fitted; ``k -> inf`` is the hard max), and the kernels run one
  after another: the GEMMs (weights read vs. FLOPs: bandwidth-bound at small batch,
  compute-bound at large batch), the attention core (decode: KV reads; prefill: FLOPs) and the
  element-wise kernels add up;
- **MoE layers** (Mixtral, Qwen3, DeepSeek-V3, ...): the routed experts are their own GEMMs.
  Each GPU of the TP group holds a 1/tp share of every expert (TensorRT-LLM's default expert
  tensor parallelism) or, with expert parallelism ``ep`` (= tp: vLLM's
  ``--enable-expert-parallel``, TensorRT-LLM's ``--ep_size``, SGLang's ``--ep-size``), whole
  experts, num_experts / ep of them. A pass over T tokens sends T·top-k token copies through the
  experts, two grouped GEMMs (FC1 with the gate, FC2), each one kernel over every local expert
  (TensorRT-LLM's MoE plugin, vLLM's and SGLang's fused_moe), priced at the GEMM efficiency of
  its whole size: the training model's grouped-GEMM structure (``layer_time.routed_experts_time``:
  the curve read at the GEMMs in flight together) with every local expert in flight, since one
  persistent kernel schedules all experts' tiles. Tile padding is not priced: TensorRT-LLM's
  Hopper grouped GEMM puts the tokens on the tile's N side (``computeStridesHopperKernel``, "M and
  N transposed since we are using the #tokens as the N dimension", NVIDIA/TensorRT-LLM 05316d33
  ``moe_kernels.cu``) and profiles N tiles of 16 to 256 (``get_candidate_tiles_sm90``,
  GROUPED_GEMM, 0b53e947 ``cutlass_heuristic.cpp``), so at most 15 rows per expert are padded.
  The kernels around the GEMMs that a dense layer lacks (permute, top-k sum) are
  ``moe_plugin_bytes``; the gated activation between FC1 and FC2, which dense layers run too,
  is ``gated_activation_bytes``. Under EP the busiest GPU takes ``moe.load_imbalance`` times the even
  share (the spread fitted to the training runs).
  Only the experts some token picks are read: with uniform routing a share
  1 - (1 - top-k / num_experts)^T of them, so a small decode batch reads a few experts and a
  large one reads them all. The expert outputs are summed by the TP all-reduce the layer has
  anyway (as TensorRT-LLM's MoE plugin does under TP and EP alike). Inside one TP group EP
  therefore never beats the split experts; what EP gains in the engines comes from all-to-all
  dispatch and wide EP with data-parallel attention across nodes, which are not modelled.
- **Multi-latent attention** (DeepSeek-V3, Kimi-K2): the engines cache the compressed latent
  (kv_lora_rank + the rotary key, 576 values per token and layer for DeepSeek-V3), whole on
  every TP rank, and decode with the up projections absorbed into the query and output (each
  head attends over the latent: 2·(2·kv_lora_rank + rope dims) FLOPs per cached token);
  prefill attends per head at qk_head_dim + rope dims and v_head_dim.
- **Hybrid Mamba-Transformer models** (Nemotron-H, Nemotron 3: ``hybrid_layer_pattern``): a
  stage of one-block layers is priced as half as many standard layers, each holding the pattern's
  shares of Mamba, attention, MLP and MoE blocks (``hybrid_layer_work``); only the attention
  layers keep a KV cache, the Mamba layers a fixed state per sequence and their own kernels
  (``costmodel.mamba_serving``).
- **TP**: two all-reduces of the layer output per layer, priced by ``comm.all_reduce_time`` plus
  a fitted per-call latency floor (small inference messages never reach bus bandwidth), higher
  when the group leaves the NVLink domain;
- the gated MLP's activation (SwiGLU) as a pass of its own (``gated_activation_bytes``: read
  FC1's 16-bit 2 x inter outputs, write FC2's input), dense and MoE layers alike;
- memory-bound element-wise traffic per token (norms, bias, residual, a non-gated activation), a fixed
  per-layer cost (kernel launches), and on the last stage the output layer and the sampler's
  cost per logit (top-p sorts the vocabulary).

**Static batching** (``estimate_static_columns``; FasterTransformer and TensorRT-LLM's
``gptSessionBenchmark``): ``batch`` requests start together, each with ``input_len`` prompt and
``output_len`` generated tokens. The batch is split into ``m = min(pp, batch)`` micro-batches
(FasterTransformer's own rule for validation). The prefill costs ``(m + pp - 1)`` stage times of
one micro-batch plus the hand-offs; a decode step costs ``pp`` stage times in the steady state
where the micro-batches follow each other through the stages (``m + pp - 1`` for FT, which
flushes the pipeline every step). Latency metrics: ``ttft`` = prefill of the whole batch;
``tpot`` = one decode pass at the mean context length; ``e2e`` = ttft + decode_steps·tpot
(``decode_steps`` = output_len - 1 by default; FT's published latency has output_len steps).

In-flight (continuous) batching, what engines run today, is ``costmodel.inflight``; it uses the
same ``stage_pass`` and memory terms.

Memory per GPU (the fullest pipeline stage): weights (embedding and output layer in 16 bit),
KV cache, activations of the tokens of one pass (at most the engine's token budget), the logits
of one pass, and the hardware's fixed reserve.

Constants: ``InferenceEfficiency`` per serving engine, fitted by
``python -m autoparallel.serve.fit`` and stored in ``search_spaces/inference_assumptions.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from autoparallel import io
from autoparallel.costmodel import comm, gemm, mamba, mamba_serving, moe
from autoparallel.costmodel.memory import GIB
from autoparallel.errors import UnpricedModelError, UserError
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

#: Bytes per element of weights / KV cache by precision name. NVFP4 (weights only: TensorRT-LLM's
#: ``nvfp4`` quantization, which NVIDIA's MLPerf Inference v5.1 harness builds for ``precision: 'fp4'``,
#: mlcommons/inference_results_v5.1@965182b0 closed/NVIDIA/code/llmlib/builder.py "Assume that all TRTLLM
#: build.py flags assume fp4 means nvfp4"): 4-bit E2M1 values and one E4M3 scale per 16 elements
#: (NVIDIA/TransformerEngine@d0067d0da docs/features/low_precision_training/nvfp4/nvfp4.rst), 4.5 bits;
#: the per-tensor FP32 scale is left out. Its GEMMs run on the FP4 tensor cores (``pass_work``).
PRECISION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}
PRECISIONS = tuple(PRECISION_BYTES)
#: The KV cache's: NVFP4 is a weight format here (attention is priced at the FP8 or 16-bit peak).
KV_PRECISIONS = tuple(p for p in PRECISIONS if p != "nvfp4")
#: The module groups an NVFP4 checkpoint may leave in 16 bit (``nvfp4_16bit_params``), each as its
#: parameters in one layer averaged over the layers. The output layer is 16-bit under every precision.
NVFP4_UNQUANTIZED_GROUPS = {
    "mla_projections": lambda m: m.mla_down_params + m.mla_up_params,  # q_a + kv_a (fused_a), q_b, kv_b
    "router": lambda m: m.num_moe_layers / m.num_layers * m.router_params,  # mlp.gate of the MoE layers
}
ACT_BYTES = 2.0  # activations stay 16 bit
LOGIT_BYTES = 4.0  # FP32 logits of the sampled position
SCORE_TRIPS = 4.0  # unfused attention: write QK^T, read it for softmax, write P, read P for P·V
GEMMS_PER_LAYER = 4.0  # QKV, projection, FC1 (fused gate/up), FC2

STATIC_COLUMNS = ("tp", "pp", "batch", "input_len", "output_len", "weight_precision", "kv_precision")
#: Breakdown of one decode pass (seconds; compute and memory overlap in the roofline).
PASS_KEYS = ("decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_overhead_s", "decode_pp_s")
MEMORY_KEYS = ("memory_per_gpu_gib", "weights_gib", "kv_cache_gib", "activations_gib", "reserve_gib")
OUTPUT_KEYS = ("ttft_s", "tpot_s", "latency_s", "output_tokens_per_s_per_replica", "fits",
               *MEMORY_KEYS, *PASS_KEYS)


@dataclass(frozen=True)
class InferenceEfficiency:
    """Fitted fractions of peak and fixed costs of one serving engine on one GPU type.

    The defaults are the fit to FasterTransformer on A100 (rounded; the assumptions YAML holds
    each engine's exact fit, the command and the data). Fitted to an engine, they describe that
    engine: e.g. ``layer_overhead_us`` holds FT's kernel launches without CUDA graphs.
    """

    hbm: float = 0.91  # achieved share of HBM bandwidth streaming weights and KV cache
    gemm_max: float = 0.64  # GEMM efficiency = gemm_max / (1 + gemm_half_gflop / GEMM GFLOP)
    gemm_half_gflop: float = 0.01
    fp8_gemm_relative: float = 0.8  # FP8 GEMMs reach this share of the (doubled) FP8 peak
    attention: float = 0.4  # prefill attention core as a share of the BF16 peak
    roofline_sharpness: float = 20.0  # k in (compute^k + memory^k)^(1/k)
    layer_overhead_us: float = 107.0  # per layer and forward pass
    pass_overhead_us: float = 0.0  # per forward pass / engine iteration (scheduling, host work);
    #   in-flight PP pays it per micro-batch step (costmodel.inflight, serve.simulate)
    allreduce_latency_us: float = 21.2  # per all-reduce inside an NVLink domain, on top of comm
    internode_allreduce_latency_us: float = 65.8  # per all-reduce that leaves the domain
    p2p_latency_us: float = 30.0  # per pipeline hand-off inside an NVLink domain (not fitted: no data)
    internode_p2p_latency_us: float = 2106.0  # per hand-off between nodes (FT's PP3 rows)
    # Per-layer memory-bound traffic (norms, bias, residual, a non-gated activation; replicated over TP) in
    # bytes per token and hidden unit; and the sampler's cost per logit (top-p sorts the vocab).
    elementwise_bytes_per_token_hidden: float = 12.6
    sampling_ns_per_logit: float = 1.09

    def __post_init__(self) -> None:
        for key in ("hbm", "gemm_max", "fp8_gemm_relative", "attention"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        if self.roofline_sharpness < 1:
            raise ValueError(f"roofline_sharpness must be >= 1, got {self.roofline_sharpness}")


@dataclass(frozen=True)
class ServingEngine:
    """How one serving engine batches requests and allocates its KV cache (its own defaults).

    Data, not fitted: every value is the engine's documented behaviour or default (the
    assumptions YAML cites where each comes from). ``batching``: ``inflight`` (requests join and
    leave the running batch every iteration) or ``static`` (a batch runs to completion).
    ``kv_reservation``: ``full`` reserves the blocks of the whole request (prompt + every output
    token) when it is admitted (TensorRT-LLM's GUARANTEED_NO_EVICT); ``current`` allocates blocks
    as tokens arrive (vLLM, SGLang, TensorRT-LLM's MAX_UTILIZATION), so a request holds on
    average its prompt and half its output. ``kv_memory``: the KV pool is ``kv_memory_fraction``
    of the memory left after weights and activations (``free``, TensorRT-LLM's
    kv_cache_free_gpu_mem_fraction) or that fraction of the whole GPU minus weights and
    activations (``total``, vLLM's gpu_memory_utilization, SGLang's mem_fraction_static).
    ``max_batch_size`` / ``max_num_tokens``: the engine's defaults for requests in one running
    batch and tokens in one iteration (the search overrides them).
    """

    name: str
    batching: Literal["inflight", "static"] = "inflight"
    kv_block_tokens: int = 64
    kv_reservation: Literal["full", "current"] = "full"
    kv_memory: Literal["free", "total"] = "free"
    kv_memory_fraction: float = 0.9
    chunked_prefill: bool = True
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    prefill_priority: bool = False  # iterations with prompts to prefill run no decode tokens (SGLang)
    # Decode iterations per scheduler call (vLLM V0's ``num_scheduler_steps``, multi-step scheduling):
    # a decode batch runs this many iterations before the scheduler runs again, so a prompt that
    # arrives meanwhile waits for the run to end (serve/simulate.py; the steady state ignores it).
    scheduler_steps: int = 1
    microbatching: Literal["even", "fastertransformer"] = "even"
    flash_attention: bool = True
    # The decode (generation-phase) attention kernel: TensorRT-LLM runs its XQA kernel (one CTA
    # per KV head: the head's K/V are read once for all its query heads) only where the
    # dispatcher accepts the layer's shape, else the masked-MHA kernel (one CTA per query head,
    # each reading its KV head's K/V: ``decode_kv_reads``). ``xqa_group_sizes`` / ``xqa_head_sizes``:
    # the query heads per KV head (per TP rank) and head sizes XQA serves; None: every shape
    # (the cost model's default, one read per KV head).
    xqa_group_sizes: tuple[int, ...] | None = None
    xqa_head_sizes: tuple[int, ...] | None = None
    cli: str = ""  # the command that starts it (for exports and reports)
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.kv_memory_fraction <= 1:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}")
        for key in ("kv_block_tokens", "max_batch_size", "max_num_tokens", "scheduler_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")


def precision_bytes(names) -> np.ndarray:
    names = np.asarray(names)
    out = np.full(names.shape, np.nan)
    for name, nbytes in PRECISION_BYTES.items():
        out = np.where(names == name, nbytes, out)
    if np.isnan(out).any():
        bad = sorted(set(names[np.isnan(out)].tolist()))
        raise ValueError(f"unknown precision(s) {bad}; valid: {', '.join(PRECISIONS)}")
    return out


def kv_bytes_per_token(model: ModelSpec, layers, tp, kv_bytes):
    """K and V of one token on one GPU: 2 · layers · local KV heads · head_dim · bytes (MLA: the
    latent and the rotary key, layers · (kv_lora_rank + qk_pos_emb_head_dim) · bytes, on every
    TP rank)."""
    if model.multi_latent_attention:
        latent = model.kv_lora_rank + model.qk_pos_emb_head_dim
        return layers * latent * kv_bytes * np.ones_like(np.asarray(tp, dtype=float))
    local_heads = np.maximum(model.query_groups / np.asarray(tp, dtype=float), 1.0)
    return 2.0 * layers * local_heads * model.head_dim * kv_bytes


def _soft_max(a, b, k):
    """Smooth roofline: (a^k + b^k)^(1/k), computed stably."""
    hi = np.maximum(a, b)
    positive = hi > 0
    safe = np.where(positive, hi, 1.0)
    return np.where(positive, safe * ((a / safe) ** k + (b / safe) ** k) ** (1.0 / k), 0.0)


def microbatch_size(batch, tokens_per_seq, pp, policy: str = "even"):
    """Sequences per pipeline micro-batch.

    ``even``: ``batch / min(pp, batch)`` (one micro-batch per stage in flight, as vLLM's virtual
    engines and TensorRT-LLM schedule them). ``fastertransformer``: FT's getLocalBatchSize
    (ParallelGpt.cc): divide by pp when it divides the batch, then halve while the micro-batch
    holds more than 1024 tokens and stays even.
    """
    b = np.asarray(batch, dtype=float)
    pp = np.asarray(pp, dtype=float)
    if policy == "even":
        return b / np.minimum(pp, b)
    if policy != "fastertransformer":
        raise ValueError(f"unknown micro-batching policy {policy!r}; valid: even, fastertransformer")
    tokens = np.broadcast_to(np.asarray(tokens_per_seq, dtype=float), b.shape)
    local = np.where((pp > 1) & (np.mod(b, pp) == 0), b / pp, b)
    for _ in range(32):
        halve = (pp > 1) & (local * tokens > 1024) & (np.mod(local, 2) == 0)
        if not halve.any():
            break
        local = np.where(halve, local / 2, local)
    return local


@dataclass(frozen=True)
class Layout:
    """The per-candidate arrays every pass of one layout needs (one element per candidate)."""

    model: ModelSpec
    hw: HardwareSpec
    eff: InferenceEfficiency | None  # None: before the constants (``StaticBatch``, ``inflight.InflightBatch``)
    tp: np.ndarray
    pp: np.ndarray
    weight_bytes: np.ndarray  # per weight element
    kv_bytes: np.ndarray  # per KV element
    ep: np.ndarray  # expert parallel size inside the TP group (1: every GPU holds a share of every expert)
    decode_kv_reads: np.ndarray | float = 1.0  # times the decode kernel reads each KV head's cache (decode_kv_reads)
    # Attention data parallelism (``attention_dp``): the ranks that each run attention, the dense MLPs and the
    # shared experts whole on their own requests and share one expert-parallel MoE (1: a TP layout). ``tp`` is
    # then 1 (no TP split of anything but the routed experts) and ``ep`` the ranks the experts spread over.
    dp: np.ndarray | float = 1.0

    @property
    def stage_layers(self) -> np.ndarray:
        return np.ceil(self.model.num_layers / self.pp)

    @property
    def attention_layers(self) -> np.ndarray:
        """The fullest stage's layers with a KV cache: all of them, or a hybrid's * layers
        (``mamba_serving.stage_counts``)."""
        if self.model.is_hybrid:
            return mamba_serving.stage_counts(self)["*"]
        return self.stage_layers

    def kv_bytes_per_token(self) -> np.ndarray:
        """KV cache of one token on one GPU of the fullest stage."""
        return kv_bytes_per_token(self.model, self.attention_layers, self.tp, self.kv_bytes)

    def weights(self) -> np.ndarray:
        """Weight bytes on one GPU of the fullest stage (embedding and output layer in 16 bit, and
        the modules an NVFP4 checkpoint leaves unquantized: ``nvfp4_16bit_params``)."""
        m, t = self.model, self.tp
        emb = m.embedding_params / t * ACT_BYTES
        out_w = 0.0 if m.tie_embeddings else emb
        ends = np.where(self.pp > 1, np.maximum(emb, out_w), emb + out_w)
        return self.stage_layers * stored_weight_bytes(self, m.layer_params) / t + ends - unsplit_expert_bytes(self)

    def activations_per_token(self) -> np.ndarray:
        """Live activation bytes of one token in one layer's forward pass (16 bit)."""
        m, t = self.model, self.tp
        ffn = m.expert_ffn_hidden_size if m.is_moe else m.ffn_hidden_size
        ffn_mult = (2.0 if m.gated_mlp else 1.0) * (m.moe_router_topk if m.is_moe else 1)
        h, hd = m.hidden_size, m.head_dim
        return ACT_BYTES * (4.0 * h + (m.num_attention_heads + 2 * m.query_groups) * hd / t + ffn_mult * ffn / t)

    def logits(self, sequences) -> np.ndarray:
        return sequences * self.model.vocab_size / self.tp * LOGIT_BYTES


def decode_kv_reads(engine: ServingEngine | None, model: ModelSpec, tp) -> np.ndarray:
    """Times the engine's decode attention reads each KV head's cached K/V per step: 1 where its
    XQA kernel serves the layer (one CTA per KV head and sequence), else the query heads per KV
    head on one TP rank: the masked-MHA fallback runs one CTA per query head (grid = heads x
    batch [x KV tiles]), each streaming its KV head's K and V (NVIDIA/TensorRT-LLM 06c0e9b1,
    decoderMaskedMultiheadAttention/decoderMaskedMultiheadAttentionTemplate.h: ``hi = blockIdx.x``,
    ``hi_kv = hi / qhead_per_kv``; decoderMaskedMultiheadAttentionLaunch.h: ``dim3 grid{num_heads,
    batch_size, 1}``). MLA and engines without an XQA list: 1."""
    tp = np.asarray(tp, dtype=float)
    ones = np.ones_like(tp)
    if engine is None or model.multi_latent_attention or (engine.xqa_group_sizes is None
                                                          and engine.xqa_head_sizes is None):
        return ones
    q_local = model.num_attention_heads / tp
    kv_local = np.maximum(model.query_groups / tp, 1.0)
    group = q_local / kv_local
    served = np.ones(tp.shape, dtype=bool)
    if engine.xqa_group_sizes is not None:
        served &= np.isin(np.round(group), np.asarray(engine.xqa_group_sizes, dtype=float))
    if engine.xqa_head_sizes is not None:
        served &= model.head_dim in engine.xqa_head_sizes
    return np.where(served, ones, np.maximum(group, 1.0))


def refuse_unpriced(model: ModelSpec, engine: ServingEngine | None = None) -> None:
    """A hybrid Mamba-Transformer served by an engine without Mamba layers in its sources
    (``mamba_serving.HYBRID_ENGINES``) is refused rather than priced as a transformer, and so are
    DeepSeek-V4 (its compressed KV, DSA indexer cache and Hyper-Connections are not priced) and a model with
    DeepSeek Sparse Attention on every layer (GLM-5: its indexer and top-k reads are not priced)."""
    if model.is_hybrid and engine is not None and engine.name not in mamba_serving.HYBRID_ENGINES:
        raise UnpricedModelError(f"--engine {engine.name}: {model.name} is a hybrid Mamba-Transformer "
                                 "(hybrid_layer_pattern), which that engine does not serve; valid engines for it: "
                                 f"{', '.join(mamba_serving.HYBRID_ENGINES)}")
    if model.is_dsv4:
        raise UnpricedModelError(f"{model.name} is DeepSeek-V4 (csa_compress_ratios): the serving cost model prices "
                                 "a full KV cache per layer; its compressed KV, sliding window, DSA indexer cache and "
                                 "Hyper-Connections are not priced")
    if model.is_dsa:
        raise UnpricedModelError(f"{model.name} has DeepSeek Sparse Attention (dsa_indexer_*): the serving cost model "
                                 "prices dense MLA over the whole KV cache; the indexer's top-k reads and its key "
                                 "cache are not priced")


#: Engines whose attention data parallelism is priced (``attention_dp``): TensorRT-LLM's PyTorch backend
#: (``enable_attention_dp``), read in its source (see ``attention_dp_dispatch``).
ATTENTION_DP_ENGINES = ("tensorrt-llm",)


def refuse_attention_dp(model: ModelSpec, engine: ServingEngine | None, tp, ep) -> None:
    """Attention data parallelism is priced only as TensorRT-LLM's PyTorch backend runs it for a MoE
    model (``attention_dp_dispatch``): each of the ``tp`` ranks runs attention, the dense MLPs and the
    shared experts whole, and the routed experts are spread over all of them (``ep`` = ``tp``).
    Anything else is refused, naming what is valid."""
    if not model.is_moe or model.is_hybrid:
        raise UserError(f"attention data parallelism: {model.name} is not a (non-hybrid) MoE model; it is priced "
                        "for MoE models only, whose expert-parallel MoE layers the attention ranks share "
                        "(e.g. deepseek-v3, the DeepSeek-R1 architecture)")
    if engine is not None and engine.name not in ATTENTION_DP_ENGINES:
        raise UserError(f"attention data parallelism: --engine {engine.name} is not priced with it; valid engines: "
                        f"{', '.join(ATTENTION_DP_ENGINES)} (TensorRT-LLM's enable_attention_dp)")
    if np.any(np.asarray(ep, dtype=float) != np.asarray(tp, dtype=float)) or np.any(np.asarray(tp) < 2):
        raise UserError("attention data parallelism spreads the experts over every rank: it needs tp >= 2 and "
                        "ep = tp (expert parallel over the TP group)")


def layout(model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency | None, tp, pp,
           weight_precision, kv_precision, ep=1, engine: ServingEngine | None = None,
           attention_dp: bool = False) -> Layout:
    """The arrays of one layout; ``engine`` (optional) picks the decode attention kernel
    (``decode_kv_reads``). A hybrid model with an engine that does not serve it is refused
    (``refuse_unpriced``). ``attention_dp``: the ``tp`` ranks run attention data-parallel, each on
    its own requests, around an expert-parallel MoE (``ep`` = ``tp``; ``refuse_attention_dp``): the
    layout of one such rank, ``tp`` 1 and ``dp`` the ranks (``Layout.dp``)."""
    refuse_unpriced(model, engine)
    tp = np.asarray(tp, dtype=float)
    dp = np.ones_like(tp)
    if attention_dp:
        refuse_attention_dp(model, engine, tp, ep)
        tp, dp = np.ones_like(tp), tp
    return Layout(model, hw, eff, tp, np.asarray(pp, dtype=float), precision_bytes(weight_precision),
                  precision_bytes(kv_precision), np.broadcast_to(np.asarray(ep, dtype=float), tp.shape),
                  decode_kv_reads(engine, model, tp), dp)


def unsplit_expert_bytes(lay: Layout) -> np.ndarray:
    """Routed-expert weight bytes ``Layout.weights`` counts per GPU beyond what one GPU holds
    under attention DP: ``layer_params / tp`` holds every expert whole at ``tp`` 1, while the
    experts are spread over the ``dp`` ranks (num_experts / ep each). Zeros without attention DP."""
    m = lay.model
    if not m.is_moe:
        return np.zeros_like(lay.tp)
    routed = m.num_moe_layers / m.num_layers * m.num_experts * m.expert_params
    return lay.stage_layers * routed * (1.0 / lay.tp - 1.0 / (lay.tp * lay.dp)) * lay.weight_bytes


def _dispatch_bytes(lay: Layout) -> np.ndarray:
    """Bytes per element of the hidden states gathered to the experts under attention DP: quantized
    as the experts' GEMMs read them (NVFP4 with its scales, FP8), else 16 bit."""
    return np.minimum(lay.weight_bytes, ACT_BYTES)


def attention_dp_dispatch(lay: Layout, tokens) -> np.ndarray:
    """Transfer time of one MoE layer's token exchange under attention DP, for a pass over
    ``tokens`` tokens on each of the ``dp`` ranks (zeros without attention DP; the fitted per-call
    latency is added in ``price_pass``, once per collective).

    TensorRT-LLM's PyTorch backend with ``enable_attention_dp`` (NVIDIA/TensorRT-LLM@000561df
    tensorrt_llm/_torch/models/modeling_deepseekv3.py: no attention all-reduce, the dense MLPs and
    the shared experts at TP 1, the MoE with ``all_rank_num_tokens``) runs its CUTLASS MoE as
    "dynamic quant + routing + fp4_allgather + scatter + gemm1 + swiglu + gemm2 + finalizeMoeRoute +
    reducescatter" (NVIDIA/TensorRT-LLM@000a01de tensorrt_llm/_torch/modules/fused_moe/
    fused_moe_cutlass.py ``forward_chunk``, ``reducescatter_or_allreduce``): every rank gathers all
    ranks' tokens, quantized (NVFP4 values and scales, or FP8), runs its own experts on them and
    reduce-scatters the 16-bit output back. Its WIDEEP backend does the same where no all-to-all
    is available (NVIDIA/TensorRT-LLM@01303b38 .../fused_moe_wide_ep.py ``select_alltoall_method_type``:
    MNNVL all-to-all only on multi-node NVLink systems, DeepEP only for BF16); on GB200 / GB300
    NVL72 it dispatches by MNNVL all-to-all instead, which this prices as the same gather and
    reduce-scatter (an assumption: the all-to-all sends a token only to the ranks of its experts)."""
    if not lay.model.is_moe:
        return np.zeros_like(lay.tp)
    gathered = np.asarray(tokens, dtype=float) * lay.dp * lay.model.hidden_size
    per_node = comm.ranks_per_domain(lay.hw, lay.dp, 1)
    ranks = comm.group(lay.hw, lay.dp, per_node)
    return np.where(lay.dp > 1, ranks.reduce_scatter_time(gathered * _dispatch_bytes(lay))
                    + ranks.reduce_scatter_time(gathered * ACT_BYTES), 0.0)


def _gemm_gflop(gemm_flops):
    """The GEMM size ``_gemm_time`` reads its efficiency at (GFLOP, floored above 0)."""
    return np.maximum(gemm_flops / 1e9, 1e-12)


def _gemm_time(eff: InferenceEfficiency, flops, gemm_gflop, peak):
    """``flops`` of GEMMs each of ``gemm_gflop`` (``_gemm_gflop``), at the size-dependent share of ``peak``."""
    return flops / (peak * eff.gemm_max / (1.0 + eff.gemm_half_gflop / gemm_gflop))


def routed_expert_work(lay: Layout, tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(GEMM FLOPs, their GEMMs' size ``_gemm_gflop``, weight bytes read) of the routed experts of
    one MoE layer on one GPU for a pass over ``tokens`` tokens (None for a dense model)."""
    model, t, ep = lay.model, lay.tp, lay.ep
    if not model.is_moe:
        return None
    experts, k = float(model.num_experts), float(model.moe_router_topk)
    tokens = np.asarray(tokens, dtype=float)
    # Under attention DP (``lay.dp``) every rank's experts take all ``dp`` ranks' tokens and the experts
    # are spread over ``t * dp`` GPUs (``attention_dp_dispatch``); else dp is 1.
    tokens, t = tokens * lay.dp, t * lay.dp
    flops = 2.0 * tokens * k * model.expert_params / t * moe.load_imbalance(lay.hw, model, ep)
    picked = 1.0 - (1.0 - k / experts) ** tokens  # share of the experts some token routes to
    return flops, _gemm_gflop(flops / 2.0), picked * experts * model.expert_params / t * lay.weight_bytes


def price_routed_experts(eff: InferenceEfficiency, work: tuple, gemm_peak, hbm) -> tuple[np.ndarray, np.ndarray]:
    """(GEMM time, weight-read time) of ``routed_expert_work``'s ``work`` under the constants ``eff``."""
    flops, gemm_gflop, nbytes = work
    return _gemm_time(eff, flops, gemm_gflop, gemm_peak), nbytes / hbm


def routed_experts(lay: Layout, tokens, gemm_peak, hbm) -> tuple[np.ndarray, np.ndarray]:
    """(GEMM time, weight-read time) of the routed experts of one MoE layer on one GPU for a pass
    over ``tokens`` tokens (zeros for a dense model)."""
    work = routed_expert_work(lay, tokens)
    if work is None:
        return np.zeros_like(lay.tp), np.zeros_like(lay.tp)
    return price_routed_experts(lay.eff, work, gemm_peak, hbm)


#: Bytes per element the MLP's GEMMs write: 16 bit, also under FP8 (TensorRT-LLM's MoE plugin:
#: ``HopperGroupedGemmInput::OutputTypeAdaptor_t``: FP8 -> nv_bfloat16; its dense FP8 GEMMs write
#: the model's 16-bit dtype too).
MLP_GEMM_OUTPUT_BYTES = 2.0


def routed_copies(lay: Layout, tokens) -> np.ndarray:
    """Token copies the busiest GPU's experts take in one MoE layer for a pass over ``tokens``
    tokens: top-k copies of each, EP splitting the experts (TP does not split hidden),
    ``moe.load_imbalance`` times the even share."""
    model, ep = lay.model, lay.ep
    return tokens * lay.dp * model.moe_router_topk / ep * moe.load_imbalance(lay.hw, model, ep)


def moe_plugin_bytes(lay: Layout, tokens) -> np.ndarray:
    """HBM bytes of the kernels a MoE layer runs that a dense layer does not: the permutation of
    the tokens to their experts and the weighted sum of their k outputs, on one GPU for a pass
    over ``tokens`` tokens (zeros for a dense model). Memory-bound kernels of their own, launched
    before and after the grouped GEMMs, so their time adds to the layer's.

    TensorRT-LLM's MoE plugin (NVIDIA/TensorRT-LLM 05316d33,
    ``cpp/tensorrt_llm/kernels/mixtureOfExperts/moe_kernels.cu``, ``CutlassMoeFCRunner::runMoe``,
    Hopper path): ``expandInputRowsKernel`` copies each token once per routed expert (reads T
    rows, writes T*k in the plugin's activation type: FP8 under FP8); the FC2 grouped GEMM writes
    T*k rows of hidden in 16 bit (``HopperGroupedGemmInput::OutputTypeAdaptor_t``: FP8 ->
    nv_bfloat16) and ``finalizeMoeRoutingKernel`` reads the k rows of every token and writes their
    weighted sum. The gated activation between FC1 and FC2 (``doActivation``) is not counted here:
    a dense gated MLP runs the same pass, and both are ``gated_activation_bytes``.
    vLLM's fused_moe sums the k outputs in a kernel of its own too (``moe_sum``; it gathers the
    tokens inside its GEMM)."""
    model = lay.model
    if not model.is_moe:
        return np.zeros_like(lay.tp)
    tokens = np.asarray(tokens, dtype=float)
    h, act = model.hidden_size, lay.weight_bytes  # FP8 weights run FP8 activations
    copies = routed_copies(lay, tokens)
    tokens = tokens * lay.dp  # under attention DP the kernels run on every rank's tokens (``attention_dp_dispatch``)
    expand = tokens * h * act + copies * h * act
    finalize = copies * h * MLP_GEMM_OUTPUT_BYTES + tokens * h * ACT_BYTES
    return expand + finalize


def gated_activation_bytes(lay: Layout, tokens) -> np.ndarray:
    """HBM bytes of the gated MLP's activation pass, one layer (averaged over the layers) on one
    GPU for a pass over ``tokens`` tokens: a memory-bound kernel of its own between FC1 and FC2
    that reads FC1's gate and up outputs (2 x inter, 16 bit: the GEMMs write 16 bit also under
    FP8) and writes SiLU(gate) x up as FC2's input (inter, FP8-quantized under FP8 weights).
    Zeros for a non-gated MLP (its activation is left to the fitted element-wise bytes).

    Dense and MoE layers alike, as the engines run it in the releases the data holds:
    TensorRT-LLM's dense ``FusedGatedMLP.fc_gate`` (NVIDIA/TensorRT-LLM 04a2cacb
    ``tensorrt_llm/layers/mlp.py``) runs the fused FC1 GEMM, then ``ACT2FN['swiglu']`` on its
    output as graph ops (the FP8 input quantization of ``FP8RowLinear`` after it); the
    GEMM + SwiGLU plugin (``gemm_swiglu_plugin fp8``, ``fc_gate_plugin``) is off by default and
    enabled first by NVIDIA's MLPerf v5.0 llama2-70b configs (mlcommons/inference_results_v5.0
    6069beb ``closed/NVIDIA/configs/llama2-70b/Offline/__init__.py``; absent from v4.1's, a2f5d66,
    the round of every MLPerf row here). The MoE plugin's ``doActivation`` reads FC1's 16-bit
    T*k x 2 x inter rows and writes the quantized activation (05316d33
    ``cpp/tensorrt_llm/kernels/mixtureOfExperts/moe_kernels.cu``, ``CutlassMoeFCRunner::runMoe``).
    vLLM runs ``SiluAndMul`` (``silu_and_mul``) as a kernel of its own for dense and fused_moe
    layers alike. A MoE layer's shared experts run the dense pass; its routed experts run it on
    the token copies this GPU's experts take (``moe.load_imbalance`` under EP)."""
    model, t, ep = lay.model, lay.tp, lay.ep
    if not model.gated_mlp:
        return np.zeros_like(t)
    tokens = np.asarray(tokens, dtype=float)
    per_inter = 2.0 * MLP_GEMM_OUTPUT_BYTES + lay.weight_bytes  # read gate + up, write FC2's input
    dense_share, moe_share = ffn_shares(model)
    inter = dense_share * tokens * model.ffn_hidden_size / t  # per GPU, averaged over layers
    if model.is_moe:
        routed = routed_copies(lay, tokens) * model.expert_ffn_hidden_size * ep / (t * lay.dp)
        inter = inter + moe_share * (tokens * model.shared_expert_ffn_hidden_size / t + routed)
    return inter * per_inter


def ffn_shares(model: ModelSpec) -> tuple[float, float]:
    """(dense MLPs, MoE blocks) per layer of ``pass_work``: a standard model's share of dense and
    MoE layers; a hybrid's per pair of blocks (``hybrid_shares``)."""
    if model.is_hybrid:
        shares = hybrid_shares(model)
        return shares["-"], shares["E"]
    moe_share = model.num_moe_layers / model.num_layers
    return 1.0 - moe_share, moe_share


def hybrid_shares(model: ModelSpec) -> dict[str, float]:
    """Layers of each pattern symbol per pair of a hybrid's layers. A hybrid layer is one block
    and a standard layer two (a mixer and an FFN, each with its pre-norm, residual and TP
    all-reduce), so ``pass_work`` prices a hybrid stage as stage layers / 2 standard layers, each
    holding these shares of blocks: the fitted per-layer constants (element-wise bytes, launch
    overhead, two all-reduces) then count per block as for a standard layer's two, and a pattern
    of ``*-`` or ``*E`` pairs prices as the standard model it spells."""
    return {kind: 2.0 * count / model.num_layers for kind, count in model.layer_kind_counts.items()}


def stage_pass(lay: Layout, tokens, sampled, attn_flops, attn_bytes) -> dict[str, np.ndarray]:
    """One micro-batch of ``tokens`` tokens through one pipeline stage.

    ``sampled``: sequences whose next token is sampled (the output layer runs on their last
    position only). ``attn_flops`` / ``attn_bytes``: attention-core FLOPs and HBM bytes of one
    layer on one GPU (KV reads of decoding sequences; unfused prefill scores). Returns the stage
    time and its parts (compute and memory overlap in the roofline, so they do not add up):
    ``pass_work`` priced by ``lay``'s constants (``price_pass``).
    """
    return price_pass(lay.eff, pass_work(lay, tokens, sampled, attn_flops, attn_bytes))


@dataclass(frozen=True)
class PassWork:
    """What one micro-batch's pass through one pipeline stage does, per layer and GPU, before the
    fitted constants price it: GEMM FLOPs and sizes, the bytes each kernel moves, the all-reduces'
    and the pipeline hand-off's transfer times, the peaks the GPU offers. Apart from ``price_pass``
    because a fit prices the same passes under thousands of trial constants
    (``inflight.InflightBatch``); nothing here may read ``lay.eff``."""

    layers: np.ndarray  # layers of the fullest stage
    tokens: np.ndarray
    hidden: int
    moe_share: float  # share of the layers that are MoE layers
    lin_flops: np.ndarray  # the GEMMs other than the routed experts (those of 16-bit weights apart) ...
    lin16_flops: np.ndarray  # ... those an NVFP4 checkpoint leaves 16-bit (``nvfp4_16bit_params``), at ``peak16``
    lin_gflop: np.ndarray  # ... each of this size
    fp8_gemms: np.ndarray  # FP8 / NVFP4 weights run FP8 / FP4 GEMMs (at ``peak8``)
    experts: tuple | None  # ``routed_expert_work``; None: dense
    attn_flops: np.ndarray
    attn_peak: np.ndarray
    attn_bytes: np.ndarray
    weight_bytes: np.ndarray  # weights read, the routed experts apart
    gated_bytes: np.ndarray  # the gated activation's pass (``gated_activation_bytes``)
    moe_bytes: np.ndarray | None  # moe_share x ``moe_plugin_bytes``; None: dense
    tp_multi: np.ndarray  # the TP group has more than one GPU ...
    tp_internode: np.ndarray  # ... and leaves the NVLink domain
    all_reduce: np.ndarray  # one all-reduce's transfer time (``comm.all_reduce_time``)
    dispatch_multi: np.ndarray  # attention DP over more than one rank (``attention_dp_dispatch``) ...
    dispatch_internode: np.ndarray  # ... leaving the NVLink domain
    dispatch: np.ndarray  # one MoE layer's gather and reduce-scatter transfer time (``attention_dp_dispatch``)
    out_flops: np.ndarray  # the output layer's FLOPs, bytes and logits sampled
    out_bytes: np.ndarray
    logits: np.ndarray
    mamba: tuple | None  # a hybrid's M layers' (FLOPs, bytes) per layer (``mamba_serving.pass_work``); else None
    host: np.ndarray  # the executor's per-request seconds of the pass (``attention_dp_host_time``)
    peak16: float  # the GPU's peaks before the fitted shares: 16-bit and 8-bit (4-bit under NVFP4) FLOP/s, HBM bytes/s
    peak8: np.ndarray
    hbm: float
    hop: tuple  # ``_hop_work``


def pass_work(lay: Layout, tokens, sampled, attn_flops, attn_bytes, mamba_work=None) -> PassWork:
    """``stage_pass``'s work (``PassWork``) of a pass over ``tokens`` tokens. A hybrid model's
    layers are counted and shared out by ``hybrid_layer_work``, with ``mamba_work``: one M layer's
    (FLOPs, bytes) on one GPU (``mamba_serving.pass_work``); None: every token priced as a prompt
    token and every sampled sequence as a decoding one (what the traffic simulation's per-token and
    per-sequence tables hold, each its own roofline)."""
    model, hw, t = lay.model, lay.hw, lay.tp
    h, V = model.hidden_size, model.vocab_size
    peak16 = hw.bf16_tflops * 1e12
    if model.is_hybrid:
        tokens = np.asarray(tokens, dtype=float)
        layers, moe_share, lin_params, stored_params, attention_share, mamba_pass = hybrid_layer_work(
            lay, tokens, sampled, mamba_work)
    else:
        # Per layer, averaged over the layers: the routed experts apart (a share ``moe_share`` of the
        # layers are MoE layers), everything else as one set of GEMMs.
        moe_share = model.num_moe_layers / model.num_layers
        routed = model.num_experts * model.expert_params if model.is_moe else 0
        active_routed = model.moe_router_topk * model.expert_params if model.is_moe else 0
        layers, lin_params = lay.stage_layers, model.active_layer_params - moe_share * active_routed
        stored_params, attention_share, mamba_pass = model.layer_params - moe_share * routed, None, None
    lin_flops = 2.0 * lin_params / t * tokens
    lin16_flops = 2.0 * nvfp4_16bit_params(lay) / t * tokens  # split off: their FLOPs at the 16-bit peak
    if attention_share is not None:
        attn_flops, attn_bytes = attention_share * attn_flops, attention_share * attn_bytes
    # Attention runs on the KV cache's precision: an FP8 cache is read by FP8 attention kernels
    # (TensorRT-LLM's FP8 context FMHA and XQA), at the FP8 peak.
    attn_peak = np.where(lay.kv_bytes == 1.0, (hw.fp8_tflops or hw.bf16_tflops) * 1e12, peak16)
    per_node = comm.ranks_per_domain(hw, t, 1)
    return PassWork(
        layers=layers, tokens=tokens, hidden=h, moe_share=moe_share,
        lin_flops=lin_flops - lin16_flops, lin16_flops=lin16_flops, lin_gflop=_gemm_gflop(lin_flops / GEMMS_PER_LAYER),
        fp8_gemms=lay.weight_bytes < 2.0, experts=routed_expert_work(lay, tokens), attn_flops=attn_flops,
        attn_peak=attn_peak, attn_bytes=attn_bytes,
        weight_bytes=stored_weight_bytes(lay, stored_params) / t,
        gated_bytes=gated_activation_bytes(lay, tokens),
        moe_bytes=moe_share * moe_plugin_bytes(lay, tokens) if model.is_moe else None,
        tp_multi=t > 1, tp_internode=t > hw.nvlink_domain,
        all_reduce=comm.all_reduce_time(hw, ACT_BYTES * tokens * h, t, per_node),
        dispatch_multi=lay.dp > 1, dispatch_internode=lay.dp > hw.nvlink_domain,
        dispatch=attention_dp_dispatch(lay, tokens),
        out_flops=2.0 * sampled * h * V / t, out_bytes=h * V / t * ACT_BYTES, logits=sampled * V, mamba=mamba_pass,
        host=attention_dp_host_time(lay, sampled),
        peak16=peak16, peak8=quantized_gemm_peak(hw, lay.weight_bytes), hbm=hw.hbm_tbps * 1e12,
        hop=_hop_work(lay, tokens))


@lru_cache(maxsize=1)
def _attention_dp_host_us() -> float:
    return float(io.read_yaml(io.SEARCH_SPACES / "inference_assumptions.yaml")["attention_dp_host"]["us_per_sequence"])


def attention_dp_host_time(lay: Layout, sequences) -> np.ndarray:
    """Seconds one attention-DP rank's iteration spends on its ``sequences`` requests outside the GPU's
    pass (zeros without attention DP): TensorRT-LLM's PyTorch executor loops over every request of the rank
    in Python each iteration (state updates, the sampler's token bookkeeping, responses, KV blocks) while
    host collectives keep the ranks in lock-step. The rate per sequence is ``inference_assumptions.yaml``'s
    ``attention_dp_host`` (derived from NVIDIA's two B200 trtllm-bench runs of one workload at 384 and 896
    a rank: what their iteration grows per sequence beyond the cost model's pass)."""
    return np.where(np.asarray(lay.dp) > 1, np.asarray(sequences, dtype=float) * _attention_dp_host_us() * 1e-6, 0.0)


@lru_cache(maxsize=1)
def _nvfp4_unquantized() -> dict:
    return io.read_yaml(io.SEARCH_SPACES / "inference_assumptions.yaml").get("nvfp4_unquantized") or {}


def nvfp4_16bit_params(lay: Layout) -> np.ndarray:
    """Parameters of one layer (averaged over the layers) that the model's NVFP4 checkpoint keeps
    in 16 bit, where ``lay`` runs NVFP4 weights (else 0): ``inference_assumptions.yaml``'s
    ``nvfp4_unquantized`` groups (``NVFP4_UNQUANTIZED_GROUPS``) for the model. Why: NVIDIA's
    DeepSeek-R1 NVFP4 checkpoint quantizes only the MLPs and experts; its attention projections and
    router stay BF16 and run BF16 GEMMs."""
    groups = _nvfp4_unquantized().get(lay.model.name, {}).get("groups", ())
    params = float(sum(NVFP4_UNQUANTIZED_GROUPS[g](lay.model) for g in groups))
    return np.where(np.asarray(lay.weight_bytes) < 1.0, params, 0.0)


def stored_weight_bytes(lay: Layout, params) -> np.ndarray:
    """Bytes of ``params`` of one layer at the layout's weight precision, with the share its NVFP4
    checkpoint keeps 16-bit (``nvfp4_16bit_params``) at 2 bytes."""
    return params * lay.weight_bytes + nvfp4_16bit_params(lay) * (ACT_BYTES - lay.weight_bytes)


def quantized_gemm_peak(hw: HardwareSpec, weight_bytes) -> np.ndarray:
    """FLOP/s of the GEMMs of quantized weights before the fitted FP8 share: the FP8 peak, and under
    NVFP4 (under one byte) the FP4 one as training prices it (``gemm.fp4_tflops``: the datasheet
    figure capped at the measured NVFP4 / FP8 kernel ratio). TensorRT-LLM's NVFP4 Linear quantizes
    its input to NVFP4 too (W4A4), so the GEMM is an FP4 one."""
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12
    return np.where(np.asarray(weight_bytes) < 1.0, gemm.fp4_tflops(hw) * 1e12, fp8)


def hybrid_layer_work(lay: Layout, tokens, sampled, mamba_work=None) -> tuple:
    """A hybrid model's stage in ``pass_work``'s terms: (layers, MoE share, GEMM parameters, stored
    parameters per layer, the attention core's share, the Mamba kernels' (FLOPs, bytes) or None).
    Its stage is stage layers / 2 standard layers, each with ``hybrid_shares`` of M, *, - and E
    blocks: the GEMMs of every block (attention's QKV and projection, the MLP's, the MoE block's
    shared experts, router and latent projections, the Mamba in / out projections) one set of two
    per block; the routed experts, the attention core (of the * layers' share) and the Mamba
    kernels (``mamba_serving.pass_work``, of the M layers' share) their own terms."""
    model = lay.model
    shares = hybrid_shares(model)
    lin = {"M": mamba.linear_params(model), "*": model.attention_params, "-": model.mlp_params(model.ffn_hidden_size),
           "E": model.moe_block_params(0)}
    stored = {**lin, "M": model.mamba_params}
    if mamba_work is None:
        mamba_work = mamba_serving.pass_work(lay, tokens, 0.0, sampled)
    mamba_pass = (shares["M"] * mamba_work[0], shares["M"] * mamba_work[1]) if shares["M"] else None
    return (lay.stage_layers / 2.0, shares["E"], sum(shares[k] * lin[k] for k in lin),
            sum(shares[k] * stored[k] for k in stored), shares["*"], mamba_pass)


def price_pass(eff: InferenceEfficiency, w: PassWork) -> dict[str, np.ndarray]:
    """``stage_pass``'s time and parts of the work ``w`` under the constants ``eff``."""
    gemm_peak = np.where(w.fp8_gemms, w.peak8 * eff.fp8_gemm_relative, w.peak16)
    hbm = w.hbm * eff.hbm
    k = eff.roofline_sharpness
    t_lin = _gemm_time(eff, w.lin_flops, w.lin_gflop, gemm_peak) + _gemm_time(eff, w.lin16_flops, w.lin_gflop, w.peak16)
    t_attn = w.attn_flops / (w.attn_peak * eff.attention)
    weight_read = w.weight_bytes / hbm
    attn_read = w.attn_bytes / hbm
    elementwise_bytes = eff.elementwise_bytes_per_token_hidden * w.tokens * w.hidden + w.gated_bytes
    if w.moe_bytes is not None:
        elementwise_bytes = elementwise_bytes + w.moe_bytes
    elementwise = elementwise_bytes / hbm
    ar_floor = np.where(w.tp_multi, np.where(w.tp_internode, eff.internode_allreduce_latency_us,
                                             eff.allreduce_latency_us), 0.0) * 1e-6
    ar = 2.0 * (w.all_reduce + ar_floor)
    ar = ar + w.moe_share * moe_dispatch_time(eff, w)
    overhead = eff.layer_overhead_us * 1e-6
    # Each kernel is bound by its own FLOPs or bytes; the kernels run one after another (a dense
    # model's routed-expert terms are zeros, left out).
    if w.experts is None:
        mem = weight_read + attn_read + elementwise
        compute = t_lin + t_attn
        layer = _soft_max(t_lin, weight_read, k) + _soft_max(t_attn, attn_read, k) + elementwise + ar + overhead
    else:
        t_experts, expert_read = price_routed_experts(eff, w.experts, gemm_peak, hbm)
        mem = weight_read + w.moe_share * expert_read + attn_read + elementwise
        compute = t_lin + w.moe_share * t_experts + t_attn
        layer = (_soft_max(t_lin, weight_read, k) + w.moe_share * _soft_max(t_experts, expert_read, k)
                 + _soft_max(t_attn, attn_read, k) + elementwise + ar + overhead)
    if w.mamba is not None:  # a hybrid's Mamba kernels: the SSD scan at the attention core's share of the peak
        t_mamba, mamba_read = w.mamba[0] / (w.peak16 * eff.attention), w.mamba[1] / hbm
        mem, compute = mem + mamba_read, compute + t_mamba
        layer = layer + _soft_max(t_mamba, mamba_read, k)
    # Output layer on the last stage: logits of the sampled positions.
    out_compute = w.out_flops / (w.peak16 * eff.gemm_max)
    out_mem = w.out_bytes / hbm
    t_out = _soft_max(out_compute, out_mem, k) + w.logits * eff.sampling_ns_per_logit * 1e-9 + w.host
    layers = w.layers
    return {"time": layers * layer + t_out, "compute": layers * compute + out_compute,
            "memory": layers * mem + out_mem, "tp_comm": layers * ar, "overhead": layers * overhead}


def routed_moe_time(lay: Layout, tokens) -> np.ndarray:
    """Seconds of a pass over ``tokens`` tokens a rank that its MoE layers' routed part takes (the
    routed experts' GEMMs and weight reads, their plugin kernels' bytes, the attention-DP token
    exchange): ``stage_pass``'s time less the same pass priced without them (the other terms add
    to it unchanged). Under attention DP this part runs on every rank's tokens at once and keeps the
    ranks in lock-step at every MoE layer (``serve.attention_dp``); zeros for a dense model."""
    zero = np.zeros_like(np.asarray(tokens, dtype=float))
    w = pass_work(lay, tokens, zero, zero, zero)
    if w.experts is None:
        return zero
    rest = dataclasses.replace(w, experts=None, moe_bytes=None, moe_share=0.0)
    return price_pass(lay.eff, w)["time"] - price_pass(lay.eff, rest)["time"]


def moe_dispatch_time(eff: InferenceEfficiency, w: PassWork) -> np.ndarray:
    """One MoE layer's token exchange under attention DP (``attention_dp_dispatch``): its transfer
    time and the fitted per-call latency of an all-reduce (``allreduce_latency_us``, or the
    inter-node one) for each of its two collectives, the gather and the reduce-scatter; zeros
    without attention DP."""
    floor = np.where(w.dispatch_internode, eff.internode_allreduce_latency_us, eff.allreduce_latency_us) * 1e-6
    return np.where(w.dispatch_multi, w.dispatch + 2.0 * floor, 0.0)


def _hop_work(lay: Layout, tokens) -> tuple:
    """(pipelined, crosses nodes, transfer time) of ``pipeline_hop``, before the constants."""
    cross = lay.tp * lay.pp > lay.hw.nvlink_domain
    nbytes = ACT_BYTES * tokens * lay.model.hidden_size
    return lay.pp > 1, cross, comm.p2p_time(lay.hw, nbytes, ~cross)


def price_hop(eff: InferenceEfficiency, hop: tuple) -> np.ndarray:
    """``pipeline_hop`` of the work ``hop`` (``_hop_work``) under the constants ``eff``."""
    pipelined, cross, transfer = hop
    floor = np.where(cross, eff.internode_p2p_latency_us, eff.p2p_latency_us) * 1e-6
    return np.where(pipelined, transfer + floor, 0.0)


def pipeline_hop(lay: Layout, tokens) -> np.ndarray:
    """Hand-off of ``tokens`` activations to the next pipeline stage (0 without PP)."""
    return price_hop(lay.eff, _hop_work(lay, tokens))


def prefill_attention(lay: Layout, sequences, prompt, flash: bool = True):
    """Causal attention over whole prompts: (FLOPs, HBM bytes) of one layer on one GPU."""
    m = lay.model
    flops = 0.5 * 2.0 * sequences * prompt * prompt * m.num_attention_heads * (m.qk_dim + m.v_dim) / lay.tp
    scores = 0.0 if flash else SCORE_TRIPS * ACT_BYTES * sequences * prompt * prompt * m.num_attention_heads / lay.tp
    return flops, scores


def decode_attention(lay: Layout, sequences, context):
    """One new token per sequence attending to ``context`` cached tokens: (FLOPs, KV bytes)."""
    m = lay.model
    # Per head and cached token: q·k and p·v (MLA, absorbed: both over the latent, q·k also over the rotary key).
    per_head = (2.0 * (2 * m.kv_lora_rank + m.qk_pos_emb_head_dim) if m.multi_latent_attention
                else 2.0 * (m.qk_dim + m.v_dim))
    flops = sequences * context * m.num_attention_heads * per_head / lay.tp
    return flops, sequences * context * kv_bytes_per_token(m, 1, lay.tp, lay.kv_bytes) * lay.decode_kv_reads


def estimate_static_columns(model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency,
                            cols: Mapping[str, np.ndarray], memory_fraction: float = 0.9,
                            prefill_chunk_tokens: float | np.ndarray = np.inf,
                            decode_steps=None, microbatching: str = "even",
                            flash_attention: bool = True) -> dict[str, np.ndarray]:
    """Predict static-batching layouts (``STATIC_COLUMNS`` -> arrays, and optionally ``ep``, the
    expert parallel size of a MoE model). Returns ``OUTPUT_KEYS``.

    ``decode_steps``: decode passes that follow the prefill (default ``output_len - 1``: the
    prefill yields the first token). ``flash_attention=False`` prices an unfused prefill
    attention (FasterTransformer's): the scores make four FP16 trips through HBM.
    ``prefill_chunk_tokens`` bounds the prefill tokens whose activations are live at once
    (memory only; compute is the same). ``microbatching``: see ``microbatch_size``.
    """
    return StaticBatch(model, hw, cols, memory_fraction, prefill_chunk_tokens, decode_steps, microbatching,
                       flash_attention).estimate(eff)


class StaticBatch:
    """Static-batching layouts up to the fitted constants (``estimate`` prices them).

    Why apart: the micro-batches, the work of the prefill and decode passes (``PassWork``) and the
    memory depend on the model, the GPU and the columns alone; a fit prices the same rows under
    thousands of trial constants, so it builds this once per group of rows (as
    ``inflight.InflightBatch``). Its layout holds no constants (``lay.eff`` is None).
    """

    def __init__(self, model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
                 memory_fraction: float = 0.9, prefill_chunk_tokens: float | np.ndarray = np.inf,
                 decode_steps=None, microbatching: str = "even", flash_attention: bool = True):
        f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
        b, s_in, s_out = f64("batch"), f64("input_len"), f64("output_len")
        self.batch, self.s_out = b, s_out
        lay = layout(model, hw, None, cols["tp"], cols["pp"], cols["weight_precision"], cols["kv_precision"],
                     cols["ep"] if "ep" in cols else 1)
        p = self.pp = lay.pp
        self.steps = np.maximum(s_out - 1.0, 0.0) if decode_steps is None else np.asarray(decode_steps, float)

        # Prefill: the whole batch's prompts, micro-batched over the pipeline.
        mb_prefill = microbatch_size(b, s_in, p, microbatching)
        self.prefill_mbs = b / mb_prefill
        flops, scores = prefill_attention(lay, mb_prefill, s_in, flash_attention)
        hybrid = model.is_hybrid
        mamba_prefill = mamba_serving.pass_work(lay, mb_prefill * s_in, mb_prefill, 0.0) if hybrid else None
        self.prefill = pass_work(lay, mb_prefill * s_in, mb_prefill, flops, scores, mamba_prefill)

        # Decode: one token per sequence at the mean context length.
        ctx = s_in + 0.5 * (s_out + 1.0)
        mb = microbatch_size(b, 1, p, microbatching)
        m = b / mb
        flops, kv_read = decode_attention(lay, mb, ctx)
        self.decode = pass_work(lay, mb, mb, flops, kv_read, mamba_serving.pass_work(lay, 0.0, 0.0, mb) if hybrid else None)
        # FT flushes the pipeline every step: (m + pp - 1) stage times. Engines that keep pp
        # micro-batches in flight across steps (vLLM virtual engines, TensorRT-LLM) reach a steady
        # state where each micro-batch's token takes pp stage times and all stages stay busy.
        self.slots = m + p - 1.0 if microbatching == "fastertransformer" else np.maximum(m, p)

        self.weights = lay.weights()
        self.kv = b * (s_in + s_out) * lay.kv_bytes_per_token()
        if hybrid:  # each sequence's Mamba states
            self.kv = self.kv + b * mamba_serving.sequence_state_bytes(lay)
        chunk = np.minimum(mb_prefill * s_in, prefill_chunk_tokens)
        self.activations = chunk * lay.activations_per_token() + lay.logits(b)
        self.reserve_gib = hw.reserve_gib
        self.memory_limit = memory_fraction * hw.memory_gib * GIB

    def estimate(self, eff: InferenceEfficiency) -> dict[str, np.ndarray]:
        """``estimate_static_columns``' outputs under the constants ``eff``."""
        p, slots = self.pp, self.slots
        pass_us = eff.pass_overhead_us * 1e-6
        pre = price_pass(eff, self.prefill)
        ttft = (self.prefill_mbs + p - 1.0) * (pre["time"] + price_hop(eff, self.prefill.hop)) + pass_us
        dec = price_pass(eff, self.decode)
        hop = price_hop(eff, self.decode.hop)
        tpot = slots * (dec["time"] + hop) + pass_us
        latency = ttft + self.steps * tpot
        throughput = self.batch * self.s_out / latency  # generated tokens per second of one replica

        weights, kv, activations = self.weights, self.kv, self.activations
        reserve = self.reserve_gib * GIB
        total = weights + kv + activations + reserve
        return {
            "ttft_s": ttft,
            "tpot_s": tpot,
            "latency_s": latency,
            "output_tokens_per_s_per_replica": throughput,
            "fits": total <= self.memory_limit,
            "memory_per_gpu_gib": total / GIB,
            "weights_gib": weights / GIB,
            "kv_cache_gib": kv / GIB,
            "activations_gib": activations / GIB,
            "reserve_gib": np.full_like(total, self.reserve_gib),
            "decode_compute_s": slots * dec["compute"],
            "decode_memory_s": slots * dec["memory"],
            "decode_tp_comm_s": slots * dec["tp_comm"],
            "decode_overhead_s": slots * dec["overhead"] + pass_us,
            "decode_pp_s": slots * hop,
        }
