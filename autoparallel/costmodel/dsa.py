"""DeepSeek Sparse Attention's lightning indexer beyond the attention core, per layer, micro-batch and
GPU: its top-k over FP32 scores and its sparse KL loss against the attention's scores, on DeepSeek-V4's
ratio-4 layers and on every layer of a DSA model (GLM-5), from Megatron-LM d98e8a64dd
``experimental_attention_variant/dsa.py`` and ``dsa_cudnn_kernels.py`` (benchmarks/RESULTS.md sessions 49
s49h5, 50 s50h4). ``layer_time`` puts them into the layer (``dsa_attention_kernels``,
``dsv4_attention_kernels``) beside the CP all-gather (``cp_allgather_time``).
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import flops, gemm
from autoparallel.costmodel.candidates import Candidates


def dsa_indexer_loss_time(x: Candidates):
    """(forward, backward) seconds of the sparse DSA indexer loss, averaged over the layers: DeepSeek-V4's
    ratio-4 layers (the perf recipes' ``dsa_indexer_loss_coeff`` 0.01 with ``dsa_indexer_use_sparse_loss``;
    Megatron-Bridge 067f987df0 ``perf_recipes/deepseek/gb200/deepseek_v4.py``) or every layer of a DSA model
    (GLM5Bridge's 0.001, sparse, ``models/glm_moe_dsa/glm5_bridge.py``; its recipes' ``dsa_kernel_backend``
    "cudnn"): the fused path's attention-target recompute and indexer gradients
    (``flops.dsa_indexer_loss_flops``), all in the forward, BF16 kernels of the attention core's kind at its
    efficiency (``attention_time``'s GEMMs or exponentials, whichever is slower); the target over the TP
    rank's heads, the indexer (built "duplicated") whole, each CP rank on its s/cp queries (MCore's zigzag
    split gives every rank the mean context); the backward only scales the gradients (none here)."""
    model, hw = x.model, x.hw
    target, indexer, exponentials = flops.dsa_indexer_loss_flops(model, x.b, model.seq_length)
    gemms = (target / x.t + indexer) / gemm.bf16_peak(hw)  # the heads split by TP, the indexer whole
    forward = (np.maximum(gemms, exponentials / x.t / (hw.exp_tera_per_s * 1e12)) / x.c
               / hw.attention_peak_share(x.s_local))
    return forward, 0.0 * forward


def dsa_score_row_keys(model, s, c):
    """Keys of one query's FP32 indexer score row under DSA on every layer (GLM-5) where Megatron-LM d98e8a64dd's
    cuDNN kernels score (``dsa_cudnn_kernels.py`` ``_indexer_topk_bshd``): without CP ``indexer_forward_wrapper``
    writes the whole (b, s, s) matrix, masked entries -inf; under CP each rank's two zigzag halves of s/2cp
    queries score the gathered keys cropped to their causal prefix (``_indexer_topk_single_packed_cp_segments``,
    the packed path Bridge's 128k recipes run: rank r's (r + 1) and (2cp - r) halves), (2cp + 1) s / 4cp keys a
    query whatever the rank (one document a sequence: more documents shorten the rows, not priced)."""
    return np.where(c > 1, (2.0 * c + 1.0) * s / (4.0 * np.maximum(c, 1)), s)


# Megatron-LM d98e8a64dd ``dsa_cudnn_kernels.py``: ``_indexer_topk_bshd`` leaves the cuDNN scorer for the eager
# ``_compute_indexer_scores_chunk_with_global_rows`` wherever the rows carry varlen bounds its fast paths do not
# take (``dsa_eager_scorer``). FP32 bytes per score of the (b, s, gathered keys) matrix: per indexer head the
# bmm's output (4), ``relu_`` (4 + 4), the weight's ``mul_`` (4 + 4) and the ``add_`` into the sum (4 + 4 + 4);
# once the zeroed sum (4), the causal ``masked_fill_`` (a one-byte mask written and read, 4 + 4),
# ``apply_starts_ends_mask_to_scores`` (its mask built and inverted, 3, the masked copy 4 + 1 + 4 ... about 12)
# and the top-k's read (4). The cuDNN path writes each score once and the top-k reads it (4 + 4).
EAGER_SCORE_BYTES_PER_HEAD = 32.0
EAGER_SCORE_BYTES = 30.0
FUSED_SCORE_BYTES = 8.0


def dsa_eager_scorer(model, c):
    """Whether DSA's indexer scores run eagerly (``EAGER_SCORE_BYTES``): Megatron-LM d98e8a64dd's
    ``build_dsattention_forward_mask`` gives the rows varlen bounds under packed sequences or CP, and the cuDNN
    path keeps its own scorer only without either (plain causal, normalized back) or for packed sequences under
    CP (``use_local_indexer_varlen``): unpacked sequences under CP, and packed ones without CP, score eagerly."""
    packed = model.finetune is not None and model.finetune.packed_sequence
    return np.asarray(c) > 1 if not packed else np.asarray(c) == 1


def dsa_indexer_topk_time(x: Candidates):
    """(forward, backward) seconds of the DSA indexer's top-k selection, averaged over the layers: Megatron-LM
    d98e8a64dd's fused path (``dsa_cudnn_kernels.py`` ``_indexer_topk_bshd``) has ``indexer_forward_wrapper``
    write each query's FP32 scores and ``indexer_top_k_wrapper`` read them back (``FUSED_SCORE_BYTES``), on
    DeepSeek-V4's ratio-4 layers over the s/4 compressed keys, under DSA on every layer over
    ``dsa_score_row_keys``, or where it scores eagerly (``dsa_eager_scorer``) the eager passes over every
    gathered key (``EAGER_SCORE_BYTES``; their FP32 bmm FLOPs stay as the attention core prices the indexer's,
    on the tensor cores over the causal keys: short of the eager kernels' CUDA-core rate); built "duplicated"
    over TP; no backward."""
    model, s = x.model, x.model.seq_length
    if model.is_dsv4:
        ratios = model.dsv4_decoder_ratios
        scores = FUSED_SCORE_BYTES * x.tokens * s / 4 * ratios.count(4) / len(ratios)
    else:
        eager = dsa_eager_scorer(model, x.c)
        per_score = np.where(eager, EAGER_SCORE_BYTES + EAGER_SCORE_BYTES_PER_HEAD * model.dsa_indexer_n_heads,
                             FUSED_SCORE_BYTES)
        scores = per_score * x.tokens * np.where(eager, s, dsa_score_row_keys(model, s, x.c))
    forward = scores / x.hbm
    return forward, 0.0 * forward
