"""Loads the CUDA kernels in ``autoparallel/kernels/`` and picks, per device, kernels or their references.

The kernels are built on first use with ``torch.utils.cpp_extension`` (nvcc for the .cu files,
the host compiler for the torch binding in ``fp8_binding.cpp``). Anything that stops them
(no GPU, no nvcc, a compile error) is reported as ``KernelStatus(available=False, reason=...)``
and the pure-PyTorch twins in ``reference.py`` run instead: same signatures, same results.
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from dataclasses import dataclass
from types import ModuleType

import torch

from autoparallel import resources
from autoparallel.model import reference

KERNEL_DIR = resources.KERNELS
CU_SOURCES = ("fp8_cast.cu", "fp8_blockwise.cu", "fp8_cast_transpose.cu", "fp8_delayed_update.cu",
              "swiglu.cu")
BINDING = "fp8_binding.cpp"
DISABLE_ENV = "AUTOPARALLEL_DISABLE_KERNELS"
FP8_CODES = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
SWIGLU_DTYPES = (torch.float32, torch.bfloat16)  # the SwiGLU kernels' (others: the reference)


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str


def nvcc_gencode_flags(capability: tuple[int, int]) -> list[str]:
    """sm_90a on Hopper (the 'a' variant enables its arch-specific instructions), else sm_XY."""
    arch = f"{capability[0]}{capability[1]}" + ("a" if capability == (9, 0) else "")
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


@functools.lru_cache(maxsize=1)
def load() -> tuple[ModuleType | None, KernelStatus]:
    """Build (or load from torch's extension cache) the kernels; never raises."""
    if os.environ.get(DISABLE_ENV):
        return None, KernelStatus(False, f"disabled by {DISABLE_ENV}")
    if not torch.cuda.is_available():
        return None, KernelStatus(False, "torch.cuda is not available (CPU-only torch or no GPU)")
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        return None, KernelStatus(False, "nvcc not found on PATH and CUDA_HOME is not set")
    missing = [s for s in (*CU_SOURCES, BINDING) if not (KERNEL_DIR / s).is_file()]
    if missing:
        return None, KernelStatus(False, f"kernel sources missing under {KERNEL_DIR}: {missing}")
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return None, KernelStatus(False, "ninja is not installed (pip install ninja); "
                                         "torch.utils.cpp_extension needs it to build")
    try:
        from torch.utils.cpp_extension import load as build

        flags = nvcc_gencode_flags(torch.cuda.get_device_capability())
        module = build(name="autoparallel_fp8_kernels",
                       sources=[str(KERNEL_DIR / s) for s in (BINDING, *CU_SOURCES)],
                       extra_cflags=["-O3"], extra_cuda_cflags=["-O3", *flags], verbose=False)
    except Exception as exc:  # a failed build is a reason to report, not a crash
        return None, KernelStatus(False, f"build failed: {type(exc).__name__}: {exc}")
    return module, KernelStatus(True, f"built for {' '.join(flags)}")


def status() -> KernelStatus:
    return load()[1]


class CudaOps:
    """The reference module's functions, backed by the compiled kernels."""

    def __init__(self, module: ModuleType) -> None:
        self._m = module

    def amax(self, x):
        return self._m.amax(x.contiguous())

    def cast_amax(self, x, dtype, scale, amax_out=None):
        return tuple(self._m.cast_amax(x.contiguous(), FP8_CODES[dtype], _scalar(scale, x),
                                       amax_out))

    def current_scale_cast(self, x, dtype, margin=0):
        return tuple(self._m.current_scale_cast(x.contiguous(), FP8_CODES[dtype], int(margin)))

    def cast_transpose(self, x, dtype, scale, amax_out=None):
        return tuple(self._m.cast_transpose(x.contiguous(), FP8_CODES[dtype], _scalar(scale, x),
                                            amax_out))

    def current_scale_cast_transpose(self, x, dtype, margin=0):
        return tuple(self._m.current_scale_cast_transpose(x.contiguous(), FP8_CODES[dtype],
                                                          int(margin)))

    def blockwise_cast_1d(self, x, dtype, block=128):
        if block != 128:
            return reference.blockwise_cast_1d(x, dtype, block)
        return tuple(self._m.blockwise_cast_1d(x.contiguous(), FP8_CODES[dtype]))

    def blockwise_cast_transpose_1d(self, x, dtype, block=128):
        if block != 128 or x.shape[0] % 16 or x.shape[1] % 16:  # the kernel's shape rule
            return reference.blockwise_cast_transpose_1d(x, dtype, block)
        return tuple(self._m.blockwise_cast_transpose_1d(x.contiguous(), FP8_CODES[dtype]))

    def blockwise_cast_2d(self, x, dtype, block=128):
        if block != 128:
            return reference.blockwise_cast_2d(x, dtype, block)
        return tuple(self._m.blockwise_cast_2d(x.contiguous(), FP8_CODES[dtype]))

    def delayed_scaling_update(self, amax_history, scale, scale_inv, fp8_maxes, margin, algo):
        if algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo={algo!r} is not valid; "
                             "choose one of max, most_recent")
        self._m.delayed_scaling_update(amax_history, scale, scale_inv,
                                       fp8_maxes.float().contiguous(), int(margin),
                                       algo == "most_recent")

    def swiglu(self, h):
        if h.dtype not in SWIGLU_DTYPES:
            return reference.swiglu(h)
        return self._m.swiglu_forward(h.contiguous())

    def swiglu_backward(self, h, grad):
        if h.dtype not in SWIGLU_DTYPES or grad.dtype != h.dtype:
            return reference.swiglu_backward(h, grad)
        return self._m.swiglu_backward(h.contiguous(), grad.contiguous())


def _scalar(scale, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(scale, dtype=torch.float32, device=like.device).reshape(())


def ops_for(device: torch.device | str):
    """Kernels for a CUDA device when they built, else the references (with one warning)."""
    if torch.device(device).type != "cuda":
        return reference
    module, why = load()
    if module is None:
        _warn_once(why.reason)
        return reference
    return CudaOps(module)


@functools.lru_cache(maxsize=None)
def _warn_once(reason: str) -> None:
    warnings.warn(f"autoparallel CUDA kernels unavailable ({reason}); using PyTorch references",
                  RuntimeWarning, stacklevel=3)
