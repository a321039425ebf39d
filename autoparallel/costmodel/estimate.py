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

from autoparallel.costmodel import comm, dataparallel, flops, memory, moe, pipeline
from autoparallel.costmodel.memory import GIB
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

GEMMS_PER_LAYER = 4  # QKV, projection, FC1 (gate and up fused), FC2
OPTIMIZER_BYTES_PER_PARAM = 32.0  # Adam reads/writes master, m, v, grad, BF16 copy
# HBM bytes per element of an FP8 cast (read BF16, write FP8 in both layouts), by recipe.
FP8_CAST_BYTES = {"fp8-delayed": 4.0, "fp8-current": 6.0, "fp8-blockwise": 4.5, "mxfp8": 4.0}
LOSS_PASSES = 4  # softmax cross-entropy reads/writes the FP32 logits about four times

BREAKDOWN_KEYS = ("compute_s", "recompute_s", "fp8_cast_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                  "pp_comm_s", "bubble_s", "dp_comm_s", "offload_s", "optimizer_s")
MEMORY_KEYS = ("weights_gib", "grads_gib", "optimizer_gib", "fp8_weights_gib",
               "activations_gib", "logits_gib", "reserve_gib")


def gemm_efficiency(hw: HardwareSpec, gemm_flops):
    """Fraction of peak one GEMM of ``gemm_flops`` reaches: small GEMMs starve the GPU."""
    eff = hw.efficiency
    return eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(gemm_flops / 1e9, 1e-9))


def _gemm_peak(hw: HardwareSpec, fp8_fraction):
    """Effective peak FLOP/s of the Linear GEMMs: the FP8 share of the layers at the FP8 peak,
    the rest BF16."""
    bf16 = hw.bf16_tflops * 1e12
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative
    # Harmonic mix: time adds, not speed.
    return 1.0 / (fp8_fraction / fp8 + (1.0 - fp8_fraction) / bf16)


def _cast_bytes_per_element(precision):
    codes, names = pipeline.factorize(precision)
    return np.array([FP8_CAST_BYTES.get(name, 0.0) for name in names])[codes].reshape(np.shape(precision))


def _pick(masks_and_values, default):
    """Elementwise select: the value of the first mask that holds (np.select, broadcasting)."""
    masks, values = zip(*masks_and_values)
    return np.select(list(masks), [np.broadcast_to(v, np.shape(masks[0])) for v in values], default)


def _gemm_input_elements(model: ModelSpec, moe: bool) -> float:
    """Elements per token entering a layer's Linear GEMMs (each cast to FP8 under a recipe): the
    attention's inputs, then FC1's and FC2's (a MoE layer: its top-k and shared experts')."""
    h = model.hidden_size
    if model.multi_latent_attention:
        attention = h + (model.q_lora_rank or 0) + model.kv_lora_rank + model.num_attention_heads * model.v_dim
    else:
        attention = h + model.num_attention_heads * model.head_dim
    if not moe:
        return attention + h + model.ffn_hidden_size
    shared = h + model.shared_expert_ffn_hidden_size if model.shared_expert_ffn_hidden_size else 0
    return attention + model.moe_router_topk * (h + model.expert_ffn_hidden_size) + shared


