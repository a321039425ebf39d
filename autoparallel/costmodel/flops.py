"""FLOP counts of one transformer layer, counted per GEMM so GQA, SwiGLU and MoE come out right.

Sources: Narayanan et al. SC'21 (arXiv 2104.04473) §5.1 and appendix for the GPT count
96·B·s·l·h²·(1 + s/6h + V/16lh) with full recompute (72·… without), and Megatron-LM's own
``num_floating_point_operations`` (``megatron/training/training.py``), which is what Megatron
prints as "throughput per GPU (TFLOP/s/GPU)" and what ``model_tflops_per_gpu`` and ``mfu``
report here: every Linear GEMM three times (forward, dgrad, wgrad), causal attention (half the
s×s scores), the output layer over the padded vocabulary, no input embedding, no recompute.
All functions are vectorised: ``b`` (micro-batch), ``s`` (sequence) and ``tp`` may be arrays.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import finetune
from autoparallel.specs.model import ModelSpec


def linear_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one layer's Linear GEMMs per token (the part FP8 accelerates), averaged
    over the layers (a MoE layer counts its top-k experts)."""
    return 2.0 * model.active_layer_params


def attention_core_flops(model: ModelSpec, b, s, causal: bool | np.ndarray = False):
    """Forward FLOPs of QK^T and attention·V for a micro-batch of ``b`` sequences of ``s``
    (multi-latent attention: queries and keys of qk_head_dim + qk_pos_emb_head_dim, values of
    v_head_dim per head).

    Narayanan counts the full s×s matrix; a causal flash kernel skips the upper half. DeepSeek-V4:
    ``dsv4_attention_core_flops``.
    """
    if model.is_dsv4:
        return dsv4_attention_core_flops(model, b, s)
    if model.is_dsa:
        return dsa_attention_core_flops(model, b, s)
    full = 2.0 * b * s * s * model.num_attention_heads * (model.qk_dim + model.v_dim)
    return np.where(causal, 0.5 * full, full)


def dsv4_attention_core_flops(model: ModelSpec, b, s):
    """Forward FLOPs of DeepSeek-V4's attention cores for ``b`` sequences of ``s``, averaged over the
    decoder layers: each query's QK^T and P·V over the keys it attends to (``dsv4_sparse_context``:
    the window, the indexer's top-k compressed keys on ratio-4 layers, the causal half of the
    compressed keys on ratio-128 ones; already causal), and on ratio-4 layers the DSA indexer's
    scores of every query against the causal half of the s/4 compressed keys (index_n_heads x
    index_head_dim each; Megatron-LM d98e8a64dd ``experimental_attention_variant/dsa.py``)."""
    ratios = model.dsv4_decoder_ratios
    per_token = 0.0
    for ratio in ratios:
        per_token += 2.0 * model.num_attention_heads * dsv4_sparse_context(model, ratio, s) * (model.qk_dim + model.v_dim)
        if ratio == 4:
            per_token += 2.0 * model.dsa_indexer_n_heads * model.dsa_indexer_head_dim * s / 4 / 2
    return b * s * per_token / len(ratios)


# cuDNN's sparse indexer backward runs at least 64 indexer heads: fewer are zero-padded to 64 (Megatron-LM
# d98e8a64dd ``experimental_attention_variant/dsa_cudnn_kernels.py`` ``_pad_indexer_heads_for_backward``,
# "cuDNN backward kernels that require at least 64 heads"): GLM-5's 32 run as 64, DeepSeek-V4's 64 as they are.
CUDNN_INDEXER_BACKWARD_MIN_HEADS = 64


