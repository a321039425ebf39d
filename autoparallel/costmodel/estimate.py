"""Step time and peak memory of every candidate plan, as columns.

The time of one step is built bottom-up (DESIGN.md §5): one layer's forward and backward for one
micro-batch on one GPU (GEMMs at a size-dependent efficiency, attention core, memory-bound
kernels, FP8 casts, exposed TP and CP communication, recompute), times the layers of a pipeline
stage, plus the output layer on the last stage; then the pipeline schedule (m micro-batches plus
the bubble), then the exposed data-parallel traffic and the optimizer step. Memory takes the
worse of the first stage (most activations in flight) and the last (logits).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autoparallel.costmodel import comm, flops, memory, pipeline
from autoparallel.costmodel.memory import GIB
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

GEMMS_PER_LAYER = 4  # QKV, projection, FC1 (gate and up fused), FC2
OPTIMIZER_BYTES_PER_PARAM = 32.0  # Adam reads/writes master, m, v, grad, BF16 copy
# HBM bytes per element of an FP8 cast (read BF16, write FP8 in both layouts), by recipe.
FP8_CAST_BYTES = {"fp8-delayed": 4.0, "fp8-current": 6.0, "fp8-blockwise": 4.5, "mxfp8": 4.0}
LOSS_PASSES = 4  # softmax cross-entropy reads/writes the FP32 logits about four times

BREAKDOWN_KEYS = ("compute_s", "recompute_s", "fp8_cast_s", "tp_comm_s", "cp_comm_s",
                  "pp_comm_s", "bubble_s", "dp_comm_s", "optimizer_s")
MEMORY_KEYS = ("weights_gib", "grads_gib", "optimizer_gib", "fp8_weights_gib",
               "activations_gib", "logits_gib", "reserve_gib")


def gemm_efficiency(hw: HardwareSpec, gemm_flops):
    """Fraction of peak one GEMM of ``gemm_flops`` reaches: small GEMMs starve the GPU."""
    eff = hw.efficiency
    return eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(gemm_flops / 1e9, 1e-9))


def _gemm_peak(hw: HardwareSpec, precision, bf16_layer_fraction):
    """Effective peak FLOP/s of the Linear GEMMs: FP8 layers at the FP8 peak, the rest BF16."""
    bf16 = hw.bf16_tflops * 1e12
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative
    is_fp8 = np.isin(precision, list(FP8_CAST_BYTES))
    fp8_fraction = np.where(is_fp8, 1.0 - bf16_layer_fraction, 0.0)
    # Harmonic mix: time adds, not speed.
    return 1.0 / (fp8_fraction / fp8 + (1.0 - fp8_fraction) / bf16)


def _cast_bytes_per_element(precision):
    out = np.zeros(np.shape(precision))
    for name, nbytes in FP8_CAST_BYTES.items():
        out = np.where(precision == name, nbytes, out)
    return out


def estimate_columns(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
                     memory_fraction: float = 0.95) -> dict[str, np.ndarray]:
    """Predict every plan in ``cols`` (Plan field name -> array). Returns metric columns.

    ``memory_fraction``: a plan fits when its peak is at most this share of GPU memory.
    """
    eff = hw.efficiency
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    t, p, v, c, dp, e = (f64(k) for k in ("tp", "pp", "vp", "cp", "dp", "ep"))
    b, gbs = f64("mbs"), f64("gbs")
    sp = np.asarray(cols["sp"], dtype=bool)
    flash = np.asarray(cols["flash_attention"], dtype=bool)
    recompute = np.asarray(cols["recompute"])
    precision = np.asarray(cols["precision"])
    tp_overlap = np.asarray(cols["tp_comm_overlap"], dtype=bool)
    full = recompute == "full"
    selective = recompute == "selective"
    is_fp8 = np.isin(precision, list(FP8_CAST_BYTES))

    L, h, s, V = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    s_local = s / c
    tokens = b * s_local  # tokens one GPU processes per micro-batch
    m = gbs / (b * dp)
    layers_per_stage = L / p
    layers_per_chunk = layers_per_stage / v
    n_recomputed = np.where(f64("recompute_num_layers") > 0,
                            np.minimum(f64("recompute_num_layers"), layers_per_chunk), layers_per_chunk)
    recomputed_fraction = np.where(full, n_recomputed / layers_per_chunk, 0.0)
    bf16_layer_fraction = np.minimum(2.0 * f64("fp8_bf16_edge_layers") / L, 1.0)

    # --- one layer, one micro-batch, one GPU -------------------------------------------------
    lin_flops = flops.linear_flops_per_token(model) * tokens / t
    gemm_peak = _gemm_peak(hw, precision, bf16_layer_fraction)
    t_linear = lin_flops / (gemm_peak * gemm_efficiency(hw, lin_flops / GEMMS_PER_LAYER))
    attn_flops = flops.attention_core_flops(model, b, s, causal=flash) / (t * c)
    t_attention = attn_flops / (hw.bf16_tflops * 1e12 * eff.attention)
    hbm = hw.hbm_tbps * 1e12 * eff.hbm
    no_score_bytes = memory.layer_activation_bytes(model, b, s_local, t, sp, keep_scores=False)
    t_elementwise = eff.elementwise_bytes_per_token_hidden / 34.0 * no_score_bytes / hbm
    score_bytes = 2 * memory.bytes_per_attention_score(model) * model.num_attention_heads * s_local * s * b / t
    t_softmax = np.where(flash, 0.0, score_bytes / hbm)
    forward = t_linear + t_attention + t_elementwise + t_softmax + eff.layer_overhead_s
    layer_compute = 3.0 * forward

    gemm_io = (2 * h + model.num_attention_heads * model.head_dim
               + (model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size))
    cast_elements = 2.0 * tokens * gemm_io / t  # GEMM inputs forward, output grads backward
    layer_cast = np.where(is_fp8, (1 - bf16_layer_fraction) * cast_elements
                          * _cast_bytes_per_element(precision) / hbm, 0.0)

    selective_extra = np.where(selective, t_attention + t_softmax, 0.0)

    # TP: two all-reduces (or all-gather + reduce-scatter pairs under SP) each way per layer.
    tp_per_node = comm.ranks_per_domain(hw, t, 1)
    tp_bytes = 2.0 * tokens * h
    tp_fwd = 2.0 * comm.all_reduce_time(hw, tp_bytes, t, tp_per_node)
    tp_exposed_share = np.where(tp_overlap, 1.0 - eff.tp_overlap, 1.0)
    layer_tp = tp_exposed_share * tp_fwd * (2.0 + recomputed_fraction)
    full_extra = recomputed_fraction * forward

    # CP: ring exchange of the local K/V chunk, (cp-1) hops forward, K/V and dK/dV backward.
    kv_heads_local = np.maximum(model.query_groups / t, 1.0)
    kv_bytes = 2.0 * 2.0 * b * s_local * model.head_dim * kv_heads_local
    cp_same_domain = t * c <= hw.nvlink_domain
    cp_comm = 3.0 * (c - 1) * comm.p2p_time(hw, kv_bytes, cp_same_domain)
    layer_cp = np.maximum(cp_comm * (1 - eff.cp_overlap), cp_comm - 3.0 * t_attention)

    # --- a pipeline stage, one micro-batch -----------------------------------------------------
    stage_layers = layers_per_stage * (layer_compute + layer_cast + selective_extra + full_extra
                                       + layer_tp + layer_cp)
    logit_flops = flops.logits_flops(model, b, s_local) / t
    t_logits = 3.0 * logit_flops / (hw.bf16_tflops * 1e12 * gemm_efficiency(hw, logit_flops))
    t_logits = t_logits + LOSS_PASSES * 4.0 * tokens * V / t / hbm
    pp_bytes = 2.0 * tokens * h / t
    pp_same_domain = t * c * dp * p <= hw.nvlink_domain
    pp_exposed_share = np.where(v > 1, 1.0 - eff.pp_overlap, 1.0)
    stage_pp = np.where(p > 1, 2.0 * v * pp_exposed_share * comm.p2p_time(hw, pp_bytes, pp_same_domain), 0.0)

    last_stage = stage_layers + t_logits + stage_pp
    average_stage = stage_layers + t_logits / p + stage_pp
    bubble = pipeline.bubble_microbatches(p, v) * average_stage

    # --- data parallel and optimizer, once per step ---------------------------------------------
    embedding_gpu = model.embedding_params / t
    output_gpu = 0.0 if model.tie_embeddings else model.embedding_params / t
    layer_params_gpu = model.layer_params / t
    dense_first = layers_per_stage * layer_params_gpu + embedding_gpu
    dense_last = layers_per_stage * layer_params_gpu + np.where(p > 1, embedding_gpu, output_gpu)
    params_gpu = np.maximum(dense_first, np.where(p > 1, dense_last, dense_first + output_gpu))
    if model.is_moe:  # routed experts are sharded by EP as well
        expert_share = model.num_experts * model.dense_mlp_params / model.layer_params
        params_gpu = params_gpu - layers_per_stage * layer_params_gpu * expert_share * (1 - 1 / e)
    grad_bytes = np.where(np.asarray(cols["grad_reduce_in_fp32"], dtype=bool), 4.0, 2.0)
    dist_opt = np.asarray(cols["distributed_optimizer"], dtype=bool)
    dp_group = dp * c
    dp_per_node = comm.ranks_per_domain(hw, dp_group, t)
    grads_rs = np.where(dist_opt,
                        comm.reduce_scatter_time(hw, params_gpu * grad_bytes, dp_group, dp_per_node),
                        comm.all_reduce_time(hw, params_gpu * grad_bytes, dp_group, dp_per_node))
    params_ag = np.where(dist_opt,
                         comm.reduce_scatter_time(hw, params_gpu * memory.WEIGHT_BYTES, dp_group, dp_per_node),
                         0.0)
    backward_window = (2.0 / 3.0) * stage_layers
    forward_window = (1.0 / 3.0) * stage_layers
    overlap_grads = np.asarray(cols["overlap_grad_reduce"], dtype=bool)
    overlap_params = np.asarray(cols["overlap_param_gather"], dtype=bool)
    dp_exposed = (np.where(overlap_grads, np.maximum((1 - eff.dp_overlap) * grads_rs, grads_rs - backward_window), grads_rs)
                  + np.where(overlap_params, np.maximum((1 - eff.dp_overlap) * params_ag, params_ag - forward_window), params_ag))
    optimizer_shards = np.where(dist_opt, dp_group, 1.0)
    t_optimizer = params_gpu / optimizer_shards * OPTIMIZER_BYTES_PER_PARAM / hbm
    weight_cast = np.where(is_fp8, layers_per_stage * layer_params_gpu * (1 - bf16_layer_fraction)
                           * _cast_bytes_per_element(precision) / hbm, 0.0)

    step = m * last_stage + bubble + dp_exposed + t_optimizer + weight_cast

    # --- memory ----------------------------------------------------------------------------------
    weights = memory.WEIGHT_BYTES * params_gpu
    grads = grad_bytes * params_gpu
    optimizer = memory.OPTIMIZER_BYTES * params_gpu / optimizer_shards
    fp8_weights = np.where(is_fp8, memory.FP8_WEIGHT_COPY_BYTES * layers_per_stage * layer_params_gpu
                           * (1 - bf16_layer_fraction), 0.0)
    keep_scores = ~flash & ~selective
    full_layer = memory.layer_activation_bytes(model, b, s_local, t, sp, keep_scores)
    stored_layer = (recomputed_fraction * memory.layer_input_bytes(model, b, s_local, t, sp)
                    + (1 - recomputed_fraction) * full_layer)
    first_acts = L * pipeline.inflight_layer_fraction(p, v, m) * stored_layer + full_layer
    last_acts = layers_per_stage * stored_layer + full_layer
    logits = memory.logits_bytes(model, b, s_local, t) + memory.head_input_bytes(model, b, s_local, t, sp)
    activations = np.where(p > 1, np.maximum(first_acts, last_acts + logits), first_acts + logits)
    logits_shown = np.where(p > 1, np.where(last_acts + logits > first_acts, logits, 0.0), logits)
    states = weights + grads + optimizer + fp8_weights
    peak = states + activations + hw.reserve_gib * GIB
    fits = peak <= memory_fraction * hw.memory_gib * GIB

    n_gpus = t * p * c * dp
    tokens_per_s_per_gpu = gbs * s / (step * n_gpus)
    model_tflops = flops.model_flops_per_token(model) * tokens_per_s_per_gpu / 1e12
    peak_tflops = np.where(is_fp8, hw.fp8_tflops or hw.bf16_tflops, hw.bf16_tflops)

    out = {
        "fits": fits,
        "peak_memory_gib": peak / GIB,
        "step_time_s": step,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_tflops_per_gpu": model_tflops,
        "mfu": model_tflops / peak_tflops,
        "num_microbatches": m,
        # Breakdown of the step (seconds on the slowest stage; they add up to step_time_s).
        "compute_s": m * (layers_per_stage * layer_compute + t_logits),
        "fp8_cast_s": m * layers_per_stage * layer_cast + weight_cast,
        "recompute_s": m * layers_per_stage * (selective_extra + full_extra),
        "tp_comm_s": m * layers_per_stage * layer_tp,
        "cp_comm_s": m * layers_per_stage * layer_cp,
        "pp_comm_s": m * stage_pp,
        "bubble_s": bubble,
        "dp_comm_s": dp_exposed,
        "optimizer_s": t_optimizer,
        # Memory by kind (GiB on the fullest GPU).
        "weights_gib": weights / GIB,
        "grads_gib": grads / GIB,
        "optimizer_gib": optimizer / GIB,
        "fp8_weights_gib": fp8_weights / GIB,
        "activations_gib": (activations - logits_shown) / GIB,
        "logits_gib": logits_shown / GIB,
        "reserve_gib": np.full_like(peak, hw.reserve_gib),
    }
    return out


def plan_columns(plans: list[Plan]) -> dict[str, np.ndarray]:
    """Plans as the columns ``estimate_columns`` takes."""
    return {name: np.array([getattr(pl, name) for pl in plans]) for name in Plan.field_names()}


def estimate_plan(model: ModelSpec, hw: HardwareSpec, plan: Plan,
                  memory_fraction: float = 0.95) -> dict:
    """One plan's prediction as the stable JSON record (config, fits, metrics, breakdown)."""
    cols = estimate_columns(model, hw, plan_columns([plan]), memory_fraction)
    return record(plan.as_dict(), {k: v[0] for k, v in cols.items()})


def record(config: dict, row: Mapping) -> dict:
    """The stable output record other tools read (keys named in issue 2)."""
    return {
        "config": config,
        "fits": bool(row["fits"]),
        "peak_memory_gib": float(row["peak_memory_gib"]),
        "step_time_s": float(row["step_time_s"]),
        "tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
        "model_tflops_per_gpu": float(row["model_tflops_per_gpu"]),
        "mfu": float(row["mfu"]),
        "breakdown": {
            "time_s": {k: float(row[k]) for k in BREAKDOWN_KEYS},
            "memory_gib": {k: float(row[k]) for k in MEMORY_KEYS},
        },
    }
