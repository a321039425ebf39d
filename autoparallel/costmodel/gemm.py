"""How fast a GEMM runs: a size-dependent share of a peak that mixes FP8 (or FP4) and BF16 layers.

Small GEMMs cannot fill the GPU (too few tiles per SM, launch and epilogue costs): a GEMM of F
FLOPs reaches ``gemm_max / (1 + gemm_half_gflop / F[GFLOP])`` of peak, both constants fitted per
GPU on published runs (``calibrate``).
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.hardware import HardwareSpec


def tensor_speed(hw: HardwareSpec) -> float:
    """The sustained tensor-core speed of ``hw`` relative to its datasheet peaks, against the GPU
    whose constants it takes: a fitted factor where the constants hold one (``Efficiency.gpu_speed``),
    else its SMs x max SM clock against the donor's (``HardwareSpec.clock_speed``, from
    ``specs.hardware.clock_limited_speed``; 1 for that GPU itself and where a clock is not stated)."""
    return hw.efficiency.gpu_speed.get(hw.name, hw.clock_speed)


def size_speed(hw: HardwareSpec, gemm_flops):
    """The factor on ``tensor_speed`` an FP8 GEMM of ``gemm_flops`` runs at: 1 on a GPU with one measured
    speed; where a benchmark measured ``hw`` beside its reference at several shapes
    (``HardwareSpec.fp8_gemm_size_speed``), the measured ratio at this size over the one ``tensor_speed``
    holds, read linearly in log(FLOPs) between the measured shapes and held beyond the smallest and the
    largest. On top of the donor's own curve (``efficiency``), which prices the reference GPU."""
    if not hw.fp8_gemm_size_speed:
        return 1.0
    flops, speed = zip(*hw.fp8_gemm_size_speed)
    return np.interp(np.log(np.maximum(gemm_flops, 1.0)), np.log(flops), speed)


def bf16_speed(hw: HardwareSpec) -> float:
    """``tensor_speed`` for the BF16 GEMMs: where a benchmark measured ``hw``'s BF16 GEMM rate beside its
    reference's (``HardwareSpec.bf16_clock_speed``, ``specs.hardware.measured_bf16_speed``) that speed,
    else the one every tensor peak takes. A fitted factor (``Efficiency.gpu_speed``) still wins."""
    return hw.efficiency.gpu_speed.get(hw.name, hw.bf16_clock_speed or hw.clock_speed)


def bf16_peak(hw: HardwareSpec) -> float:
    """FLOP/s of the BF16 tensor cores: the datasheet peak at ``hw``'s sustained BF16 speed."""
    return hw.bf16_tflops * 1e12 * bf16_speed(hw)


def efficiency(hw: HardwareSpec, gemm_flops):
    """Fraction of peak one GEMM of ``gemm_flops`` reaches: small GEMMs starve the GPU."""
    eff = hw.efficiency
    return eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(gemm_flops / 1e9, 1e-9))


# The NVFP4 GEMM kernel's measured throughput against the per-tensor FP8 one on the same shapes,
# quantization excluded: TransformerEngine's GEMM-profiling tutorial (NVIDIA/TransformerEngine@d0067d0da
# docs/examples/gemm_profiling/gemm_profiling.rst, "NVIDIA B300 SXM6 AC", --pre-quantize, hidden 4096,
# intermediate 16384, 15,872 tokens, the 12 Fprop/Dgrad/Wgrad GEMMs of a layer): FP8CurrentScaling
# 6.812 ms, NVFP4 3.764 ms per layer, 1.81x, against a datasheet FP4/FP8 ratio of 3 on B300 (the same
# table: MXFP8 7.161 ms, 1.90x; BF16 13.102 ms, 3.48x against 6). The tutorial: "well short of the
# theoretical 2--3x from the hardware spec". Measured on B300 only; taking it as the ceiling on B200 /
# GB200 too (datasheet ratio 2) is an assumption.
NVFP4_OVER_FP8_GEMM = 6.812 / 3.764


def fp4_tflops(hw: HardwareSpec) -> float:
    """The FP4 peak a Linear's NVFP4 GEMMs are priced at: the datasheet figure, but no more than
    ``NVFP4_OVER_FP8_GEMM`` times the FP8 one (the measured kernel ratio; the datasheet's 3x on
    Blackwell Ultra is not what the NVFP4 GEMM sustains)."""
    fp8 = hw.fp8_tflops or hw.bf16_tflops
    return min(hw.fp4_tflops or fp8, NVFP4_OVER_FP8_GEMM * fp8)


def peak(hw: HardwareSpec, quantized_fraction, fp4=False, gemm_flops=None):
    """Effective peak FLOP/s of the Linear GEMMs: the quantized share of the layers at the FP8
    peak, or at the FP4 peak under NVFP4 (all three GEMMs of a Linear run NVFP4: forward, data
    and weight gradient), the rest BF16, each at ``hw``'s sustained speed (``tensor_speed``; given
    ``gemm_flops``, the quantized GEMMs' at that size, ``size_speed``). The
    FP4 GEMMs take the FP8 ones' fitted efficiency (no published NVFP4 run to fit their own), at
    the FP4 peak the measured NVFP4/FP8 kernel ratio allows (``fp4_tflops``)."""
    speed = tensor_speed(hw) * (1.0 if gemm_flops is None else size_speed(hw, gemm_flops))
    bf16 = bf16_peak(hw)
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    fp4_peak = fp4_tflops(hw) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    low = np.where(fp4, fp4_peak, fp8)
    # Harmonic mix: time adds, not speed.
    return 1.0 / (quantized_fraction / low + (1.0 - quantized_fraction) / bf16)
