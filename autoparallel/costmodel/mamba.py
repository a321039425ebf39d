"""The Mamba-2 mixer of a hybrid model's M layers as Megatron-Core runs it in training, priced per
GPU and micro-batch (``layer_time.mamba_layer`` puts it together).

Megatron-LM d98e8a64dd ``megatron/core/ssm/mamba_mixer.py`` (``MambaMixer.forward`` ->
``_ssm_training``): ``in_proj`` (a ColumnParallelLinear with the layer's pre-norm fused, TP-split
over heads and groups: z, x, B, C, dt) -> mamba_ssm's ``mamba_split_conv1d_scan_combined`` (the
causal conv1d over x, B and C, then the SSD chunked scan ``_mamba_chunk_scan_combined_fwd`` with
the D skip and the z gate, chunk size ``CHUNK_SIZE``) -> ``self.norm`` (mamba_ssm's Triton
grouped RMSNorm, without a gate: the gate ran in the scan) -> ``out_proj`` (RowParallelLinear).
The GEMMs are priced as any Linear (``layer_time.linear_time``); the conv1d and the norm are
memory-bound (bytes over HBM bandwidth); the SSD kernels are small batched matmuls over chunks,
priced as a roofline of their FLOPs (BF16 tensor cores at the GEMM curve's efficiency for one
kernel's work) and their HBM traffic, whichever is slower.

SSD per token (H heads of P channels, d = H·P, state N, G groups, chunk Q), from the Triton
kernels of mamba_ssm ``ops/triton/ssd_combined.py`` (state-spaces/mamba v2.2): forward
``_bmm_chunk_fwd`` C·Bᵀ per chunk and group (2·Q·N·G, the whole Q×Q block), ``_chunk_state_fwd``
the chunk's final state Bᵀ·x per head (2·N·d), ``_state_passing_fwd`` (elementwise over the states),
``_chunk_scan_fwd`` the output from the previous state C·S (2·N·d) plus the intra-chunk
(C·Bᵀ ∘ decay)·x, causal (the kernel stops at the diagonal block: Q·d, half of 2·Q·d).
``_mamba_chunk_scan_combined_bwd`` recomputes C·Bᵀ and the states (2·Q·N·G + 2·N·d), then dstates
(Cᵀ·dout, 2·N·d), dx (B·dstates 2·N·d, causal (C·Bᵀ)ᵀ·dout Q·d), dC (dout·Sᵀ, 2·N·d), dB
(x·dstatesᵀ, 2·N·d), dCB (dout·xᵀ, causal, Q·d) and dC, dB from dCB (2 x 2·Q·N·G).

Megatron-Core's ``_ssm_training`` also moves the mixer's tensors between its sequence-first layout
and the kernels' batch-first one (``layout_copy_time``): real copies when the micro-batch holds
more than one sequence.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import dispatch, gemm, memory

# MambaMixer's chunk_size (its __init__ default; MambaLayer passes none).
CHUNK_SIZE = 128
# The SSD kernels each pass launches that carry the matmuls (forward: bmm, chunk state, chunk scan;
# backward: the recomputed bmm and chunk state, dstates, dx, dC, dB, dCB), over which a pass's
# FLOPs are spread to read the GEMM curve at one kernel's size.
SSD_KERNELS = (3.0, 7.0)
# Bytes per state element per chunk that the SSD's chunk states move through HBM: forward FP32
# written by ``_chunk_state_fwd`` (4), read and written by ``_state_passing_fwd`` (4 + 4), read by
# ``_chunk_scan_fwd`` (4); the backward (``_mamba_chunk_scan_combined_bwd``, state-spaces/mamba
# e9594ce ``ops/triton/ssd_combined.py``) recomputes them in FP32 (``_chunk_state_fwd`` 4,
# ``_state_passing_fwd`` 4 + 4), writes dstates in FP32 (``_chunk_scan_bwd_dstates`` 4),
# ``_state_passing_bwd`` reads both in FP32 (8) and writes both in BF16 (4), the dx and dB kernels
# read the BF16 dstates (2 + 2) and the dC kernel the BF16 states (2): 34.
STATE_BYTES = (16.0, 34.0)
# The SSD backward's other HBM traffic per token, kernel by kernel (same source; the per-head FP32
# scalars dt, dA_cumsum and their gradients, under 3 % of it, left out):
# - BF16 tensors d wide (x, z, out_x, dout and their gradients), 17 reads and writes: x by the
#   recomputed ``_chunk_state_fwd``; dout, out_x, z, x read and dz, the gated dout written by
#   ``_chunk_scan_bwd_dz``; dout by ``_chunk_scan_bwd_dstates``; x, dout read and dx written by
#   ``_chunk_scan_chunk_state_bwd_dx``; x by ``_chunk_state_bwd_db``; dout by ``_chunk_scan_bwd_dC``;
#   x and dout by ``_chunk_scan_bwd_dcb`` and again by ``_chunk_scan_bwd_ddAcs_stable``;
# - B and C (G·N wide): 11 BF16 passes (C, B by the recomputed ``_bmm_chunk_fwd``; B by
#   ``_chunk_state_fwd``, the dx and dB kernels; C by the dstates and dC kernels; C, B read and dB,
#   dC written by the two ``_bmm_chunk_bwd``) and 8 FP32 passes (dB and dC written in FP32 by their
#   kernels, summed over the head splits (read, write), read as the residual of ``_bmm_chunk_bwd``);
# - C·Bᵀ and its gradient (G·Q FP32 per token), 8 passes: CB written by the recomputed bmm, read by
#   the dx and ddA kernels; dCB written by ``_chunk_scan_bwd_dcb``, summed over the head splits (read,
#   write), read by the two ``_bmm_chunk_bwd``.
BACKWARD_PASSES = {"inner_bf16": 17.0, "bc_bf16": 11.0, "bc_fp32": 8.0, "cb_fp32": 8.0}
BF16 = 2.0
FP32 = 4.0


def linear_params(model) -> float:
    """in_proj and out_proj: the mixer's GEMM weights."""
    return model.hidden_size * model.mamba_in_proj_width + out_proj_params(model)


