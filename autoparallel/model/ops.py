"""The fused kernels as torch operators (``torch.ops.autoparallel.*``): one operator per fused
FP8 cast, and the SwiGLU activation's forward and backward.

Why operators and not plain functions: each cast the FP8 Linear issues is then one dispatch on
every device, and one kernel launch on a GPU (current scaling: two, amax then cast, inside one
operator), so the number of operators a forward + backward issues, counted with torch's
dispatch mode on a CPU, is the number of FP8 launches it issues on a GPU
(``tests/model/test_fp8_budget.py`` holds it to a budget). The CUDA implementation calls the
compiled kernels (``kernels.CudaOps``) or, where they did not build, the PyTorch references; on
CPU it is the reference. Fake implementations give shapes to ``torch.compile``.

They are registered with ``torch.library.Library`` directly rather than ``custom_op``: measured
on this project's CPU, a ``custom_op`` call costs about 100 us of Python around the kernel, a
``Library`` operator about 3 us, and host time per FP8 Linear is what made the old path
launch-bound.

Scales of 1x128 tiles come back outer-dim-major on every device (the layout ``torch._scaled_mm``
takes without a copy: ``[rows, tiles]`` with strides ``(1, rows)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoparallel.model import kernels

_LIB = torch.library.Library("autoparallel", "DEF")  # kept alive: it owns the registrations


def _outer_major(scale: Tensor) -> Tensor:
    """``scale`` ([rows, tiles]) with strides (1, rows); a copy only if it is not already."""
    if scale.stride(0) == 1 and (scale.shape[1] == 1 or scale.stride(1) == scale.shape[0]):
        return scale
    return scale.t().contiguous().t()


def _empty_outer_major(like: Tensor, rows: int, tiles: int) -> Tensor:
    return like.new_empty((tiles, rows), dtype=torch.float32).t()


def _none(like: Tensor, dtype: torch.dtype) -> Tensor:
    return like.new_empty(0, dtype=dtype)


def _define(schema: str, impl, fake) -> None:
    name = schema.split("(")[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    torch.library.register_fake(f"autoparallel::{name}", fake, lib=_LIB)


def _cast(x, dtype, scale, amax, transpose):
    ops = kernels.ops_for(x.device)
    if transpose:
        q, q_t, _ = ops.cast_transpose(x, dtype, scale, amax)
        return q, q_t
    q, _ = ops.cast_amax(x, dtype, scale, amax)
    return q, _none(x, dtype)


def _cast_fake(x, dtype, scale, amax, transpose):
    q_t = x.new_empty((x.shape[1], x.shape[0]), dtype=dtype) if transpose else _none(x, dtype)
    return x.new_empty(x.shape, dtype=dtype), q_t


_define("fp8_cast(Tensor x, ScalarType dtype, Tensor scale, Tensor(a!) amax, bool transpose)"
        " -> (Tensor, Tensor)", _cast, _cast_fake)


def _cast_current(x, dtype, margin, transpose):
    ops = kernels.ops_for(x.device)
    if transpose:
        return ops.current_scale_cast_transpose(x, dtype, margin)
    q, scale_inv, a = ops.current_scale_cast(x, dtype, margin)
    return q, _none(x, dtype), scale_inv, a


def _cast_current_fake(x, dtype, margin, transpose):
    q_t = x.new_empty((x.shape[1], x.shape[0]), dtype=dtype) if transpose else _none(x, dtype)
    scalar = x.new_empty((), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=dtype), q_t, scalar, scalar.clone()


_define("fp8_cast_current(Tensor x, ScalarType dtype, int margin, bool transpose)"
        " -> (Tensor, Tensor, Tensor, Tensor)", _cast_current, _cast_current_fake)


def _cast_blockwise(x, dtype, block, transpose):
    ops = kernels.ops_for(x.device)
    if transpose:
        q, s, q_t, s_t = ops.blockwise_cast_transpose_1d(x, dtype, block)
        return q, _outer_major(s), q_t, _outer_major(s_t)
    q, s = ops.blockwise_cast_1d(x, dtype, block)
    return q, _outer_major(s), _none(x, dtype), _none(x, torch.float32)


def _cast_blockwise_fake(x, dtype, block, transpose):
    rows, cols = x.shape
    q, s = x.new_empty(x.shape, dtype=dtype), _empty_outer_major(x, rows, -(-cols // block))
    if not transpose:
        return q, s, _none(x, dtype), _none(x, torch.float32)
    return q, s, x.new_empty((cols, rows), dtype=dtype), _empty_outer_major(x, cols,
                                                                             -(-rows // block))


_define("fp8_cast_blockwise(Tensor x, ScalarType dtype, int block, bool transpose)"
        " -> (Tensor, Tensor, Tensor, Tensor)", _cast_blockwise, _cast_blockwise_fake)


def _cast_blocks2d(x, dtype, block):
    q, s = kernels.ops_for(x.device).blockwise_cast_2d(x, dtype, block)
    return q, s.contiguous()


def _cast_blocks2d_fake(x, dtype, block):
    rows, cols = x.shape
    return (x.new_empty(x.shape, dtype=dtype),
            x.new_empty((-(-rows // block), -(-cols // block)), dtype=torch.float32))


_define("fp8_cast_blocks2d(Tensor x, ScalarType dtype, int block) -> (Tensor, Tensor)",
        _cast_blocks2d, _cast_blocks2d_fake)


def _delayed_update(history, scale, scale_inv, fp8_max, margin, most_recent):
    kernels.ops_for(history.device).delayed_scaling_update(
        history, scale, scale_inv, fp8_max, margin, "most_recent" if most_recent else "max")


def _delayed_update_fake(history, scale, scale_inv, fp8_max, margin, most_recent):
    return None


_define("fp8_delayed_update(Tensor(a!) history, Tensor(b!) scale, Tensor(c!) scale_inv, "
        "Tensor fp8_max, int margin, bool most_recent) -> ()", _delayed_update,
        _delayed_update_fake)


def _swiglu(h):
    return kernels.ops_for(h.device).swiglu(h)


def _swiglu_fake(h):
    return h.new_empty((*h.shape[:-1], h.shape[-1] // 2))


_define("swiglu(Tensor h) -> Tensor", _swiglu, _swiglu_fake)


def _swiglu_backward(h, grad):
    return kernels.ops_for(h.device).swiglu_backward(h, grad)


def _swiglu_backward_fake(h, grad):
    return torch.empty_like(h)


_define("swiglu_backward(Tensor h, Tensor grad) -> Tensor", _swiglu_backward,
        _swiglu_backward_fake)

_ops = torch.ops.autoparallel
fp8_cast = _ops.fp8_cast.default
"""(x, dtype, scale, amax, transpose) -> (fp8, fp8 of x.T or empty): delayed scaling's cast
with a known scale; max|x| is folded into ``amax`` in place (this step's history slot)."""
fp8_cast_current = _ops.fp8_cast_current.default
"""(x, dtype, margin, transpose) -> (fp8, fp8 of x.T or empty, scale_inv, amax)."""
fp8_cast_blockwise = _ops.fp8_cast_blockwise.default
"""(x, dtype, block, transpose) -> (fp8, scale_inv, fp8 of x.T or empty, its scale_inv or
empty): 1 x block tiles along x's rows, and along its columns for the transposed copy."""
fp8_cast_blocks2d = _ops.fp8_cast_blocks2d.default
"""(x, dtype, block) -> (fp8, scale_inv [rows/block, cols/block] row-major)."""
fp8_delayed_update = _ops.fp8_delayed_update.default
"""(history [L, n], scale, scale_inv, fp8_max, margin, most_recent): every tensor at once."""

swiglu = _ops.swiglu.default
"""(h = [gate | up]) -> silu(gate) * up: one kernel on a GPU (kernels/swiglu.cu)."""
swiglu_backward = _ops.swiglu_backward.default
"""(h, grad) -> d(h) = [d(gate) | d(up)], FP32 arithmetic (``reference.swiglu_backward``)."""

OPERATORS = ("fp8_cast", "fp8_cast_current", "fp8_cast_blockwise", "fp8_cast_blocks2d",
             "fp8_delayed_update", "swiglu", "swiglu_backward")
