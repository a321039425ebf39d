"""How fast a GEMM runs: a size-dependent share of a peak that mixes FP8 and BF16 layers.

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


def peak(hw: HardwareSpec, fp8_fraction):
    """Effective peak FLOP/s of the Linear GEMMs: the FP8 share of the layers at the FP8 peak,
    the rest BF16."""
    bf16 = hw.bf16_tflops * 1e12
    fp8 = (hw.fp8_tflops or hw.bf16_tflops) * 1e12 * hw.efficiency.fp8_gemm_relative
    # Harmonic mix: time adds, not speed.
    return 1.0 / (fp8_fraction / fp8 + (1.0 - fp8_fraction) / bf16)