def estimate_columns(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
                     memory_fraction: float = 0.95) -> dict[str, np.ndarray]:
    """Predict every plan in ``cols`` (Plan field name -> array). Returns metric columns.

    ``memory_fraction``: a plan fits when its peak is at most this share of GPU memory.
    """
    eff = hw.efficiency
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    flag = lambda k: np.asarray(cols[k], dtype=bool)  # noqa: E731
    t, p, v, c, dp, e, et = (f64(k) for k in ("tp", "pp", "vp", "cp", "dp", "ep", "etp"))
    b, gbs = f64("mbs"), f64("gbs")
    sp, flash, tp_overlap, fsdp = flag("sp"), flag("flash_attention"), flag("tp_comm_overlap"), flag("fsdp")
    recompute = np.asarray(cols["recompute"])
    precision = np.asarray(cols["precision"])
    full = recompute == "full"
    selective = recompute == "selective"
    is_fp8 = np.isin(precision, list(FP8_CAST_BYTES))
    cast_bytes = _cast_bytes_per_element(precision)

    L, h, s, V = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    s_local = s / c
    tokens = b * s_local  # tokens one GPU processes per micro-batch
    m = gbs / (b * dp)
    split = (f64("num_layers_in_first_pipeline_stage"), f64("num_layers_in_last_pipeline_stage"),
             f64("account_for_embedding_in_pipeline_split"), f64("account_for_loss_in_pipeline_split"),
             np.asarray(cols["pipeline_model_parallel_layout"], dtype=object))
    first_layers, middle_layers, last_layers = pipeline.stage_layers(L, p, v, *split)
    # MoE layers of each stage (the middle stage with most of them); the rest are dense.
    if model.is_moe:
        first_moe, middle_moe, last_moe = pipeline.stage_pattern_counts(model.moe_layer_pattern, p, v, *split)
    else:
        first_moe = middle_moe = last_moe = np.zeros_like(t)
    layers_per_chunk = np.maximum(np.maximum(first_layers, middle_layers), last_layers) / v
    n_recomputed = np.where(f64("recompute_num_layers") > 0,
                            np.minimum(f64("recompute_num_layers"), layers_per_chunk), layers_per_chunk)
    recomputed_fraction = np.where(full, n_recomputed / layers_per_chunk, 0.0)
    bf16_layer_fraction = np.minimum(2.0 * f64("fp8_bf16_edge_layers") / L, 1.0)
    fp8_layer_fraction = np.where(is_fp8, 1.0 - bf16_layer_fraction, 0.0)

    # --- one layer, one micro-batch, one GPU: what dense and MoE layers share ------------------
    gemm_peak = _gemm_peak(hw, fp8_layer_fraction)
    # MLA's down projections run whole on every TP rank, on its sequence-parallel share.
    mla_tokens = np.where(sp, tokens / t, tokens)

    def linear_time(params, whole=0.0):
        """Linear GEMMs on ``params`` split by TP, of which ``whole`` (MLA's down projections) on
        every TP rank."""
        lin_flops = 2.0 * (tokens * (params - whole) / t + mla_tokens * whole)
        return lin_flops / (gemm_peak * gemm_efficiency(hw, lin_flops / GEMMS_PER_LAYER))

    # Flash attention: QK^T, the softmax's exponentials on the SFUs, then P·V, one after the
    # other (the second GEMM waits for the softmax), at one fitted efficiency.
    attn_flops = flops.attention_core_flops(model, b, s, causal=flash) / (t * c)
    exponentials = np.where(flash, attn_flops / (2.0 * (model.qk_dim + model.v_dim)), 0.0)
    t_attention = (attn_flops / (hw.bf16_tflops * 1e12) + exponentials / (hw.exp_tera_per_s * 1e12)) / eff.attention
    hbm = hw.hbm_tbps * 1e12 * eff.hbm
    score_bytes = 2 * memory.bytes_per_attention_score(model) * model.num_attention_heads * s_local * s * b / t
    t_softmax = np.where(flash, 0.0, score_bytes / hbm)
    # Selective recompute of Megatron's --recompute-modules (core_attn alone for dense models).
    module_codes, module_sets = pipeline.factorize(cols["recompute_modules"])
    module = lambda name: selective & np.array([name in m.split() for m in module_sets], dtype=bool)[module_codes]  # noqa: E731
    core_attn, mla_up_proj, moe_act, moe_recompute = (module(n) for n in ("core_attn", "mla_up_proj", "moe_act", "moe"))
    selective_extra = np.where(core_attn, t_attention + t_softmax, 0.0)
    if model.multi_latent_attention:
        selective_extra = selective_extra + np.where(mla_up_proj, linear_time(model.mla_up_params), 0.0)

    # TP: an all-reduce (or all-gather + reduce-scatter pair under SP) each way per block that
    # TP splits. Overlap (userbuffers) hides them behind the GEMMs they run beside, never more.
    tp_per_node = comm.ranks_per_domain(hw, t, 1)
    tp_block = comm.all_reduce_time(hw, 2.0 * tokens * h, t, tp_per_node) * (2.0 + recomputed_fraction)

    # CP: ring exchange of the local K/V chunk, (cp-1) hops forward, K/V and dK/dV backward.
    kv_heads_local = np.maximum(model.query_groups / t, 1.0)
    kv_bytes = 2.0 * b * s_local * (model.qk_dim + model.v_dim) * kv_heads_local
    cp_same_domain = t * c <= hw.nvlink_domain
    cp_comm = 3.0 * (c - 1) * comm.p2p_time(hw, kv_bytes, cp_same_domain)
    layer_cp = np.maximum(cp_comm * (1 - eff.cp_overlap), cp_comm - 3.0 * t_attention)

    grad_bytes = np.where(flag("grad_reduce_in_fp32"), 4.0, 2.0)
    dp_group = dp * c
    dp_per_node = comm.ranks_per_domain(hw, dp_group, t)
    # Megatron's MoE parallel folding: experts are replicated over dp*cp*tp / (ep*etp) GPUs.
    edp_group = dp_group * t / (e * et)
    edp_per_node = comm.ranks_per_domain(hw, edp_group, e * et)
    keep_scores = ~flash & ~core_attn
    imbalance = moe.load_imbalance(hw, model, e) if model.is_moe else np.ones_like(t)

    def layer(params, expert_params, t_linear, tp_blocks, is_moe, moe_forward=0.0):
        """One dense or MoE layer: (time, forward, compute, cast, recompute, TP, FSDP, EP time,
        saved activations, working activations). ``moe_forward``: the MoE block's computation
        forward (what recomputing it costs)."""
        activations = lambda keep: memory.layer_activation_bytes(  # noqa: E731
            model, b, s_local, t, sp, keep, fp8_layer_fraction if keep is not False else 0.0,
            moe=is_moe, etp=et, imbalance=imbalance)
        t_elementwise = eff.elementwise_bytes_per_token_hidden / 34.0 * activations(False) / hbm
        overhead = eff.layer_overhead_s + (eff.moe_layer_overhead_s if is_moe else 0.0)
        forward = t_linear + t_attention + t_elementwise + t_softmax + overhead
        compute = 3.0 * forward
        cast_elements = 2.0 * tokens * _gemm_input_elements(model, is_moe) / t  # inputs fwd, grads bwd
        cast = fp8_layer_fraction * cast_elements * cast_bytes / hbm
        full_extra = recomputed_fraction * forward
        module_extra = selective_extra + (np.where(moe_recompute, moe_forward, 0.0) if is_moe else 0.0)
        tp_total = tp_blocks * tp_block
        gemms_beside = t_linear * (3.0 + recomputed_fraction)
        tp = np.where(tp_overlap, np.maximum((1 - eff.tp_overlap) * tp_total, tp_total - gemms_beside), tp_total)
        # FSDP: each layer's weights all-gathered before its forward and its backward, its
        # gradients reduce-scattered after its backward, every micro-batch, prefetched behind
        # the layer before (experts over their own data-parallel group).
        layer_fsdp = dataparallel.fsdp_exposed(hw, params, grad_bytes, dp_group, dp_per_node, forward,
                                               2.0 * forward + full_extra)
        if is_moe:
            layer_fsdp = layer_fsdp + dataparallel.fsdp_exposed(
                hw, expert_params, grad_bytes, edp_group, edp_per_node, forward, 2.0 * forward + full_extra)
            # Dispatch and combine each way, again in a recomputed forward (of the layer or block).
            recomputed = recomputed_fraction + np.where(moe_recompute, 1.0, 0.0)
            dispatches = (4.0 + 2.0 * recomputed) * moe.dispatch_time(hw, model, tokens / t, e, et, imbalance)
            ep_time = moe.exposed_dispatch(hw, dispatches, flag("overlap_moe_expert_parallel_comm"), compute)
        else:
            ep_time = np.zeros_like(t)
        layer_fsdp = np.where(fsdp, layer_fsdp, 0.0)
        spared = memory.recomputed_bytes(model, b, s_local, t, sp, fp8_layer_fraction, is_moe, et, imbalance,
                                         mla_up_proj, moe_act, moe_recompute)
        stored = (recomputed_fraction * memory.layer_input_bytes(model, b, s_local, t, sp)
                  + (1 - recomputed_fraction) * (activations(keep_scores) - spared))
        time = compute + cast + module_extra + full_extra + tp + layer_cp + layer_fsdp + ep_time
        return dict(time=time, forward=forward, compute=compute, cast=cast, recompute=module_extra + full_extra,
                    tp=tp, fsdp=layer_fsdp, ep=ep_time, stored=stored, working=activations(keep_scores),
                    params=params, expert_params=expert_params)

    dense_params = (model.dense_layer_params - model.mla_down_params) / t + model.mla_down_params
    dense = layer(dense_params, 0.0, linear_time(model.dense_layer_params, model.mla_down_params), 2.0, False)
    if model.is_moe:
        nonexpert = model.moe_layer_params - model.num_experts * model.expert_params
        # Routed experts: one grouped GEMM per local expert group, at the efficiency of one
        # expert's GEMM on its tokens; the busiest EP rank has ``imbalance`` times the tokens.
        expert_flops = moe.expert_flops(model, tokens / t) * imbalance
        group_flops = moe.expert_gemm_flops(model, tokens / t, e, et)
        grouped_eff = eff.grouped_gemm_max / (1.0 + eff.grouped_gemm_half_gflop / (group_flops / 1e9))
        t_experts = expert_flops / (gemm_peak * grouped_eff)
        shared_blocks = 1.0 + (model.shared_expert_ffn_hidden_size > 0)
        block = linear_time(model.router_params + model.shared_expert_params) + t_experts
        moe_layer = layer(moe.nonexpert_moe_params_gpu(model, t), moe.expert_params_gpu(model, e, et),
                          linear_time(nonexpert, model.mla_down_params) + t_experts, shared_blocks, True, block)
    else:
        moe_layer = {k: np.zeros_like(t) for k in dense}

    def stage_sum(key, layers, moe_layers):
        return (layers - moe_layers) * dense[key] + moe_layers * moe_layer[key]

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
    offloaded = np.minimum(f64("cpu_offloading_num_layers"), first_layers)
    mean = lambda key: stage_sum(key, first_layers, first_moe) / np.maximum(first_layers, 1.0)  # noqa: E731
    host_link = hw.host_link_gbps * 1e9
    if hw.network_shares_host_link:  # FSDP's inter-node gathers and reduce-scatters take their share
        per_param = 2.0 * memory.WEIGHT_BYTES + grad_bytes
        fsdp_network = np.where(fsdp, comm.internode_bytes(mean("params") * per_param, dp_group, dp_per_node)
                                + comm.internode_bytes(mean("expert_params") * per_param, edp_group, edp_per_node),
                                0.0)
        host_link = np.maximum(host_link - fsdp_network / mean("compute"), 0.1 * host_link)
    transfer = offloaded * mean("stored") / host_link
    first_forward = first_layers * mean("forward")
    t_offload = (np.maximum(transfer - first_forward, 0.0)
                 + np.maximum(transfer - (first_layers * mean("compute") - first_forward), 0.0))

    single = p == 1
    first_time = stage_sum("time", first_layers, first_moe) + stage_pp + np.where(single, t_logits, 0.0) + t_offload
    middle_time = stage_sum("time", middle_layers, middle_moe) + stage_pp
    last_time = stage_sum("time", last_layers, last_moe) + stage_pp + t_logits
    has_middle = p > 2
    slowest = np.maximum(np.maximum(first_time, np.where(has_middle, middle_time, 0.0)),
                         np.where(single, 0.0, last_time))
    stage_total = np.where(single, first_time, first_time + (p - 2) * np.where(has_middle, middle_time, 0.0)
                           + last_time)
    pipeline_time = pipeline.schedule_time(m, v, slowest, stage_total)
    # The bottleneck stage: its layers (MoE among them) and whether it computes the logits.
    last_is_slowest = ~single & (last_time >= slowest)
    first_is_slowest = ~last_is_slowest & (first_time >= slowest)
    bottleneck_layers = _pick([(last_is_slowest, last_layers), (first_is_slowest, first_layers)], middle_layers)
    bottleneck_moe = _pick([(last_is_slowest, last_moe), (first_is_slowest, first_moe)], middle_moe)
    bottleneck_logits = np.where(last_is_slowest | single, t_logits, 0.0)
    bottleneck = lambda key: stage_sum(key, bottleneck_layers, bottleneck_moe)  # noqa: E731

    # --- parameters per stage; data parallel and optimizer, once per step ------------------------
    # Per stage: (parameters replicated over dp*cp, experts replicated over the expert-data group).
    embedding_gpu = model.embedding_params / t
    output_gpu = 0.0 if model.tie_embeddings else model.embedding_params / t
    first_params = (stage_sum("params", first_layers, first_moe) + embedding_gpu + np.where(single, output_gpu, 0.0),
                    first_moe * moe_layer["expert_params"])
    middle_params = (stage_sum("params", middle_layers, middle_moe), middle_moe * moe_layer["expert_params"])
    last_params = (stage_sum("params", last_layers, last_moe) + embedding_gpu,  # the output layer (a copy if tied)
                   last_moe * moe_layer["expert_params"])
    stage_params = [first_params, middle_params, last_params]
    present = [np.full_like(t, True, dtype=bool), has_middle, ~single]
    heaviest = np.argmax(np.stack([np.where(ok, a + x, -np.inf) for ok, (a, x) in zip(present, stage_params)]), axis=0)
    params_gpu, experts_gpu = (np.choose(heaviest, [np.broadcast_to(sp_[i], t.shape) for sp_ in stage_params])
                               for i in range(2))
    dist_opt = flag("distributed_optimizer") | fsdp
    stage_compute = bottleneck("time")
    dp_exposed = np.where(fsdp, 0.0, dataparallel.distributed_optimizer_exposed(
        hw, params_gpu, grad_bytes, dp_group, dp_per_node, dist_opt, v, p, stage_compute,
        flag("overlap_grad_reduce"), flag("overlap_param_gather")))
    if model.is_moe:
        dp_exposed = dp_exposed + np.where(fsdp, 0.0, dataparallel.distributed_optimizer_exposed(
            hw, experts_gpu, grad_bytes, edp_group, edp_per_node, dist_opt, v, p, stage_compute,
            flag("overlap_grad_reduce"), flag("overlap_param_gather")))
    optimizer_shards = np.where(dist_opt, dp_group, 1.0)
    expert_optimizer_shards = np.where(dist_opt, edp_group, 1.0)
    t_optimizer = ((params_gpu / optimizer_shards + experts_gpu / expert_optimizer_shards)
                   * OPTIMIZER_BYTES_PER_PARAM / hbm)
    bottleneck_layer_params = bottleneck("params") + bottleneck_moe * moe_layer["expert_params"]
    weight_cast = bottleneck_layer_params * fp8_layer_fraction * cast_bytes / hbm

    step = pipeline_time + dp_exposed + t_optimizer + weight_cast

    # --- memory, on the first, first middle and last stage ---------------------------------------
    weight_shards = np.where(fsdp, dp_group, 1.0)
    expert_weight_shards = np.where(fsdp, edp_group, 1.0)
    largest_layer = np.maximum(dense["params"], np.where(first_moe + middle_moe + last_moe > 0,
                                                         moe_layer["params"] + moe_layer["expert_params"], 0.0))

    def states(params, layers, moe_layers):
        replicated, experts = params
        weights = memory.WEIGHT_BYTES * (replicated / weight_shards + experts / expert_weight_shards)
        grads = grad_bytes * (replicated / weight_shards + experts / expert_weight_shards)
        optimizer = memory.OPTIMIZER_BYTES * (replicated / optimizer_shards + experts / expert_optimizer_shards)
        layer_weights = (stage_sum("params", layers, moe_layers) / weight_shards
                         + experts / expert_weight_shards)
        fp8_weights = memory.FP8_WEIGHT_COPY_BYTES * layer_weights * fp8_layer_fraction
        buffers = np.where(fsdp, memory.fsdp_buffer_bytes(largest_layer, grad_bytes), 0.0)
        return weights, grads + buffers, optimizer, fp8_weights

    def activations(layers, moe_layers, stage):
        held = pipeline.inflight_chunks(p, v, m, stage) / v
        working = np.where(moe_layers > 0, moe_layer["working"], dense["working"])
        return held * stage_sum("stored", layers, moe_layers) + working, held

    logits = memory.logits_bytes(model, b, s_local, t) + memory.head_input_bytes(model, b, s_local, t, sp)
    # Offloading keeps two layers' worth on the GPU: the one being copied and the next.
    kept = 1.0 - (offloaded - 2.0 * np.minimum(offloaded, 1.0)) / first_layers
    first_acts, first_held = activations(first_layers * kept, first_moe * kept, 0)
    first_acts = first_acts + first_held * memory.embedding_activation_bytes(model, b, s_local)
    first_acts = first_acts + np.where(single, logits, 0.0)
    middle_acts, _ = activations(middle_layers, middle_moe, 1)
    last_acts, _ = activations(last_layers, last_moe, p - 1)
    stage_states = [states(first_params, first_layers, first_moe), states(middle_params, middle_layers, middle_moe),
                    states(last_params, last_layers, last_moe)]
    stage_acts = [first_acts, middle_acts, last_acts + logits]
    stage_logits = [np.where(single, logits, 0.0), 0.0, logits]
    stage_peaks = [sum(st) + acts for st, acts in zip(stage_states, stage_acts)]
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
        "compute_s": m * (bottleneck("compute") + bottleneck_logits),
        "fp8_cast_s": m * bottleneck("cast") + weight_cast,
        "recompute_s": m * bottleneck("recompute"),
        "tp_comm_s": m * bottleneck("tp"),
        "cp_comm_s": m * bottleneck_layers * layer_cp,
        "ep_comm_s": m * bottleneck("ep"),
        "pp_comm_s": m * stage_pp,
        "bubble_s": pipeline_time - m * slowest,
        "dp_comm_s": dp_exposed + m * bottleneck("fsdp"),
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
