"""One transformer layer, one micro-batch, one GPU: the layer-time step of the cost model.

A layer's time is the sum of ``LAYER_TIME_TERMS``, each priced by one function below:

- ``compute``: forward and backward (3x the forward) of the Linear GEMMs at a size-dependent
  efficiency (``gemm``), the attention core, the memory-bound elementwise kernels and a fixed
  per-layer overhead;
- ``fp8_cast``: TransformerEngine's casts of GEMM inputs (forward) and gradients (backward);
- ``selective_recompute`` / ``full_recompute``: the forward work recomputed in the backward pass;
- ``tp_comm``, ``cp_comm``, ``fsdp``, ``ep_comm``: what communication leaves exposed (TP's as
  TransformerEngine overlaps it, ``tensor_parallel``);
- ``amax_reduction``: the delayed-scaling recipe's blocking amax all-reduce per model chunk;
- ``lora_adapters``: LoRA's adapters, forward and backward (``finetune``); a frozen base computes no
  weight gradients, so ``compute`` drops its wgrad GEMMs.

A dense and a MoE layer share these terms; the MoE layer adds routed experts to its GEMM time
and has expert-parallel traffic. A new term is one function here and one name in
``LAYER_TIME_TERMS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel.costmodel import comm, dataparallel, dispatch, finetune, flops, gemm, memory, moe, pipeline, tensor_parallel
from autoparallel.costmodel.candidates import Candidates

GEMMS_PER_LAYER = 4  # QKV, projection, FC1 (gate and up fused), FC2
# TF32 tensor cores run at half the BF16 rate (dense, datasheets: H100 SXM 494.7 of 989 TFLOPS,
# B200 1.1 of 2.25 PFLOPS, A100 156 of 312).
TF32_PER_BF16 = 0.5
# Summed in this order into a layer's time (the breakdown reads each one).
LAYER_TIME_TERMS = ("compute", "fp8_cast", "selective_recompute", "full_recompute", "tp_comm", "cp_comm",
                    "fsdp", "ep_comm", "lora_adapters", "amax_reduction")


def linear_time(x: Candidates, params, whole=0.0, chunks=1.0):
    """Forward time of Linear GEMMs on ``params`` split by TP, of which ``whole`` (MLA's down
    projections) run whole on every TP rank, on its sequence-parallel share of the tokens;
    ``chunks``: each GEMM split into that many row chunks (userbuffers' ring exchange), each at
    the efficiency of its own size."""
    whole_tokens = np.where(x.sp, x.tokens / x.t, x.tokens)
    lin_flops = 2.0 * (x.tokens * (params - whole) / x.t + whole_tokens * whole)
    return lin_flops / (x.gemm_peak * gemm.efficiency(x.hw, lin_flops / GEMMS_PER_LAYER / chunks))


def attention_time(x: Candidates):
    """Attention core forward: QK^T, the softmax's exponentials on the SFUs and P·V, at one
    fitted efficiency. A flash kernel keeps the tensor cores and the SFUs busy at once: while one
    warpgroup's exponentials run, another's GEMMs do (FlashAttention-3, arXiv 2407.08608 §3.1-3.2:
    ping-pong scheduling and intra-warpgroup pipelining; cuDNN's fused attention on Hopper and
    Blackwell pipelines them alike), so the slower of the two sets the time. A flash kernel on
    packed sequences computes each document's causal block only (``finetune.attention_share``).
    FP8 attention runs both GEMMs at the FP8 peak, at the same fitted efficiency (no published run
    to fit its own); the exponentials stay on the SFUs."""
    model, hw = x.model, x.hw
    attn_flops = flops.attention_core_flops(model, x.b, model.seq_length, causal=x.flash) / (x.t * x.c)
    attn_flops = attn_flops * np.where(x.flash, finetune.attention_share(model), 1.0)
    exponentials = np.where(x.flash, attn_flops / (2.0 * (model.qk_dim + model.v_dim)), 0.0)
    peak = np.where(x.flag("fp8_attention"), hw.fp8_tflops or hw.bf16_tflops, hw.bf16_tflops) * 1e12
    return np.maximum(attn_flops / peak, exponentials / (hw.exp_tera_per_s * 1e12)) / hw.efficiency.attention


def softmax_time(x: Candidates):
    """Without flash attention the s x s scores go through HBM (written, read by the softmax)."""
    model = x.model
    score_bytes = (2 * memory.bytes_per_attention_score(model) * model.num_attention_heads
                   * x.s_local * model.seq_length * x.b / x.t)
    return np.where(x.flash, 0.0, score_bytes / x.hbm)


def activation_bytes(x: Candidates, is_moe: bool, keep_scores):
    """Bytes one layer saves for backward (a LoRA layer: what its frozen Linears and adapters
    keep); with ``keep_scores`` False counted in BF16 throughout (the tensors the elementwise
    kernels touch)."""
    fraction = x.quantized_fraction if keep_scores is not False else 0.0
    act_in = x.act_input_bytes if keep_scores is not False else memory.ACT_INPUT_BYTES
    routed_act_in = x.routed_act_input_bytes if keep_scores is not False else memory.ACT_INPUT_BYTES
    output = x.attention_output_bytes if keep_scores is not False else None
    saved = memory.layer_activation_bytes(x.model, x.b, x.s_local, x.t, x.sp, keep_scores, fraction, moe=is_moe,
                                          etp=x.et, imbalance=x.imbalance, quantized_bytes=x.quantized_input_bytes,
                                          act_in=act_in, attention_output=output, routed_act_in=routed_act_in)
    if keep_scores is False:
        return saved
    return saved + finetune.frozen_activation_bytes(x.model, x.b, x.s_local, x.t, x.sp, x.quantized_fraction,
                                                    x.quantized_input_bytes, output, x.attention_output_fused)


def permutation_time(x: Candidates):
    """(forward, backward) seconds of a MoE layer's token permutations: HBM traffic of one gather
    or scatter pass each (TransformerEngine's fused ``moe_permute`` / ``moe_unpermute`` /
    ``moe_sort_chunks_by_index``, ``--moe-permute-fusion``), BF16 tokens. The permutation reads
    the T tokens a GPU holds and writes their T*k copies in expert order; the unpermutation reads
    the copies (the routing probabilities are already in the activation) and writes T tokens back;
    the alltoall dispatcher with several local experts also sorts the copies it received (etp
    times gathered, ``imbalance`` times the even share on the busiest rank) by local expert after
    the dispatch and back before the combine (``sort_chunks_by_idxs``). Each pass's backward is
    its transpose, one pass of the same bytes."""
    model = x.model
    tokens, k = x.tokens / x.t, model.moe_router_topk
    received = tokens * k * x.imbalance * x.et
    sorts = (np.asarray(x.knobs["moe_token_dispatcher_type"]) == "alltoall") & (moe.local_experts(model, x.e) > 1)
    passes = 2.0 * tokens * (1.0 + k) + np.where(sorts, 2.0 * 2.0 * received, 0.0)
    forward = passes * dispatch.DISPATCH_BYTES * model.hidden_size / x.hbm
    return forward, forward


def forward_time(x: Candidates, t_linear, attention, softmax, is_moe: bool):
    """One layer's forward: GEMMs, attention core, elementwise kernels (norms, activation,
    residuals: bytes in proportion to what the layer saves), unfused softmax, fixed overhead:
    the kernel launches a CUDA graph replays in one
    (``layer_overhead_s``) and a MoE layer's fixed cost per local expert (``moe_expert_overhead``),
    which no graph removes."""
    eff = x.hw.efficiency
    t_elementwise = eff.elementwise_bytes_per_token_hidden / 34.0 * activation_bytes(x, is_moe, False) / x.hbm
    launches = np.where(x.cuda_graph == "none", eff.layer_overhead_s, 0.0)
    overhead = launches + (moe_expert_overhead(x) if is_moe else 0.0)
    return t_linear + attention + t_elementwise + softmax + overhead


def moe_expert_overhead(x: Candidates):
    """A MoE layer's forward pays a fixed cost per local expert (``moe_expert_overhead_s``):
    TransformerEngine's GroupedLinear runs its grouped GEMM as one cuBLAS GEMM per expert
    (``multi_stream_cublas_gemm`` loops over them, ``transformer_engine/common/gemm/cublaslt_gemm.cu``
    at d0067d0; CUTLASS's single grouped kernel only on Hopper under NVTE_USE_CUTLASS_GROUPED_GEMM)
    and splits and quantizes each expert's input apart, so launches and the per-GEMM tail grow with
    the experts a GPU holds, not with their tokens. Its backward pays it twice again (dgrad and
    wgrad GEMMs per expert: ``compute_time``'s 3x the forward)."""
    return x.hw.efficiency.moe_expert_overhead_s * moe.local_experts(x.model, x.e)


def compute_time(x: Candidates, forward, t_linear):
    """Forward and backward (data and weight gradients: twice the forward); a frozen base (LoRA)
    skips its Linears' weight-gradient GEMMs (one forward's worth of them)."""
    return 3.0 * forward - (3.0 - finetune.linear_passes(x.model)) * t_linear


def lora_adapters_time(x: Candidates):
    """LoRA's adapters (BF16, their own GEMMs): forward, dgrad and wgrad, 3x the forward FLOPs
    at the GEMMs' top efficiency, or the HBM traffic of their thin GEMMs and eager elementwise
    ops (``finetune.adapter_stream_elements``) where that is slower, as it is at LoRA ranks; then
    the TP collectives of their own (``finetune.adapter_collectives``), exposed."""
    if not finetune.adapter_gemms(x.model):
        return np.zeros_like(x.t)
    flops_time = 3.0 * 2.0 * x.tokens * finetune.adapter_params_gpu(x.model, x.t) / (
        x.hw.bf16_tflops * 1e12 * x.hw.efficiency.gemm_max)
    stream_time = x.tokens * finetune.adapter_stream_elements(x.model, x.t, x.sp) * finetune.ADAPTER_BYTES / x.hbm
    tp_group = comm.group(x.hw, x.t, comm.ranks_per_domain(x.hw, x.t, 1))
    collectives = sum(count * tp_group.reduce_scatter_time(finetune.ADAPTER_BYTES * x.tokens * width)
                      for width, count in finetune.adapter_collectives(x.model, x.t, x.sp,
                                                                             x.flag("tp_comm_overlap")))
    return np.maximum(flops_time, stream_time) + collectives


def gemm_input_elements(x: Candidates, is_moe: bool) -> float:
    """Elements per token entering a layer's Linear GEMMs (each cast to FP8 under a recipe): the
    attention's inputs, then FC1's and FC2's (a MoE layer: its top-k and shared experts')."""
    model = x.model
    h = model.hidden_size
    if model.multi_latent_attention:
        attention = h + (model.q_lora_rank or 0) + model.kv_lora_rank + model.num_attention_heads * model.v_dim
    else:
        attention = h + model.num_attention_heads * model.head_dim
    if not is_moe:
        return attention + h + model.ffn_hidden_size
    shared = h + model.shared_expert_ffn_hidden_size if model.shared_expert_ffn_hidden_size else 0
    return attention + model.moe_router_topk * (h + model.expert_ffn_hidden_size) + shared


def activation_input_elements(x: Candidates, is_moe: bool):
    """Elements per GPU of the activation's input (gate and up) in one layer: the MLP's, or a MoE
    layer's routed copies (``imbalance`` times the even share, ETP-split FFN) and shared experts'."""
    model, tokens = x.model, x.tokens / x.t
    if not is_moe:
        return 2.0 * tokens * model.ffn_hidden_size
    routed = tokens * model.moe_router_topk * x.imbalance * model.expert_ffn_hidden_size
    return 2.0 * (routed + tokens * (model.shared_expert_ffn_hidden_size or 0))


def fp8_cast_time(x: Candidates, is_moe: bool):
    """Casting the GEMM inputs (forward) and output gradients (backward) to FP8 or NVFP4: HBM
    traffic (``candidates.CAST_BYTES``; a frozen LoRA base: ``finetune.cast_bytes``); and where
    the SwiGLU's input is kept in FP8 (``activation_func_fp8_input_store``), its cast to E4M3 after
    the forward (2 B read, 1 B written) and back to BF16 before the backward (1 B read, 2 B
    written)."""
    cast_elements = 2.0 * x.tokens * gemm_input_elements(x, is_moe) / x.t
    per_element = finetune.cast_bytes(x.model, x.cast_bytes, x.quantized_input_bytes)
    stored = x.act_input_bytes < memory.ACT_INPUT_BYTES
    store = np.where(stored, 2.0 * (memory.ACT_INPUT_BYTES + memory.FP8_ACT_INPUT_BYTES), 0.0)
    return (x.quantized_fraction * cast_elements * per_element + store * activation_input_elements(x, is_moe)) / x.hbm


def norm_recompute_time(x: Candidates):
    """The two norms run again in the backward pass (``layernorm``): each reads its BF16 input
    and writes its BF16 output, HBM-bound."""
    return 2 * 2 * memory.layer_input_bytes(x.model, x.b, x.s_local, x.t, x.sp) / x.hbm


def selective_recompute_time(x: Candidates, attention, softmax, is_moe: bool, moe_block=0.0):
    """Megatron's --recompute-modules: core_attn (attention core and unfused softmax),
    mla_up_proj (MLA's up projections), moe (the whole MoE block, ``moe_block`` forward),
    layernorm (the two norms, ``norm_recompute_time``)."""
    extra = np.where(x.modules["core_attn"], attention + softmax, 0.0)
    extra = extra + np.where(x.modules["layernorm"], norm_recompute_time(x), 0.0)
    if x.model.multi_latent_attention:
        extra = extra + np.where(x.modules["mla_up_proj"], linear_time(x, x.model.mla_up_params), 0.0)
    return extra + (np.where(x.modules["moe"], moe_block, 0.0) if is_moe else 0.0)


def full_recompute_time(x: Candidates, forward):
    """Full recompute reruns the forward of the share of layers it covers."""
    return x.recomputed_fraction * forward


def cp_comm_time(x: Candidates, attention):
    """Ring exchange of the local K/V chunk: (cp-1) hops forward, K/V and dK/dV backward, partly
    hidden behind the attention computed meanwhile."""
    model = x.model
    kv_heads_local = np.maximum(model.query_groups / x.t, 1.0)
    kv_bytes = 2.0 * x.b * x.s_local * (model.qk_dim + model.v_dim) * kv_heads_local
    same_domain = x.t * x.c <= x.hw.nvlink_domain
    ring = 3.0 * (x.c - 1) * comm.p2p_time(x.hw, kv_bytes, same_domain)
    return np.maximum(ring * (1 - x.hw.efficiency.cp_overlap), ring - 3.0 * attention)


def fsdp_time(x: Candidates, params, expert_params, forward, full_recompute, is_moe: bool):
    """FSDP: each layer's weights all-gathered before its forward and its backward, its gradients
    reduce-scattered after its backward, every micro-batch, prefetched behind the layer before
    (experts over their own data-parallel group)."""
    backward = 2.0 * forward + full_recompute
    exposed = dataparallel.fsdp_exposed(x.hw, params, x.grad_bytes, x.dp_group, x.dp_per_node, forward, backward,
                                        x.gather_bytes)
    if is_moe:
        exposed = exposed + dataparallel.fsdp_exposed(
            x.hw, expert_params, x.grad_bytes, x.edp_group, x.edp_per_node, forward, backward, x.gather_bytes)
    return np.where(x.fsdp, exposed, 0.0)


def ep_comm_time(x: Candidates, compute, is_moe: bool):
    """Dispatch and combine each way, again in a recomputed forward (of the layer or the MoE
    block), with the plan's token dispatcher (alltoall: each dispatch a second all-to-all of the
    routing probabilities, ``dispatch.probs_time``); the 1F1B overlap hides them behind another
    micro-batch's compute, the shared-expert overlap behind the shared experts' own GEMMs
    (forward, backward and a recomputed forward: Megatron runs them on a side stream); a published
    row's DualPipe hides all that the compute beside can (``pipeline.DUALPIPE_HIDDEN_SHARE``)."""
    if not is_moe:
        return np.zeros_like(x.t)
    dispatcher = x.knobs["moe_token_dispatcher_type"]
    recomputed = x.recomputed_fraction + np.where(x.modules["moe"], 1.0, 0.0)
    one = dispatch.dispatch_time(x.hw, x.model, x.tokens / x.t, x.e, x.et, x.imbalance, dispatcher, x.dispatch_bytes)
    probs = dispatch.probs_time(x.hw, x.model, x.tokens / x.t, x.e, x.et, x.imbalance, dispatcher)
    a2a_overlap, shared_overlap = x.flag("overlap_moe_expert_parallel_comm"), x.flag("moe_shared_expert_overlap")
    shared = (3.0 + recomputed) * linear_time(x, x.model.shared_expert_params)  # forward, backward, recomputed
    hidden_share = np.where(x.dualpipe, pipeline.DUALPIPE_HIDDEN_SHARE, x.hw.efficiency.ep_overlap)
    total = (4.0 + 2.0 * recomputed) * one + (2.0 + recomputed) * probs  # each dispatch sends its probabilities
    return dispatch.exposed_dispatch(x.hw, total, a2a_overlap | shared_overlap,
                                     np.where(shared_overlap, shared, compute), dispatcher, hidden_share)


def amax_reduction_time(x: Candidates):
    """FP8 delayed scaling: when a model chunk's fp8_autocast exits, and when the backward of its
    first FP8 module ends, TransformerEngine all-reduces (MAX) the chunk's amaxes over the amax
    group, blocking (``reduce_and_update_fp8_tensors``; TE 0.8's ``global_amax_reduction`` with
    NVTE_ASYNC_AMAX_REDUCTION unset): TP x DP x CP ranks (Megatron's ``get_amax_reduction_group``),
    TP x CP with --tp-only-amax-red. A few bytes: latency only (a tree), twice per chunk and
    micro-batch, spread here over the chunk's layers. Other recipes keep no amax history."""
    layers_per_chunk = np.maximum(np.maximum(x.first_layers, x.middle_layers), x.last_layers) / x.v
    tp_only = x.flag("tp_only_amax_red")
    group = np.where(tp_only, x.t * x.c, x.t * x.c * x.dp)
    per_node = comm.ranks_per_domain(x.hw, group, 1)
    delayed = np.asarray(x.knobs["precision"]) == "fp8-delayed"
    reduce = comm.tree_all_reduce_latency(x.hw, group, per_node)
    return np.where(delayed, 2.0 * reduce / np.maximum(layers_per_chunk, 1.0), 0.0)


def stored_activation_bytes(x: Candidates, is_moe: bool):
    """What the layer keeps per micro-batch in flight: its input where full recompute covers it,
    else its activations less what selective recompute spares."""
    spared = memory.recomputed_bytes(x.model, x.b, x.s_local, x.t, x.sp, x.quantized_fraction, is_moe, x.et,
                                     x.imbalance, x.modules["mla_up_proj"], x.modules["moe_act"], x.modules["moe"],
                                     x.quantized_input_bytes, x.modules["layernorm"], x.act_input_bytes,
                                     x.routed_act_input_bytes)
    return (x.recomputed_fraction * memory.layer_input_bytes(x.model, x.b, x.s_local, x.t, x.sp)
            + (1 - x.recomputed_fraction) * (activation_bytes(x, is_moe, x.keep_scores) - spared))


def layer_cost(x: Candidates, params, expert_params, t_linear, tp_blocks, is_moe: bool, moe_block=0.0,
               kernels=(), tp_linear=(0.0, 0.0)) -> dict:
    """Every term of one layer (``LAYER_TIME_TERMS``), their sum ``time`` and what the other
    steps read: ``forward``, the bytes ``stored`` per micro-batch in flight and ``working`` while
    it computes (``stored_imbalance`` of it: what the busiest EP rank keeps beyond the even share),
    its ``params`` and ``expert_params`` on the GPU. ``kernels``: (forward,
    backward) pairs of a MoE layer priced with their own backward (``router_time``,
    ``permutation_time``); ``tp_linear``: forward time of the TP-split GEMMs, whole and in
    ring-exchange chunks (``tensor_parallel``)."""
    attention, softmax = attention_time(x), softmax_time(x)
    forward = forward_time(x, t_linear, attention, softmax, is_moe) + sum(f for f, _ in kernels)
    # compute_time prices a backward of twice the forward; these kernels' backward is their own.
    compute = compute_time(x, forward, t_linear) + sum(b - 2.0 * f for f, b in kernels)
    full_recompute = full_recompute_time(x, forward)
    terms = {
        "compute": compute,
        "fp8_cast": fp8_cast_time(x, is_moe),
        "selective_recompute": selective_recompute_time(x, attention, softmax, is_moe, moe_block),
        "full_recompute": full_recompute,
        "tp_comm": tensor_parallel.tp_comm_time(x, tp_blocks, *tp_linear),
        "cp_comm": cp_comm_time(x, attention),
        "fsdp": fsdp_time(x, params, expert_params, forward, full_recompute, is_moe),
        "ep_comm": ep_comm_time(x, compute, is_moe),
        "lora_adapters": lora_adapters_time(x) if not is_moe else np.zeros_like(x.t),
        "amax_reduction": amax_reduction_time(x),
    }
    stored = stored_activation_bytes(x, is_moe)
    return dict(terms, time=sum(terms[k] for k in LAYER_TIME_TERMS), forward=forward,
                recompute=terms["selective_recompute"] + terms["full_recompute"],
                stored=stored, stored_imbalance=stored - stored_activation_bytes(x.evenly_loaded(), is_moe) if is_moe
                else np.zeros_like(stored), working=activation_bytes(x, is_moe, x.keep_scores),
                params=params, expert_params=expert_params,
                adapter_params=finetune.adapter_params_gpu(x.model, x.t) + np.zeros_like(x.t))


def dense_layer(x: Candidates) -> dict:
    """A dense layer: attention and MLP split by TP (MLA's down projections whole)."""
    model = x.model
    params = (model.dense_layer_params - model.mla_down_params) / x.t + model.mla_down_params
    t_linear = linear_time(x, model.dense_layer_params, model.mla_down_params)
    chunked = linear_time(x, model.dense_layer_params, model.mla_down_params, chunks=x.t)
    return layer_cost(x, params, 0.0, t_linear, 2.0, False, tp_linear=(t_linear, chunked))


def router_time(x: Candidates):
    """(forward, backward) seconds of the router's GEMM, the T/tp tokens on num_experts logits.
    Megatron-Core's ``router_gating_linear`` calls TransformerEngine's ``general_gemm`` itself, so
    no FP8 recipe quantizes it: the forward takes BF16 inputs to FP32 logits (BF16 tensor cores);
    the backward's dgrad and wgrad take FP32 operands under ``--moe-router-dtype fp32``, which TE
    runs as TF32 ("Use TF32 only for pure FP32 GEMM", ``cublaslt_gemm.cu``). Each GEMM is priced at
    the dense efficiency of its own (small) size, not at the layer's."""
    model, hw = x.model, x.hw
    gemm_flops = 2.0 * x.tokens / x.t * model.router_params
    forward = gemm_flops / (hw.bf16_tflops * 1e12 * gemm.efficiency(hw, gemm_flops))
    backward_rate = TF32_PER_BF16 if model.moe_router_fp32 else 1.0
    return forward, 2.0 * forward / backward_rate


def routed_experts_time(x: Candidates):
    """Routed experts: one grouped GEMM per local expert group, at the efficiency of one expert's
    GEMM on its tokens; the busiest EP rank has ``imbalance`` times the tokens."""
    eff = x.hw.efficiency
    expert_flops = moe.expert_flops(x.model, x.tokens / x.t) * x.imbalance
    group_flops = moe.expert_gemm_flops(x.model, x.tokens / x.t, x.e, x.et)
    grouped_eff = eff.grouped_gemm_max / (1.0 + eff.grouped_gemm_half_gflop / (group_flops / 1e9))
    return expert_flops / (x.gemm_peak * grouped_eff)


def moe_layer(x: Candidates) -> dict:
    """A MoE layer: attention and shared experts split by TP, the router on each GPU's tokens
    (``router_time``), the token permutations (``permutation_time``), routed experts over EP x
    ETP; TP all-reduces after attention and after the shared experts (if any)."""
    model = x.model
    nonexpert = model.moe_layer_params - model.num_experts * model.expert_params - model.router_params
    t_experts = routed_experts_time(x)
    router, permutation = router_time(x), permutation_time(x)
    tp_blocks = 1.0 + (model.shared_expert_ffn_hidden_size > 0)
    block = linear_time(x, model.shared_expert_params) + t_experts + router[0] + permutation[0]
    t_nonexpert = linear_time(x, nonexpert, model.mla_down_params)
    chunked = linear_time(x, nonexpert, model.mla_down_params, chunks=x.t)
    return layer_cost(x, moe.nonexpert_moe_params_gpu(model, x.t), moe.expert_params_gpu(model, x.e, x.et),
                      t_nonexpert + t_experts, tp_blocks, True, block, (router, permutation),
                      tp_linear=(t_nonexpert, chunked))


@dataclass
class Layers:
    """The dense and the MoE layer's costs, summed over the layers of a pipeline stage."""

    dense: dict
    moe: dict

    def on(self, key: str, layers, moe_layers):
        """``key`` summed over ``layers`` layers of which ``moe_layers`` are MoE."""
        return (layers - moe_layers) * self.dense[key] + moe_layers * self.moe[key]


def layers(x: Candidates) -> Layers:
    """Both layers' costs (the MoE one all zeros for a dense model)."""
    dense = dense_layer(x)
    return Layers(dense, moe_layer(x) if x.model.is_moe else {k: np.zeros_like(x.t) for k in dense})
