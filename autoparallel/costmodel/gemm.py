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


def bf16_peak(hw: HardwareSpec) -> float:
    """FLOP/s of the BF16 tensor cores: the datasheet peak at ``hw``'s sustained speed."""
    return hw.bf16_tflops * 1e12 * tensor_speed(hw)


def efficiency(hw: HardwareSpec, gemm_flops):
    """Fraction of peak one GEMM of ``gemm_flops`` reaches: small GEMMs starve the GPU."""
    eff = hw.efficiency
    return eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(gemm_flops / 1e9, 1e-9))


def peak(hw: HardwareSpec, quantized_fraction, fp4=False):
    """Effective peak FLOP/s of the Linear GEMMs: the quantized share of the layers at the FP8
    peak, or at the FP4 peak under NVFP4 (all three GEMMs of a Linear run NVFP4: forward, data
    and weight gradient), the rest BF16, each at ``hw``'s sustained speed (``tensor_speed``). The
    FP4 GEMMs take the FP8 ones' fitted efficiency (no published NVFP4 run to fit their own)."""
    speed = tensor_speed(hw)
    bf16 = bf16_peak(hw)
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    fp4_peak = (hw.fp4_tflops or hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    low = np.where(fp4, fp4_peak, fp8)
    # Harmonic mix: time adds, not speed.
    return 1.0 / (quantized_fraction / low + (1.0 - quantized_fraction) / bf16)
