"""The FP8 Linear layer: one autograd function whose three GEMMs run on FP8 operands.

fprop Y = X W^T, dgrad dX = dY W and wgrad dW = dY^T X each take FP8 operands quantized as the
recipe says (E4M3 for X and W, E5M2 for dY under HYBRID). What it does per call is what
TransformerEngine does, so that a GPU step is GEMM-bound rather than launch-bound:

* The weight is quantized once per optimizer step, in both memory layouts where the GEMMs need
  them, and every micro-batch (and every recompute) reuses that copy. The cache is keyed by the
  weight tensor, its version counter (any in-place change) and a generation that
  ``update_fp8_scales`` advances once per step.
* Each activation / gradient is cast by one operator (``autoparallel.model.ops``: one kernel
  launch on a GPU, two for current scaling) that also folds its amax into this step's slot of
  the delayed-scaling history: no separate amax, no Python arithmetic on tensors, and nothing
  that waits for the GPU (no ``.item()``, no Python branch on a tensor value).
* Backward keeps only the FP8 copy of X that its GEMM reads (X^T for ``torch._scaled_mm``,
  X tiled along the tokens for blockwise), one byte per element, never the BF16 X.
* Delayed-scaling state of all layers lives in one contiguous buffer per recipe
  (``Fp8StatePack``): the per-step update of every layer is one launch, and the amax all-reduce
  across ranks one collective.

GEMMs: on a GPU (sm89+) tensorwise operands go to ``torch._scaled_mm``; blockwise operands go to
``torch._scaled_mm`` with 1x128 / 128x128 block scales where the installed torch supports them
on that GPU (``blockwise_support`` tries once and checks the result), and a GPU without that
support is an error, never a silent dequantize-and-multiply. On CPU, or with
``gemm_backend="emulate"``, the GEMM is emulated by dequantizing the bit-exact FP8 values to
fp32 and multiplying: the numerics oracle.

Delayed-scaling state (amax history, scale) is held in buffers of the layer, so ``state_dict``
saves and restores it; the recipe is a constructor argument, never global state; and the layer
keeps ``nn.Linear``'s ``weight`` / ``bias`` names and shapes so that parallel wrappers can shard
it from outside.

Two deliberate departures from TransformerEngine: before the first scale update the layer scales
from the tensor's own amax (current scaling) instead of scale 1, which would underflow the first
step's gradients to zero; and a step whose amax is inf / NaN is recorded as 0 in the history, so
one bad step does not freeze the scale for the next ``amax_history_len`` steps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.model import kernels, ops
from autoparallel.model.recipes import (ROLES, BlockwiseScaling, CurrentScaling, DelayedScaling,
                                        Recipe, TensorRole, role_dtype)
from autoparallel.model.reference import compute_scale, fp8_to_float, fp8_to_float_scaled

# Recipes and the policy are defined in recipes.py; re-exported so ``fp8`` is the one import.
from autoparallel.model.recipes import Fp8Policy, recipe_from_name  # noqa: F401  (re-export)

GemmBackend = Literal["auto", "scaled_mm", "emulate"]
ROLE_INDEX = {role: i for i, role in enumerate(ROLES)}
GEMM_BACKENDS = ("auto", "scaled_mm", "emulate")


def init_quantized_linear(module: nn.Module, in_features: int, out_features: int, recipe, bias: bool,
                          gemm_backend: str, device, dtype) -> None:
    """The settings and parameters every quantized Linear (FP8, MXFP8, NVFP4) holds, laid out as
    ``nn.Linear``'s so parallel wrappers shard them from outside."""
    if gemm_backend not in GEMM_BACKENDS:
        raise ValueError(f"gemm_backend={gemm_backend!r} is not valid; choose one of {', '.join(GEMM_BACKENDS)}")
    module.in_features, module.out_features = in_features, out_features
    module.recipe, module.gemm_backend = recipe, gemm_backend
    factory = {"device": device, "dtype": dtype}
    module.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
    module.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None


class Fp8Unsupported(RuntimeError):
    """An FP8 GEMM this device / torch cannot run natively (the reason is in the message)."""