def out_proj_params(model) -> float:
    """out_proj: the mixer's inner channels back to the hidden size."""
    return model.mamba_inner * model.hidden_size


def ssd_flops_per_token(model) -> tuple[float, float]:
    """(forward, backward) FLOPs per token of the SSD chunked scan (module docstring)."""
    q, n, g, d = CHUNK_SIZE, model.mamba_state_dim, model.mamba_num_groups, model.mamba_inner
    cb, state, intra = 2.0 * q * n * g, 2.0 * n * d, q * d
    forward = cb + state + state + intra
    backward = (cb + state) + state + (state + intra) + state + state + intra + 2.0 * cb
    return forward, backward


def ssd_bytes_per_token(model) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the SSD kernels: the chunk states
    (``STATE_BYTES`` per element, d·N/Q of them per token) and the other tensors. Forward: x, B,
    C, dt, z read once, the gated output and the ungated out_x written (the kernels' own count,
    x read twice and C·Bᵀ written and read in FP32, is within -2..+4 % of it on Nemotron 3). Backward:
    each kernel's reads and writes (``BACKWARD_PASSES``): the backward's eleven kernels read x and
    dout again and again and keep the B / C gradients and C·Bᵀ in FP32."""
    d, g, h = model.mamba_inner, model.mamba_num_groups * model.mamba_state_dim, model.mamba_heads
    states = d * model.mamba_state_dim / CHUNK_SIZE
    io_forward = BF16 * (d + 2 * g + h + d) + BF16 * 2 * d
    passes = BACKWARD_PASSES
    io_backward = (BF16 * passes["inner_bf16"] * d + (BF16 * passes["bc_bf16"] + FP32 * passes["bc_fp32"]) * g
                   + FP32 * passes["cb_fp32"] * model.mamba_num_groups * CHUNK_SIZE)
    return STATE_BYTES[0] * states + io_forward, STATE_BYTES[1] * states + io_backward


def ssd_time(x):
    """(forward, backward) seconds of the SSD scan on the GPU's tokens and heads (TP splits the
    heads; CP's all-to-all hands each rank the whole sequence for its heads, the same work)."""
    per_gpu = x.tokens / x.t
    bf16 = gemm.bf16_peak(x.hw)
    times = []
    for flops, nbytes, kernels in zip(ssd_flops_per_token(x.model), ssd_bytes_per_token(x.model), SSD_KERNELS):
        work = per_gpu * flops
        compute = work / (bf16 * gemm.efficiency(x.hw, work / kernels))
        times.append(np.maximum(compute, per_gpu * nbytes / x.hbm))
    return tuple(times)