def dsa_indexer_loss_flops(model: ModelSpec, b, s):
    """(target GEMM FLOPs, indexer GEMM FLOPs, exponentials) of the sparse DSA indexer loss for ``b`` sequences
    of ``s``, averaged over the decoder layers, as Megatron-LM d98e8a64dd's fused cuDNN path runs it
    (``experimental_attention_variant/dsa_cudnn_kernels.py`` ``FusedIndexerSparseAttnFunc``,
    ``_compute_sparse_indexer_loss_and_grads``, ``dsa_indexer_use_sparse_loss``): in the forward,
    ``sparse_attn_score_recompute_wrapper`` recomputes every head's QK^T over each query's selected keys
    (heads x keys x the kernel's query channels, and the softmax's exponentials) for the head-summed target,
    and ``indexer_backward_wrapper`` computes the indexer's gradients over the same keys (its scores again,
    d q_indexer, d k_indexer: three GEMMs of index heads, at least ``CUDNN_INDEXER_BACKWARD_MIN_HEADS``, x
    keys x index_head_dim); the backward only scales those gradients. DeepSeek-V4: its ratio-4 layers only,
    keys per query the compressed part of ``dsv4_sparse_context`` (MCore's nominal k (1 - 4k / 2s)), channels
    its qk head dim. DSA on every layer (GLM-5): every layer, the top-k keys as ``dsa_contexts`` counts them,
    channels the absorbed MLA query's and latent key's kv_lora_rank + rotary dims (``DSAttention`` runs
    absorbed: ``AbsorbedMLASelfAttention``)."""
    if model.is_dsv4:
        ratios = model.dsv4_decoder_ratios
        share = b * s * dsv4_selected_keys(model, s) * ratios.count(4) / len(ratios)
        channels = model.qk_dim
    else:
        share = b * s * dsa_contexts(model, s)[1]
        channels = model.kv_lora_rank + model.qk_pos_emb_head_dim
    target = 2.0 * model.num_attention_heads * channels
    heads = max(model.dsa_indexer_n_heads, CUDNN_INDEXER_BACKWARD_MIN_HEADS)
    indexer = 3 * 2.0 * heads * model.dsa_indexer_head_dim
    return share * target, share * indexer, share * model.num_attention_heads


def dsa_contexts(model: ModelSpec, s):
    """Keys per query of DeepSeek Sparse Attention on every layer (GLM-5), as Megatron-Bridge 067f987df0
    ``flop_utils.py`` (the ``dsa`` branch) counts them over a causal sequence of ``s``: the dense causal
    context (s + 1) / 2 the indexer scores, and the sparse one the attention reads, the indexer's top-k
    (k - k (k - 1) / 2s once s passes k)."""
    dense = (s + 1) / 2
    k = model.dsa_indexer_topk
    return dense, np.where(s <= k, dense, k - k * (k - 1) / (2 * np.maximum(s, 1)))


def dsa_attention_core_flops(model: ModelSpec, b, s):
    """Forward FLOPs of GLM-5's attention cores for ``b`` sequences of ``s``: the absorbed MLA kernel
    (Megatron-Core's dsa variant: QK over kv_lora_rank + rotary dims, P·V over kv_lora_rank) on each
    query's top-k keys, and the lightning indexer's scores (heads x (head_dim + 1)) on every causal key."""
    dense, sparse = dsa_contexts(model, s)
    absorbed = 2 * model.kv_lora_rank + model.qk_pos_emb_head_dim
    per_token = (2.0 * model.num_attention_heads * sparse * absorbed
                 + 2.0 * model.dsa_indexer_n_heads * (model.dsa_indexer_head_dim + 1) * dense)
    return b * s * per_token


def dsa_flops_per_token(model: ModelSpec, tp=1):
    """Training FLOPs per token of an MLA model with DeepSeek Sparse Attention on every layer (GLM-5) as
    Megatron-Bridge 067f987df0 ``training/utils/flop_utils.py`` counts them (the ``dsa`` branch, the
    indexer trained by the sparse KL loss GLM5Bridge turns on: dsa_indexer_loss_coeff 0.001,
    dsa_indexer_use_sparse_loss): per decoder and MTP layer 6 x the MLA projections and the absorbed
    core on the top-k keys; 4 x the indexer's projections (its inputs are detached: forward and wgrad);
    its scores 2 x on every causal key and 4 x on the selected ones; the loss's teacher QK on the selected
    keys; then the dense layers' MLPs, the routed and shared experts (the MTP layer's too), MTP's e/h
    projection and norms, and the output layer once per prediction."""
    h, heads, s = model.hidden_size, model.num_attention_heads, model.seq_length
    layers = model.num_layers + model.mtp_num_layers
    dense, sparse = dsa_contexts(model, s)
    q_term = model.q_lora_rank * (h + heads * (model.qk_head_dim + model.qk_pos_emb_head_dim) + 1)
    kv_term = (model.kv_lora_rank * (h + heads * (model.qk_head_dim + model.v_head_dim) + 1)
               + h * model.qk_pos_emb_head_dim)
    absorbed_qk = model.kv_lora_rank + model.qk_pos_emb_head_dim
    attention = 6.0 * layers * (q_term + kv_term + heads * model.v_head_dim * h
                                + sparse * heads * (absorbed_qk + model.kv_lora_rank))
    score = model.dsa_indexer_n_heads * (model.dsa_indexer_head_dim + 1)
    indexer = layers * (4.0 * model.dsa_indexer_params + 2.0 * dense * score + 4.0 * sparse * score
                        + 2.0 * sparse * heads * absorbed_qk)
    moe_layers = model.num_moe_layers + model.mtp_num_layers * model.moe_layer_pattern[-1]
    mlp = 6.0 * ((layers - moe_layers) * model.mlp_params(model.ffn_hidden_size)
                 + moe_layers * (model.moe_router_topk * model.expert_params + model.shared_expert_params))
    mtp = 6.0 * model.mtp_num_layers * (3 * h + 2 * h * h)
    return attention + indexer + mlp + mtp + 6.0 * h * padded_vocab_size(model, tp) * (1 + model.mtp_num_layers)


