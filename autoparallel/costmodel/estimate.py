"""Step time and peak memory of every candidate plan, as columns.

The time of one step is built bottom-up (DESIGN.md §5): one layer's forward and backward for one
micro-batch on one GPU (GEMMs at a size-dependent efficiency, attention core, memory-bound
kernels, FP8 casts, exposed TP and CP communication, recompute); each pipeline stage is its
layers plus what only it holds (the output layer and loss on the last stage); the schedule runs
the bottleneck stage m times plus the fill and drain of the others (``pipeline``); then the
exposed data-parallel traffic (``dataparallel``) and the optimizer step.

Memory is priced on three stages, which cover the fullest one for every split Megatron makes
(``pipeline``): the first (most micro-batches in flight, the embedding), the first middle stage
(nearly as many in flight, possibly more layers) and the last (fewest in flight, the logits).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autoparallel.costmodel import comm, dataparallel, flops, memory, pipeline
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
                  "pp_comm_s", "bubble_s", "dp_comm_s", "offload_s", "optimizer_s")
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


def _pick(masks_and_values, default):
    """Elementwise select: the value of the first mask that holds (np.select, broadcasting)."""
    masks, values = zip(*masks_and_values)
    return np.select(list(masks), [np.broadcast_to(v, np.shape(masks[0])) for v in values], default)


def estimate_columns(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
                     memory_fraction: float = 0.95) -> dict[str, np.ndarray]:
    """Predict every plan in ``cols`` (Plan field name -> array). Returns metric columns.

    ``memory_fraction``: a plan fits when its peak is at most this share of GPU memory.
    """
    eff = hw.efficiency
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    flag = lambda k: np.asarray(cols[k], dtype=bool)  # noqa: E731
    t, p, v, c, dp, e = (f64(k) for k in ("tp", "pp", "vp", "cp", "dp", "ep"))
    b, gbs = f64("mbs"), f64("gbs")
    sp, flash, tp_overlap, fsdp = flag("sp"), flag("flash_attention"), flag("tp_comm_overlap"), flag("fsdp")
    recompute = np.asarray(cols["recompute"])
    precision = np.asarray(cols["precision"])
    full = recompute == "full"
    selective = recompute == "selective"
    is_fp8 = np.isin(precision, list(FP8_CAST_BYTES))

    L, h, s, V = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    s_local = s / c
    tokens = b * s_local  # tokens one GPU processes per micro-batch
    m = gbs / (b * dp)
    first_layers, middle_layers, last_layers = pipeline.stage_layers(
        L, p, v, f64("num_layers_in_first_pipeline_stage"), f64("num_layers_in_last_pipeline_stage"),
        f64("account_for_embedding_in_pipeline_split"), f64("account_for_loss_in_pipeline_split"))
    layers_per_chunk = np.maximum(np.maximum(first_layers, middle_layers), last_layers) / v
    n_recomputed = np.where(f64("recompute_num_layers") > 0,
                            np.minimum(f64("recompute_num_layers"), layers_per_chunk), layers_per_chunk)
    recomputed_fraction = np.where(full, n_recomputed / layers_per_chunk, 0.0)
    bf16_layer_fraction = np.minimum(2.0 * f64("fp8_bf16_edge_layers") / L, 1.0)
    fp8_layer_fraction = np.where(is_fp8, 1.0 - bf16_layer_fraction, 0.0)

    # --- one layer, one micro-batch, one GPU -------------------------------------------------
    lin_flops = flops.linear_flops_per_token(model) * tokens / t
    gemm_peak = _gemm_peak(hw, precision, bf16_layer_fraction)
    t_linear = lin_flops / (gemm_peak * gemm_efficiency(hw, lin_flops / GEMMS_PER_LAYER))
    # Flash attention: QK^T, the softmax's exponentials on the SFUs, then P·V, one after the
    # other (the second GEMM waits for the softmax), at one fitted efficiency.
    attn_flops = flops.attention_core_flops(model, b, s, causal=flash) / (t * c)
    exponentials = np.where(flash, attn_flops / (4.0 * model.head_dim), 0.0)
    t_attention = (attn_flops / (hw.bf16_tflops * 1e12) + exponentials / (hw.exp_tera_per_s * 1e12)) / eff.attention
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
    layer_cast = fp8_layer_fraction * cast_elements * _cast_bytes_per_element(precision) / hbm

    selective_extra = np.where(selective, t_attention + t_softmax, 0.0)
    full_extra = recomputed_fraction * forward

    # TP: two all-reduces (or all-gather + reduce-scatter pairs under SP) each way per layer.
    # Overlap (userbuffers) hides them behind the GEMMs they run beside, never more than those.
    tp_per_node = comm.ranks_per_domain(hw, t, 1)
    tp_fwd = 2.0 * comm.all_reduce_time(hw, 2.0 * tokens * h, t, tp_per_node)
    tp_total = tp_fwd * (2.0 + recomputed_fraction)
    gemms_beside = t_linear * (3.0 + recomputed_fraction)
    layer_tp = np.where(tp_overlap, np.maximum((1 - eff.tp_overlap) * tp_total, tp_total - gemms_beside),
                        tp_total)

    # CP: ring exchange of the local K/V chunk, (cp-1) hops forward, K/V and dK/dV backward.
    kv_heads_local = np.maximum(model.query_groups / t, 1.0)
    kv_bytes = 2.0 * 2.0 * b * s_local * model.head_dim * kv_heads_local
    cp_same_domain = t * c <= hw.nvlink_domain
    cp_comm = 3.0 * (c - 1) * comm.p2p_time(hw, kv_bytes, cp_same_domain)
    layer_cp = np.maximum(cp_comm * (1 - eff.cp_overlap), cp_comm - 3.0 * t_attention)

    # FSDP: each layer's weights all-gathered before its forward and its backward, its gradients
    # reduce-scattered after its backward, every micro-batch, prefetched behind the layer before.
    layer_params_gpu = model.layer_params / t
    grad_bytes = np.where(flag("grad_reduce_in_fp32"), 4.0, 2.0)
    dp_group = dp * c
    dp_per_node = comm.ranks_per_domain(hw, dp_group, t)
    layer_fsdp = np.where(fsdp, dataparallel.fsdp_exposed(
        hw, layer_params_gpu, grad_bytes, dp_group, dp_per_node, forward, 2.0 * forward + full_extra), 0.0)

    layer_time = (layer_compute + layer_cast + selective_extra + full_extra + layer_tp + layer_cp
                  + layer_fsdp)

    # --- pipeline stages, one micro-batch each ---------------------------------------------------
    logit_flops = flops.logits_flops(model, b, s_local) / t
    t_logits = 3.0 * logit_flops / (hw.bf16_tflops * 1e12 * gemm_efficiency(hw, logit_flops))
    t_logits = t_logits + LOSS_PASSES * 4.0 * tokens * V / t / hbm
    pp_bytes = 2.0 * tokens * h / t
    pp_same_domain = t * c * dp * p <= hw.nvlink_domain
    pp_exposed_share = np.where(v > 1, 1.0 - eff.pp_overlap, 1.0)
    stage_pp = np.where(p > 1, 2.0 * v * pp_exposed_share * comm.p2p_time(hw, pp_bytes, pp_same_domain), 0.0)

    # Activation offloading (pp = 1 only): the offloaded layers' saved activations go to the host
    # behind the forward pass and come back behind the backward pass.
    keep_scores = ~flash & ~selective
    full_layer = memory.layer_activation_bytes(model, b, s_local, t, sp, keep_scores, fp8_layer_fraction)
    stored_layer = (recomputed_fraction * memory.layer_input_bytes(model, b, s_local, t, sp)
                    + (1 - recomputed_fraction) * full_layer)
    offloaded = np.minimum(f64("cpu_offloading_num_layers"), first_layers)
    host_link = hw.host_link_gbps * 1e9
    if hw.network_shares_host_link:  # FSDP's inter-node gathers and reduce-scatters take their share
        fsdp_network = np.where(fsdp, comm.internode_bytes(layer_params_gpu * (2.0 * memory.WEIGHT_BYTES + grad_bytes),
                                                           dp_group, dp_per_node), 0.0)
        host_link = np.maximum(host_link - fsdp_network / layer_compute, 0.1 * host_link)
    transfer = offloaded * stored_layer / host_link
    t_offload = (np.maximum(transfer - first_layers * forward, 0.0)
                 + np.maximum(transfer - first_layers * (layer_compute - forward), 0.0))

    single = p == 1
    first_time = first_layers * layer_time + stage_pp + np.where(single, t_logits, 0.0) + t_offload
    middle_time = middle_layers * layer_time + stage_pp
    last_time = last_layers * layer_time + stage_pp + t_logits
    has_middle = p > 2
    slowest = np.maximum(np.maximum(first_time, np.where(has_middle, middle_time, 0.0)),
                         np.where(single, 0.0, last_time))
    stage_sum = np.where(single, first_time, first_time + (p - 2) * np.where(has_middle, middle_time, 0.0)
                         + last_time)
    pipeline_time = pipeline.schedule_time(m, v, slowest, stage_sum)
    # The bottleneck stage: its layer count and whether it computes the logits.
    last_is_slowest = ~single & (last_time >= slowest)
    first_is_slowest = ~last_is_slowest & (first_time >= slowest)
    bottleneck_layers = _pick([(last_is_slowest, last_layers), (first_is_slowest, first_layers)],
                              middle_layers)
    bottleneck_logits = np.where(last_is_slowest | single, t_logits, 0.0)

    # --- parameters per stage; data parallel and optimizer, once per step ------------------------
    embedding_gpu = model.embedding_params / t
    output_gpu = 0.0 if model.tie_embeddings else model.embedding_params / t
    first_params = first_layers * layer_params_gpu + embedding_gpu + np.where(single, output_gpu, 0.0)
    middle_params = middle_layers * layer_params_gpu
    last_params = last_layers * layer_params_gpu + embedding_gpu  # the output layer (a copy if tied)
    params_gpu = np.maximum(np.maximum(first_params, np.where(has_middle, middle_params, 0.0)),
                            np.where(single, 0.0, last_params))
    if model.is_moe:  # routed experts are sharded by EP as well
        expert_share = model.num_experts * model.dense_mlp_params / model.layer_params
        params_gpu = params_gpu - layers_per_chunk * v * layer_params_gpu * expert_share * (1 - 1 / e)
    dist_opt = flag("distributed_optimizer") | fsdp
    stage_compute = bottleneck_layers * layer_time
    dp_exposed = np.where(fsdp, 0.0, dataparallel.distributed_optimizer_exposed(
        hw, params_gpu, grad_bytes, dp_group, dp_per_node, dist_opt, v, p, stage_compute,
        flag("overlap_grad_reduce"), flag("overlap_param_gather")))
    optimizer_shards = np.where(dist_opt, dp_group, 1.0)
    t_optimizer = params_gpu / optimizer_shards * OPTIMIZER_BYTES_PER_PARAM / hbm
    weight_cast = (bottleneck_layers * layer_params_gpu * fp8_layer_fraction
                   * _cast_bytes_per_element(precision) / hbm)

    step = pipeline_time + dp_exposed + t_optimizer + weight_cast

    # --- memory, on the first, first middle and last stage ---------------------------------------
    weight_shards = np.where(fsdp, dp_group, 1.0)

    def states(stage_params, stage_layers):
        weights = memory.WEIGHT_BYTES * stage_params / weight_shards
        grads = grad_bytes * stage_params / weight_shards
        optimizer = memory.OPTIMIZER_BYTES * stage_params / optimizer_shards
        fp8_weights = (memory.FP8_WEIGHT_COPY_BYTES * stage_layers * layer_params_gpu * fp8_layer_fraction
                       / weight_shards)
        buffers = np.where(fsdp, memory.fsdp_buffer_bytes(layer_params_gpu, grad_bytes), 0.0)
        return weights, grads + buffers, optimizer, fp8_weights

    def activations(layers, stage):
        held = pipeline.inflight_chunks(p, v, m, stage) / v
        return held * layers * stored_layer + full_layer, held

    logits = memory.logits_bytes(model, b, s_local, t) + memory.head_input_bytes(model, b, s_local, t, sp)
    # Offloading keeps two layers' worth on the GPU: the one being copied and the next.
    first_acts, first_held = activations(first_layers - offloaded + 2.0 * np.minimum(offloaded, 1.0), 0)
    first_acts = first_acts + first_held * memory.embedding_activation_bytes(model, b, s_local)
    first_acts = first_acts + np.where(single, logits, 0.0)
    middle_acts, _ = activations(middle_layers, 1)
    last_acts, _ = activations(last_layers, p - 1)
    stage_states = [states(first_params, first_layers), states(middle_params, middle_layers),
                    states(last_params, last_layers)]
    stage_acts = [first_acts, middle_acts, last_acts + logits]
    stage_logits = [np.where(single, logits, 0.0), 0.0, logits]
    stage_peaks = [sum(st) + acts for st, acts in zip(stage_states, stage_acts)]
    present = [np.full_like(t, True, dtype=bool), has_middle, ~single]
    peaks = np.stack([np.where(ok, pk, -np.inf) for ok, pk in zip(present, stage_peaks)])
    fullest = np.argmax(peaks, axis=0)
    choose = lambda values: np.choose(fullest, [np.broadcast_to(x, t.shape) for x in values])  # noqa: E731
    weights, grads, optimizer, fp8_weights = (choose([st[i] for st in stage_states]) for i in range(4))
    acts = choose(stage_acts)
    logits_shown = choose(stage_logits)
    peak = choose(stage_peaks) + hw.reserve_gib * GIB
    fits = peak <= memory_fraction * hw.memory_gib * GIB

    n_gpus = t * p * c * dp
    tokens_per_s_per_gpu = gbs * s / (step * n_gpus)
    model_tflops = flops.model_flops_per_token(model, t) * tokens_per_s_per_gpu / 1e12
    precision_peak = np.where(is_fp8, hw.fp8_tflops or hw.bf16_tflops, hw.bf16_tflops)

    return {
        "fits": fits,
        "peak_memory_gib": peak / GIB,
        "step_time_s": step,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_tflops_per_gpu": model_tflops,
        # Model FLOP utilisation against the dense BF16 peak, as Megatron-LM and NeMo users read
        # it; against the peak of the plan's GEMM precision (the FP8 peak under an FP8 recipe).
        "mfu": model_tflops / hw.bf16_tflops,
        "precision_utilization": model_tflops / precision_peak,
        "num_microbatches": m,
        # Breakdown of the step on the bottleneck stage (they add up to step_time_s).
        "compute_s": m * (bottleneck_layers * layer_compute + bottleneck_logits),
        "fp8_cast_s": m * bottleneck_layers * layer_cast + weight_cast,
        "recompute_s": m * bottleneck_layers * (selective_extra + full_extra),
        "tp_comm_s": m * bottleneck_layers * layer_tp,
        "cp_comm_s": m * bottleneck_layers * layer_cp,
        "pp_comm_s": m * stage_pp,
        "bubble_s": pipeline_time - m * slowest,
        "dp_comm_s": dp_exposed + m * bottleneck_layers * layer_fsdp,
        "offload_s": m * np.where(first_is_slowest, t_offload, 0.0),
        "optimizer_s": t_optimizer,
        # Memory by kind (GiB on the fullest GPU).
        "weights_gib": weights / GIB,
        "grads_gib": grads / GIB,
        "optimizer_gib": optimizer / GIB,
        "fp8_weights_gib": fp8_weights / GIB,
        "activations_gib": (acts - logits_shown) / GIB,
        "logits_gib": logits_shown / GIB,
        "reserve_gib": np.full_like(peak, hw.reserve_gib),
    }


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
        "precision_utilization": float(row["precision_utilization"]),
        "breakdown": {
            "time_s": {k: float(row[k]) for k in BREAKDOWN_KEYS},
            "memory_gib": {k: float(row[k]) for k in MEMORY_KEYS},
        },
    }
