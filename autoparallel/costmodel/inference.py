"""Latency, throughput and memory of serving layouts, as columns (pure numpy).

One replica of ``tp * pp`` GPUs serves ``batch`` requests at once, each with ``input_len``
prompt tokens and ``output_len`` generated tokens (static batching, as FasterTransformer and
the TensorRT-LLM / vLLM benchmark harnesses measure it). Per forward pass and per layer, on one
GPU:

- **compute**: Linear GEMMs, 2 FLOPs per active parameter per token (over ``tp``), at a
  size-dependent fraction of the BF16 / FP8 peak (small GEMMs starve the GPU, as in training);
  plus the attention core (prefill: 4·s²·heads·head_dim per sequence; decode: 4·ctx·heads·
  head_dim per token);
- **memory**: every weight of the layer shard is read once per pass, and in decode every cached
  K/V of every sequence (KV cache = 2·layers·kv_heads·head_dim·bytes per token, KV heads sharded
  by ``tp`` and replicated where ``tp`` exceeds them) at an achieved fraction of HBM bandwidth;
- the two are combined by a smooth roofline ``(c^k + m^k)^(1/k)`` (``k`` fitted; ``k -> inf``
  is the hard max): decode is bandwidth-bound at small batch, compute-bound at large batch,
  prefill is compute-bound;
- **TP**: two all-reduces of the layer output per layer, priced by ``comm.all_reduce_time`` plus
  a fitted per-call latency floor (small inference messages never reach bus bandwidth), higher
  when the group leaves the NVLink domain;
- memory-bound element-wise traffic per token (norms, bias, activation, residual), a fixed
  per-layer cost (kernel launches), the sampler's cost per logit (top-p sorts the vocabulary)
  and a per-pass host cost.

**Pipeline**: the batch is split into ``m = min(pp, batch)`` micro-batches (vLLM's virtual
engines; FasterTransformer's own rule for validation). The prefill of the batch costs
``(m + pp - 1)`` stage times of one micro-batch plus the hand-offs; a decode step costs ``pp``
stage times in the steady state where the micro-batches follow each other through the stages
(``m + pp - 1`` for FT, which flushes the pipeline every step). So PP adds per-token latency
(hand-offs, smaller micro-batches) and earns throughput only by keeping stages busy.

Latency metrics: ``ttft`` = prefill of the whole batch (the first token comes out of it);
``tpot`` = one decode pass at the mean context length; ``e2e`` = ttft + (output_len - 1)·tpot.
FasterTransformer's published latency is context + ``output_len`` decoder steps; the
validation passes ``decode_steps`` for that.

Memory per GPU (the fullest pipeline stage): weights (embedding and output layer in 16 bit),
KV cache for ``batch * (input_len + output_len)`` tokens, prefill activations of one chunk of
at most ``prefill_chunk_tokens`` tokens (what the engine's scheduler bounds), the logits of one
pass, and the hardware's fixed reserve.

Constants: ``InferenceEfficiency``; fitted to FasterTransformer's A100 tables by
``python -m autoparallel.serve.validate --fit`` and stored in
``search_spaces/inference_assumptions.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autoparallel.costmodel import comm
from autoparallel.costmodel.memory import GIB
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

#: Bytes per element of weights / KV cache by precision name.
PRECISION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
PRECISIONS = tuple(PRECISION_BYTES)
ACT_BYTES = 2.0  # activations stay 16 bit
LOGIT_BYTES = 4.0  # FP32 logits of the sampled position
SCORE_TRIPS = 4.0  # unfused attention: write QK^T, read it for softmax, write P, read P for P·V
LATENCY_METRICS = ("ttft", "tpot", "e2e")

COLUMNS = ("tp", "pp", "batch", "input_len", "output_len", "weight_precision", "kv_precision")
OUTPUT_KEYS = ("ttft_s", "tpot_s", "latency_s", "output_tokens_per_s_per_replica", "fits",
               "memory_per_gpu_gib", "weights_gib", "kv_cache_gib", "activations_gib", "reserve_gib",
               "decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_overhead_s",
               "decode_pp_s")


@dataclass(frozen=True)
class InferenceEfficiency:
    """Fitted fractions of peak and fixed costs of one serving engine on one GPU type.

    The defaults are the fit to FasterTransformer on A100 (rounded; the assumptions YAML holds
    the exact fit, the command and the data); other GPUs reuse them unless their own block in
    that YAML overrides them. Fitted to FT, they describe FT: e.g. ``layer_overhead_us`` holds
    FT's kernel launches without CUDA graphs. ``attention`` is not fitted (the published prompts
    are too short to show it): 0.4 of the BF16 peak, below FlashAttention-2's 50-70 % forward.
    """

    hbm: float = 0.91  # achieved share of HBM bandwidth streaming weights and KV cache
    gemm_max: float = 0.64  # GEMM efficiency = gemm_max / (1 + gemm_half_gflop / GEMM GFLOP)
    gemm_half_gflop: float = 0.01
    fp8_gemm_relative: float = 0.8  # FP8 GEMMs reach this share of the (doubled) FP8 peak
    attention: float = 0.4  # prefill attention core as a share of the BF16 peak
    roofline_sharpness: float = 20.0  # k in (compute^k + memory^k)^(1/k)
    layer_overhead_us: float = 107.0  # per layer and forward pass
    pass_overhead_us: float = 0.0  # per forward pass (sampling, host work)
    allreduce_latency_us: float = 21.2  # per all-reduce inside an NVLink domain, on top of comm
    internode_allreduce_latency_us: float = 65.8  # per all-reduce that leaves the domain
    p2p_latency_us: float = 30.0  # per pipeline hand-off inside an NVLink domain (not fitted: no data)
    internode_p2p_latency_us: float = 2106.0  # per hand-off between nodes (FT's PP3 rows)
    # Per-layer memory-bound traffic (norms, bias, activation, residual; replicated over TP) in
    # bytes per token and hidden unit; and the sampler's cost per logit (top-p sorts the vocab).
    elementwise_bytes_per_token_hidden: float = 12.6
    sampling_ns_per_logit: float = 1.09

    def __post_init__(self) -> None:
        for key in ("hbm", "gemm_max", "fp8_gemm_relative", "attention"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        if self.roofline_sharpness < 1:
            raise ValueError(f"roofline_sharpness must be >= 1, got {self.roofline_sharpness}")


def _bytes(names) -> np.ndarray:
    names = np.asarray(names)
    out = np.full(names.shape, np.nan)
    for name, nbytes in PRECISION_BYTES.items():
        out = np.where(names == name, nbytes, out)
    if np.isnan(out).any():
        bad = sorted(set(names[np.isnan(out)].tolist()))
        raise ValueError(f"unknown precision(s) {bad}; valid: {', '.join(PRECISIONS)}")
    return out


def kv_bytes_per_token(model: ModelSpec, layers, tp, kv_bytes):
    """K and V of one token on one GPU: 2 · layers · local KV heads · head_dim · bytes."""
    local_heads = np.maximum(model.query_groups / np.asarray(tp, dtype=float), 1.0)
    return 2.0 * layers * local_heads * model.head_dim * kv_bytes


def _soft_max(a, b, k):
    """Smooth roofline: (a^k + b^k)^(1/k), computed stably."""
    hi = np.maximum(a, b)
    safe = np.where(hi > 0, hi, 1.0)
    return np.where(hi > 0, safe * ((a / safe) ** k + (b / safe) ** k) ** (1.0 / k), 0.0)


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


def estimate_inference_columns(model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency,
                               cols: Mapping[str, np.ndarray], memory_fraction: float = 0.9,
                               prefill_chunk_tokens: float | np.ndarray = np.inf,
                               decode_steps=None, microbatching: str = "even",
                               flash_attention: bool = True) -> dict[str, np.ndarray]:
    """Predict every serving layout in ``cols`` (``COLUMNS`` -> arrays). Returns metric columns.

    ``decode_steps``: decode passes that follow the prefill (default ``output_len - 1``: the
    prefill yields the first token). ``flash_attention=False`` prices an unfused prefill
    attention (FasterTransformer's): the scores make four FP16 trips through HBM.
    ``prefill_chunk_tokens`` bounds the prefill tokens whose activations are live at once
    (memory only; compute is the same). ``microbatching``: see ``microbatch_size``.
    """
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    t, p, b = f64("tp"), f64("pp"), f64("batch")
    s_in, s_out = f64("input_len"), f64("output_len")
    wb = _bytes(cols["weight_precision"])
    kvb = _bytes(cols["kv_precision"])
    steps = np.maximum(s_out - 1.0, 0.0) if decode_steps is None else np.asarray(decode_steps, float)

    L, h, V = model.num_layers, model.hidden_size, model.vocab_size
    heads, hd = model.num_attention_heads, model.head_dim
    stage_layers = np.ceil(L / p)

    peak16 = hw.bf16_tflops * 1e12
    peak8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * eff.fp8_gemm_relative
    gemm_peak = np.where(wb == 1.0, peak8, peak16)  # FP8 weights run FP8 GEMMs
    hbm = hw.hbm_tbps * 1e12 * eff.hbm
    k = eff.roofline_sharpness

    layer_params = model.active_layer_params / t  # per GPU
    layer_weight_bytes = model.layer_params / t * wb
    gemms = 4.0  # QKV, projection, FC1 (fused gate/up), FC2
    per_node = comm.ranks_per_domain(hw, t, 1)
    crosses = t > hw.nvlink_domain
    ar_floor = np.where(t > 1, np.where(crosses, eff.internode_allreduce_latency_us,
                                        eff.allreduce_latency_us), 0.0) * 1e-6
    pp_cross = t * p > hw.nvlink_domain

    def stage_pass(tokens, seqs, ctx, prefill):
        """One micro-batch through one pipeline stage: (time, compute, memory, tp, overhead)."""
        lin_flops = 2.0 * layer_params * tokens
        gemm_eff = eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(lin_flops / gemms / 1e9, 1e-12))
        t_lin = lin_flops / (gemm_peak * gemm_eff)
        if prefill:  # causal attention over the prompt
            attn_flops = 0.5 * 4.0 * seqs * ctx * ctx * heads * hd / t
            kv_read = 0.0 if flash_attention else SCORE_TRIPS * ACT_BYTES * seqs * ctx * ctx * heads / t
        else:
            attn_flops = 4.0 * seqs * ctx * heads * hd / t
            kv_read = seqs * ctx * kv_bytes_per_token(model, 1, t, kvb)
        t_attn = attn_flops / (peak16 * eff.attention)
        elementwise = eff.elementwise_bytes_per_token_hidden * tokens * h
        mem = (layer_weight_bytes + kv_read + elementwise) / hbm
        compute = t_lin + t_attn
        layer = _soft_max(compute, mem, k)
        ar = 2.0 * (comm.all_reduce_time(hw, ACT_BYTES * tokens * h, t, per_node) + ar_floor)
        layer_total = layer + ar + eff.layer_overhead_us * 1e-6
        # Output layer on the last stage: logits of the last position of each sequence.
        out_flops = 2.0 * seqs * h * V / t
        out_mem = (h * V / t * ACT_BYTES) / hbm
        out_compute = out_flops / (peak16 * eff.gemm_max)
        t_out = _soft_max(out_compute, out_mem, k) + seqs * V * eff.sampling_ns_per_logit * 1e-9
        stage = stage_layers * layer_total + t_out
        return (stage, stage_layers * compute + out_compute, stage_layers * mem + out_mem,
                stage_layers * ar, stage_layers * eff.layer_overhead_us * 1e-6)

    hop_bytes = lambda tokens: ACT_BYTES * tokens * h  # noqa: E731
    hop_floor = np.where(pp_cross, eff.internode_p2p_latency_us, eff.p2p_latency_us) * 1e-6
    hop = lambda tokens: np.where(p > 1, comm.p2p_time(hw, hop_bytes(tokens), ~pp_cross)  # noqa: E731
                                  + hop_floor, 0.0)

    # Prefill: the whole batch's prompts, micro-batched over the pipeline.
    mb = microbatch_size(b, s_in, p, microbatching)
    m = b / mb
    pre_stage, *_ = stage_pass(mb * s_in, mb, s_in, prefill=True)
    ttft = (m + p - 1.0) * (pre_stage + hop(mb * s_in)) + eff.pass_overhead_us * 1e-6

    # Decode: one token per sequence at the mean context length.
    ctx = s_in + 0.5 * (s_out + 1.0)
    mb_prefill = mb
    mb = microbatch_size(b, 1, p, microbatching)
    m = b / mb
    dec_stage, dec_compute, dec_mem, dec_ar, dec_over = stage_pass(mb, mb, ctx, prefill=False)
    # FT flushes the pipeline every step: (m + pp - 1) stage times. Engines that keep pp
    # micro-batches in flight across steps (vLLM virtual engines, TensorRT-LLM) reach a steady
    # state where each micro-batch's token takes pp stage times and all stages stay busy.
    slots = m + p - 1.0 if microbatching == "fastertransformer" else np.maximum(m, p)
    dec_hop = hop(mb)
    tpot = slots * (dec_stage + dec_hop) + eff.pass_overhead_us * 1e-6
    latency = ttft + steps * tpot
    throughput = b * s_out / latency  # generated tokens per second of one replica

    # --- memory (fullest stage) -----------------------------------------------------------
    emb = model.embedding_params / t * ACT_BYTES
    out_w = 0.0 if model.tie_embeddings else emb
    ends = np.where(p > 1, np.maximum(emb, out_w), emb + out_w)
    weights = stage_layers * layer_weight_bytes + ends
    per_seq_kv = (s_in + s_out) * kv_bytes_per_token(model, stage_layers, t, kvb)
    kv = b * per_seq_kv
    ffn = model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    ffn_mult = (2.0 if model.gated_mlp else 1.0) * (model.moe_router_topk if model.is_moe else 1)
    act_per_token = ACT_BYTES * (4.0 * h + (heads + 2 * model.query_groups) * hd / t + ffn_mult * ffn / t)
    chunk = np.minimum(mb_prefill * s_in, prefill_chunk_tokens)
    logits = b * V / t * LOGIT_BYTES
    activations = chunk * act_per_token + logits
    reserve = hw.reserve_gib * GIB
    total = weights + kv + activations + reserve
    limit = memory_fraction * hw.memory_gib * GIB
    fits = total <= limit
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "latency_s": latency,
        "output_tokens_per_s_per_replica": throughput,
        "fits": fits,
        "memory_per_gpu_gib": total / GIB,
        "weights_gib": weights / GIB,
        "kv_cache_gib": kv / GIB,
        "activations_gib": activations / GIB,
        "reserve_gib": np.full_like(total, hw.reserve_gib),
        # One decode pass, split (seconds; compute and memory overlap in the roofline).
        "decode_compute_s": slots * dec_compute,
        "decode_memory_s": slots * dec_mem,
        "decode_tp_comm_s": slots * dec_ar,
        "decode_overhead_s": slots * dec_over + eff.pass_overhead_us * 1e-6,
        "decode_pp_s": slots * dec_hop,
    }