def conv_bytes_per_token(model) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the causal depthwise conv1d over x, B and C
    (kernel width 4: memory-bound): forward reads its input and writes its output; the backward
    runs the forward again (the fused function keeps the conv's input only) and reads dout and the
    input, writing dx: five passes."""
    one = BF16 * model.mamba_conv_channels
    return 2.0 * one, 5.0 * one


def conv_time(x):
    """(forward, backward) seconds of the conv1d (``conv_bytes_per_token``) on the GPU's tokens."""
    forward, backward = conv_bytes_per_token(x.model)
    per_byte = x.tokens / x.t / x.hbm
    return forward * per_byte, backward * per_byte


def norm_bytes_per_token(model) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the grouped RMSNorm on the scan's output: read
    and write (forward); read dout and the input, write dx (backward)."""
    one = BF16 * model.mamba_inner
    return 2.0 * one, 3.0 * one


def norm_time(x):
    """(forward, backward) seconds of the grouped RMSNorm (``norm_bytes_per_token``)."""
    forward, backward = norm_bytes_per_token(x.model)
    per_byte = x.tokens / x.t / x.hbm
    return forward * per_byte, backward * per_byte


def layout_copy_time(x):
    """(forward, backward) seconds of the layout copies around the fused scan in Megatron-Core's
    ``MambaMixer._ssm_training`` (NVIDIA/Megatron-LM d98e8a64dd ``megatron/core/ssm/mamba_mixer.py``):
    ``rearrange(zxBCdt, "l b d -> b l d").contiguous()`` copies in_proj's output to the kernels'
    batch-first layout and ``rearrange(y, "b l d -> l b d").contiguous()`` the scan's output back
    (forward: read and write each, BF16); in the backward the gradient of zxBCdt comes back as a
    sequence-first view that in_proj's backward copies to contiguous rows (the gradient of y
    enters the scan's backward as a view, which its kernels read by strides). A micro-batch of one
    sequence is contiguous in both layouts: no copy."""
    model = x.model
    per_byte = 2.0 * BF16 * x.tokens / x.t / x.hbm  # one read and one write of each element
    several = x.b > 1
    forward = np.where(several, (model.mamba_in_proj_width + model.mamba_inner) * per_byte, 0.0)
    backward = np.where(several, model.mamba_in_proj_width * per_byte, 0.0)
    return forward, backward


def cp_time(x):
    """Megatron-Core's Mamba context parallelism (``megatron/core/ssm/mamba_context_parallel.py``):
    an all-to-all before the conv (the in_proj output: sequence gathered, heads split over CP) and
    one after the scan (back), the backward the same two: priced as the expert dispatch's
    all-to-all (``dispatch.alltoall_time``), exposed (the mixer waits for it)."""
    local = BF16 * x.b * x.s_local / x.t
    one_way = (dispatch.alltoall_time(x.hw, local * x.model.mamba_in_proj_width, x.c, x.t)
               + dispatch.alltoall_time(x.hw, local * x.model.mamba_inner, x.c, x.t))
    return np.where(x.c > 1, 2.0 * one_way, 0.0)


def activation_bytes(model, b, s, t, sp, fp8_fraction, quantized_bytes, keep: bool = True):
    """Bytes one Mamba layer saves for backward: the pre-norm's BF16 input and in_proj's input
    (its FP8 copy under a recipe; both SP-sharded); ``mamba_split_conv1d_scan_combined`` keeps the
    in_proj output zxBCdt and the scan's ungated output out_x (BF16); the norm its BF16 input and
    FP32 rstd per group; out_proj its input (TP-sharded). ``keep`` False: the norm's input alone,
    the basis of the layer's generic elementwise kernels (``layer_time.forward_time``)."""
    sbh = b * s * model.hidden_size
    mask = memory.HIDDEN_DROPOUT_MASK_BYTES / 2.0 if model.hidden_dropout else 0.0
    norm = (memory.NORM_INPUT_BYTES / 2.0 + mask) * sbh / np.where(sp, t, 1)
    if not keep:
        return norm
    gemm_in = memory.gemm_input_bytes(fp8_fraction, quantized_bytes)
    replicated = gemm_in * sbh / np.where(sp, t, 1)
    d = model.mamba_inner
    sharded = (BF16 * model.mamba_in_proj_width + BF16 * d + BF16 * d + FP32 * model.mamba_num_groups
               + gemm_in * d) * b * s / t
    return norm + replicated + sharded