def logits_flops(model: ModelSpec, b, s):
    """Forward FLOPs of the output layer (on the last pipeline stage)."""
    return 2.0 * b * s * model.hidden_size * model.vocab_size


MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM's default --make-vocab-size-divisible-by


def padded_vocab_size(model: ModelSpec, tp=1):
    """The vocabulary Megatron-LM builds: a multiple of 128·tp (``_vocab_size_with_padding``)."""
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * np.asarray(tp, dtype=float)
    return np.ceil(model.vocab_size / multiple) * multiple


def model_flops_per_token(model: ModelSpec, tp=1):
    """Training FLOPs per token as Megatron-LM's ``num_floating_point_operations`` counts them:
    6 per active Linear parameter (forward, dgrad, wgrad: the dense layers' MLP, the top-k and
    shared experts of the MoE layers, attention or MLA's projections; not the router),
    3·s·heads·(qk + v head dims) per layer for causal attention, 6·h·V for the output layer
    (V padded for ``tp``), no input embedding and no multi-token prediction. Fine-tuning: packed
    documents' attention (``finetune.attention_share``); under LoRA the frozen weights count 4
    (no wgrad) and the adapters 6 per parameter. A hybrid model: ``hybrid_flops_per_token``."""
    if model.is_hybrid:
        return hybrid_flops_per_token(model, tp)
    if model.is_dsv4:
        return dsv4_flops_per_token(model, tp)
    if model.is_dsa:
        return dsa_flops_per_token(model, tp)
    layers = (model.num_dense_layers * model.dense_layer_params
              + model.num_moe_layers * (model.active_moe_layer_params - model.router_params))
    attention = (3.0 * model.num_layers * model.seq_length * model.num_attention_heads
                 * (model.qk_dim + model.v_dim)) * finetune.attention_share(model)
    per_weight = 2.0 * finetune.linear_passes(model)
    logits = per_weight * model.hidden_size * padded_vocab_size(model, tp)
    adapters = 6.0 * model.num_layers * finetune.adapter_params_gpu(model, 1)
    return per_weight * layers + attention + logits + adapters


def megatron_mamba_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one Mamba layer as Megatron-LM counts them (d98e8a64dd
    ``megatron/training/training.py`` ``mamba_layer_flops``): in_proj on d_in = 2 x hidden_size
    (not the mixer's mamba_num_heads x mamba_head_dim: Nemotron 3 Nano's 5,376 for 4,096, so the
    count exceeds the executed GEMMs), 7·d_in·state for the scan, out_proj; the conv1d left out."""
    h, d_in = model.hidden_size, 2 * model.hidden_size
    in_proj = 2.0 * h * (2 * d_in + 2 * model.mamba_num_groups * model.mamba_state_dim + model.mamba_heads)
    return in_proj + 7.0 * d_in * model.mamba_state_dim + 2.0 * d_in * h


def megatron_moe_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one MoE block as Megatron-LM counts them (``moe_layer_flops``):
    the top-k routed experts (on moe_latent_size under LatentMoE, plus its two h x latent
    projections) and the shared experts; no router."""
    experts = model.moe_router_topk * model.expert_params
    return 2.0 * (experts + model.shared_expert_params + model.latent_projection_params)


