"""DeepSeek-V4's own kernels beyond a standard MLA + MoE layer, per layer, micro-batch and GPU: the
Hyper-Connections' (mHC) HBM passes and saved streams, the ``mhc`` recompute module, the compressors' gated pooling (each from the Megatron-LM / Megatron-Bridge
source its docstring names; benchmarks/RESULTS.md sessions 49 s49h2, s49h5, s49h9, 50 s50h4).

The GEMM terms stay with every other Linear in ``layer_time`` (``dsv4_output_groups_bf16_time``), as do
the router (``hash_routed_router_time``) and the assembly of these terms into the MoE layer
(``dsv4_attention_kernels``, ``moe_layer``): as ``mamba`` is to the Mamba-2 mixer. The DSA indexer's
top-k and sparse loss, which its ratio-4 layers run as GLM-5 runs them on every layer, are ``dsa``'s.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import memory
from autoparallel.costmodel.candidates import Candidates


def hyper_connection_saved_bytes(x: Candidates):
    """What a DeepSeek-V4 layer's two mHC blocks keep for backward beyond a plain residual: each
    block's n-stream input (for the mappings' projection and norm, H_pre and H_res), BF16."""
    return 2.0 * x.model.hc_mult * x.tokens / x.t * x.model.hidden_size * memory.ACT_INPUT_BYTES


# DeepSeek-V4's Hyper-Connections (Megatron-LM d98e8a64dd ``megatron/core/transformer/hyper_connection.py``
# HyperConnectionModule, the unfused path), per block and token, in hidden-size elements of the n = hc_mult
# streams: ``compute_mappings`` reads the n streams twice (the RMS norm and the projection to the mixing
# weights), ``aggregate`` reads n and writes 1 (H_pre), ``fused_h_res_h_post_bda`` reads the n-stream residual
# and the block's output and writes n streams (H_res x + H_post^T out): 2n + (n + 1) + (2n + 1). Two blocks per
# layer (attention, MoE). The backward moves each pass's gradient: twice the forward's bytes.
def hyper_connection_elements(n: int) -> float:
    """Hidden-size elements one mHC block moves per token forward (see above)."""
    return 2.0 * n + (n + 1.0) + (2.0 * n + 1.0)


def fused_hyper_connection_elements(n: int) -> tuple[float, float]:
    """(forward, backward) hidden-size elements one mHC block moves per token under ``use_fused_mhc``
    (NVIDIA/Megatron-LM@296a8922a2 ``megatron/core/fusions/fused_mhc_kernels.py``, cuTile, compute capability
    10+; Megatron-Bridge 067f987df0 turns it on on Blackwell, ``deepseek_v4_supports_blackwell_fused_kernels``).
    Forward: ``proj_rms`` reads the n streams once (projection and RMS norm together), ``h_aggregate`` reads n
    and writes 1, ``h_post_bda`` reads n and the block's output and writes n: 4n + 2. Backward: ``proj_rms``
    reads n and writes their gradient (2n), ``h_aggregate`` reads the gradient, n streams, writes n (2n + 1),
    ``h_post_bda`` reads n gradients, n streams and the output, writes n and 1 (3n + 2), and autograd sums the
    three n-stream gradients of the block's input (two adds, each reading 2n and writing n): 13n + 3. The
    Sinkhorn iterations run inside one kernel on the n x n matrices (no HBM pass of hidden size)."""
    return 4.0 * n + 2.0, 13.0 * n + 3.0


def hyper_connection_time(x: Candidates):
    """(forward, backward) seconds of a DeepSeek-V4 layer's two mHC blocks over HBM, BF16, on the
    GPU's tokens: on Blackwell the fused cuTile kernels the recipes run (``fused_hyper_connection_elements``),
    elsewhere the unfused module (``hyper_connection_elements``, backward twice the forward); the
    tiny projection GEMM's FLOPs are left out (per token ~1 % of the bytes)."""
    n = x.model.hc_mult
    fused_forward, fused_backward = fused_hyper_connection_elements(n)
    per_element = 2.0 * x.tokens / x.t * x.model.hidden_size * memory.ACT_INPUT_BYTES / x.hbm
    forward = np.where(x.hw.mxfp8, fused_forward, hyper_connection_elements(n)) * per_element
    backward = np.where(x.hw.mxfp8, fused_backward, 2.0 * hyper_connection_elements(n)) * per_element
    return forward, backward


def mhc_recompute_time(x: Candidates):
    """Seconds the ``mhc`` recompute module adds to a layer's backward: Megatron-LM (NVIDIA/Megatron-LM@caeff8c80d
    ``transformer/hyper_connection.py`` ``_forward_with_checkpoint``, ``fused_h_res_h_post_bda`` with a
    ``CheckpointManager``; ``transformer_layer.py`` ``HyperConnectionTransformerLayer``) wraps each block's
    aggregation and its H_res / H_post residual merge in output-discarding checkpoints that one manager
    recomputes before the backward: both blocks' mHC forward again (``hyper_connection_time``'s forward,
    which also counts the mappings' projection the checkpoint does not rerun: an upper bound by their
    share)."""
    return hyper_connection_time(x)[0]


def compressor_bytes_per_token(ratio: int, head_dim: int) -> float:
    """HBM bytes per token one DeepSeek-V4 Compressor's gated pooling moves forward (NVIDIA/Megatron-LM@caeff8c80d
    ``experimental_attention_variant/csa.py`` ``Compressor.forward``, eager PyTorch), on its wkv and wgate
    outputs of coff x head_dim (coff 2 on ratio-4 layers, which overlap windows): the FP32 positional bias
    added to the BF16 gate (read 2, write 4 bytes per element); on ratio-4 layers ``_overlap_transform``
    of both (a filled 2 x head_dim buffer and the two half copies: 12 bytes per head_dim element for the
    BF16 values, 24 for the FP32 gate); the softmax over the window (FP32 read and write, 8 per pooled
    element), the BF16 x FP32 product (2 + 4 read, 4 written) and the sum (4 read). The norm and RoPE run
    on the 1/ratio compressed rows (left out)."""
    coff = 2 if ratio == 4 else 1
    pooled = coff * head_dim
    overlap = 36.0 * head_dim if ratio == 4 else 0.0
    return 6.0 * coff * head_dim + overlap + (8.0 + 10.0 + 4.0) * pooled


def dsv4_compressor_time(x: Candidates):
    """(forward, backward) seconds of DeepSeek-V4's compressors' gated pooling, averaged over the decoder
    layers: ratio-4 layers run the attention's compressor (v_head_dim) and the indexer's (index_head_dim),
    ratio-128 layers the attention's only (``compressor_bytes_per_token``); built "duplicated" over TP,
    so on every GPU's whole micro-batch. The backward moves each pass's gradient: twice the forward's
    bytes (as ``hyper_connection_time``)."""
    model = x.model
    ratios = model.dsv4_decoder_ratios
    per_token = sum(compressor_bytes_per_token(r, model.v_head_dim)
                    + (compressor_bytes_per_token(r, model.dsa_indexer_head_dim) if r == 4 else 0.0)
                    for r in ratios if r > 1) / len(ratios)
    forward = per_token * x.tokens / x.hbm
    return forward, 2.0 * forward