@dataclass
class Fp8Tensor:
    """FP8 data with the fp32 ``scale_inv`` that turns it back into real values.

    ``block`` is None for one tensorwise scale, else the (rows, cols) extent of the region each
    scale_inv entry covers: (1, 128) tiles, (128, 1) for a transposed tile layout, (128, 128)
    blocks. ``data_other`` optionally holds the same logical tensor in the other memory layout
    (a cast-transpose output), with its block scales in ``scale_inv_other`` laid out to match,
    so a GEMM never has to transpose FP8 data itself.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    block: tuple[int, int] | None = None
    data_other: torch.Tensor | None = None
    scale_inv_other: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def t(self) -> "Fp8Tensor":
        other = None if self.data_other is None else self.data_other.t()
        if self.block is None:
            return Fp8Tensor(self.data.t(), self.scale_inv, None, other)
        other_scale = None if self.scale_inv_other is None else self.scale_inv_other.t()
        return Fp8Tensor(self.data.t(), self.scale_inv.t(), self.block[::-1], other,
                         other_scale)

    def dequantize(self) -> torch.Tensor:
        """fp32 values: data * scale_inv, each scale broadcast over the region it covers."""
        if self.block is None and not self.data.is_cuda and self.scale_inv.numel() == 1 \
                and self.scale_inv.dtype == torch.float32 and self.scale_inv.dim() <= self.data.dim():
            return fp8_to_float_scaled(self.data, self.scale_inv)  # the same products
        values = self.data.float() if self.data.is_cuda else fp8_to_float(self.data)
        if self.block is None:
            return values * self.scale_inv
        (rows, cols), (br, bc) = values.shape, self.block
        if rows % br == 0 and cols % bc == 0:
            blocks = values.reshape(rows // br, br, cols // bc, bc)
            scale = self.scale_inv.reshape(rows // br, 1, cols // bc, 1)
            return (blocks * scale).reshape(rows, cols)
        scale = self.scale_inv.repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return values * scale[:rows, :cols]

    def nbytes(self) -> int:
        parts = (self.data, self.scale_inv, self.data_other, self.scale_inv_other)
        seen, total = set(), 0
        for t in parts:
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
        return total


def _is_layout(t: torch.Tensor, row_major: bool) -> bool:
    return t.stride(1 if row_major else 0) == 1


# -- GEMMs ---------------------------------------------------------------------------------------

# torch._scaled_mm's names for block scales of operand A ([M, K], row-major) and B ([K, N],
# column-major): tiles along the contracted dim K are "1x128" on either side.
_BLOCK_KIND = {("a", (1, 128)): "1x128", ("a", (128, 128)): "128x128",
               ("b", (128, 1)): "1x128", ("b", (128, 128)): "128x128"}


# cuBLASLt reads an FP8 GEMM's scales through pointers it wants 16-byte aligned, as it wants
# every matrix pointer (cuBLAS docs, cublasLtMatmul, FP8 requirements): an unaligned one fails
# with CUBLAS_STATUS_NOT_SUPPORTED.
SCALE_ALIGN_BYTES = 16


def _aligned_scale(scale: torch.Tensor) -> torch.Tensor:
    return scale if scale.data_ptr() % SCALE_ALIGN_BYTES == 0 else scale.clone()


def _b_blocks(scale: torch.Tensor, layout: str) -> torch.Tensor:
    """B's 128x128 block scales ([K/128, N/128] grid) as torch._scaled_mm reads them: K-blocks
    contiguous per N-block, their count padded to a multiple of 4 as cuBLASLt reads them
    ("padded": the padded grid, as PyTorch PR #166752 checks it) or not ("bare": what torch 2.11
    takes, and cuBLASLt then reads as if padded, so right only where K/128 % 4 == 0)."""
    kb, nb = scale.shape
    rows = kb if layout == "bare" else -(-kb // 4) * 4
    if scale.stride(0) == 1 and scale.stride(1) == rows and rows == kb:
        return scale
    memory = scale.new_ones(nb, rows)
    memory[:, :kb].copy_(scale.t())
    return memory.t()


def _scale_for_scaled_mm(scale: torch.Tensor, block: tuple[int, int], role: str,
                         b_layout: str) -> torch.Tensor:
    """The block-scale grid in the strides torch._scaled_mm checks (a copy only if needed):
    column-major for A's 1x128 tiles (cuBLASLt's outer-dim-major), B's 128x128 blocks per
    ``b_layout``, row-major otherwise."""
    kind = _BLOCK_KIND[(role, block)]
    if role == "b" and kind == "128x128":
        return _b_blocks(scale, b_layout)
    if role == "a" and kind == "1x128":
        ok = scale.stride(0) == 1 and (scale.shape[1] == 1 or scale.stride(1) == scale.shape[0])
        return scale if ok else scale.t().contiguous().t()
    return scale if scale.is_contiguous() else scale.contiguous()


def _scaled_mm_operand(t: Fp8Tensor, role: str, b_layout: str = "padded"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) of ``t`` as operand A (row-major) or B (column-major) of torch._scaled_mm."""
    row_major = role == "a"
    other_scale = t.scale_inv if t.scale_inv_other is None else t.scale_inv_other
    pairs = ((t.data, t.scale_inv), (t.data_other, other_scale))
    data, scale = next(((d, s) for d, s in pairs if d is not None and _is_layout(d, row_major)),
                       (None, None))
    if data is None:
        data, scale = (t.data.contiguous() if row_major else t.data.t().contiguous().t(),
                       t.scale_inv)
    if t.block is not None:
        return data, _scale_for_scaled_mm(scale, t.block, role, b_layout)
    return data, _aligned_scale(scale)