def hybrid_flops_per_token(model: ModelSpec, tp=1):
    """Training FLOPs per token of a hybrid model as Megatron-LM's ``hybrid_flops`` counts them
    (d98e8a64dd ``megatron/training/training.py``): three times the forward of each kind's layers
    (attention: QKV and projection plus causal s·heads·(qk + v) per token; MLP; Mamba
    ``megatron_mamba_flops_per_token``; MoE ``megatron_moe_flops_per_token``) and of the output
    layer over the padded vocabulary once per prediction (1 + mtp_num_layers): the MTP modules'
    own layers are not counted."""
    counts = model.layer_kind_counts
    attention = (2.0 * model.attention_params + model.seq_length * model.num_attention_heads
                 * (model.qk_dim + model.v_dim) * finetune.attention_share(model))
    forward = (counts["*"] * attention + counts["-"] * 2.0 * model.mlp_params(model.ffn_hidden_size)
               + counts["M"] * megatron_mamba_flops_per_token(model)
               + (counts["E"] * megatron_moe_flops_per_token(model) if counts["E"] else 0.0)
               + 2.0 * model.hidden_size * padded_vocab_size(model, tp) * (1 + model.mtp_num_layers))
    return 3.0 * forward


def dsv4_sparse_context(model: ModelSpec, ratio: int, s) -> float:
    """Keys one query attends to on average in a DeepSeek-V4 layer of compression ``ratio`` over a
    causal sequence of ``s``, as Megatron-Bridge 067f987df0 ``flop_utils.py`` (dsv4_hybrid) counts
    them: the csa_window_size window everywhere; ratio 4 adds the indexer's top-k of the s/4
    compressed keys (MCore's nominal estimate k (1 - 4k / 2s), k = min(topk, s/4)); ratio 128 the
    causal half of the s/128 compressed keys."""
    window = model.csa_window_size
    if ratio == 4:
        return window + dsv4_selected_keys(model, s)
    return window + (s / 128 / 2 if ratio == 128 else 0.0)


def dsv4_selected_keys(model: ModelSpec, s):
    """Compressed keys the DSA indexer selects per query on a ratio-4 layer over a causal sequence of
    ``s``: MCore's nominal k (1 - 4k / 2s), k = min(topk, s/4)."""
    k = np.minimum(model.dsa_indexer_topk, s // 4)
    return k * (1 - k * 4 / (2 * s))


def dsv4_flops_per_token(model: ModelSpec, tp=1):
    """Training FLOPs per token of DeepSeek-V4 as Megatron-Bridge counts its TFLOP/s (067f987df0
    ``src/megatron/bridge/training/utils/flop_utils.py``, the ``dsv4_hybrid`` branch), 3 x 2 x per
    layer and MTP layer: the projections (q_lora_rank x (h + heads x 512 + 1), h x d + d for wkv and
    its norm, the grouped low-rank output), sparse attention 2 x heads x context x d (QK and PV)
    (``dsv4_sparse_context``), the compressors' and indexer's weights (``ModelSpec.csa_extra_params``),
    the indexer's scores heads x dim x s/4 (no causal half), the top-k routed and shared experts on
    every layer and the MTP layer, the MTP's e/h projections and norms, and the output layer once per
    prediction. Leaves out what runs but Bridge does not count: mHC, the router, compressor pooling."""
    h, heads, d, s = model.hidden_size, model.num_attention_heads, model.v_head_dim, model.seq_length
    q_term = model.q_lora_rank * (h + heads * (model.qk_head_dim + model.qk_pos_emb_head_dim) + 1)
    out_term = heads * d * model.o_lora_rank + model.o_groups * model.o_lora_rank * h
    projections = q_term + h * d + d + out_term
    forward = 0.0
    for ratio in model.csa_compress_ratios:
        forward += projections + 2 * heads * dsv4_sparse_context(model, ratio, s) * d + model.csa_extra_params(ratio)
        if ratio == 4:
            forward += model.dsa_indexer_n_heads * model.dsa_indexer_head_dim * s / 4
    layers = len(model.csa_compress_ratios)
    forward += layers * (model.moe_router_topk * model.expert_params + model.shared_expert_params)
    forward += model.mtp_num_layers * (3 * h + 2 * h * h)
    forward += h * padded_vocab_size(model, tp) * (1 + model.mtp_num_layers)
    return 6.0 * forward


def narayanan_flops_per_step(model: ModelSpec, gbs: float, full_recompute: bool) -> float:
    """Narayanan et al. eq. (3): hardware FLOPs per iteration of a GPT model (4 passes with
    full recompute, 3 without); used to compare with their Table 1."""
    l, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    coefficient = 96.0 if full_recompute else 72.0
    return coefficient * gbs * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
