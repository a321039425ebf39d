"""The FP8 Linear layer: one autograd function whose three GEMMs run on FP8 operands.

fprop Y = X W^T, dgrad dX = dY W and wgrad dW = dY^T X each quantize their operands as the recipe
says (E4M3 for X and W, E5M2 for dY under HYBRID). On a GPU with sm89+ tensorwise GEMMs call
``torch._scaled_mm``; elsewhere, and for blockwise scales, the GEMM is emulated by dequantizing
the bit-exact FP8 values to fp32 and multiplying, which is what the FP8 tensor cores compute up
to the order of fp32 accumulation.

Delayed-scaling state (amax history and scale per operand) lives in buffers of the layer, so it
is saved and restored with ``state_dict``; ``update_fp8_scales(model)`` advances it once per
optimizer step for every layer in one batched call (one kernel launch on a GPU). The recipe is a
constructor argument, never global state, and the layer keeps ``nn.Linear``'s ``weight`` /
``bias`` names and shapes so that parallel wrappers can shard it from outside.

Two deliberate departures from TransformerEngine: before the first scale update the layer scales
from the tensor's own amax (current scaling) instead of scale 1, which would underflow the first
step's gradients to zero; and an inf / NaN amax is left out of the history, so one bad step does
not freeze the scale for the next ``amax_history_len`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

from autoparallel.model import kernels
from autoparallel.model.recipes import (ROLES, BlockwiseScaling, CurrentScaling, DelayedScaling,
                                        Recipe, TensorRole, role_dtype)
from autoparallel.model.reference import compute_scale, fp8_to_float

# Recipes and the policy are defined in recipes.py; re-exported so ``fp8`` is the one import.
from autoparallel.model.recipes import Fp8Policy, recipe_from_name  # noqa: F401  (re-export)

GemmBackend = Literal["auto", "scaled_mm", "emulate"]
ROLE_INDEX = {role: i for i, role in enumerate(ROLES)}


@dataclass
class Fp8Tensor:
    """FP8 data with the fp32 ``scale_inv`` that turns it back into real values.

    ``block`` is None for one tensorwise scale, else the (rows, cols) extent of the region each
    scale_inv entry covers: (1, 128) tiles, (128, 1) for a transposed tile layout, (128, 128)
    blocks. ``data_other`` optionally holds the same logical tensor in the other memory layout
    (the cast-transpose output), so a GEMM never has to transpose FP8 data itself.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    block: tuple[int, int] | None = None
    data_other: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def t(self) -> "Fp8Tensor":
        other = None if self.data_other is None else self.data_other.t()
        if self.block is None:
            return Fp8Tensor(self.data.t(), self.scale_inv, None, other)
        return Fp8Tensor(self.data.t(), self.scale_inv.t(), self.block[::-1], other)

    def dequantize(self) -> torch.Tensor:
        """fp32 values: data * scale_inv, each scale broadcast over the region it covers."""
        values = self.data.float() if self.data.is_cuda else fp8_to_float(self.data)
        if self.block is None:
            return values * self.scale_inv
        (rows, cols), (br, bc) = values.shape, self.block
        if rows % br == 0 and cols % bc == 0:
            blocks = values.view(rows // br, br, cols // bc, bc)
            scale = self.scale_inv.view(rows // br, 1, cols // bc, 1)
            return (blocks * scale).view(rows, cols)
        scale = self.scale_inv.repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return values * scale[:rows, :cols]

    def layout(self, row_major: bool) -> torch.Tensor:
        """The data with unit stride along rows (row-major) or columns, copying only if needed."""
        for candidate in (self.data, self.data_other):
            if candidate is not None and _is_layout(candidate, row_major):
                return candidate
        return self.data.contiguous() if row_major else self.data.t().contiguous().t()


def _is_layout(t: torch.Tensor, row_major: bool) -> bool:
    return t.stride(1 if row_major else 0) == 1


def _use_scaled_mm(a: Fp8Tensor, b: Fp8Tensor, backend: GemmBackend) -> bool:
    if backend == "emulate" or a.block is not None or b.block is not None:
        return False
    dims_ok = all(d % 16 == 0 for d in (*a.shape, b.shape[1]))
    if backend == "scaled_mm":
        if not dims_ok:
            raise ValueError(f"torch._scaled_mm needs every dim divisible by 16, got "
                             f"{tuple(a.shape)} x {tuple(b.shape)}")
        return True
    device = a.data.device
    return (dims_ok and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (8, 9))


def fp8_gemm(a: Fp8Tensor, b: Fp8Tensor, out_dtype: torch.dtype,
             backend: GemmBackend = "auto") -> torch.Tensor:
    """a @ b for FP8 operands: [M, K] x [K, N] -> [M, N] in ``out_dtype``."""
    if _use_scaled_mm(a, b, backend):
        return torch._scaled_mm(a.layout(row_major=True), b.layout(row_major=False),
                                scale_a=a.scale_inv, scale_b=b.scale_inv, out_dtype=out_dtype)
    return (a.dequantize() @ b.dequantize()).to(out_dtype)


class NumericsObserver(Protocol):
    def __call__(self, layer: str, role: TensorRole, high_precision: torch.Tensor,
                 quantized: Fp8Tensor, current_scale: torch.Tensor | None) -> None: ...


class Fp8Linear(nn.Module):
    """A bias-optional Linear whose GEMMs run in FP8 per ``recipe``.

    ``gemm_backend``: "auto" picks ``torch._scaled_mm`` on sm89+ GPUs for tensorwise recipes,
    "scaled_mm" forces it (also on CPU, where torch emulates it slowly: for tests), "emulate"
    always dequantizes and multiplies in fp32.
    """

    def __init__(self, in_features: int, out_features: int, recipe: Recipe, bias: bool = False,
                 gemm_backend: GemmBackend = "auto", device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(recipe, (DelayedScaling, CurrentScaling, BlockwiseScaling)):
            raise ValueError(f"recipe={recipe!r} is not an FP8 recipe")
        if gemm_backend not in ("auto", "scaled_mm", "emulate"):
            raise ValueError(f"gemm_backend={gemm_backend!r} is not valid; "
                             "choose one of auto, scaled_mm, emulate")
        self.in_features, self.out_features = in_features, out_features
        self.recipe, self.gemm_backend = recipe, gemm_backend
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        if isinstance(recipe, DelayedScaling):
            n = len(ROLES)
            self.register_buffer("amax_history",
                                 torch.zeros(n, recipe.amax_history_len, device=device))
            self.register_buffer("scale", torch.ones(n, device=device))
            self.register_buffer("scales_initialized", torch.zeros((), dtype=torch.bool,
                                                                   device=device))
        self.observer: NumericsObserver | None = None
        self.numerics_name = ""
        self._ready: bool | None = None  # host copy of scales_initialized: no sync per cast
        self.reset_parameters()

    def _scales_ready(self) -> bool:
        if self._ready is None:
            self._ready = bool(self.scales_initialized)
        return self._ready

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._ready = None

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe.name}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        out_dtype = (torch.get_autocast_dtype(device_type)
                     if torch.is_autocast_enabled(device_type) else x.dtype)
        with torch.autocast(device_type, enabled=False):
            y = _Fp8LinearFunction.apply(x.reshape(-1, self.in_features), self.weight, self.bias,
                                         self, out_dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    # -- quantization, per recipe ------------------------------------------------------------

    def quantize(self, x: torch.Tensor, role: TensorRole, *, both_layouts: bool = False,
                 weight_blocks: bool = False) -> Fp8Tensor:
        """Quantize a 2-D operand per the recipe and report it to the observer, if any.

        ``both_layouts`` also produces the transposed copy (for torch._scaled_mm); blockwise
        tiles run along the last (contracted) dim, or 128x128 blocks with ``weight_blocks``.
        """
        dtype = role_dtype(self.recipe.fp8_format, role)
        ops = kernels.ops_for(x.device)
        current = None
        if isinstance(self.recipe, BlockwiseScaling):
            out = self._quantize_blockwise(ops, x, dtype, weight_blocks)
        elif isinstance(self.recipe, CurrentScaling):
            out = self._quantize_current(ops, x, dtype, both_layouts)
        else:
            out, current = self._quantize_delayed(ops, x, dtype, ROLE_INDEX[role], both_layouts)
        if self.observer is not None:
            self.observer(self.numerics_name, role, x, out, current)
        return out

    def _quantize_blockwise(self, ops, x, dtype, weight_blocks: bool) -> Fp8Tensor:
        size = self.recipe.block_size
        if weight_blocks:
            q, s_inv = ops.blockwise_cast_2d(x, dtype, size)
            return Fp8Tensor(q, s_inv, (size, size))
        q, s_inv = ops.blockwise_cast_1d(x, dtype, size)
        return Fp8Tensor(q, s_inv, (1, size))

    def _quantize_current(self, ops, x, dtype, both_layouts: bool) -> Fp8Tensor:
        if not both_layouts:
            q, s_inv, _ = ops.current_scale_cast(x, dtype, self.recipe.margin)
            return Fp8Tensor(q, s_inv)
        scale = compute_scale(ops.amax(x), dtype, self.recipe.margin)
        q, q_t, _ = ops.cast_transpose(x, dtype, scale)
        return Fp8Tensor(q, scale.reciprocal(), None, q_t.t())

    def _quantize_delayed(self, ops, x, dtype, i: int, both_layouts: bool
                          ) -> tuple[Fp8Tensor, torch.Tensor | None]:
        """Cast with the stored scale, record this amax; returns the tensor and, when observed,
        the scale current scaling would have used (for the delayed / current ratio)."""
        a_now = None
        if self._scales_ready():
            scale = self.scale[i]
        else:
            a_now = ops.amax(x)
            scale = compute_scale(a_now, dtype, self.recipe.margin)
        if both_layouts:
            q, q_t, a = ops.cast_transpose(x, dtype, scale)
            out = Fp8Tensor(q, scale.reciprocal(), None, q_t.t())
        else:
            q, a = ops.cast_amax(x, dtype, scale)
            out = Fp8Tensor(q, scale.reciprocal())
        # A non-finite amax is not recorded: it would pin the scale for the whole history
        # window (TransformerEngine keeps the old scale for amax_history_len steps then).
        recorded = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
        self.amax_history[i, 0] = torch.maximum(self.amax_history[i, 0], recorded)
        current = None
        if self.observer is not None:
            current = compute_scale(a if a_now is None else a_now, dtype, self.recipe.margin)
        return out, current

    def _wants_scaled_mm(self, x: torch.Tensor) -> bool:
        """Whether to produce the transposed layouts that torch._scaled_mm's backward needs."""
        if isinstance(self.recipe, BlockwiseScaling) or self.gemm_backend == "emulate":
            return False
        if self.gemm_backend == "scaled_mm":
            return True
        return x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) >= (8, 9)


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Fp8Linear, out_dtype: torch.dtype) -> torch.Tensor:
        backend = layer.gemm_backend
        blockwise = isinstance(layer.recipe, BlockwiseScaling)
        transposes = layer._wants_scaled_mm(x)
        xq = layer.quantize(x, "input", both_layouts=transposes)
        wq = layer.quantize(weight, "weight", both_layouts=transposes, weight_blocks=True)
        y = fp8_gemm(xq, wq.t(), out_dtype, backend)
        if bias is not None:
            y = y + bias.to(out_dtype)
        # Tensorwise: keep the FP8 copies for backward (TE does the same: a quarter of the
        # bytes). Blockwise: wgrad needs X tiled along the other dim, so keep X itself.
        # Everything goes through save_for_backward so that checkpointing and the saved-tensor
        # hooks that measure activation memory see it.
        ctx.layer, ctx.blockwise, ctx.has_bias = layer, blockwise, bias is not None
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        ctx.blocks = (xq.block, wq.block)
        kept_x = (x, None, None, None) if blockwise else (None, xq.data, xq.scale_inv,
                                                          xq.data_other)
        ctx.save_for_backward(*kept_x, wq.data, wq.scale_inv, wq.data_other)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        layer = ctx.layer
        backend = layer.gemm_backend
        x, xq_data, xq_scale_inv, xq_other, wq_data, wq_scale_inv, wq_other = ctx.saved_tensors
        wq = Fp8Tensor(wq_data, wq_scale_inv, ctx.blocks[1], wq_other)
        dy = dy.contiguous()
        if ctx.blockwise:
            dyq = layer.quantize(dy, "grad_output")                       # tiles along N
            dyq_t = layer.quantize(dy.t().contiguous(), "grad_output")   # tiles along M
            xq_t = layer.quantize(x.t().contiguous(), "input")           # tiles along M
            dx = fp8_gemm(dyq, wq, torch.float32, backend)
            dw = fp8_gemm(dyq_t, xq_t.t(), torch.float32, backend)
        else:
            xq = Fp8Tensor(xq_data, xq_scale_inv, ctx.blocks[0], xq_other)
            dyq = layer.quantize(dy, "grad_output", both_layouts=layer._wants_scaled_mm(dy))
            dx = fp8_gemm(dyq, wq, torch.float32, backend)
            dw = fp8_gemm(dyq.t(), xq, torch.float32, backend)
        db = dy.float().sum(0).to(ctx.w_dtype) if ctx.has_bias else None
        return dx.to(ctx.x_dtype), dw.to(ctx.w_dtype), db, None, None


def fp8_modules(model: nn.Module) -> list[Fp8Linear]:
    return [m for m in model.modules() if isinstance(m, Fp8Linear)]


def update_fp8_scales(model: nn.Module) -> int:
    """Advance every delayed-scaling state in ``model`` by one step; returns how many layers.

    Call once per optimizer step (after all micro-batches and any recompute). Layers with the
    same recipe are stacked and updated in one batched call: one kernel launch on a GPU.
    """
    groups: dict[tuple, list[Fp8Linear]] = {}
    for m in fp8_modules(model):
        if isinstance(m.recipe, DelayedScaling):
            groups.setdefault((m.recipe, m.amax_history.device), []).append(m)
    for (recipe, device), layers in groups.items():
        ops = kernels.ops_for(device)
        history = torch.cat([m.amax_history for m in layers])
        scale = torch.cat([m.scale for m in layers])
        maxes = torch.tensor([torch.finfo(role_dtype(recipe.fp8_format, r)).max for r in ROLES]
                             * len(layers), dtype=torch.float32, device=device)
        ops.delayed_scaling_update(history, scale, maxes, recipe.margin,
                                   recipe.amax_compute_algo)
        n = len(ROLES)
        for k, m in enumerate(layers):
            m.amax_history.copy_(history[k * n:(k + 1) * n])
            m.scale.copy_(scale[k * n:(k + 1) * n])
            m.scales_initialized.fill_(True)
            m._ready = True
    return sum(len(v) for v in groups.values())


def attach_observer(model: nn.Module, observer: NumericsObserver | None) -> int:
    """Point every Fp8Linear at ``observer`` (None detaches); returns how many layers."""
    layers = 0
    for name, m in model.named_modules():
        if isinstance(m, Fp8Linear):
            m.observer, m.numerics_name = observer, name
            layers += 1
    return layers
