"""One transformer layer, one micro-batch, one GPU: the layer-time step of the cost model.

A layer's time is the sum of ``LAYER_TIME_TERMS``, each priced by one function below:

- ``compute``: forward and backward (3x the forward) of the Linear GEMMs at a size-dependent
  efficiency (``gemm``), the attention core, the memory-bound elementwise kernels and a fixed
  per-layer overhead;
- ``fp8_cast``: TransformerEngine's casts of GEMM inputs (forward) and gradients (backward), and a
  LoRA run's frozen FP8 weights transposed for each micro-batch's dgrad where the run makes them so;
- ``selective_recompute`` / ``full_recompute``: the forward work recomputed in the backward pass;
- ``tp_comm``, ``cp_comm``, ``fsdp``, ``ep_comm``: what communication leaves exposed (TP's as
  TransformerEngine overlaps it, ``tensor_parallel``);
- ``cp_merge``: the HBM passes TransformerEngine's p2p context parallelism spends merging its ring's
  per-step partial outputs and gradients (``cp_merge_time``);
- ``amax_reduction``: the delayed-scaling recipe's blocking amax all-reduce per model chunk;
- ``lora_adapters``: LoRA's adapters, forward and backward (``finetune``); a frozen base computes no
  weight gradients, so ``compute`` drops its wgrad GEMMs.

A dense and a MoE layer share these terms; the MoE layer adds routed experts to its GEMM time
and has expert-parallel traffic. A new term is one function here and one name in
``LAYER_TIME_TERMS``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from autoparallel.costmodel import (comm, cp_kinds, dataparallel, dispatch, dsa, dsv4, finetune, flops, gemm,
                                    gemm_precision, mamba, memory, moe, pipeline, tensor_parallel)
from autoparallel.costmodel.candidates import (CP_COMM_TYPE_COLUMN, CUDNN_FRONTEND_COLUMN, CUTLASS_DSL_COLUMN,
                                               Candidates, te_at_least)
from autoparallel.costmodel.layer_kinds import EDGE, HYBRID, STAGE_KINDS, LayerKind, as_kind

GEMMS_PER_LAYER = 4  # QKV, projection, FC1 (gate and up fused), FC2
# TF32 tensor cores run at half the BF16 rate (dense, datasheets: H100 SXM 494.7 of 989 TFLOPS,
# B200 1.1 of 2.25 PFLOPS, A100 156 of 312).
TF32_PER_BF16 = 0.5
# Summed in this order into a layer's time (the breakdown reads each one).
LAYER_TIME_TERMS = ("compute", "fp8_cast", "selective_recompute", "full_recompute", "tp_comm", "cp_comm",
                    "cp_merge", "fsdp", "ep_comm", "lora_adapters", "amax_reduction")


def linear_time(x: Candidates, params, whole=0.0, chunks=1.0, gemms=GEMMS_PER_LAYER, peak=None):
    """Forward time of Linear GEMMs on ``params`` split by TP, of which ``whole`` (MLA's down
    projections) run whole on every TP rank, on its sequence-parallel share of the tokens;
    ``chunks``: each GEMM split into that many row chunks (userbuffers' ring exchange), each at
    the efficiency of its own size; ``gemms``: how many GEMMs share the FLOPs (a hybrid layer's
    one block has two); ``peak``: their FLOP/s at full efficiency (default ``x.gemm_peak``; a GEMM
    class a quantization recipe runs in a precision of its own, ``gemm_precision.class_peak``)."""
    whole_tokens = np.where(x.sp, x.tokens / x.t, x.tokens)
    lin_flops = 2.0 * (x.tokens * (params - whole) / x.t + whole_tokens * whole)
    size = lin_flops / gemms / chunks
    peak = sized_peak(x, size) if peak is None else peak
    return lin_flops / (peak * gemm.efficiency(x.hw, size))


def sized_peak(x: Candidates, gemm_flops):
    """``x.gemm_peak`` with its quantized GEMMs at the speed ``x.hw`` sustains at ``gemm_flops`` a GEMM
    (``gemm.size_speed``); ``x.gemm_peak`` itself on a GPU measured at one size."""
    if not x.hw.fp8_gemm_size_speed:
        return x.gemm_peak
    return gemm.peak(x.hw, x.quantized_fraction, x.is_fp4, gemm_flops)


# cuDNN's MXFP8 fused attention (TransformerEngine's FusedAttention under the MXFP8 recipe with
# fp8_dot_product_attention: TE >= 2.16 with cuDNN >= 9.21, Blackwell only; TE v2.16.1
# ``transformer_engine/pytorch/attention/dot_product_attention/utils.py`` get_attention_backend) takes a
# fixed time per score element whatever the head dimension, the time its BF16 kernel takes at head
# dimension 128: NVIDIA/cudnn-frontend 3929da2 ``benchmark/sdpa_benchmark_training/results`` (cuDNN 9.22,
# causal, 4,096 tokens, forward + backward per score): GB300 MXFP8 1.345 / 1.348 / 1.354 ns at d 128
# (llama3.1) / 192-128 (dsv3) / 192-128 (kimiK26), BF16 1.326 at d 128 and 1.859 at 192-128; GB200
# MXFP8 1.519 / 1.553 / 1.577, BF16 1.480 at d 128 (the 26.06 container runs cuDNN 9.21.1.3, per
# Megatron-Bridge/docs/releases/software-versions.md). Its block-scaled quantizations of P and dS in
# both layouts (a scale per 32 elements) are work per score element that the FP8 GEMMs do not shorten.
MXFP8_ATTENTION_HEAD_DIM = 128


def attention_time(x: Candidates):
    """Attention core forward: QK^T, the softmax's exponentials on the SFUs and P·V, at one
    fitted efficiency. A flash kernel keeps the tensor cores and the SFUs busy at once: while one
    warpgroup's exponentials run, another's GEMMs do (FlashAttention-3, arXiv 2407.08608 §3.1-3.2:
    ping-pong scheduling and intra-warpgroup pipelining; cuDNN's fused attention on Hopper and
    Blackwell pipelines them alike), so the slower of the two sets the time. A flash kernel on
    packed sequences computes each document's causal block only (``finetune.attention_share``).
    FP8 attention runs both GEMMs at the FP8 peak, at the same fitted efficiency (no published run
    to fit its own); the exponentials stay on the SFUs. Under the MXFP8 recipe (cuDNN's MXFP8
    kernel, ``MXFP8_ATTENTION_HEAD_DIM``) no faster than the BF16 kernel at head dimension 128 per
    score element."""
    model, hw = x.model, x.hw
    fp8 = x.flag("fp8_attention")
    attn_flops = flops.attention_core_flops(model, x.b, model.seq_length, causal=x.flash) / (x.t * x.c)
    attn_flops = attn_flops * np.where(x.flash, finetune.attention_share(model), 1.0)
    scores = attn_flops / (2.0 * (model.qk_dim + model.v_dim))
    exponentials = np.where(x.flash, scores, 0.0)
    bf16 = gemm.bf16_peak(hw)
    peak = np.where(fp8, (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * gemm.tensor_speed(hw), bf16)
    gemms = attn_flops / peak
    mxfp8 = fp8 & x.knob_is("precision", "mxfp8")
    gemms = np.where(mxfp8, np.maximum(gemms, scores * 2.0 * 2.0 * MXFP8_ATTENTION_HEAD_DIM / bf16), gemms)
    return np.maximum(gemms, exponentials / (hw.exp_tera_per_s * 1e12)) / hw.attention_peak_share(x.s_local)


def softmax_time(x: Candidates):
    """Without flash attention the s x s scores go through HBM (written, read by the softmax)."""
    model = x.model
    score_bytes = (2 * memory.bytes_per_attention_score(model) * model.num_attention_heads
                   * x.s_local * model.seq_length * x.b / x.t)
    return np.where(x.flash, 0.0, score_bytes / x.hbm)


def clamps_glu(model) -> bool:
    """A quick-GEGLU with a clamp (GPT-OSS): Megatron-Core clamps its input eagerly (``glu_clamp_time``)."""
    return model.quick_geglu and model.activation_func_clamp_value is not None


def glu_clamp_saved_bytes(model) -> float:
    """Bytes per GLU input element that a quick-GEGLU's eager clamp (``glu_clamp_time``) keeps
    for backward beyond the fused GLU's own saved input: the two clamps keep their BF16 input (the
    FC1 output, for their masks) while the fused GLU keeps the clamped copy. Under --recompute-modules
    moe_act the checkpoint keeps the FC1 output only (``stored_activation_bytes`` spares it)."""
    return memory.ACT_INPUT_BYTES if clamps_glu(model) else 0.0


def activation_bytes(x: Candidates, kind: LayerKind | bool, keep_scores):
    """Bytes one layer saves for backward (a LoRA layer: what its frozen Linears and adapters
    keep); with ``keep_scores`` False counted in BF16 throughout (the tensors the elementwise
    kernels touch; a Mamba layer's: its norm's input, its mixer's kernels priced apart).
    ``kind``: the layer's kind (``layer_kinds``)."""
    kind = as_kind(kind)
    is_moe = kind.is_moe
    if kind.mamba:
        return mamba.activation_bytes(x.model, x.b, x.s_local, x.t, x.sp,
                                      x.quantized_fraction if keep_scores is not False else 0.0,
                                      x.quantized_input_bytes, keep=keep_scores is not False)
    fraction = x.quantized_fraction if keep_scores is not False else 0.0
    clamp = glu_clamp_saved_bytes(x.model)
    act_in = x.act_input_bytes + clamp if keep_scores is not False else memory.ACT_INPUT_BYTES
    routed_act_in = x.routed_act_input_bytes + clamp if keep_scores is not False else memory.ACT_INPUT_BYTES
    output = x.attention_output_bytes if keep_scores is not False else None
    saved = memory.layer_activation_bytes(x.model, x.b, x.s_local, x.t, x.sp, keep_scores, fraction, moe=is_moe,
                                          etp=x.et, imbalance=x.imbalance, quantized_bytes=x.quantized_input_bytes,
                                          act_in=act_in, attention_output=output, routed_act_in=routed_act_in,
                                          attention=kind.attention, ffn=kind.ffn is not None)
    if keep_scores is not False and x.model.hc_mult > 1:
        saved = saved + dsv4.hyper_connection_saved_bytes(x)
    if keep_scores is False or not kind.standard:
        return saved
    return (saved + finetune.frozen_activation_bytes(x.model, x.b, x.s_local, x.t, x.sp, x.quantized_fraction,
                                                     x.quantized_input_bytes, output, x.attention_output_fused,
                                                     x.flag("lora_input_regather"))
            + finetune.dropout_saved_bytes(x.model, x.b, x.s_local, x.t, x.sp))


def received_copies(x: Candidates):
    """Routed token copies the busiest EP rank computes per micro-batch: its tokens' top-k copies
    over the EP group, gathered over ETP, ``imbalance`` times the even share."""
    return x.tokens / x.t * x.model.moe_router_topk * x.imbalance * x.et


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
    received = received_copies(x)
    sorts = x.knob_is("moe_token_dispatcher_type", "alltoall") & (moe.local_experts(model, x.e) > 1)
    passes = 2.0 * tokens * (1.0 + k) + np.where(sorts, 2.0 * 2.0 * received, 0.0)
    forward = passes * dispatch.DISPATCH_BYTES * moe.routed_width(model) / x.hbm
    return forward, forward


# Bytes per element of a routed expert's FC2 output that Megatron-Core's eager expert-bias step
# moves (``expert_bias_time``): BF16 activations, and the routing probabilities' dtype, which the
# bias-times-probability product and everything after it take by type promotion.
EXPERT_OUTPUT_BYTES = 2.0
ROUTER_FP32_BYTES, ROUTER_BF16_BYTES = 4.0, 2.0


def expert_bias_bytes(probs_bytes: float, act_bytes: float = EXPERT_OUTPUT_BYTES) -> tuple[float, float]:
    """(forward, backward) HBM bytes per element of the routed experts' FC2 output that adding
    their bias costs in Megatron-Core's ``TEGroupedMLP._apply_bias`` (NVIDIA/Megatron-LM a329dd6
    "Enable bias in expert mlp [gpt-oss 5/5]", megatron/core/transformer/moe/experts.py, unchanged
    in d98e8a6 except a CUDA-graph path added in 883533e, 2026-08). FC2 is built with
    ``skip_bias_add=True`` (FC1's bias TransformerEngine's GroupedLinear adds in the GEMM epilogue,
    its gradient fused into the wgrad GEMM: free), and the returned per-expert biases are applied
    token-weighted, in PyTorch, one local expert at a time::

        torch.cat([t + b * p for t, b, p in zip(split(out), biases, split(probs))]).to(out.dtype)

    Forward, per element (activations ``a`` bytes, the probability's dtype ``e``): ``b * p`` writes
    e; ``t + ...`` reads a + e and writes e; ``cat`` reads and writes e; ``.to`` reads e and writes
    a when e is wider (a no-op otherwise). Backward (autograd): the cast's backward (e written from
    a, when wider), ``cat``'s (views), the add's gradient cast back to ``t``'s dtype (when wider),
    then ``mul``'s two gradients, each a product written (e read, e written) and reduced (e read):
    over the tokens for the bias, over the hidden size for the probability (the router is trained
    through it)."""
    wider = probs_bytes > act_bytes
    cast = (probs_bytes + act_bytes) if wider else 0.0
    forward = probs_bytes + (act_bytes + 2 * probs_bytes) + 2 * probs_bytes + cast
    backward = cast + cast + 2 * 3 * probs_bytes
    return forward, backward


def fp32_expert_probs(x: Candidates) -> np.ndarray:
    """Whether the routing probabilities the experts' eager bias step multiplies are FP32: when the
    model routes in FP32 (``ModelSpec.moe_router_fp32``), and under the flex dispatcher whatever the
    router's dtype, since every flex backend hands the experts FP32 probabilities (Megatron-LM
    ``megatron/core/transformer/moe/token_dispatcher.py``: ``_HybridEPManager.dispatch`` "HybridEP
    only supports float32 probs" and ``_DeepepManager`` "DeepEP only supports float32 probs" cast
    ``token_probs.float()`` before dispatching them, ``_NCCLEPManager`` passes ``token_probs.float()``;
    HybridEP's since it entered Megatron-Core, 3df200905e, 2025-11-18, core_v0.16.0, the core of
    every Megatron-Bridge 26.02+ container). The alltoall and allgather dispatchers permute the
    router's own probabilities. Under TransformerEngine's fused grouped MLP
    (``cutedsl_fused_grouped_mlp``) the bias is added in the FC2 GEMM's epilogue, not by the eager
    step (Megatron-Core 0.18.0, the 26.06 container's, ``TEGroupedMLP.forward`` returns the fused
    ops' output before ``_apply_bias``): nothing there is promoted to FP32 in memory, and the
    epilogue's work stays priced at the BF16 step's bytes, as the fused MLP's other epilogue work
    (``fused_grouped_mlp_calls``)."""
    flex = x.knob_is("moe_token_dispatcher_type", "flex")
    return (flex & ~x.flag("cutedsl_fused_grouped_mlp")) | x.model.moe_router_fp32


def expert_bias_time(x: Candidates):
    """(forward, backward) seconds of adding a MoE layer's routed-expert biases (``add_bias_linear``)
    as Megatron-Core does it, eagerly (``expert_bias_bytes``), over the routed copies the busiest
    EP rank computes (``imbalance`` times the even share, gathered over ETP) and the full hidden
    size, HBM-bound; with FP32 probabilities where the experts receive them
    (``fp32_expert_probs``: an FP32 router, or the flex dispatcher's backends), else BF16. Zero
    without expert biases."""
    model = x.model
    if not (model.is_moe and model.add_bias_linear):
        return np.zeros_like(x.t, dtype=float), np.zeros_like(x.t, dtype=float)
    elements = received_copies(x) * moe.routed_width(model)
    wide = fp32_expert_probs(x)
    return tuple(np.where(wide, fp32, bf16) * elements / x.hbm
                 for fp32, bf16 in zip(expert_bias_bytes(ROUTER_FP32_BYTES), expert_bias_bytes(ROUTER_BF16_BYTES)))


# HBM bytes per element of a GLU's input (gate and up halves, BF16) that Megatron-Core's eager
# clamp before a fused quick-GEGLU moves (``glu_clamp_time``): forward, each half clamped (read 2,
# write 2) and the halves concatenated again (read 2, write 2); backward, each clamp's gradient
# masked by its input (grad and input read, written: 6) and the chunk's backward concatenating the
# two halves' gradients (read 2, write 2).
GLU_CLAMP_BYTES = (4.0 + 4.0, 6.0 + 4.0)


def glu_clamp_time(x: Candidates, kind: LayerKind | bool):
    """(forward, backward) seconds of clamping a quick-GEGLU's input (``activation_func_clamp_value``
    with ``quick_geglu``; GPT-OSS). Megatron-Core's ``weighted_bias_quick_geglu_impl`` (NVIDIA/
    Megatron-LM 2e29a5e "Add quick geglu activation for gpt-oss", megatron/core/fusions/
    fused_bias_geglu.py, unchanged in d98e8a6; called by TEGroupedMLP and MLP with
    bias_activation_fusion) runs, before its jit-fused GLU::

        x_glu, x_linear = input.chunk(2, -1)
        input = torch.cat((x_glu.clamp(max=c), x_linear.clamp(min=-c, max=c)), -1)

    in eager PyTorch (``GLU_CLAMP_BYTES`` over every GLU input element: the MLP's, or the routed
    copies' and shared experts' of a MoE layer), where SwiGLU's clamp sits inside its fused kernel
    (fused_bias_swiglu.py ``clamped_swiglu``): nothing then. Under --recompute-modules moe_act the
    checkpointed activation (clamp included) runs its forward again in the backward pass."""
    kind = as_kind(kind)
    if not clamps_glu(x.model) or kind.ffn is None:
        return np.zeros_like(x.t, dtype=float), np.zeros_like(x.t, dtype=float)
    is_moe = kind.is_moe
    elements = activation_input_elements(x, is_moe)
    forward, backward = (b * elements / x.hbm for b in GLU_CLAMP_BYTES)
    if is_moe:
        backward = backward + np.where(x.modules["moe_act"], forward, 0.0)
    return forward, backward


# HBM bytes per output element of the routed experts' fused bias-activation kernel (BF16): a GLU reads its
# gate and up halves (2 x 2) and writes one (2); a plain activation reads one and writes one.
MOE_ACT_BYTES = {True: 6.0, False: 4.0}


def moe_act_recompute_time(x: Candidates):
    """(forward, backward) seconds of ``--recompute-modules moe_act`` rerunning the routed experts'
    activation kernel in the backward pass. NVIDIA/Megatron-LM d98e8a64dd
    ``megatron/core/transformer/moe/experts.py`` ``TEGroupedMLP.forward``: with ``moe_act`` the
    ``bias_act_func`` (``weighted_bias_swiglu_impl`` / ``weighted_bias_quick_geglu_impl``, one fused
    kernel over FC1's output) runs under ``CheckpointWithoutOutput``, whose output is discarded after
    FC2 and recomputed when FC2's backward starts. The forward's own run is in the fitted elementwise
    term; the rerun was priced for GPT-OSS's eager clamp only (``glu_clamp_time``). ``MOE_ACT_BYTES``
    per output element of the busiest EP rank's routed copies, HBM-bound. Nothing where the whole MoE
    block is recomputed (``moe``: its rerun holds it) or under TransformerEngine's fused grouped MLP
    (its own op recomputes inside the fused kernel)."""
    model = x.model
    out = x.tokens / x.t * model.moe_router_topk * x.imbalance * model.expert_ffn_hidden_size
    rerun = x.modules["moe_act"] & ~x.modules["moe"] & ~x.flag("cutedsl_fused_grouped_mlp")
    backward = np.where(rerun, MOE_ACT_BYTES[bool(model.gated_mlp)] * out / x.hbm, 0.0)
    return np.zeros_like(backward), backward


# HBM bytes per query or key element (BF16) that Megatron-Core's unfused RoPE moves beyond
# TransformerEngine's fused kernel (one read and one write each way: 4 and 4), counted from
# ``_apply_rotary_pos_emb_bshd`` and ``_rotate_half`` (NVIDIA/Megatron-LM core_v0.16.0 - core_v0.18.0
# ``megatron/core/models/common/embeddings/rope_utils.py``, unchanged between them):
# ``t * cos_ + _rotate_half(t) * sin_`` then ``torch.cat((t, t_pass))``. Forward: the negated half
# (read and write half the elements: 2), ``_rotate_half``'s cat (4), the two products (4 + 4), their sum
# (read 4, write 2: 6), the final cat (4): 24. Backward (autograd): the two products' gradients (4 + 4),
# the negation's (2), the chunk's cat of its halves' gradients (4), the two paths summed (6): 20.
UNFUSED_ROPE_BYTES = (24.0 - 4.0, 20.0 - 4.0)


def unfused_rope_time(x: Candidates):
    """(forward, backward) seconds a layer's RoPE takes beyond TransformerEngine's fused kernel where
    Megatron-Core runs its unfused one: ``apply_rotary_pos_emb`` falls back to it whenever the cos / sin
    scale (``ModelSpec.rope_concentration``, YaRN's concentration factor on GQA attention: GPT-OSS's
    1.35) is not 1 ("mscale ... is not supported by TE's fused RoPE. Using unfused implementation",
    NVIDIA/Megatron-LM core_v0.16.0 - core_v0.18.0 ``rope_utils.py``, the cores of Megatron-Bridge 26.02 -
    26.06; ``attention.py`` passes ``_yarn_get_concentration_factor_from_config`` for both the query and
    the key). ``UNFUSED_ROPE_BYTES`` per element of the TP rank's query and key heads, HBM-bound; a
    CUDA graph replays the same kernels. Zero for plain RoPE."""
    model = x.model
    if model.rope_concentration == 1.0:
        return np.zeros_like(x.t, dtype=float), np.zeros_like(x.t, dtype=float)
    elements = x.tokens * (model.num_attention_heads + model.query_groups) * model.head_dim / x.t
    return tuple(b * elements / x.hbm for b in UNFUSED_ROPE_BYTES)


def dsv4_output_groups_bf16_time(x: Candidates):
    """(forward, backward) seconds DeepSeek-V4's grouped output projection (wo_a: heads x v_head_dim x
    o_lora_rank weights in o_groups groups) takes beyond what the layer's Linear GEMMs price for it:
    Megatron-LM's DSv4HybridAttention (NVIDIA/Megatron-LM@caeff8c80d
    ``experimental_attention_variant/deepseek_v4_hybrid_attention.py``) runs it as
    ``torch.einsum("...gd,grd->...gr")`` on a plain Parameter, not a TransformerEngine module, so no FP8
    recipe quantizes it: one batched GEMM at the BF16 peak instead of the recipe's. Zero in BF16; the
    backward (dgrad, wgrad) twice the forward."""
    model = x.model
    params = model.num_attention_heads * model.v_head_dim * model.o_lora_rank
    bf16 = linear_time(x, params, gemms=1.0, peak=gemm.bf16_peak(x.hw))
    forward = np.maximum(bf16 - linear_time(x, params, gemms=1.0), 0.0)
    return forward, 2.0 * forward


# DeepSeek-V4's compressor and indexer GEMMs as NVIDIA/Megatron-LM@d48bd6be0a (the dev branch: its
# examples/moe_recipes/deepseek_v4_flash/gb200/mxfp8_SL4K_128GPU_TP1PP1EP64.yaml is these rows' layout)
# ``experimental_attention_variant/csa.py`` builds and runs them: each Compressor's ``linear_wkv`` and
# ``linear_wgate`` (hidden -> coff x head_dim) and the indexer's ``linear_weights_proj`` (hidden -> index
# heads) under ``get_fp8_disabled_context`` (BF16 whatever the recipe); the indexer's ``linear_wq_b`` in
# the recipe's precision. ``CompressedSparseAttention._forward_fused_indexer_training`` feeds the indexer
# ``x.detach()`` and ``qr.detach()``: its three Linears and its compressor's two compute no input gradient,
# only the weight gradient (two passes, not three). As (params, BF16, passes) per layer of each ratio.
def dsv4_compressor_gemms(model, ratio: int) -> tuple:
    """The (params, runs in BF16, passes) of one DeepSeek-V4 layer's compressor and indexer GEMMs."""
    h, d = model.hidden_size, model.v_head_dim
    if ratio == 128:
        return ((2 * h * d, True, 3.0),)
    if ratio != 4:
        return ()
    heads, dim = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim
    return ((2 * h * 2 * d, True, 3.0), (2 * h * 2 * dim, True, 2.0), (h * heads, True, 2.0),
            (model.q_lora_rank * heads * dim, False, 2.0))


def dsv4_compressor_gemms_time(x: Candidates):
    """(forward, backward) seconds DeepSeek-V4's compressor and indexer GEMMs take beyond what the layer's
    Linear GEMMs price for them (every weight at the recipe's peak, three passes), averaged over the decoder
    layers: each GEMM at its own size, BF16 where Megatron-LM keeps it so, and the indexer's two passes
    (``dsv4_compressor_gemms``)."""
    ratios = x.model.dsv4_decoder_ratios
    forward = backward = 0.0
    for ratio in ratios:
        for params, bf16, passes in dsv4_compressor_gemms(x.model, ratio):
            priced = linear_time(x, params, gemms=1.0)
            run = linear_time(x, params, gemms=1.0, peak=gemm.bf16_peak(x.hw)) if bf16 else priced
            forward = forward + run - priced
            backward = backward + (passes - 1.0) * run - 2.0 * priced
    return forward / len(ratios), backward / len(ratios)


# FlashMLA's SM100 sparse forward for 64 heads (deepseek-ai/FlashMLA@9241ae3
# ``csrc/sm100/prefill/sparse/fwd/head64/config.h`` B_TOPK 64, ``phase1.cuh``: num_k_blocks =
# ceil(topk_length / B_TOPK), topk_length = params.topk where none is given) runs every 64-key block it is
# handed, valid or masked; Megatron-LM's ``_csa_fwd_flash_mla`` (d48bd6be0a
# ``csa_utils/fused_sparse_attention.py``) pads the index list to that alignment.
FLASH_MLA_SPARSE_BLOCK = 64


def dsv4_forward_key_slots(model, ratio: int, s: int) -> float:
    """Key slots FlashMLA's sparse forward computes per query on a DeepSeek-V4 layer of ``ratio``, mean
    over a causal sequence of ``s``: ratio-4 layers (``_forward_fused_indexer_training``) compact each
    query's valid keys (indexer top-k of its (p + 1) // 4 compressed keys, its window) into a prefix of
    ``topk_length`` run in whole blocks; ratio-128 and window-only layers (``_forward_fused_no_indexer``,
    ``build_flat_topk_idxs`` without ``compact``) pass no ``topk_length``: the window and all s // 128
    compressed slots, padded to the block."""
    block, window = FLASH_MLA_SPARSE_BLOCK, model.csa_window_size
    if ratio == 4:
        p = np.arange(1, s + 1)
        valid = np.minimum(model.dsa_indexer_topk, p // 4) + np.minimum(window, p)
        return float(np.mean(np.ceil(valid / block) * block))
    return float(np.ceil((window + (s // 128 if ratio == 128 else 0)) / block) * block)


def dsv4_padded_key_slots_time(x: Candidates):
    """(forward, backward) seconds of the attention core's key slots FlashMLA's sparse forward computes
    beyond the keys ``flops.dsv4_sparse_context`` prices (``dsv4_forward_key_slots``), averaged over the
    decoder layers, at the attention core's priced rate; the backward (cuDNN's DSA kernel, no source) as
    priced."""
    model = x.model
    s = model.seq_length
    ratios = model.dsv4_decoder_ratios
    extra = sum(dsv4_forward_key_slots(model, r, s) - flops.dsv4_sparse_context(model, r, s) for r in ratios)
    extra_flops = x.b * s * 2.0 * model.num_attention_heads * (extra / len(ratios)) * (model.qk_dim + model.v_dim) / x.t
    core = flops.attention_core_flops(model, x.b, s, causal=x.flash) / x.t
    forward = attention_time(x) * extra_flops / core
    return forward, np.zeros_like(forward)


def dsv4_attention_kernels(x: Candidates) -> tuple:
    """DeepSeek-V4's attention work beyond the sparse attention core, (forward, backward) pairs of the MoE
    layer's kernels: the DSA indexer's top-k and its sparse loss, the grouped output projection in BF16,
    the compressors' gated pooling, the compressor and indexer GEMMs as they run (BF16, the indexer's two
    passes), the key slots FlashMLA's sparse forward computes beyond the keys priced."""
    return (dsa.dsa_indexer_topk_time(x), dsa.dsa_indexer_loss_time(x), dsv4_output_groups_bf16_time(x),
            dsv4.dsv4_compressor_time(x),
            dsv4_compressor_gemms_time(x),
            dsv4_padded_key_slots_time(x))


def dsa_attention_kernels(x: Candidates) -> tuple:
    """DeepSeek Sparse Attention's work beyond its attention core on every layer of a DSA model (GLM-5), dense
    and MoE alike, as (forward, backward) pairs: the indexer's top-k over its FP32 scores and its sparse KL
    loss, the two kernels DeepSeek-V4 runs on its ratio-4 layers (``dsa.dsa_indexer_topk_time``,
    ``dsa.dsa_indexer_loss_time``)."""
    return (dsa.dsa_indexer_topk_time(x), dsa.dsa_indexer_loss_time(x))


def hash_routed_router_time(x: Candidates):
    """The router's (forward, backward) seconds averaged over the MoE layers: DeepSeek-V4's first
    ``moe_n_hash_layers`` route by a vocabulary table (Megatron-Bridge ``moe_n_hash_layers``, the
    checkpoint's ``tid2eid``), running no router GEMM or scoring; the others as ``router_time``."""
    share = 1.0 - x.model.moe_n_hash_layers / x.model.num_moe_layers
    return tuple(share * t for t in router_time(x))


def forward_time(x: Candidates, t_linear, attention, softmax, kind: LayerKind | bool):
    """One layer's forward: GEMMs, attention core, elementwise kernels (norms, activation,
    residuals: bytes in proportion to what the layer saves), unfused softmax, fixed overhead:
    the kernel launches a CUDA graph replays in one
    (``layer_overhead_s``). A MoE layer's calls per local expert are priced on their own
    (``moe_expert_calls``). A hybrid layer without attention has no attention core or softmax."""
    kind = as_kind(kind)
    eff = x.hw.efficiency
    t_elementwise = eff.elementwise_bytes_per_token_hidden / 34.0 * activation_bytes(x, kind, False) / x.hbm
    launches = np.where(x.knob_is("cuda_graph", "none"), eff.layer_overhead_s, 0.0)
    if not kind.attention:
        return t_linear + t_elementwise + launches
    return t_linear + attention + t_elementwise + softmax + launches


# TransformerEngine's GroupedLinear calls per local expert and pass: one cuBLAS GEMM per expert for
# the forward, two (dgrad, wgrad) for the backward, and under a quantized recipe one quantize per
# expert of the GEMM input (forward) or output gradient (backward). The quantize's host work per split
# is more than its kernel launch: ``tex.split_quantize`` (TransformerEngine d0067d0da
# ``pytorch/csrc/extensions/cast.cpp``) converts each split's Python quantizer to C++
# (``convert_quantizer``) and builds one Python tensor object per split (``bulk_allocate_mxfp8_tensors``
# / ``_nvfp4_`` / ``_fp8_blockwise_``: ``MXFP8TensorStoragePythonClass(...)`` etc. in a loop, four
# ``py::cast`` tensors each; per-tensor FP8 ``create_tensor`` per split). NVFP4's fused kernel
# (``FUSED_NVFP4``, ``split_quantize_nvfp4_impl``) fuses the launches only, so NVFP4 counts one per
# split as the others do. A MoE layer's experts run two GroupedLinears (FC1, FC2).
EXPERT_GEMMS = (1.0, 2.0)
EXPERT_QUANTIZES = (1.0, 1.0)
GROUPED_LINEARS = 2.0


def moe_expert_calls(x: Candidates):
    """(forward, backward) seconds of a MoE layer's fixed cost per call per local expert
    (``moe_expert_call_s``): what Megatron-Core and TransformerEngine run once for every local
    expert, whatever its tokens.

    Megatron-Core's TEGroupedMLP (``megatron/core/transformer/moe/experts.py``: ``linear_fc1`` ->
    activation -> ``linear_fc2``, Megatron-LM core_v0.16.0) calls TransformerEngine's GroupedLinear,
    which in the containers of every published MoE row (NeMo 25.09-25.11: TE 2.7 / 2.9; Megatron-
    Bridge 26.02-26.06: TE 2.12, 2.14, 2.16, Bridge's ``docs/releases/software-versions.md``) splits
    its input per expert and quantizes each split apart (``tex.split_quantize``: one quantize per
    tensor, ``multi_tensor_quantize_impl``), fetches each expert's quantized weight in a Python loop
    (``get_weight_workspace``) and runs ``general_grouped_gemm`` -> ``te_general_grouped_gemm`` ->
    ``nvte_multi_tensor_gemm``, which loops one cuBLAS GEMM per expert over four compute streams
    (``multi_stream_cublas_gemm``: a cublasLt heuristic query and launch each); the backward repeats
    the split-quantize on the output gradient and runs a dgrad and a wgrad GEMM per expert, then
    hands each expert's weight gradient to Megatron's DDP in a Python loop (TransformerEngine v2.14,
    f031cf87bd, ``transformer_engine/pytorch/module/grouped_linear.py`` lines 145-215 forward,
    345-525 backward; ``transformer_engine/common/gemm/cublaslt_gemm.cu`` lines 969-1022 and
    1051-1075). CUTLASS's single grouped kernel runs only on Hopper under
    ``NVTE_USE_CUTLASS_GROUPED_GEMM`` (no recipe sets it), and the GroupedTensor path with device-side
    splits (``use_grouped_tensor``, one cuBLASLt grouped GEMM) only from Megatron-LM 883533e049
    (2026-08-14, ``moe_use_grouped_tensor``, default off) - later than every row. So the count of
    per-expert calls per pass is ``EXPERT_GEMMS`` plus, under a quantized recipe, ``EXPERT_QUANTIZES``
    (BF16: 2 forward, 4 backward per expert; FP8 / MXFP8 / NVFP4: 4 and 6), and each costs the host
    the same time (``expert_call_count``). In the plain 1F1B schedules the GPU waits for the
    forward's calls only: the dropless dispatcher syncs the host with the GPU before every forward
    all-to-all, so the host issues the forward's experts with the GPU's queue empty, while the
    backward has no sync (its all-to-alls reuse the forward's splits) and the host issues its calls
    ahead of the GPU's work; under the 1F1B all-to-all overlap both passes' calls bound the layer
    instead (``combined_host_stall``). Priced under CUDA graphs as well: a graph replays the same
    per-expert kernels (their host share goes, their GPU share stays, and the split is not known),
    and the newer recipes' full-iteration graphs also pad every expert to a capacity, which the
    cost model does not price;
    dropping the cost under a graph moved the newer MoE rows 17.0 -> 16.8 % and their worst row
    90 -> 116 % (benchmarks/RESULTS.md, issue 22 helper h6-experts). A plan that runs TE's fused
    CuTe-DSL grouped MLP (``cutedsl_fused_grouped_mlp``) has no such loop: ``fused_grouped_mlp_calls``
    instead (``expert_calls`` picks). Returns (forward, 0): the backward's calls are not waited for."""
    forward, _ = expert_call_count(x)
    return x.hw.efficiency.moe_expert_call_s * forward, np.zeros_like(forward)


def expert_call_count(x: Candidates):
    """(forward, backward) per-expert calls of one MoE layer and micro-batch on one GPU: the local
    experts' ``EXPERT_GEMMS`` and, under a quantized recipe, ``EXPERT_QUANTIZES`` for each of the
    ``GROUPED_LINEARS``, each costing the host ``moe_expert_call_s``."""
    per_pass = moe.local_experts(x.model, x.e) * GROUPED_LINEARS
    q = x.quantized_fraction
    return tuple(per_pass * (gemms + quantizes * q) for gemms, quantizes in zip(EXPERT_GEMMS, EXPERT_QUANTIZES))


def combined_host_stall(x: Candidates, layer_time):
    """Seconds per MoE layer and micro-batch the GPU waits for the host under the 1F1B all-to-all
    overlap (``overlap_moe_expert_parallel_comm``) without a CUDA graph over the experts: what one
    host thread needs to issue the layer's per-expert calls of both micro-batches
    (``expert_call_count``, forward and backward) and the forward's other calls after its sync
    (``post_sync_call_count``), at ``moe_expert_call_s`` each, beyond the layer's priced time
    ``layer_time`` (which holds the forward's calls already, ``moe_expert_calls`` and
    ``post_sync_host_calls``).

    Megatron-Core runs that overlap as a combined schedule (``megatron/core/models/common/
    model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run``, core_v0.15.0): for every
    layer one Python thread issues one micro-batch's forward (attention, router, dispatch, experts,
    combine) and another's backward (combine, experts' dgrad, ``backward_dw``, dispatch, attention)
    in one interleaved sequence. The forward's dispatch needs the token counts on the host before
    its all-to-all: the alltoall dispatcher's ``_maybe_dtoh_and_synchronize`` at
    ``before_ep_alltoall`` (``token_dispatcher.py``, dropless: ``input_splits`` / ``output_splits``
    on the CPU), DeepEP's dispatch returning ``num_recv_tokens_per_expert_list`` and HybridEP's
    blocking dispatch without a capacity (``fused_a2a.py``, ``_HybridEPManager``, core_v0.16.0), so
    the host waits there for the GPU every layer and can never queue more than the one layer pair
    ahead: the layer pair takes at least the host's time to issue it. TransformerEngine's
    GroupedLinear issues each local expert's quantize and GEMM from Python (``moe_expert_calls``),
    so that host time grows with the local experts and not with the tokens. In the plain 1F1B
    schedules the backward has no sync (its all-to-alls reuse the forward's splits) and the host
    issues it ahead of the GPU: only the forward's calls are waited for (``moe_expert_calls``).
    One constant prices both: fitted with this floor and the post-sync calls, ``moe_expert_call_s``
    is 70 us (85 us with the per-expert calls alone), and the rows that run the overlap with 16
    local experts and no graph (Qwen3-235B B200 / B300 PP8 EP8, Qwen3-30B H100 PP2 EP8) measure
    13-17 ms per layer and micro-batch, 160 per-expert calls at 82-104 us each (benchmarks/RESULTS.md,
    session 37 s37h3; session 54 s54h1 for the post-sync calls). A full-iteration
    CUDA graph replays the whole step without the host: nothing then. The warm-up and cool-down
    micro-batches (plain forwards and backwards) are priced alike."""
    if not x.model.is_moe:
        return np.zeros_like(x.t, dtype=float)
    combined = x.flag("overlap_moe_expert_parallel_comm") & ~x.knob_is("cuda_graph", "full_iteration") & ~x.dualpipe
    forward, backward = expert_call_count(x)
    host = (forward + backward + post_sync_call_count(x)) * x.hw.efficiency.moe_expert_call_s
    return np.where(combined, np.maximum(host - layer_time, 0.0), 0.0)


# The host calls of a MoE layer's forward after the dropless dispatcher's host sync (token counts to the
# CPU before the all-to-all), besides the per-expert loop (``moe_expert_calls``), counted from Megatron-LM
# d98e8a64dd ``megatron/core/transformer/moe/`` (``moe_layer.py`` ``MoELayer.forward``: dispatch ->
# routed_experts_compute -> combine -> postprocess; the shared experts and the router run before the sync).
# alltoall (``token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``, sync ``before_ep_alltoall``, fused
# permutation): the tokens' and the probabilities' all-to-all, the combine's all-to-all and the fused
# unpermute; with several local experts the fused ``sort_chunks_by_idxs`` after the dispatch and before the
# combine; with expert TP the tokens' and probabilities' all-gathers and the reduce-scatter.
ALLTOALL_POST_SYNC_CALLS = 4.0
ALLTOALL_SORT_CALLS = 2.0
ALLTOALL_ETP_CALLS = 3.0
# flex / DeepEP (``_DeepepManager``; ``fused_a2a.py`` ``FusedDispatch``: the host waits in
# ``buffer.dispatch`` for the GPU's token counts): the dispatch kernel and its stream wait, the unfused
# ``_indices_to_multihot`` (two zeros, the mask, its sum, arange, repeat_interleave, the index, two index_puts,
# the probabilities' gather, the cast: 11), ``tokens_per_expert.sum().item()``, the fused permute, the fused
# unpermute, the combine kernel and its stream wait.
DEEPEP_POST_SYNC_CALLS = 2.0 + 11.0 + 2.0 + 1.0 + 1.0 + 2.0
# flex / HybridEP (``_HybridEPManager``: ``dispatch_with_permute`` blocks in its metadata preprocessing
# without a capacity, deepseek-ai/DeepEP@94a9f8f ``deep_ep/hybrid_ep_buffer.py``): the fused dispatch and
# permute, ``tokens_per_expert.to(int64)`` and its ``sum``, the fused unpermute and combine.
HYBRIDEP_POST_SYNC_CALLS = 4.0
# ``TEGroupedMLP.forward`` (``experts.py``) besides each expert's quantize and GEMM: ``tokens_per_expert
# .tolist()``, the probabilities' ``unsqueeze``, the two GroupedLinear module calls and the weighted
# activation: one fused kernel for a GLU (``weighted_bias_swiglu_impl`` / ``_quick_geglu_``), else the
# activation (squared ReLU: ``relu``, ``pow``), the product with the probabilities and the cast (4).
EXPERT_MODULE_CALLS = 4.0
GLU_ACTIVATION_CALLS, PLAIN_ACTIVATION_CALLS = 1.0, 4.0
# Quantized, not HybridEP: ``Fp8Padding`` of the tokens and of the probabilities, ``Fp8Unpadding`` after FC2.
QUANTIZATION_PADDING_CALLS = 3.0
# After the combine: the shared experts' output added (``MoELayer.postprocess``), LatentMoE's
# ``fc2_latent_proj`` (a Linear: its GEMM and, quantized, its input's quantize), the layer's residual add.
RESIDUAL_CALLS = 1.0


def flex_backend(x: Candidates):
    """The flex dispatcher's backend as a mask function (``dispatch.is_named``), or None where the
    plans state none (read as DeepEP, as ``dispatch.dispatcher_sms`` does)."""
    name = "moe_flex_dispatcher_backend"
    return partial(x.knob_is, name) if name in x.knobs else None


def post_sync_call_count(x: Candidates):
    """Host calls of one MoE layer's forward that the dropless dispatcher's sync leaves the GPU
    waiting for, beyond the per-expert loop (``expert_call_count``): the dispatcher's own after the
    sync (``ALLTOALL_POST_SYNC_CALLS`` .., ``DEEPEP_POST_SYNC_CALLS``, ``HYBRIDEP_POST_SYNC_CALLS``),
    the experts' module calls and weighted activation, the quantization padding, the shared
    experts' add, LatentMoE's output projection and the residual add."""
    model = x.model
    dispatcher = partial(x.knob_is, "moe_token_dispatcher_type")
    backend = flex_backend(x)
    flex = dispatcher("flex")
    hybridep = flex & (backend("hybridep") if backend else False)
    local = moe.local_experts(model, x.e)
    alltoall = (ALLTOALL_POST_SYNC_CALLS + np.where(local > 1, ALLTOALL_SORT_CALLS, 0.0)
                + np.where(x.et > 1, ALLTOALL_ETP_CALLS, 0.0))
    dispatch_calls = np.where(hybridep, HYBRIDEP_POST_SYNC_CALLS, np.where(flex, DEEPEP_POST_SYNC_CALLS, alltoall))
    activation = GLU_ACTIVATION_CALLS if model.gated_mlp else PLAIN_ACTIVATION_CALLS
    q = x.quantized_fraction
    padding = np.where(hybridep, 0.0, QUANTIZATION_PADDING_CALLS * q)
    after = (RESIDUAL_CALLS + (model.shared_expert_ffn_hidden_size > 0)
             + (model.moe_latent_size is not None) * (1.0 + q))
    return dispatch_calls + EXPERT_MODULE_CALLS + activation + padding + after


def post_sync_host_calls(x: Candidates):
    """(forward, backward) seconds the GPU waits for the host in a MoE layer's forward after the
    dropless dispatcher's sync, besides the per-expert loop: with the GPU's queue emptied by the
    sync (``combined_host_stall`` names where each dispatcher waits), every call the host issues
    until it is ahead again is waited for, the dispatch, permutations, experts' module calls,
    combine and the adds alike (``post_sync_call_count``), each at the per-call constant
    ``moe_expert_call_s``. None under a full-iteration CUDA graph (no sync: the recipes that run it
    size the dispatch by a capacity) and none in the backward (no sync: its all-to-alls reuse the
    forward's splits)."""
    synced = ~x.knob_is("cuda_graph", "full_iteration")
    forward = np.where(synced, post_sync_call_count(x) * x.hw.efficiency.moe_expert_call_s, 0.0)
    return forward, np.zeros_like(forward)


# TransformerEngine's fused MoE grouped MLP (Megatron-Bridge ``cutedsl_fused_grouped_mlp``: TE v2.16,
# 4220403e8, ``transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py`` and
# ``backward_grouped_mlp.py``, the container of the 26.06+ rows per Megatron-Bridge v0.5.0
# ``docs/releases/software-versions.md``): kernels per pass over ALL local experts at once. Forward:
# ``tex.group_quantize`` of FC1's input (one MXFP8 quantize for every split), cuDNN's CuTe-DSL
# ``grouped_gemm_glu_wrapper_sm100`` (FC1 + GLU + routing-probability scale + MXFP8 quantize of FC2's
# input, rowwise and columnwise, in the epilogue) and ``grouped_gemm_quant_wrapper_sm100`` (FC2).
# Backward: ``tex.bgrad_group_quantize`` / ``group_quantize`` of the output gradient,
# ``grouped_gemm_dglu_wrapper_sm100`` (FC2 dgrad + GLU backward + quantize), ``grouped_gemm_quant``
# (FC1 dgrad) and one grouped wgrad per GroupedLinear (``grouped_gemm_wgrad_wrapper_sm100``, else
# ``general_grouped_gemm_for_grouped_tensor``): no per-expert loop in either pass.
FUSED_MLP_KERNELS = (3.0, 5.0)
# Megatron-Core pads every expert's tokens to 256 rows for the fused kernel
# (``moe_utils.get_align_size_for_quantization``: "TE's grouped-tensor and fused grouped-MLP kernels
# require 256-token alignment", Megatron-LM d98e8a64dd): half a tile per local expert on average.
FUSED_MLP_ALIGN_TOKENS = 256


def fused_grouped_mlp_calls(x: Candidates, t_experts):
    """(forward, backward) seconds the fused CuTe-DSL grouped MLP adds to the routed experts' GEMMs
    (``t_experts``, the forward) in place of ``moe_expert_calls``: its forward's ``FUSED_MLP_KERNELS``
    launches, each at the fitted cost of one call (``moe_expert_call_s``) whatever the number of
    local experts (the backward's, like the looped backward's calls, are not waited for), and the
    rows each local expert is padded by to ``FUSED_MLP_ALIGN_TOKENS`` (half an alignment on average)
    at the routed experts' GEMM speed, twice over in the backward (dgrad and wgrad), and the
    backward's dGLU kernel's bias-gradient reduction where a container's kernels regressed it
    (``dglu_dbias_regression_time``). The GLU, the probability scale and the MXFP8 quantizes run in
    the GEMMs' epilogues: their bytes stay priced as the unfused kernels' (``activation_bytes``)."""
    forward_launches = x.hw.efficiency.moe_expert_call_s * FUSED_MLP_KERNELS[0]
    padding = padded_rows_time(x, t_experts, FUSED_MLP_ALIGN_TOKENS)
    return forward_launches + padding, 2.0 * padding + dglu_dbias_regression_time(x, t_experts)


# The fused MLP's backward kernel ``grouped_gemm_dglu_wrapper_sm100`` (FC2's data gradient, the GLU's
# backward and, with ``generate_dbias``, FC1's bias gradient in its epilogue: cudnn-frontend
# ``python/cudnn/grouped_gemm/grouped_gemm_dglu/moe_blockscaled_grouped_gemm_dglu_dbias.py``
# ``dbias_reduction``, run once per epilogue subtile, so its work grows with the GEMM's output rows x
# columns as the GEMM's own does at a fixed K). TransformerEngine asks for the bias gradient when FC1
# has a bias (TE ``ops/fused/backward_grouped_mlp.py`` ``is_fc1_bias_supported``). Under CUTLASS DSL
# 4.5 that loop spilled to local memory: NVIDIA/cudnn-frontend issue 256 ("became 10x slower between
# cudnn-frontend v1.23.0 and v1.24.0 for a grouped GEMM dGeGLU MoE workload in GPT-OSS-20B", the kernel
# BlockScaledMoEGroupedGemmDgluDbiasKernel, "persists in v1.25.0"), fixed by PR 322 ("Fix grouped GEMM
# dGLU dbias reduction DSL 4.5 regression", merged 2026-06-23, before v1.26.0 of 2026-07-07), whose
# SM100 benchmark at the issue's shape (GPT-OSS-20B: hidden = expert FFN = 2,880, as GPT-OSS-120B) gives
# these medians, microseconds, with CUTLASS DSL 4.5.0:
DGLU_DBIAS_US = {"no_dbias": 138.960, "dbias_fixed": 155.632, "dbias_regressed": 1362.768}
# The cuDNN frontend releases whose dGLU kernel carries the loop PR 322 rewrote: [first, fixed).
DGLU_DBIAS_REGRESSED_FRONTEND = ((1, 24), (1, 26))
DGLU_DBIAS_REGRESSED_DSL = (4, 5)


def dglu_dbias_regressed(x: Candidates) -> np.ndarray:
    """Whether each plan's stated container (``CUDNN_FRONTEND_COLUMN``, ``CUTLASS_DSL_COLUMN``) runs
    the regressed dGLU bias-gradient loop (``DGLU_DBIAS_REGRESSED_FRONTEND`` under CUTLASS DSL
    ``DGLU_DBIAS_REGRESSED_DSL`` or later); a plan that states neither (a search) runs a current one."""
    if CUDNN_FRONTEND_COLUMN not in x.knobs or CUTLASS_DSL_COLUMN not in x.knobs:
        return np.zeros((), dtype=bool)
    (first, fixed), frontend = DGLU_DBIAS_REGRESSED_FRONTEND, x.knobs[CUDNN_FRONTEND_COLUMN]
    return (te_at_least(frontend, *first) & ~te_at_least(frontend, *fixed)
            & te_at_least(x.knobs[CUTLASS_DSL_COLUMN], *DGLU_DBIAS_REGRESSED_DSL))


def fc2_gemm_share(model) -> float:
    """FC2's share of a routed expert's forward GEMM FLOPs (its data gradient's share as well):
    the expert FFN over FC1's output width plus it (1/3 with a GLU)."""
    return 1.0 / ((2.0 if model.gated_mlp else 1.0) + 1.0)


def dglu_dbias_regression_time(x: Candidates, t_experts):
    """Backward seconds the regressed bias-gradient loop (``DGLU_DBIAS_US``) adds to the fused MLP's
    dGLU kernel: its excess over the fixed kernel, in units of the same kernel without the bias
    gradient (8.69x), times that kernel as priced, FC2's data-gradient GEMM (``fc2_gemm_share`` of the
    routed experts' forward GEMMs ``t_experts``, at their speed). Only a model with expert biases and a
    GLU asks for it; zero unless ``dglu_dbias_regressed``."""
    model = x.model
    if not (model.is_moe and model.add_bias_linear and model.gated_mlp):
        return np.zeros_like(np.asarray(t_experts, dtype=float))
    excess = (DGLU_DBIAS_US["dbias_regressed"] - DGLU_DBIAS_US["dbias_fixed"]) / DGLU_DBIAS_US["no_dbias"]
    return np.where(dglu_dbias_regressed(x), excess * fc2_gemm_share(model) * t_experts, 0.0)


def padded_rows_time(x: Candidates, t_experts, align):
    """Forward seconds of the rows each local expert's segment is padded by to a multiple of
    ``align`` (half an alignment on average) at the routed experts' GEMM speed: ``t_experts`` over
    the busiest rank's rows per local expert (the T*k copies of all ep*etp GPUs that feed it), every
    local expert's share alike."""
    routed = moe.tokens_per_expert(x.model, x.tokens / x.t, x.e, x.et) * x.imbalance
    return t_experts * (np.asarray(align, dtype=float) / 2.0) / routed


# The rows Megatron-Core pads each local expert's segment to under a quantized recipe (Megatron-LM
# d98e8a64dd ``moe/moe_utils.py`` ``get_align_size_for_quantization``: ``fp8_utils.get_fp8_align_size``
# MXFP8 32, other FP8 16; ``fp4_utils.get_fp4_align_size`` 128; TransformerEngine d0067d0da
# ``quantization.get_align_size_for_quantization``, ``Fp8Padding``'s default, the same): HybridEP and
# NCCL-EP pad in their fused dispatch, the router under ``moe_router_padding_for_quantization``, and
# otherwise ``TEGroupedMLP`` pads with ``Fp8Padding`` (``moe/experts.py``, ``skip_routed_expert_padding``
# picks which): every quantized MoE run pays it, whatever its dispatcher.
QUANTIZATION_ALIGN_TOKENS = {"fp8-delayed": 16, "fp8-current": 16, "fp8-blockwise": 16, "mxfp8": 32, "nvfp4": 128}


def quantization_padding_time(x: Candidates, t_experts):
    """(forward, backward) seconds of the per-expert loop's padded rows under a quantized recipe
    (``QUANTIZATION_ALIGN_TOKENS``, ``padded_rows_time``), twice over in the backward (dgrad and
    wgrad); none in BF16. Small beside the routed rows (a local expert gets the copies of every EP
    rank): Nemotron 3 Super at EP 64, MBS 1, 22,528 rows per local expert, 16 padded under MXFP8."""
    align = sum(np.where(x.knob_is("precision", p), a, 0.0) for p, a in QUANTIZATION_ALIGN_TOKENS.items())
    padding = padded_rows_time(x, t_experts, align)
    return padding, 2.0 * padding


# Megatron-Core's paged stashing (``moe_paged_stash``, Megatron-LM d98e8a64dd
# ``megatron/core/transformer/moe/paged_stash.py``): under the full-iteration CUDA graph the fused
# grouped MLP's buffers have the static size of ``moe_expert_rank_capacity_factor`` (1.5) times the
# routed tokens, so the saved-for-backward tensors that TransformerEngine marks as grouped
# (``mark_grouped_tensor(saved_fc1_x, activation_in, scales, grouped_fc2_x)``, TE
# ``ops/fused/grouped_mlp.py``; only that op marks any) are copied, their real rows only, into a
# paged buffer after the forward (``paged_stash_copy_kernel``) and back before the backward
# (``paged_stash_pop_kernel``). Megatron-Bridge v0.5.0 ``Megatron-Bridge/scripts/performance/configs/
# {qwen,deepseek,gpt_oss}/*_llm_pretrain.py`` ``set_full_iter_cg_configs`` set it (with the 1.5
# capacity) on every MXFP8 full-iteration-graph recipe, the recipes that run the fused MLP.
# Per routed token copy, MXFP8 (only the columnwise copies are kept, ``mark_grouped_tensor``):
# FC1's input (h bytes + one E8M0 scale per 32), FC1's BF16 output (the GLU's input, 2 x 2f
# bytes gated), the routing probability (FP32) and FC2's input (f bytes + scales).
MXFP8_BLOCK = 32
STASH_PROB_BYTES = 4.0


def paged_stash_bytes_per_copy(model) -> float:
    """HBM bytes one routed token copy's stashed tensors hold (``paged_stash_time``)."""
    h, f = moe.routed_width(model), model.expert_ffn_hidden_size
    fc1_out = (2.0 if model.gated_mlp else 1.0) * f
    scaled = 1.0 + 1.0 / MXFP8_BLOCK
    return h * scaled + 2.0 * fc1_out + STASH_PROB_BYTES + f * scaled


def paged_stash_time(x: Candidates):
    """(forward, backward) seconds of paged stashing's copies on the busiest EP rank: each stashed
    byte read and written once into the paged buffer (forward) and once back (backward), at the
    GPU's HBM bandwidth; the copies run on a side stream beside the compute but move their bytes
    through the same HBM (priced exposed, as the casts and permutations are)."""
    one = 2.0 * received_copies(x) * paged_stash_bytes_per_copy(x.model) / x.hbm
    return one, one


def expert_calls(x: Candidates, t_experts):
    """The routed experts' calls: the fused grouped MLP's where the plan runs it
    (``cutedsl_fused_grouped_mlp``), plus paged stashing's copies under the full-iteration CUDA
    graph (``paged_stash_time``), else TransformerEngine's per-expert loop (``moe_expert_calls``) and its
    segments' padding to the quantization alignment (``quantization_padding_time``)."""
    looped = tuple(c + p for c, p in zip(moe_expert_calls(x), quantization_padding_time(x, t_experts)))
    fused = x.flag("cutedsl_fused_grouped_mlp")
    if not fused.any():
        return looped
    stashed = fused & x.knob_is("cuda_graph", "full_iteration")
    stash = paged_stash_time(x)
    return tuple(np.where(fused, f + np.where(stashed, s, 0.0), l)
                 for f, s, l in zip(fused_grouped_mlp_calls(x, t_experts), stash, looped))


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
        gemm.bf16_peak(x.hw) * x.hw.efficiency.gemm_max)
    stream_time = x.tokens * finetune.adapter_stream_elements(x.model, x.t, x.sp) * finetune.ADAPTER_BYTES / x.hbm
    tp_group = x.tp_ranks
    collectives = sum(count * tp_group.reduce_scatter_time(finetune.ADAPTER_BYTES * x.tokens * width)
                      for width, count in finetune.adapter_collectives(x.model, x.t, x.sp, x.flag("tp_comm_overlap"),
                                                                             x.flag("lora_input_regather")))
    return np.maximum(flops_time, stream_time) + collectives


def moe_block_input_elements(model) -> float:
    """Elements per token entering a MoE block's GEMMs: its top-k experts' FC1 (on the latent
    width under LatentMoE, which adds its two projections' inputs) and FC2, and the shared experts'."""
    h = model.hidden_size
    shared = h + model.shared_expert_ffn_hidden_size if model.shared_expert_ffn_hidden_size else 0
    latent = h + model.moe_latent_size if model.moe_latent_size else 0
    width = model.moe_latent_size or h
    return model.moe_router_topk * (width + model.expert_ffn_hidden_size) + shared + latent


def block_gemm_input_elements(model, kind: LayerKind) -> float:
    """Elements per token entering the GEMMs of a hybrid layer's one block (``gemm_input_elements``)."""
    h = model.hidden_size
    if kind.mamba:
        return h + model.mamba_inner
    if kind.attention:
        return h + model.num_attention_heads * model.head_dim
    if kind.is_moe:
        return moe_block_input_elements(model)
    return h + model.ffn_hidden_size


def gemm_input_elements(x: Candidates, kind: LayerKind | bool) -> float:
    """Elements per token entering a layer's Linear GEMMs (each cast to FP8 under a recipe): the
    attention's inputs, then FC1's and FC2's (a MoE layer: its top-k and shared experts')."""
    model = x.model
    kind = as_kind(kind)
    if not kind.standard:
        return block_gemm_input_elements(model, kind)
    is_moe = kind.is_moe
    h = model.hidden_size
    if model.multi_latent_attention:
        attention = h + (model.q_lora_rank or 0) + model.kv_lora_rank + model.num_attention_heads * model.v_dim
    else:
        attention = h + model.num_attention_heads * model.head_dim
    if not is_moe:
        return attention + h + model.ffn_hidden_size
    shared = h + model.shared_expert_ffn_hidden_size if model.shared_expert_ffn_hidden_size else 0
    return attention + model.moe_router_topk * (h + model.expert_ffn_hidden_size) + shared


def activation_input_elements(x: Candidates, kind: LayerKind | bool):
    """Elements per GPU of the activation's input (gate and up) in one layer: the MLP's, or a MoE
    layer's routed copies (``imbalance`` times the even share, ETP-split FFN) and shared experts';
    none in a hybrid layer without an FFN."""
    model, tokens = x.model, x.tokens / x.t
    kind = as_kind(kind)
    if kind.ffn is None:
        return 0.0
    if not kind.is_moe:
        return 2.0 * tokens * model.ffn_hidden_size
    routed = tokens * model.moe_router_topk * x.imbalance * model.expert_ffn_hidden_size
    return 2.0 * (routed + tokens * (model.shared_expert_ffn_hidden_size or 0))


def row_parallel_output_elements(x: Candidates, kind: LayerKind | bool) -> float:
    """Elements per token leaving a layer's row-parallel Linears (the attention projection and
    FC2: h each; a MoE layer's FC2 once per routed copy and shared expert; a hybrid layer's one
    block: its own)."""
    model = x.model
    h = model.hidden_size
    kind = as_kind(kind)
    if not kind.standard:
        if not kind.is_moe:
            return h
        return model.moe_router_topk * (model.moe_latent_size or h) + (h if model.shared_expert_ffn_hidden_size else 0)
    is_moe = kind.is_moe
    if not is_moe:
        return 2.0 * h
    return h + model.moe_router_topk * h + (h if model.shared_expert_ffn_hidden_size else 0)


def fp8_cast_time(x: Candidates, kind: LayerKind | bool):
    """Casting the GEMM inputs (forward) and output gradients (backward) to FP8 or NVFP4: HBM
    traffic (``candidates.CAST_BYTES``), less, for a frozen LoRA base, the column-wise copies
    TransformerEngine does not write (``finetune.frozen_column_copy_elements``); and where the
    SwiGLU's input is kept in FP8 (``activation_func_fp8_input_store``), its cast to E4M3 after
    the forward (2 B read, 1 B written) and back to BF16 before the backward (1 B read, 2 B
    written)."""
    inputs = gemm_input_elements(x, kind)
    cast_elements = 2.0 * x.tokens * inputs / x.t
    frozen = finetune.frozen_column_copy_elements(x.model, inputs, row_parallel_output_elements(x, kind))
    cast_traffic = x.cast_bytes * cast_elements - x.quantized_input_bytes * x.tokens * frozen / x.t
    stored = x.act_input_bytes < memory.ACT_INPUT_BYTES
    store = np.where(stored, 2.0 * (memory.ACT_INPUT_BYTES + memory.FP8_ACT_INPUT_BYTES), 0.0)
    return (x.quantized_fraction * cast_traffic + store * activation_input_elements(x, kind)) / x.hbm


def frozen_transpose_time(x: Candidates, params):
    """A LoRA run's frozen FP8 base weights (``params`` on the GPU) transposed for the dgrad GEMMs
    once per micro-batch (``finetune.frozen_transpose_bytes``), HBM-bound."""
    per_weight = finetune.frozen_transpose_bytes(x.model, x.quantized_weight_bytes, x.hw.mxfp8)
    return x.quantized_fraction * per_weight * params / x.hbm


def norm_recompute_time(x: Candidates):
    """The two norms run again in the backward pass (``layernorm``): each reads its BF16 input
    and writes its BF16 output, HBM-bound."""
    return 2 * 2 * memory.layer_input_bytes(x.model, x.b, x.s_local, x.t, x.sp) / x.hbm


def selective_recompute_time(x: Candidates, attention, softmax, kind: LayerKind | bool, moe_block=0.0):
    """Megatron's --recompute-modules: core_attn (attention core and unfused softmax),
    mla_up_proj (MLA's up projections), moe (the whole MoE block, ``moe_block`` forward),
    layernorm (the two norms, ``norm_recompute_time``; in a hybrid model only the E layer's).

    A hybrid model's layers (Megatron-LM d98e8a64dd ``models/hybrid/hybrid_layer_specs.py``
    ``hybrid_stack_spec``) fuse the pre-norm into the first Linear of the M, * and - layers
    (``TELayerNormColumnParallelLinear``: in_proj, linear_qkv, linear_fc1), leaving no norm module to
    recompute (``MambaLayer`` has no recompute path; ``TransformerLayer`` recomputes a norm only
    when it is not an ``IdentityOp``); the E layer keeps its own ``pre_mlp_layernorm`` (``TENorm``)."""
    kind = as_kind(kind)
    is_moe = kind.is_moe
    if not kind.standard:
        extra = (np.where(x.modules["core_attn"], attention + softmax, 0.0) if kind.attention
                 else np.zeros_like(x.t, dtype=float))
        if is_moe:  # the E layer's pre_mlp_layernorm: one of norm_recompute_time's two norms
            extra = extra + np.where(x.modules["layernorm"], norm_recompute_time(x) / 2.0, 0.0)
        return extra + (np.where(x.modules["moe"], moe_block, 0.0) if is_moe else 0.0)
    extra = np.where(x.modules["core_attn"], attention + softmax, 0.0)
    extra = extra + np.where(x.modules["layernorm"], norm_recompute_time(x), 0.0)
    if x.model.multi_latent_attention:
        extra = extra + np.where(x.modules["mla_up_proj"], linear_time(x, x.model.mla_up_params), 0.0)
    if x.model.hc_mult > 1:  # mhc: both blocks' Hyper-Connection forward again (mhc_recompute_time)
        extra = extra + np.where(x.modules["mhc"], dsv4.mhc_recompute_time(x), 0.0)
    return extra + (np.where(x.modules["moe"], moe_block, 0.0) if is_moe else 0.0)


def full_recompute_time(x: Candidates, forward):
    """Full recompute reruns the forward of the share of layers it covers."""
    return x.recomputed_fraction * forward


def cp_a2a_time(x: Candidates, ranks=None):
    """TransformerEngine's all-to-all context parallelism (``AttnFuncWithCPAndQKVOA2A``, TE
    ``attention/dot_product_attention/context_parallel.py``, DeepSpeed-Ulysses style): before the
    attention each of Q, K and V goes through one all-to-all over the CP group ("gather s and split
    h": every rank then holds the whole sequence for heads/cp of its heads), after it the output comes
    back the same way ("split s and gather h"); the backward moves dO in and dQ, dK, dV out. Eight
    all-to-alls of the local tensors per layer and micro-batch, CP ranks tp apart (Megatron's rank
    order), priced as the expert dispatch's all-to-all (``dispatch.alltoall_time``) and exposed: the
    attention waits for its inputs and the next layer for the output. ``ranks``: the all-to-all group
    (cp; the a2a+p2p kind's inner group, ``cp_hierarchical_time``): each rank sends its local tensors
    whatever the group's size."""
    model = x.model
    heads = model.num_attention_heads / x.t
    kv_heads = np.maximum(model.query_groups / x.t, 1.0)
    per_head = 2.0 * x.b * x.s_local  # BF16 bytes per head dimension of one local tensor
    q, o = per_head * heads * model.qk_dim, per_head * heads * model.v_dim
    k, v = per_head * kv_heads * model.qk_dim, per_head * kv_heads * model.v_dim
    ranks = x.c if ranks is None else ranks
    one_way = sum(dispatch.alltoall_time(x.hw, nbytes, ranks, x.t) for nbytes in (q, k, v, o))
    return 2.0 * one_way  # forward Q, K, V in and O out; backward dO in and dQ, dK, dV out


def cp_allgather_time(x: Candidates):
    """DeepSeek Sparse Attention's context parallelism (GLM-5), the only kind Megatron-LM runs for it
    (d98e8a64dd ``transformer_config.py``: "DSAttention context parallelism currently supports
    cp_comm_type=allgather only"; GLM5Bridge sets ``cp_comm_type`` "allgather"): ``DSAttention.forward``
    (``experimental_attention_variant/dsa.py``) all-gathers over the CP group, with
    ``gather_from_sequence_parallel_region``, the absorbed MLA's one latent key head (kv_lora_rank + rotary
    dims) and the indexer's key (index_head_dim) of every rank's s/cp tokens, BF16, whole on each TP rank
    (after the sequence-parallel gather); their gradients come back by reduce-scatter in the backward, and
    full recompute all-gathers again. Blocking collectives before the attention: exposed. CP ranks tp apart."""
    model, hw = x.model, x.hw
    gathered = 2.0 * x.b * model.seq_length * (model.kv_lora_rank + model.qk_pos_emb_head_dim
                                               + model.dsa_indexer_head_dim)
    gather = comm.reduce_scatter_time(hw, gathered, x.c, comm.ranks_per_domain(hw, x.c, x.t))
    return (2.0 + x.recomputed_fraction) * gather


def cp_kv_bytes(x: Candidates):
    """BF16 bytes of one CP rank's K and V chunk: b x s/cp tokens, a TP rank's query groups (at least
    one) of qk_dim + v_dim each. What a p2p hop carries, and each rank's share of the all-gather."""
    kv_heads_local = np.maximum(x.model.query_groups / x.t, 1.0)
    return 2.0 * x.b * x.s_local * (x.model.qk_dim + x.model.v_dim) * kv_heads_local


def cp_ring_time(x: Candidates, attention, ranks=None):
    """TE's p2p CP (``AttnFuncWithCPAndKVP2P``, Megatron's default): the local K/V chunk goes round a
    ring of ``ranks`` (cp; the a2a+p2p kind's outer ring, whose chunks are as large), (ranks-1) hops
    forward, K/V and dK/dV backward, partly hidden behind the attention computed meanwhile."""
    return _ring_hidden(x, _ring_exchange(x, ranks), attention)


def _ring_exchange(x, ranks=None):
    """``cp_ring_time``'s exchange before any of it is hidden (``x``: the structure's fields suffice)."""
    ranks = x.c if ranks is None else ranks
    same_domain = x.t * x.c <= x.hw.nvlink_domain
    return 3.0 * (ranks - 1) * comm.p2p_time(x.hw, cp_kv_bytes(x), same_domain)


def _ring_hidden(x, ring, attention):
    """What of the ring exchange ``ring`` the attention leaves exposed."""
    return np.maximum(ring * (1 - x.hw.efficiency.cp_overlap), ring - 3.0 * attention)


def cp_kv_allgather_time(x: Candidates):
    """TE's all-gather CP (``AttnFuncWithCPAndKVAllGather``, Megatron's ``all_gather``): the forward
    all-gathers K and V over the CP group (cp x ``cp_kv_bytes``), the backward gathers them again and
    reduce-scatters dK and dV; blocking collectives before and after the attention ("KV all-gather
    between CP ranks is exposed"): three, exposed, CP ranks tp apart. The recomputed forward's gather
    is left out, as the p2p and a2a kinds leave out their exchange in it."""
    gathered = x.c * cp_kv_bytes(x)
    return 3.0 * comm.reduce_scatter_time(x.hw, gathered, x.c, comm.ranks_per_domain(x.hw, x.c, x.t))


def cp_hierarchical_time(x: Candidates, attention):
    """TE's a2a+p2p CP: the all-to-alls of ``cp_a2a_time`` inside groups of A consecutive CP ranks
    (``cp_kinds.a2a_group``; every rank then holds A x s/cp tokens of heads/A of its heads), then the p2p
    ring of ``cp_ring_time`` over the cp/A groups (chunks of A x s/cp tokens and kv/A heads: the bytes of
    one rank's own K/V), hidden behind the attention as the plain ring is."""
    a2a, ring = _hierarchical_exchanges(x)
    return a2a + _ring_hidden(x, ring, attention)


def _hierarchical_exchanges(x):
    """The a2a+p2p kind's all-to-alls and its outer ring before any of it is hidden."""
    inner = np.maximum(cp_kinds.a2a_group(x.model, x.t, x.c, "a2a+p2p"), 1)
    return cp_a2a_time(x, inner), _ring_exchange(x, x.c / inner)


def _kind_exchanges(x, kind: str):
    """CP kind ``kind``'s (exchange exposed whole, ring exchange the attention may hide), before any
    of it is hidden (``x``: the structure's fields suffice): the p2p ring, the a2a's and the
    all-gather's blocking collectives, a2a+p2p's both. What ``cp_comm_time`` prices and
    ``cp_kind_bounds`` bounds."""
    if kind == "p2p":
        return 0.0, _ring_exchange(x)
    if kind == "a2a":
        return cp_a2a_time(x), 0.0
    if kind == "allgather":
        return cp_kv_allgather_time(x), 0.0
    return _hierarchical_exchanges(x)


# Bytes TransformerEngine's p2p context parallelism (``AttnFuncWithCPAndKVP2P``) moves through HBM to
# merge its ring's per-step partial results, beyond what one attention kernel on the whole local
# sequence writes: ((per ring step, once) per element of a rank's local attention output O, (per
# step, once) per element of its local K and V together), BF16 attention (False) and FP8 (True).
# Counted in TransformerEngine v1.10 transformer_engine/pytorch/attention.py (the release MLPerf
# v4.1's NeMo 24.09 images run) for the sbhd / bshd formats, at the busiest rank (the last: every
# step's partial output covers its whole local query):
# - BF16, forward: the output zeroed once (2 B written; L1944) and each step's output merged into it
#   by its softmax statistics (``flash_attn_fwd_out_correction``, torch.compile'd into one kernel:
#   the step's output and the output read, the output written, 6; L1977-2011); K and V concatenated
#   into the ring's first buffer once (4; L1458-1459). Backward: dQ accumulated per step (6; the first a
#   copy, 4; L2606-2645), the K/V copied into the ring buffer once (4; L2229), each step's dK and dV
#   concatenated (4; L2690) and accumulated (6; L2717-2745). TE 1.6 (MLPerf v4.0) runs the same
#   passes (v1.6 attention.py L556, L702, L726-733, L781, L978-1030).
# - FP8 (delayed scaling with NVTE_FP8_DPA_BWD=1, as MLPerf's FP8_DPA configs set): forward, each
#   step's FP8 output dequantized to FP32 (1 read, 4 written; L1938-1944) and merged into the FP32
#   output (12); once: the FP32 output zeroed (4), cast to BF16 (6) and to FP8 for the backward (3;
#   L2038-2040), where the plain kernel's FP8 output is cast to BF16 once (3): +10; K and V (already
#   FP8) concatenated once (2). Backward: each step's FP8 dQ copied into its slot of a cp x Q buffer
#   (2; L2163, L2604-2620), each step's dK, dV concatenated (2) and copied into a cp x KV buffer (2;
#   L2706-2716); once, each buffer dequantized to FP32 (cp x (1 + 4)), summed over its slots (cp x 4
#   read, 4 written) and cast to BF16 (6; L2755-2771), where the plain kernel's FP8 gradients are
#   cast to BF16 once (3). Every FP8 recipe is priced so (TE 1.x has delayed scaling only).
# Later releases keep these passes (d0067d0da context_parallel.py: FP32 merge of the output, cp x
# buffers under delayed scaling), not recounted here. The all-to-all kinds merge nothing; the
# all-gather kind's two-step merge is not priced.
CP_MERGE_BYTES = {False: ((12.0, 0.0), (10.0, 8.0)), True: ((28.0, 17.0), (13.0, 9.0))}


def cp_merge_bytes(x, steps, fp8):
    """HBM bytes of ``CP_MERGE_BYTES`` for ``steps`` ring steps (``x``: model, t, b, s_local), FP8
    counts where ``fp8``: per micro-batch and layer on one rank."""
    model = x.model
    out = x.b * x.s_local * model.num_attention_heads / x.t * model.v_dim
    kv = x.b * x.s_local * np.maximum(model.query_groups / x.t, 1.0) * (model.qk_dim + model.v_dim)

    def bytes_at(f):
        (o_step, o_once), (kv_step, kv_once) = CP_MERGE_BYTES[f]
        return out * (o_step * steps + o_once) + kv * (kv_step * steps + kv_once)
    return np.where(steps > 1, np.where(fp8, bytes_at(True), bytes_at(False)), 0.0)


def _ring_steps(x, kind: str):
    """The ring steps of CP kind ``kind`` (``x``: model, t, c): cp for p2p, cp / A for a2a+p2p's
    outer ring (``cp_kinds.a2a_group``), none for the all-to-all and all-gather kinds."""
    if kind == "p2p":
        return np.asarray(x.c, dtype=float)
    if kind == "a2a+p2p":
        return x.c / np.maximum(cp_kinds.a2a_group(x.model, x.t, x.c, "a2a+p2p"), 1)
    return np.zeros_like(np.asarray(x.c, dtype=float))


def cp_merge_time(x: Candidates):
    """TE's p2p CP ring merges each step's partial output into the layer's output by the softmax
    statistics, and accumulates each step's dQ, dK and dV (``CP_MERGE_BYTES``): HBM-bound passes on
    the attention's stream, priced unhidden at the achievable HBM bandwidth, once per micro-batch
    (a recomputed forward's merges are left out). The kinds as ``cp_comm_time`` runs them: none for
    softmax sinks (a2a) and DeepSeek Sparse Attention (all-gather); DeepSeek-V4 prices its own
    attention kernels."""
    model = x.model
    if model.softmax_sinks or model.is_dsa or model.is_dsv4:
        return np.zeros_like(x.t, dtype=float)
    steps = _ring_steps(x, "p2p")
    if CP_COMM_TYPE_COLUMN in x.knobs:
        steps = np.where(x.knob_is(CP_COMM_TYPE_COLUMN, "p2p"), steps,
                         np.where(x.knob_is(CP_COMM_TYPE_COLUMN, "a2a+p2p"), _ring_steps(x, "a2a+p2p"), 0.0))
    return cp_merge_bytes(x, steps, x.flag("fp8_attention")) / x.hbm


def attention_time_least(x, fp8_attention: bool):
    """A lower bound of ``attention_time`` over the feature knobs (``x``: model, hw, b, t, c, s_local): the
    causal flash kernel's GEMMs alone (a kernel without flash computes the whole s x s, and the
    exponentials only add), at the FP8 peak where FP8 attention may run, else at the BF16 one."""
    model, hw = x.model, x.hw
    attn_flops = flops.attention_core_flops(model, x.b, model.seq_length, causal=True) / (x.t * x.c)
    peak = gemm.bf16_peak(hw)
    if fp8_attention:
        peak = max(peak, (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * gemm.tensor_speed(hw))
    return attn_flops * finetune.attention_share(model) / peak / hw.attention_peak_share(x.s_local)


def attention_time_most(x, non_flash: bool):
    """An upper bound of ``attention_time`` over the feature knobs (``x``: model, hw, b, t, c, s_local): the
    causal flash kernel at the BF16 peak or on its exponentials, whichever is slower, and no faster
    than the MXFP8 kernel's floor; the whole s x s at the BF16 peak where ``non_flash`` (a row of the
    space runs without flash attention)."""
    model, hw = x.model, x.hw
    bf16 = gemm.bf16_peak(hw)

    def gemms(attn_flops):  # at the BF16 peak, and no faster than the MXFP8 kernel's floor
        scores = attn_flops / (2.0 * (model.qk_dim + model.v_dim))
        return np.maximum(attn_flops / bf16, scores * 2.0 * 2.0 * MXFP8_ATTENTION_HEAD_DIM / bf16)

    causal = flops.attention_core_flops(model, x.b, model.seq_length, causal=True) / (x.t * x.c)
    causal = causal * finetune.attention_share(model)
    most = np.maximum(gemms(causal), causal / (2.0 * (model.qk_dim + model.v_dim)) / (hw.exp_tera_per_s * 1e12))
    if non_flash:
        most = np.maximum(most, gemms(flops.attention_core_flops(model, x.b, model.seq_length, causal=False)
                                      / (x.t * x.c)))
    return most / hw.attention_peak_share(x.s_local)


def cp_kind_bounds(x, kinds, attention_least=0.0, attention_most=np.inf) -> dict:
    """Each CP kind's exposed exchange per layer and micro-batch as (least, most) over every
    attention time from ``attention_least`` to ``attention_most`` (``attention_time_least`` /
    ``_most``; ``x``: anything with the fields these terms read: model, hw, t, c, b, s_local): the p2p
    ring hides behind the attention up to its overlap; the others are exposed whole (a2a+p2p's ring
    hides as the p2p one); a ring's merges (``cp_merge_time``) add BF16's bytes to the least and FP8's
    to the most. The search drops a kind whose least is above another's most (``space``): the kind
    changes these terms alone, so it could not be the faster there."""
    out = {}
    overlap = 1 - x.hw.efficiency.cp_overlap
    hbm = x.hw.achievable_hbm

    for kind in kinds:
        whole, ring = _kind_exchanges(x, kind)
        steps = _ring_steps(x, kind)  # the ring's merges (``cp_merge_time``): BF16's at least, FP8's at most
        least, most = (cp_merge_bytes(x, steps, fp8) / hbm for fp8 in (False, True))
        out[kind] = (whole + np.maximum(overlap * ring, ring - 3.0 * attention_most) + least,
                     whole + np.maximum(overlap * ring, ring - 3.0 * attention_least) + most)
    return out


def cp_comm_time(x: Candidates, attention):
    """The plan's CP exchange (``Plan.cp_comm_type``): the p2p ring (``cp_ring_time``), the all-to-all
    (``cp_a2a_time``), the all-gather (``cp_kv_allgather_time``) or both hierarchically
    (``cp_hierarchical_time``). A model with softmax sinks (``ModelSpec.softmax_sinks``) runs the
    all-to-all whatever the plan says and DeepSeek Sparse Attention its own all-gather
    (``cp_allgather_time``), the only kinds TE and Megatron run for them; a published row's stated kind
    is its plan's (MLPerf's Blackwell LoRA runs, whose train.py passes cp_comm_type a2a); a row that
    states none runs the p2p ring."""
    model = x.model
    if model.softmax_sinks:
        return cp_a2a_time(x)
    if model.is_dsa:
        return cp_allgather_time(x)
    # Each exchange depends on the structure alone (computed once per structure, ``by_structure``);
    # only how much of a ring the attention hides is the row's.
    ring = _ring_hidden(x, x.by_structure(_ring_exchange), attention)
    if CP_COMM_TYPE_COLUMN not in x.knobs:
        return ring
    out = ring
    for kind in ("a2a", "allgather", "a2a+p2p"):
        rows = x.knob_is(CP_COMM_TYPE_COLUMN, kind)
        if rows.any():
            whole, outer = x.by_structure(_kind_exchanges, kind)
            out = np.where(rows, whole + _ring_hidden(x, outer, attention), out)
    return out


def fsdp_time(x: Candidates, params, expert_params, forward, full_recompute, kind: LayerKind | bool):
    """FSDP: each layer's weights all-gathered before its forward and its backward, its gradients
    reduce-scattered after its backward, every micro-batch, prefetched behind the layer before
    (experts over their own data-parallel group)."""
    backward = 2.0 * forward + full_recompute
    exposed = dataparallel.fsdp_exposed(x.hw, params, x.grad_bytes, x.dp_ranks, forward, backward, x.gather_bytes)
    if as_kind(kind).is_moe:
        exposed = exposed + dataparallel.fsdp_exposed(
            x.hw, expert_params, x.grad_bytes, x.edp_ranks, forward, backward, x.gather_bytes)
    return np.where(x.fsdp, exposed, 0.0)


def ep_comm_time(x: Candidates, compute, kind: LayerKind | bool):
    """Dispatch and combine each way, again in a recomputed forward (of the layer or the MoE
    block), with the plan's token dispatcher (alltoall: each dispatch a second all-to-all of the
    routing probabilities, ``dispatch.probs_time``); the 1F1B overlap hides them behind another
    micro-batch's compute, the shared-expert overlap behind the shared experts' own GEMMs
    (forward, backward and a recomputed forward: Megatron runs them on a side stream); a published
    row's DualPipe hides all that the compute beside can (``pipeline.DUALPIPE_HIDDEN_SHARE``)."""
    if not as_kind(kind).is_moe:
        return np.zeros_like(x.t)
    dispatcher = partial(x.knob_is, "moe_token_dispatcher_type")  # codes compared, not strings
    recomputed = x.recomputed_fraction + np.where(x.modules["moe"], 1.0, 0.0)
    # Each dispatcher's times depend on the structure alone (and a run's dispatch bytes): per structure.
    one = dispatch.by_dispatcher(dispatcher, np.shape(x.e), lambda name: x.by_structure(
        lambda s, value_bytes: dispatch.dispatcher_time(s.hw, s.model, s.tokens / s.t, s.e, s.et, s.imbalance, name,
                                                        value_bytes), x.dispatch_bytes))
    probs = dispatch.by_dispatcher(dispatcher, np.shape(x.e), lambda name: x.by_structure(
        lambda s: dispatch.probs_alltoall_time(s.hw, s.model, s.tokens / s.t, s.e, s.et, s.imbalance))
        if name == "alltoall" else None)
    a2a_overlap, shared_overlap = x.flag("overlap_moe_expert_parallel_comm"), x.flag("moe_shared_expert_overlap")
    shared = (3.0 + recomputed) * linear_time(x, x.model.shared_expert_params)  # forward, backward, recomputed
    hidden_share = np.where(x.dualpipe, pipeline.DUALPIPE_HIDDEN_SHARE, x.hw.efficiency.ep_overlap)
    total = (4.0 + 2.0 * recomputed) * one + (2.0 + recomputed) * probs  # each dispatch sends its probabilities
    return dispatch.exposed_dispatch(x.hw, total, a2a_overlap | shared_overlap,
                                     np.where(shared_overlap, shared, compute), dispatcher, hidden_share,
                                     flex_backend(x))


def amax_reduction_time(x: Candidates):
    """FP8 delayed scaling: when a model chunk's fp8_autocast exits, and when the backward of its
    first FP8 module ends, TransformerEngine all-reduces (MAX) the chunk's amaxes over the amax
    group, blocking (``reduce_and_update_fp8_tensors``; TE 0.8's ``global_amax_reduction`` with
    NVTE_ASYNC_AMAX_REDUCTION unset): TP x DP x CP ranks (Megatron's ``get_amax_reduction_group``),
    TP x CP with --tp-only-amax-red. A few bytes: latency only (a tree), twice per chunk and
    micro-batch, spread here over the chunk's layers. Other recipes keep no amax history."""
    layers_per_chunk = x.layers_per_chunk
    tp_only = x.flag("tp_only_amax_red")
    group = np.where(tp_only, x.t * x.c, x.t * x.c * x.dp)
    per_node = comm.ranks_per_domain(x.hw, group, 1)
    delayed = x.knob_is("precision", "fp8-delayed")
    reduce = comm.tree_all_reduce_latency(x.hw, group, per_node)
    return np.where(delayed, 2.0 * reduce / np.maximum(layers_per_chunk, 1.0), 0.0)


def one_block_norm_output_bytes(x: Candidates, kind: LayerKind):
    """What ``--recompute-modules layernorm`` spares a hybrid layer of one block: its norm's
    output, i.e. its first Linear's quantized input copy (``memory.norm_output_bytes``), or a MoE
    block's router input (its shared experts' input is the MoE module's to spare)."""
    gemm_in = memory.gemm_input_bytes(x.quantized_fraction, x.quantized_input_bytes)
    first = memory.ROUTER_INPUT_BYTES if kind.is_moe else gemm_in
    return first * x.b * x.s_local * x.model.hidden_size / np.where(x.sp, x.t, 1)


def stored_activation_bytes(x: Candidates, kind: LayerKind | bool, saved=None):
    """What the layer keeps per micro-batch in flight: its input where full recompute covers it,
    else its activations (``saved``: ``activation_bytes`` with the plan's ``keep_scores``, where
    the caller has them) less what selective recompute spares."""
    kind = as_kind(kind)
    is_moe = kind.is_moe
    saved = activation_bytes(x, kind, x.keep_scores) if saved is None else saved
    clamp = glu_clamp_saved_bytes(x.model)
    if kind.standard:
        layernorm, mla_up_proj = x.modules["layernorm"], x.modules["mla_up_proj"]
    else:
        layernorm, mla_up_proj = False, np.zeros_like(x.modules["mla_up_proj"])
    spared = memory.recomputed_bytes(x.model, x.b, x.s_local, x.t, x.sp, x.quantized_fraction, is_moe, x.et,
                                     x.imbalance, mla_up_proj, x.modules["moe_act"], x.modules["moe"],
                                     x.quantized_input_bytes, layernorm, x.act_input_bytes + clamp,
                                     x.routed_act_input_bytes + clamp)
    if not kind.standard:
        spared = spared + np.where(x.modules["layernorm"], one_block_norm_output_bytes(x, kind), 0.0)
    if x.model.hc_mult > 1 and x.keep_scores is not False:  # mhc: the n-stream tensors ``saved`` holds
        spared = spared + np.where(x.modules["mhc"], dsv4.hyper_connection_saved_bytes(x), 0.0)
    if is_moe and clamp:  # moe_act's checkpoint drops the routed clamp's extra copy (moe drops it anyway)
        copies = x.b * x.s_local / x.t * x.model.moe_router_topk * x.imbalance
        extra = copies * 2.0 * x.model.expert_ffn_hidden_size * clamp
        spared = spared + np.where(x.modules["moe"], 0.0, np.where(x.modules["moe_act"], extra, 0.0))
    return (x.recomputed_fraction * memory.layer_input_bytes(x.model, x.b, x.s_local, x.t, x.sp)
            + (1 - x.recomputed_fraction) * (saved - spared))


def shared_terms(x: Candidates):
    """(attention core, unfused softmax, CP exchange, amax reduction): the same in a dense and a
    MoE layer, priced once per candidates (``Candidates.once``)."""
    attention = attention_time(x)
    return attention, softmax_time(x), cp_comm_time(x, attention), amax_reduction_time(x)


def layer_cost(x: Candidates, params, expert_params, t_linear, tp_blocks, kind: LayerKind | bool, moe_block=0.0,
               kernels=(), tp_linear=(0.0, 0.0), cp_comm=None) -> dict:
    """Every term of one layer (``LAYER_TIME_TERMS``), their sum ``time`` and what the other
    steps read: ``forward``, the bytes ``stored`` per micro-batch in flight and ``working`` while
    it computes (``stored_imbalance`` of it: what the busiest EP rank keeps beyond the even share),
    its ``params`` and ``expert_params`` on the GPU. ``kernels``: (forward,
    backward) pairs of a MoE layer priced with their own backward (``router_time``,
    ``permutation_time``, ``expert_bias_time``, ``glu_clamp_time``, ``unfused_rope_time``); ``tp_linear``: forward time of the TP-split
    GEMMs, whole and in ring-exchange chunks (``tensor_parallel``). ``kind``: the layer's kind
    (``layer_kinds``); ``cp_comm``: a layer without attention's own CP traffic (else none)."""
    kind = as_kind(kind)
    is_moe = kind.is_moe
    attention, softmax, attention_cp, amax_reduction = x.once(shared_terms)
    if kind.attention:
        cp_comm = attention_cp
    elif cp_comm is None:
        cp_comm = np.zeros_like(x.t, dtype=float)
    forward = forward_time(x, t_linear, attention, softmax, kind) + sum(f for f, _ in kernels)
    # compute_time prices a backward of twice the forward; these kernels' backward is their own.
    compute = compute_time(x, forward, t_linear) + sum(b - 2.0 * f for f, b in kernels)
    full_recompute = full_recompute_time(x, forward)
    terms = {
        "compute": compute,
        "fp8_cast": fp8_cast_time(x, kind) + frozen_transpose_time(x, params + expert_params),
        "selective_recompute": selective_recompute_time(x, attention, softmax, kind, moe_block),
        "full_recompute": full_recompute,
        "tp_comm": (tensor_parallel.tp_comm_time(x, tp_blocks, *tp_linear) if tp_blocks
                    else np.zeros_like(x.t, dtype=float)),
        "cp_comm": cp_comm,
        "cp_merge": x.once(cp_merge_time) if kind.attention else np.zeros_like(x.t, dtype=float),
        "fsdp": fsdp_time(x, params, expert_params, forward, full_recompute, is_moe),
        "ep_comm": ep_comm_time(x, compute, is_moe),
        "lora_adapters": lora_adapters_time(x) if kind.standard and not is_moe else np.zeros_like(x.t),
        "amax_reduction": amax_reduction,
    }
    time = sum(terms[k] for k in LAYER_TIME_TERMS)
    if is_moe:  # the GPU idles while the host issues the layer (the 1F1B all-to-all overlap)
        stall = combined_host_stall(x, time)
        terms["compute"] = terms["compute"] + stall
        time = time + stall
    working = activation_bytes(x, kind, x.keep_scores)
    stored = stored_activation_bytes(x, kind, working)
    return dict(terms, time=time, forward=forward,
                recompute=terms["selective_recompute"] + terms["full_recompute"],
                stored=stored, stored_imbalance=stored - stored_activation_bytes(x.evenly_loaded(), kind) if is_moe
                else np.zeros_like(stored), working=working,
                params=params, expert_params=expert_params,
                adapter_params=finetune.adapter_params_gpu(x.model, x.t) + np.zeros_like(x.t))


def dense_layer(x: Candidates) -> dict:
    """A dense layer: attention and MLP split by TP (MLA's down projections whole), a quick-GEGLU's
    eager clamp (``glu_clamp_time``), an unfused RoPE (``unfused_rope_time``), DeepSeek Sparse Attention's indexer
    kernels (``dsa_attention_kernels``)."""
    model = x.model
    params = dense_params(x)
    t_linear = linear_time(x, model.dense_layer_params, model.mla_down_params)
    chunked = linear_time(x, model.dense_layer_params, model.mla_down_params, chunks=x.t)
    kernels = (glu_clamp_time(x, False), unfused_rope_time(x)) + (dsa_attention_kernels(x) if model.is_dsa else ())
    return layer_cost(x, params, 0.0, t_linear, 2.0, False, kernels=kernels, tp_linear=(t_linear, chunked))


def dense_params(x: Candidates):
    """A dense layer's parameters on one GPU: attention and MLP split by TP, MLA's down projections
    whole."""
    model = x.model
    return (model.dense_layer_params - model.mla_down_params) / x.t + model.mla_down_params


def router_time(x: Candidates):
    """(forward, backward) seconds of the router's GEMM, the T/tp tokens on num_experts logits.
    Megatron-Core's ``router_gating_linear`` calls TransformerEngine's ``general_gemm`` itself, so
    no FP8 recipe quantizes it: the forward takes BF16 inputs to FP32 logits (BF16 tensor cores);
    the backward's dgrad and wgrad take FP32 operands under ``--moe-router-dtype fp32``, which TE
    runs as TF32 ("Use TF32 only for pure FP32 GEMM", ``cublaslt_gemm.cu``). Each GEMM is priced at
    the dense efficiency of its own (small) size, not at the layer's."""
    model, hw = x.model, x.hw
    gemm_flops = 2.0 * x.tokens / x.t * model.router_params
    forward = gemm_flops / (gemm.bf16_peak(hw) * gemm.efficiency(hw, gemm_flops))
    backward_rate = TF32_PER_BF16 if model.moe_router_fp32 else 1.0
    return forward, 2.0 * forward / backward_rate


# TransformerEngine's compute streams for a grouped GEMM's per-expert cuBLAS calls
# (``transformer_engine/common/util/multi_stream.cpp``: ``num_compute_streams = 4``).
TE_COMPUTE_STREAMS = 4


def concurrent_experts(model, ep):
    """Local experts whose GEMMs run at once: TransformerEngine's ``multi_stream_cublas_gemm``
    launches expert i's GEMM on compute stream i mod 4 (``cublaslt_gemm.cu``), so up to
    ``TE_COMPUTE_STREAMS`` of them share the GPU, never more than the local experts."""
    return np.minimum(float(TE_COMPUTE_STREAMS), np.maximum(moe.local_experts(model, ep), 1.0))


def routed_experts_time(x: Candidates):
    """Routed experts: each local expert's FC1 and FC2 are cuBLAS GEMMs of their own
    (``moe_expert_calls``: TransformerEngine's grouped GEMM is a loop of the same ``cublas_gemm`` a
    Linear calls), priced on the GPU's dense GEMM curve (``gemm.efficiency``, as the router's GEMM).
    The loop puts consecutive experts' GEMMs on TransformerEngine's 4 compute streams, which the GPU
    runs side by side: a small GEMM's SMs left idle (too few tiles, the last wave's tail) are
    filled by the GEMMs of the other streams, so the curve is read at the size of the GEMMs in
    flight together (``concurrent_experts`` of them), not of one expert's. The busiest EP rank has
    ``imbalance`` times the tokens."""
    expert_flops = moe.expert_flops(x.model, x.tokens / x.t) * x.imbalance
    group_flops = moe.expert_gemm_flops(x.model, x.tokens / x.t, x.e, x.et) * concurrent_experts(x.model, x.e)
    return expert_flops / (sized_peak(x, group_flops) * gemm.efficiency(x.hw, group_flops))


def moe_layer(x: Candidates) -> dict:
    """A MoE layer: attention and shared experts split by TP, the router on each GPU's tokens
    (``router_time``), the token permutations (``permutation_time``), routed experts over EP x
    ETP and their calls per local expert (``moe_expert_calls``), the host's other calls after the
    dispatcher's sync (``post_sync_host_calls``), the experts' biases (``expert_bias_time``), a
    quick-GEGLU's clamp (``glu_clamp_time``) and an unfused RoPE (``unfused_rope_time``); TP
    all-reduces after attention and after the shared experts (if any)."""
    model = x.model
    nonexpert = model.moe_layer_params - model.num_experts * model.expert_params - model.router_params
    t_experts = routed_experts_time(x)
    router = hash_routed_router_time(x)
    permutation, calls, host = permutation_time(x), expert_calls(x, t_experts), post_sync_host_calls(x)
    bias, clamp = expert_bias_time(x), glu_clamp_time(x, True)
    kernels = (router, permutation, calls, host, bias, clamp, unfused_rope_time(x))
    kernels += (moe_act_recompute_time(x),)
    kernels += (dsv4.hyper_connection_time(x),) if model.hc_mult > 1 else ()
    kernels += dsv4_attention_kernels(x) if model.is_dsv4 else dsa_attention_kernels(x) if model.is_dsa else ()
    tp_blocks = 1.0 + (model.shared_expert_ffn_hidden_size > 0)
    block = (linear_time(x, model.shared_expert_params) + t_experts + router[0] + permutation[0] + calls[0] + host[0]
             + bias[0] + clamp[0])
    t_nonexpert = linear_time(x, nonexpert, model.mla_down_params)
    chunked = linear_time(x, nonexpert, model.mla_down_params, chunks=x.t)
    return layer_cost(x, moe.nonexpert_moe_params_gpu(model, x.t), moe.expert_params_gpu(model, x.e, x.et),
                      t_nonexpert + t_experts, tp_blocks, True, block, kernels,
                      tp_linear=(t_nonexpert, chunked))


def block_linear_times(x: Candidates, *gemm_sets: dict):
    """(whole, in TP ring-exchange chunks) seconds of a hybrid block's GEMMs: each set the
    ``linear_time`` arguments of GEMMs priced together (a class at its own precision apart)."""
    whole = sum(linear_time(x, **g) for g in gemm_sets)
    chunked = sum(linear_time(x, chunks=x.t, **g) for g in gemm_sets)
    return whole, chunked


def attention_params_gpu(s):
    """A * layer's parameters on one GPU: attention split by TP, MLA's down projections whole."""
    model = s.model
    return (model.attention_params - model.mla_down_params) / s.t + model.mla_down_params


def attention_block_layer(x: Candidates) -> dict:
    """A hybrid model's * layer: the pre-norm and self-attention alone (its QKV and projection
    GEMMs split by TP, one TP block), no MLP."""
    model = x.model
    t_linear, chunked = block_linear_times(x, dict(params=model.attention_params, whole=model.mla_down_params,
                                                   gemms=2))
    return layer_cost(x, attention_params_gpu(x), 0.0, t_linear, 1.0, HYBRID["*"], tp_linear=(t_linear, chunked))


def mlp_block_layer(x: Candidates) -> dict:
    """A hybrid model's - layer: the pre-norm and an MLP of ffn_hidden_size (FC1 and FC2 split by
    TP, one TP block), no attention."""
    params = x.model.mlp_params(x.model.ffn_hidden_size)
    t_linear, chunked = block_linear_times(x, dict(params=params, gemms=2))
    return layer_cost(x, params / x.t, 0.0, t_linear, 1.0, HYBRID["-"], kernels=(glu_clamp_time(x, HYBRID["-"]),),
                      tp_linear=(t_linear, chunked))


def moe_block_layer(x: Candidates) -> dict:
    """A hybrid model's E layer: the pre-norm and a MoE block alone, priced as ``moe_layer``
    without its attention (router, permutations, routed experts and their calls, the host's calls
    after the dispatcher's sync, biases, clamp,
    the expert-parallel dispatch and combine); TP all-reduces after the shared experts (if any)
    and LatentMoE's projections split by TP beside them (each a GEMM of its own on the GEMM curve)."""
    model = x.model
    kind = HYBRID["E"]
    nonexpert = model.shared_expert_params + model.latent_projection_params
    t_experts = routed_experts_time(x)
    router, permutation, calls = router_time(x), permutation_time(x), expert_calls(x, t_experts)
    host, bias, clamp = post_sync_host_calls(x), expert_bias_time(x), glu_clamp_time(x, kind)
    tp_blocks = float(model.shared_expert_ffn_hidden_size > 0)
    gemms = 2.0 * (model.shared_expert_ffn_hidden_size > 0) + 2.0 * (model.moe_latent_size is not None)
    if "latent_projection" in gemm_precision.recipe(x) and model.moe_latent_size is not None:
        # the latent projections at their own precision, each pair of GEMMs at its own size
        shared_gemms = max(2.0 * (model.shared_expert_ffn_hidden_size > 0), 1.0)
        t_nonexpert, chunked = block_linear_times(
            x, dict(params=model.shared_expert_params, gemms=shared_gemms),
            dict(params=model.latent_projection_params, gemms=2.0,
                 peak=gemm_precision.class_peak(x, "latent_projection")))
    else:
        t_nonexpert, chunked = block_linear_times(x, dict(params=nonexpert, gemms=max(gemms, 1.0)))
    block = t_nonexpert + t_experts + router[0] + permutation[0] + calls[0] + host[0] + bias[0] + clamp[0]
    return layer_cost(x, moe_block_params_gpu(x), moe.expert_params_gpu(model, x.e, x.et), t_nonexpert + t_experts,
                      tp_blocks, kind, block, (router, permutation, calls, host, bias, clamp, moe_act_recompute_time(x)),
                      tp_linear=(t_nonexpert, chunked))


def moe_block_params_gpu(s):
    """An E layer's non-expert parameters on one GPU: shared experts and LatentMoE's projections
    split by TP, the router whole."""
    model = s.model
    return (model.shared_expert_params + model.latent_projection_params) / s.t + model.router_params


def mamba_layer(x: Candidates) -> dict:
    """A hybrid model's M layer: the pre-norm and the Mamba-2 mixer (``mamba``): in_proj and
    out_proj split by TP over heads and groups (one TP block: all-gather before in_proj,
    reduce-scatter after out_proj under SP, as attention's), the conv1d, the SSD scan and the
    grouped RMSNorm with their own backward, MambaMixer's layout copies, the CP all-to-alls."""
    params = mamba.linear_params(x.model)
    if "mamba_out_proj" in gemm_precision.recipe(x):  # out_proj at its own precision, each GEMM at its size
        out = mamba.out_proj_params(x.model)
        t_linear, chunked = block_linear_times(
            x, dict(params=params - out, gemms=1),
            dict(params=out, gemms=1, peak=gemm_precision.class_peak(x, "mamba_out_proj")))
    else:
        t_linear, chunked = block_linear_times(x, dict(params=params, gemms=2))
    kernels = (mamba.ssd_time(x), mamba.conv_time(x), mamba.norm_time(x), mamba.layout_copy_time(x))
    return layer_cost(x, x.model.mamba_params / x.t, 0.0, t_linear, 1.0, HYBRID["M"], kernels=kernels,
                      tp_linear=(t_linear, chunked), cp_comm=mamba.cp_time(x))


HYBRID_LAYERS = {"M": mamba_layer, "*": attention_block_layer, "-": mlp_block_layer, "E": moe_block_layer}


def hybrid_kind_params(s) -> dict:
    """Each hybrid kind's parameters on one GPU (``params``, ``expert_params``, ``adapter_params``)."""
    model, zero = s.model, np.zeros_like(s.t, dtype=float)
    params = {"M": model.mamba_params / s.t, "*": attention_params_gpu(s), "-": model.mlp_params(model.ffn_hidden_size) / s.t,
              "E": moe_block_params_gpu(s) if model.is_moe else zero}
    experts = moe.expert_params_gpu(model, s.e, s.et) if model.is_moe else zero
    return {kind: {"params": params[kind] + zero, "expert_params": experts if kind == "E" else zero,
                   "adapter_params": zero} for kind in params}


def mean_of_kinds(kinds: dict, counts: dict) -> dict:
    """The per-layer mean of ``kinds``' costs (every key) weighted by ``counts`` (a hybrid model's
    non-MoE layers, ``Layers``)."""
    total = sum(counts.values())
    keys = next(iter(kinds.values())).keys()
    return {key: sum(counts[k] * kinds[k][key] for k in counts) / total for key in keys}


def hybrid_layers(costs: dict, model, mtp_costs: dict | None = None, counts: dict | None = None) -> Layers:
    """A hybrid model's ``Layers``: ``moe`` its E layer, ``dense`` the mean of its other layers
    (M, *, -) in the pattern's proportions, ``kinds`` each kind's costs. A stage's kinds are
    counted on the layers it holds (``Candidates.stage_kinds``: Megatron-LM d98e8a64dd
    ``megatron/core/models/hybrid/hybrid_layer_allocation.py`` ``select_pipeline_segment`` gives
    each rank contiguous slices); its time and parameters sum them (``Layers.on``), its
    activations price its non-E layers at the pattern's mix (``dense``); the bytes ``working``
    while a layer computes are the largest kind's. ``counts``: each kind's layers where ``costs`` holds BF16 edge
    kinds too (``layer_kinds.EDGE``); the pattern's symbols' otherwise."""
    counts = counts or model.layer_kind_counts
    moe_counts = {k: n for k, n in counts.items() if k[0] == "E" and n}
    counts = {k: n for k, n in counts.items() if k[0] != "E" and n}
    some = next(iter(costs.values()))
    zeros = {key: np.zeros_like(np.asarray(value, dtype=float)) for key, value in some.items()}
    dense = mean_of_kinds(costs, counts) if counts else zeros
    moe_layer = zeros if not model.is_moe else dict(costs["E"]) if len(moe_counts) == 1 else mean_of_kinds(
        costs, moe_counts)
    if counts and "working" in dense:  # the layer computing: the largest of the stage's kinds
        dense["working"] = np.maximum.reduce([np.asarray(costs[k]["working"], dtype=float) for k in counts])
        moe_layer["working"] = np.maximum(moe_layer["working"], dense["working"])
    return Layers(dense, moe_layer, costs, mtp_costs)


@dataclass
class Layers:
    """The dense and the MoE layer's costs, summed over the layers of a pipeline stage; a hybrid
    model's ``kinds`` (``hybrid_layers``)."""

    dense: dict
    moe: dict
    kinds: dict | None = None
    mtp_kinds: dict | None = None  # the MTP layer's kinds where a recipe runs them apart (BF16)
    ratios: dict | None = None  # DeepSeek-V4: each compress-ratio class's MoE layer (``dsv4_ratio_layers``)
    ratio_counts: tuple | None = None  # DeepSeek-V4: the model's decoder layers of each class

    def on(self, key: str, layers, moe_layers, kinds=None):
        """``key`` summed over ``layers`` layers of which ``moe_layers`` are MoE; a hybrid stage's
        over its own kinds where ``kinds`` gives them (``Candidates.stage_kinds``: each of
        ``STAGE_KINDS``' count on the stage), not the pattern's mix. A BF16 edge kind
        (``layer_kinds.EDGE``) takes its own costs where they are priced (``recipe_hybrid_layers``),
        else its symbol's (the parameters)."""
        if kinds is not None and self.ratios is not None:
            return self.moe_by_ratio(key, layers, moe_layers, kinds)
        if kinds is None or self.kinds is None:
            return (layers - moe_layers) * self.dense[key] + moe_layers * self.moe[key]
        # ``kinds`` holds the BF16 edge kinds only where a recipe keeps end layers in BF16; one takes
        # its symbol's costs where not priced apart (the parameters).
        terms = [kinds[i] * self.kinds.get(kind, self.kinds.get(kind[0]))[key]
                 for i, kind in enumerate(STAGE_KINDS[:len(kinds)]) if kind in self.kinds or kind[0] in self.kinds]
        return sum(terms[1:], terms[0])

    def moe_by_ratio(self, key: str, layers, moe_layers, counts):
        """A DeepSeek-V4 stage's ``key`` over its own layers' compress ratios (``counts``: each of
        ``ModelSpec.dsv4_ratio_classes``' layers on it): the mean layer's sum plus, per class, its
        layers beyond the mean mix's share times that class's layer. Written as a difference of
        integers (stage count x model layers - stage layers x model count) so a stage holding the
        model's mix (pp 1) adds exactly zero."""
        total = (layers - moe_layers) * self.dense[key] + moe_layers * self.moe[key]
        n_layers = sum(self.ratio_counts)
        for count, n, costs in zip(counts, self.ratio_counts, self.ratios.values()):
            total = total + (count * n_layers - moe_layers * n) / n_layers * (costs[key] - self.moe[key])
        return total

    def mtp(self, model) -> dict:
        """The transformer layer of a multi-token-prediction module: the decoder's (MoE) layer;
        a hybrid model's MTP layer is attention and a MoE block (Nemotron 3's MTP pattern "*E"),
        or attention and an MLP for a dense one."""
        if self.kinds is None:
            return self.moe if model.is_moe else self.dense
        kinds = self.mtp_kinds or self.kinds
        ffn = kinds["E"] if model.is_moe else kinds["-"]
        return {key: kinds["*"][key] + ffn[key] for key in kinds["*"]}


def layer_params(s) -> Layers:
    """The layers' parameters on one GPU as ``layers`` gives them (``params``, ``expert_params``,
    ``adapter_params``): the structure's alone (``s``: ``candidates.StructureFields``, a
    ``Structure`` or ``Candidates``), so priced once per structure where the candidates' structures
    are known (``Candidates.by_structure``)."""
    if s.model.is_hybrid:
        return hybrid_layers(hybrid_kind_params(s), s.model)
    if s.model.is_dsv4 and s.stage_ratios is not None:
        return dsv4_ratio_layers(s, layer_params(replace(s, stage_ratios=None)), layer_params)
    adapters = finetune.adapter_params_gpu(s.model, s.t) + np.zeros_like(s.t)
    dense = {"params": dense_params(s), "expert_params": 0.0, "adapter_params": adapters}
    if not s.model.is_moe:
        return Layers(dense, {k: np.zeros_like(s.t) for k in dense})
    return Layers(dense, {"params": moe.nonexpert_moe_params_gpu(s.model, s.t),
                          "expert_params": moe.expert_params_gpu(s.model, s.e, s.et), "adapter_params": adapters})


def layers(x: Candidates) -> Layers:
    """Both layers' costs (the MoE one all zeros for a dense model); a hybrid model's each kind's
    (``hybrid_layers``)."""
    if x.model.is_hybrid:
        kinds = [kind for kind, n in x.model.layer_kind_counts.items()
                 if n or kind in ("*", "-", "E") and needs_kind(x.model, kind)]
        if gemm_precision.applies(x):
            return recipe_hybrid_layers(x, kinds)
        return hybrid_layers({kind: HYBRID_LAYERS[kind](x) for kind in kinds}, x.model)
    if x.model.is_dsv4 and x.stage_ratios is not None:
        return dsv4_ratio_layers(x, layers(replace(x, stage_ratios=None)), layers)
    dense = dense_layer(x)
    return Layers(dense, moe_layer(x) if x.model.is_moe else {k: np.zeros_like(x.t) for k in dense})


def dsv4_ratio_layers(x, mean: Layers, price) -> Layers:
    """DeepSeek-V4's ``Layers`` (``mean``: priced at the model's mean compress-ratio mix, as the
    attention terms average it) with each ratio class's MoE layer priced apart (``price`` on ``x``
    with every decoder layer at that ratio, ``ModelSpec.dsv4_uniform``), so that a pipeline stage
    is priced from the ratios of the layers it holds (``Candidates.stage_ratios``;
    ``Layers.moe_by_ratio``). Only where some plan has pp > 1: at pp 1 every stage holds the mix."""
    model = x.model
    if not (x.p > 1).any():
        return mean
    ratios = {r: price(replace(x, model=model.dsv4_uniform(r), stage_ratios=None)).moe
              for r in model.dsv4_ratio_classes}
    counts = tuple(model.dsv4_decoder_ratios.count(r) for r in model.dsv4_ratio_classes)
    return replace(mean, ratios=ratios, ratio_counts=counts)


def kind_candidates(x: Candidates, fraction) -> Candidates:
    """``x`` with ``fraction`` of its layers quantized: its GEMM peak, casts and kept inputs so."""
    return replace(x, quantized_fraction=fraction, gemm_peak=gemm.peak(x.hw, fraction, x.is_fp4))


def recipe_hybrid_layers(x: Candidates, kinds) -> Layers:
    """A hybrid model's ``Layers`` under a row's per-module quantization (``gemm_precision``): each
    kind priced quantized (attention's GEMMs all BF16 where the recipe says so) and, where the
    recipe keeps first / last layers in BF16, that kind in BF16 apart (``layer_kinds.EDGE``: the
    stages holding them count them, ``Candidates.stage_kinds``); the MTP layer's kinds in BF16
    where the recipe keeps MTP so."""
    start, end = gemm_precision.end_layers(x)
    costs = {kind: HYBRID_LAYERS[kind](kind_candidates(x, gemm_precision.kind_fraction(x, kind, 0, 0)))
             for kind in kinds}
    counts = Counter(gemm_precision.layer_labels(x.model.hybrid_layer_pattern, start, end))
    bf16 = kind_candidates(x, np.zeros_like(x.quantized_fraction))
    costs.update({label: HYBRID_LAYERS[label[0]](bf16) for label in counts if label[1:] == EDGE})
    mtp_costs = None
    if x.model.mtp_num_layers and gemm_precision.recipe(x).get("mtp") == "bf16":
        mtp_costs = {kind: HYBRID_LAYERS[kind](bf16) for kind in kinds if needs_kind(x.model, kind)}
    return hybrid_layers(costs, x.model, mtp_costs, dict(counts) | {kind: 0 for kind in kinds if kind not in counts})


def needs_kind(model, kind: str) -> bool:
    """Kinds the model prices beyond its pattern's: the MTP layer's attention and FFN."""
    if not model.mtp_num_layers:
        return False
    return kind == "*" or kind == ("E" if model.is_moe else "-")