def _blockwise_operands(device: torch.device, a_kind: str, b_kind: str, out_dtype: torch.dtype,
                        k: int):
    """A 256 x ``k`` x 256 problem in the given block-scale kinds, and its emulated product."""
    from autoparallel.model import reference as R
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(256, k, generator=g) * torch.logspace(-2, 2, k)).to(device)
    w = torch.randn(256, k, generator=g).to(device)
    e4m3 = torch.float8_e4m3fn
    qa, sa = R.blockwise_cast_1d(a, e4m3) if a_kind == "1x128" else R.blockwise_cast_2d(a, e4m3)
    fa = Fp8Tensor(qa, sa, (1, 128) if a_kind == "1x128" else (128, 128))
    if b_kind == "1x128":  # B = w^T tiled along K: quantize w (rows = N) along K
        qw, sw = R.blockwise_cast_1d(w, e4m3)
        fb = Fp8Tensor(qw, sw, (1, 128)).t()
    else:
        qw, sw = R.blockwise_cast_2d(w, e4m3)
        fb = Fp8Tensor(qw, sw, (128, 128)).t()
    want = (fa.dequantize() @ fb.dequantize()).to(out_dtype)
    return fa, fb, want


@functools.lru_cache(maxsize=None)
def _probe(device: str, a_kind: str, b_kind: str, out_dtype: torch.dtype, b_layout: str,
           k: int) -> str | None:
    """None when that product matches the emulation (relative error < 1 %), else why not: a
    layout torch accepts but reads differently fails too."""
    try:
        fa, fb, want = _blockwise_operands(torch.device(device), a_kind, b_kind, out_dtype, k)
        (da, sa), (db, sb) = _scaled_mm_operand(fa, "a"), _scaled_mm_operand(fb, "b", b_layout)
        got = torch._scaled_mm(da, db, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    except Exception as exc:  # noqa: BLE001 - an unsupported configuration is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    err = float((got.float() - want.float()).norm() / want.float().norm())
    if not math.isfinite(err) or err > 1e-2:
        return f"wrong result (relative error {err:.3g} against the emulation)"
    return None


@functools.lru_cache(maxsize=None)
def blockwise_b_layout(device: str) -> str:
    """How torch._scaled_mm on ``device`` takes B's 128x128 scales: "padded" where it multiplies
    right with them at K/128 = 2, else "bare" (torch 2.11 on an H100: the padded grid is an
    "Invalid scaling configuration", the bare one a wrong result at K/128 = 2)."""
    ok = _probe(device, "1x128", "128x128", torch.bfloat16, "padded", 256) is None
    return "padded" if ok else "bare"


def blockwise_support(device: str, a_kind: str, b_kind: str,
                      out_dtype: torch.dtype = torch.bfloat16) -> str | None:
    """None when ``torch._scaled_mm`` on ``device`` multiplies FP8 operands with these block
    scales correctly (with the "bare" layout: where K/128 % 4 == 0), else the reason it does
    not (tried once per combination)."""
    if b_kind != "128x128":
        return _probe(device, a_kind, b_kind, out_dtype, "padded", 256)
    layout = blockwise_b_layout(device)
    why = _probe(device, a_kind, b_kind, out_dtype, layout, 512 if layout == "bare" else 256)
    return None if why is None else f"{why} (B's 128x128 scales laid out {layout})"


@functools.lru_cache(maxsize=None)
def _native_on(device: str, blockwise: bool, backend: str) -> bool:
    """Whether GEMMs on ``device`` run through torch._scaled_mm (True) or are emulated.

    "auto" emulates only on CPU; on a GPU an FP8 GEMM it cannot run natively is an error."""
    if backend == "emulate" or (backend == "auto" and not device.startswith("cuda")):
        return False
    if device.startswith("cuda") and not blockwise:
        capability = torch.cuda.get_device_capability(torch.device(device))
        if capability < (8, 9):
            raise Fp8Unsupported(f"FP8 GEMMs need compute capability 8.9+, {device} has "
                                 f"{capability[0]}.{capability[1]}")
    if blockwise:
        for a_kind, b_kind in (("1x128", "128x128"), ("1x128", "1x128")):
            why = blockwise_support(device, a_kind, b_kind)
            if why is not None:
                raise Fp8Unsupported(
                    f"torch {torch.__version__} cannot run blockwise FP8 GEMMs ({a_kind} x "
                    f"{b_kind} scales) on {device}: {why}. Use gemm_backend='emulate' for "
                    "numerics only, or a tensorwise recipe")
    return True


def native_gemm(device: torch.device, blockwise: bool, backend: GemmBackend = "auto") -> bool:
    """True where ``fp8_gemm`` calls torch._scaled_mm, False where it emulates; raises
    ``Fp8Unsupported`` for a GPU that cannot run the recipe's GEMMs."""
    return _native_on(_device_name(torch.device(device)), blockwise, backend)


def _zero_pad_k(da, sa, db, sb):
    """A 1x128 x B 128x128 operands with K padded by zero FP8 blocks (scale 1) to a multiple of
    4 blocks, for a torch that takes only the bare B grid, which cuBLASLt reads as if so padded:
    the product is then right, and unchanged by the zeros."""
    blocks = (-(da.shape[1] // 128)) % 4
    pad_data = (0, 128 * blocks)
    da = F.pad(da.view(torch.uint8), pad_data).view(da.dtype)
    db = F.pad(db.t().view(torch.uint8), pad_data).view(db.dtype).t()
    sa = F.pad(sa.t(), (0, 0, 0, blocks), value=1.0).t()  # stays outer-dim-major
    sb = F.pad(sb.t(), (0, blocks), value=1.0).t()
    return (da, sa), (db, sb)


def fp8_gemm(a: Fp8Tensor, b: Fp8Tensor, out_dtype: torch.dtype,
             backend: GemmBackend = "auto") -> torch.Tensor:
    """a @ b for FP8 operands: [M, K] x [K, N] -> [M, N] in ``out_dtype``."""
    blockwise = a.block is not None or b.block is not None
    if not native_gemm(a.data.device, blockwise, backend):
        return (a.dequantize() @ b.dequantize()).to(out_dtype)
    if blockwise and (("a", a.block) not in _BLOCK_KIND or ("b", b.block) not in _BLOCK_KIND):
        raise Fp8Unsupported(f"torch._scaled_mm takes 1x128 / 128x128 block scales, not "
                             f"{a.block} x {b.block}; use block_size=128 or gemm_backend='emulate'")
    (m, k), n = a.shape, b.shape[1]
    if m % 16 or k % 16 or n % 16 or (blockwise and k % 128):
        raise ValueError(f"torch._scaled_mm needs every dim divisible by 16"
                         f"{' and K by 128 (block scales)' if blockwise else ''}, got "
                         f"{tuple(a.shape)} x {tuple(b.shape)}")
    device = _device_name(a.data.device)
    b_layout = blockwise_b_layout(device) if b.block == (128, 128) else "padded"
    (da, sa), (db, sb) = _scaled_mm_operand(a, "a"), _scaled_mm_operand(b, "b", b_layout)
    if b_layout == "bare" and (k // 128) % 4:
        (da, sa), (db, sb) = _zero_pad_k(da, sa, db, sb)
    if blockwise and out_dtype != torch.bfloat16:
        # Block-scaled outputs other than BF16 are used only where the probe says they work.
        if blockwise_support(device, _BLOCK_KIND[("a", a.block)],
                             _BLOCK_KIND[("b", b.block)], out_dtype) is not None:
            return torch._scaled_mm(da, db, scale_a=sa, scale_b=sb,
                                    out_dtype=torch.bfloat16).to(out_dtype)
    return torch._scaled_mm(da, db, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


class NumericsObserver(Protocol):
    def __call__(self, layer: str, role: TensorRole, high_precision: torch.Tensor,
                 quantized: Fp8Tensor, current_scale: torch.Tensor | None) -> None: ...


# -- the layer -----------------------------------------------------------------------------------

class Fp8Linear(nn.Module):
    """A bias-optional Linear whose GEMMs run in FP8 per ``recipe``.

    ``gemm_backend``: "auto" calls ``torch._scaled_mm`` on GPUs (and fails there rather than
    emulate) and emulates on CPU; "scaled_mm" forces torch._scaled_mm (also on CPU, where torch
    emulates tensorwise scaling slowly: for tests); "emulate" always dequantizes and multiplies
    in fp32 (numerics studies on any device).
    """

    def __init__(self, in_features: int, out_features: int, recipe: Recipe, bias: bool = False,
                 gemm_backend: GemmBackend = "auto", device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(recipe, (DelayedScaling, CurrentScaling, BlockwiseScaling)):
            raise ValueError(f"recipe={recipe!r} is not an FP8 recipe")
        init_quantized_linear(self, in_features, out_features, recipe, bias, gemm_backend, device, dtype)
        if isinstance(recipe, DelayedScaling):
            n, f32 = len(ROLES), {"device": device, "dtype": torch.float32}
            self.register_buffer("amax_history", torch.zeros(n, recipe.amax_history_len, **f32))
            self.register_buffer("scale", torch.ones(n, **f32))
            self.register_buffer("scale_inv", torch.ones(n, **f32), persistent=False)
            self.register_buffer("scales_initialized",
                                 torch.zeros((), dtype=torch.bool, device=device))
        self.observer: NumericsObserver | None = None
        self.numerics_name = ""
        self._ready: bool | None = None  # host copy of scales_initialized: no sync per cast
        self._generation = 0             # advanced once per optimizer step
        self._weight_cache: tuple | None = None
        self._fp8_pack: Fp8StatePack | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def reset_fp8_state(self) -> None:
        """Fresh delayed-scaling state (after ``to_empty`` materialised the buffers)."""
        if isinstance(self.recipe, DelayedScaling):
            with torch.no_grad():
                self.amax_history.zero_()
                self.scale.fill_(1.0)
                self.scale_inv.fill_(1.0)
                self.scales_initialized.fill_(False)
        self._ready, self._weight_cache = None, None

    def _scales_ready(self) -> bool:
        if self._ready is None:
            self._ready = bool(self.scales_initialized)
        return self._ready

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if isinstance(self.recipe, DelayedScaling):
            with torch.no_grad():
                self.scale_inv.copy_(self.scale.reciprocal())
        self._ready, self._weight_cache = None, None

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe.name}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        x2 = x.reshape(-1, self.in_features)
        if torch.is_autocast_enabled(device_type):
            out_dtype = torch.get_autocast_dtype(device_type)
            with torch.autocast(device_type, enabled=False):
                y = _Fp8LinearFunction.apply(x2, self.weight, self.bias, self, out_dtype)
        else:
            y = _Fp8LinearFunction.apply(x2, self.weight, self.bias, self, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    # -- quantization, per recipe ------------------------------------------------------------

    def native(self, device: torch.device) -> bool:
        """Whether this layer's GEMMs call torch._scaled_mm on ``device``."""
        return native_gemm(device, isinstance(self.recipe, BlockwiseScaling), self.gemm_backend)

    def quantize(self, x: torch.Tensor, role: TensorRole, *, transpose: bool = False
                 ) -> tuple[Fp8Tensor, Fp8Tensor | None]:
        """Quantize a 2-D operand per the recipe and report it to the observer, if any.

        Returns the tensor and, with ``transpose``, the copy the transposed GEMM reads. For
        tensorwise recipes, and blockwise weights (128x128 blocks), that copy holds the same
        values in the other layout and is folded into the first result's ``data_other``, so
        the second is None; for blockwise activations and gradients (1x128 tiles) it is x^T
        tiled along x's rows, a different quantization, returned as the second result.
        """
        dtype = role_dtype(self.recipe.fp8_format, role)
        other, current = None, None
        if isinstance(self.recipe, BlockwiseScaling):
            out, other = self._quantize_blockwise(x, dtype, role, transpose)
        elif isinstance(self.recipe, CurrentScaling):
            q, q_t, scale_inv, _ = ops.fp8_cast_current(x, dtype, self.recipe.margin, transpose)
            out = Fp8Tensor(q, scale_inv, None, q_t.t() if transpose else None)
        else:
            out, current = self._quantize_delayed(x, dtype, ROLE_INDEX[role], transpose)
        if self.observer is not None:
            self.observer(self.numerics_name, role, x, out, current)
        return out, other

    def _quantize_blockwise(self, x, dtype, role: TensorRole, transpose: bool
                            ) -> tuple[Fp8Tensor, Fp8Tensor | None]:
        size = self.recipe.block_size
        if role == "weight":
            q, s = ops.fp8_cast_blocks2d(x, dtype, size)
            if not transpose:
                return Fp8Tensor(q, s, (size, size)), None
            # W^T row-major for dgrad, its block scales laid out to match
            return Fp8Tensor(q, s, (size, size), q.t().contiguous().t(),
                             s.t().contiguous().t()), None
        q, s, q_t, s_t = ops.fp8_cast_blockwise(x, dtype, size, transpose)
        return Fp8Tensor(q, s, (1, size)), Fp8Tensor(q_t, s_t, (1, size)) if transpose else None

    def _quantize_delayed(self, x, dtype, i: int, transpose: bool
                          ) -> tuple[Fp8Tensor, torch.Tensor | None]:
        """Cast with the stored scale and fold this amax into the history; returns the tensor
        and, when observed, the scale current scaling would have used (delayed / current)."""
        slot = self.amax_history[i, 0]
        if self._scales_ready():
            q, q_t = ops.fp8_cast(x, dtype, self.scale[i], slot, transpose)
            out = Fp8Tensor(q, self.scale_inv[i], None, q_t.t() if transpose else None)
        else:  # first step: scale from the tensor itself, and record its amax
            q, q_t, scale_inv, a = ops.fp8_cast_current(x, dtype, self.recipe.margin, transpose)
            torch.maximum(slot, a, out=slot)
            out = Fp8Tensor(q, scale_inv, None, q_t.t() if transpose else None)
        current = None
        if self.observer is not None:
            current = compute_scale(kernels.ops_for(x.device).amax(x), dtype, self.recipe.margin)
        return out, current

    def weight_fp8(self, weight: torch.Tensor) -> Fp8Tensor:
        """The FP8 weight (both layouts where the GEMMs need them), quantized once per step."""
        key = (weight._version, self._generation)
        cached = self._weight_cache
        if cached is not None and cached[0] is weight and cached[1] == key:
            return cached[2]
        # dgrad reads W^T row-major: cast both layouts where the GEMMs are torch._scaled_mm
        wq, _ = self.quantize(weight, "weight", transpose=self.native(weight.device))
        self._weight_cache = (weight, key, wq)
        return wq

    def weight_cache_bytes(self) -> int:
        return 0 if self._weight_cache is None else self._weight_cache[2].nbytes()

    def next_step(self) -> None:
        """The weights and scales of the next step differ: re-cast the weight on next use."""
        self._generation += 1
        self._weight_cache = None


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Fp8Linear, out_dtype: torch.dtype) -> torch.Tensor:
        native = layer.native(x.device)
        blockwise = isinstance(layer.recipe, BlockwiseScaling)
        # A frozen weight (LoRA's base) has no wgrad, so neither its input copy nor dY's other
        # layout is made: TransformerEngine's Linear skips both (backward_needs_input).
        wgrad = ctx.needs_input_grad[1]
        # wgrad reads X in the other layout (native tensorwise) or tiled along the tokens
        # (blockwise): that copy is the only one backward keeps, one byte per element.
        xq, x_col = layer.quantize(x, "input", transpose=(native or blockwise) and wgrad)
        wq = layer.weight_fp8(weight)
        y = fp8_gemm(xq, wq.t(), out_dtype, layer.gemm_backend)
        if bias is not None:
            y = y + bias.to(out_dtype)
        if not wgrad:
            kept = Fp8Tensor(x.new_empty(0), x.new_empty(0))
        elif blockwise:
            kept = x_col
        elif native:
            kept = Fp8Tensor(xq.data_other.t(), xq.scale_inv)  # X^T, row-major
        else:
            kept = xq
        # Through save_for_backward, so that checkpointing and the saved-tensor hooks that
        # measure activation memory see it. The FP8 weight is model state (cached on the layer
        # for the whole step), so it is held by reference, not saved.
        ctx.save_for_backward(kept.data, kept.scale_inv)
        ctx.layer, ctx.wq, ctx.kept_block, ctx.wgrad = layer, wq, kept.block, wgrad
        ctx.blockwise, ctx.native, ctx.has_bias = blockwise, native, bias is not None
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        layer, wq = ctx.layer, ctx.wq
        backend = layer.gemm_backend
        kept_data, kept_scale = ctx.saved_tensors
        dy = dy.contiguous()
        wgrad = ctx.wgrad
        dyq, dy_col = layer.quantize(dy, "grad_output",
                                     transpose=(ctx.blockwise or ctx.native) and wgrad)
        dx = fp8_gemm(dyq, wq, ctx.x_dtype, backend)
        dw = None
        if wgrad:
            x_for_wgrad = Fp8Tensor(kept_data, kept_scale, ctx.kept_block)
            if ctx.blockwise:  # X with (128, 1) tiles times dY^T with (1, 128) tiles
                x_for_wgrad, dy_for_wgrad = x_for_wgrad.t(), dy_col
            else:  # native: the kept X^T row-major read as X column-major
                x_for_wgrad = x_for_wgrad.t() if ctx.native else x_for_wgrad
                dy_for_wgrad = dyq.t()
            dw = fp8_gemm(dy_for_wgrad, x_for_wgrad, ctx.w_dtype, backend)
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(ctx.w_dtype)
        return dx, dw, db, None, None


# -- delayed-scaling state of many layers --------------------------------------------------------

def fp8_modules(model: nn.Module) -> list[Fp8Linear]:
    return [m for m in model.modules() if isinstance(m, Fp8Linear)]


class Fp8StatePack:
    """The delayed-scaling state of many layers with one recipe, in three contiguous tensors.

    ``history`` is [L, 3n] (TransformerEngine's layout: row 0 this step's amaxes, contiguous),
    ``scale`` / ``scale_inv`` [3n]; each layer's ``amax_history`` ([3, L]), ``scale`` and
    ``scale_inv`` buffers become views of them, so casts write straight into the pack, the
    per-step update is one operator over all layers and the cross-rank amax reduction one
    all-reduce of ``history[0]``. ``scale_inv`` gives each value its own 16-byte slot (a
    strided view): cuBLASLt takes only aligned scale pointers.
    """

    def __init__(self, layers: list[Fp8Linear]) -> None:
        recipe = layers[0].recipe
        device = layers[0].amax_history.device
        n, length = len(ROLES) * len(layers), recipe.amax_history_len
        self.layers, self.recipe = list(layers), recipe
        self.history = torch.empty(length, n, device=device)
        self.scale = torch.empty(n, device=device)
        self.scale_inv = torch.empty(n, SCALE_ALIGN_BYTES // 4, device=device)[:, 0]
        maxes = [torch.finfo(role_dtype(recipe.fp8_format, r)).max for r in ROLES]
        self.fp8_max = torch.tensor(maxes * len(layers), dtype=torch.float32, device=device)
        width = len(ROLES)
        with torch.no_grad():
            for k, m in enumerate(layers):
                cols = slice(width * k, width * (k + 1))
                self.history[:, cols].copy_(m.amax_history.t())
                self.scale[cols].copy_(m.scale)
                self.scale_inv[cols].copy_(m.scale_inv)
                m._buffers["amax_history"] = self.history[:, cols].t()
                m._buffers["scale"] = self.scale[cols]
                m._buffers["scale_inv"] = self.scale_inv[cols]
                m._fp8_pack = self

    def holds(self, layers: list[Fp8Linear]) -> bool:
        """Still the state of exactly these layers (a ``.to()`` or a new layer breaks a pack)."""
        ptr = self.history.untyped_storage().data_ptr()
        return (len(layers) == len(self.layers)
                and all(a is b for a, b in zip(layers, self.layers))
                and all(m.amax_history.untyped_storage().data_ptr() == ptr for m in layers))

    def update(self) -> None:
        ops.fp8_delayed_update(self.history, self.scale, self.scale_inv, self.fp8_max,
                               self.recipe.margin, self.recipe.amax_compute_algo == "most_recent")


def state_packs(model: nn.Module) -> list[Fp8StatePack]:
    """One pack per (recipe, device) of the delayed-scaling layers in ``model``, made or found."""
    groups: dict[tuple, list[Fp8Linear]] = {}
    for m in fp8_modules(model):
        if isinstance(m.recipe, DelayedScaling) and m.amax_history.device.type != "meta":
            groups.setdefault((m.recipe, m.amax_history.device), []).append(m)
    packs = []
    for layers in groups.values():
        pack = layers[0]._fp8_pack
        packs.append(pack if pack is not None and pack.holds(layers) else Fp8StatePack(layers))
    return packs


def update_fp8_scales(model: nn.Module) -> int:
    """Advance every FP8 layer in ``model`` by one step; returns how many delayed layers.

    Call once per optimizer step (after all micro-batches and any recompute): new delayed
    scales for every layer of a recipe in one operator (one kernel launch on a GPU), and every
    layer re-casts its weight on next use.
    """
    updated = 0
    for pack in state_packs(model):
        pack.update()
        for m in pack.layers:
            if not m._ready:
                m.scales_initialized.fill_(True)
                m._ready = True
        updated += len(pack.layers)
    for m in fp8_modules(model):
        m.next_step()
    return updated


def weight_cache_bytes(model: nn.Module) -> int:
    """Bytes of the FP8 weight copies the layers of ``model`` hold for the current step."""
    return sum(m.weight_cache_bytes() for m in fp8_modules(model))


def attach_observer(model: nn.Module, observer: NumericsObserver | None) -> int:
    """Point every Fp8Linear and MxLinear (which casts its weight on every call) at
    ``observer`` (None detaches); returns how many layers."""
    from autoparallel.model.mx_linear import MxLinear  # it imports this module
    layers = 0
    for name, m in model.named_modules():
        if isinstance(m, (Fp8Linear, MxLinear)):
            m.observer, m.numerics_name = observer, name
            if isinstance(m, Fp8Linear):
                m.next_step()  # the next forward casts (and so reports) the weight again
            layers += 1
    return layers
