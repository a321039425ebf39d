"""How fast a GEMM runs: a size-dependent share of a peak that mixes FP8 (or FP4) and BF16 layers.

Small GEMMs cannot fill the GPU (too few tiles per SM, launch and epilogue costs): a GEMM of F
FLOPs reaches ``gemm_max / (1 + gemm_half_gflop / F[GFLOP])`` of peak, both constants fitted per
GPU on published runs (``calibrate``).
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.hardware import HardwareSpec


def efficiency(hw: HardwareSpec, gemm_flops):
    """Fraction of peak one GEMM of ``gemm_flops`` reaches: small GEMMs starve the GPU."""
    eff = hw.efficiency
    return eff.gemm_max / (1.0 + eff.gemm_half_gflop / np.maximum(gemm_flops / 1e9, 1e-9))


def peak(hw: HardwareSpec, quantized_fraction, fp4=False):
    """Effective peak FLOP/s of the Linear GEMMs: the quantized share of the layers at the FP8
    peak, or at the FP4 peak under NVFP4 (all three GEMMs of a Linear run NVFP4: forward, data
    and weight gradient), the rest BF16. The FP4 GEMMs take the FP8 ones' fitted efficiency (no
    published NVFP4 run to fit their own)."""
    bf16 = hw.bf16_tflops * 1e12
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative
    fp4_peak = (hw.fp4_tflops or hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative
    low = np.where(fp4, fp4_peak, fp8)
    # Harmonic mix: time adds, not speed.
    return 1.0 / (quantized_fraction / low + (1.0 - quantized_fraction) / bf16)
