"""The microscaled Linear (MXFP8 / NVFP4): three GEMMs on block-scaled operands (issue 23).

Hardware block-scaled GEMMs contract both operands along K with the block scales running along
K, so every GEMM quantizes its own operands along its own contracted dim, as TransformerEngine
does:

* fprop  Y  = X W^T:  X in 1 x b blocks along the features, W along its input features;
* dgrad  dX = dY W:   dY along the output features (stochastically rounded under NVFP4), W
  along its output features: under NVFP4 the same 16x16-block weight as fprop (``weight_2d``),
  under MXFP8 a second, columnwise quantization of W;
* wgrad  dW = dY^T X: both along the tokens; under NVFP4 both first pass through the random
  Hadamard transform with one sign vector for both (so the product is unchanged), and dY^T is
  stochastically rounded.

The columnwise X for wgrad is quantized in forward and is all backward keeps of X. The numerics
observer (``autoparallel.model.numerics``) sees every quantization under the names input,
weight, grad_output and, for the second quantizations, input_t, weight_t, grad_output_t.

GEMMs are emulated (dequantize, multiply in fp32) on CPU and wherever ``gemm_backend`` is
"emulate": that is the numerics oracle. On a GPU they call ``torch._scaled_mm`` with FP4 / FP8
data and swizzled E4M3 / E8M0 block scales, which torch runs on sm_100 (Blackwell); a probe
against the emulation decides once per device, and a GPU that cannot run them is an error,
never a silent emulation (``gemm_backend="emulate"`` asks for that explicitly).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.model.fp8 import GemmBackend, _device_name, init_quantized_linear
from autoparallel.model.microscaling import (NVFP4_BLOCK, BlockScaled, mxfp8_cast, nvfp4_cast,
                                             random_signs, rht)
from autoparallel.model.recipes import MICROSCALED, Mxfp8BlockScaling, Nvfp4BlockScaling


class MxUnsupported(RuntimeError):
    """A microscaled GEMM this device / torch cannot run natively (the reason is in the message)."""


# -- GEMMs ---------------------------------------------------------------------------------------

def _swizzle(scale: torch.Tensor) -> torch.Tensor:
    """Block scales [rows, k_blocks] in cuBLAS's 128x4 tiled layout (torch's SWIZZLE_32_4_4):
    rows padded to 128, blocks to 4, each 128x4 tile stored as 32 rows of 4 x 4."""
    rows, cols = scale.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
    padded = F.pad(scale, (0, pc - cols, 0, pr - rows))
    tiles = padded.view(pr // 128, 128, pc // 4, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1).contiguous()


def _native_operand(t: BlockScaled) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, swizzled scales) of a [rows, K] operand quantized along K, as torch._scaled_mm
    takes it: E2M1 codes packed two per byte (first element in the low nibble) with E4M3
    scales, or E4M3 data with E8M0 scales. A 16x16-block weight repeats its scale per row."""
    rows = t.values.shape[0]
    scale = _swizzle(t.scale.repeat_interleave(t.block[0], 0)[:rows])
    if t.fmt == "E2M1":
        codes = t.codes()
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
        return packed.view(torch.float4_e2m1fn_x2), scale.to(torch.float8_e4m3fn)
    return t.values.to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def _scaled_mm(a: BlockScaled, b: BlockScaled, out_dtype: torch.dtype) -> torch.Tensor:
    (da, sa), (db, sb) = _native_operand(a), _native_operand(b)
    out = torch._scaled_mm(da, db.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    return (out * (a.global_inv * b.global_inv)).to(out_dtype)


@functools.lru_cache(maxsize=None)
def native_support(device: str, fmt: str) -> str | None:
    """None when torch._scaled_mm on ``device`` multiplies ``fmt`` ("E2M1" / "E4M3") microscaled
    operands as the emulation does (relative error < 1 % on a 256^3 product), else why not."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(256, 256, generator=g) * torch.logspace(-2, 2, 256)).to(device)
    b = torch.randn(256, 256, generator=g).to(device)
    cast = nvfp4_cast if fmt == "E2M1" else mxfp8_cast
    qa, qb = cast(a), cast(b)
    want = qa.dequantize() @ qb.dequantize().t()
    try:
        got = _scaled_mm(qa, qb, torch.float32)
    except Exception as exc:  # noqa: BLE001 - an unsupported configuration is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    err = float((got - want).norm() / want.norm())
    if not math.isfinite(err) or err > 1e-2:
        return f"wrong result (relative error {err:.3g} against the emulation)"
    return None


def native_gemm(device: torch.device, fmt: str, backend: GemmBackend = "auto") -> bool:
    """True where ``mx_gemm`` calls torch._scaled_mm, False where it emulates; raises
    ``MxUnsupported`` on a GPU that cannot run ``fmt`` GEMMs."""
    name = _device_name(torch.device(device))
    if backend == "emulate" or (backend == "auto" and not name.startswith("cuda")):
        return False
    cap = torch.cuda.get_device_capability(torch.device(name)) if name.startswith("cuda") else None
    if cap is not None and cap < (10, 0):
        raise MxUnsupported(f"microscaled ({fmt}) GEMMs need Blackwell (compute capability 10.0+),"
                            f" {name} has {cap[0]}.{cap[1]}; use gemm_backend='emulate'")
    why = native_support(name, fmt)
    if why is not None:
        raise MxUnsupported(f"torch {torch.__version__} cannot run {fmt} microscaled GEMMs on "
                            f"{name}: {why}; use gemm_backend='emulate'")
    return True


def mx_gemm(a: BlockScaled, b: BlockScaled, out_dtype: torch.dtype,
            backend: GemmBackend = "auto") -> torch.Tensor:
    """a @ b^T for operands both quantized along K: [M, K] x [N, K] -> [M, N]."""
    if native_gemm(a.values.device, a.fmt, backend):
        return _scaled_mm(a, b, out_dtype)
    return (a.dequantize() @ b.dequantize().t()).to(out_dtype)


# -- the layer -----------------------------------------------------------------------------------

class MxLinear(nn.Module):
    """A bias-optional Linear whose GEMMs run in MXFP8 or NVFP4 per ``recipe``; keeps
    ``nn.Linear``'s ``weight`` / ``bias`` so parallel wrappers shard it from outside."""

    def __init__(self, in_features: int, out_features: int, recipe, bias: bool = False,
                 gemm_backend: GemmBackend = "auto", device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(recipe, MICROSCALED):
            raise ValueError(f"recipe={recipe!r} is not a microscaled recipe (mxfp8, nvfp4)")
        init_quantized_linear(self, in_features, out_features, recipe, bias, gemm_backend, device, dtype)
        self.observer = None
        self.numerics_name = ""
        self.reset_parameters()

    reset_parameters = nn.Linear.reset_parameters

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        out_dtype = (torch.get_autocast_dtype(device_type)
                     if torch.is_autocast_enabled(device_type) else x.dtype)
        with torch.autocast(device_type, enabled=False):
            y = _MxLinearFunction.apply(x.reshape(-1, self.in_features), self.weight, self.bias,
                                        self, out_dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def quantize(self, x: torch.Tensor, role: str, *, gradient: bool = False,
                 signs: torch.Tensor | None = None, block_2d: bool = False) -> BlockScaled:
        """x [rows, K] quantized along K per the recipe (after the RHT when ``signs`` are given),
        reported to the observer under ``role``."""
        recipe = self.recipe
        if signs is not None:
            x = rht(x, signs)
        if isinstance(recipe, Mxfp8BlockScaling):
            out = mxfp8_cast(x)
        else:
            block = (NVFP4_BLOCK, NVFP4_BLOCK) if block_2d else (1, NVFP4_BLOCK)
            out = nvfp4_cast(x, block, stochastic=gradient and recipe.stochastic_rounding)
        if self.observer is not None:
            self.observer(self.numerics_name, role, x, out, None)
        return out

    def wgrad_signs(self, device) -> torch.Tensor | None:
        """The RHT signs of this GEMM pair. TransformerEngine draws one vector per step for all
        layers; one draw per layer call has the same distribution for every GEMM."""
        if isinstance(self.recipe, Nvfp4BlockScaling) and self.recipe.random_hadamard:
            return random_signs(device=device)
        return None

    def weights(self, weight: torch.Tensor) -> tuple[BlockScaled, BlockScaled]:
        """(W [out, in] along its inputs for fprop, W^T [in, out] along its outputs for dgrad)."""
        if isinstance(self.recipe, Nvfp4BlockScaling) and self.recipe.weight_2d:
            w = self.quantize(weight, "weight", block_2d=True)
            return w, w.t()
        return self.quantize(weight, "weight"), self.quantize(weight.t(), "weight_t")


class _MxLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: MxLinear, out_dtype: torch.dtype) -> torch.Tensor:
        xq = layer.quantize(x, "input")
        w, w_t = layer.weights(weight.detach())
        y = mx_gemm(xq, w, out_dtype, layer.gemm_backend)
        if bias is not None:
            y = y + bias.to(out_dtype)
        signs = layer.wgrad_signs(x.device)
        x_t = layer.quantize(x.detach().t(), "input_t", signs=signs)  # all backward keeps of X
        ctx.layer, ctx.w_t, ctx.x_t, ctx.signs = layer, w_t, x_t, signs
        ctx.has_bias, ctx.x_dtype, ctx.w_dtype = bias is not None, x.dtype, weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        layer, backend = ctx.layer, ctx.layer.gemm_backend
        dy = dy.contiguous()
        dyq = layer.quantize(dy, "grad_output", gradient=True)
        dx = mx_gemm(dyq, ctx.w_t, ctx.x_dtype, backend)
        dy_t = layer.quantize(dy.t(), "grad_output_t", gradient=True, signs=ctx.signs)
        dw = mx_gemm(dy_t, ctx.x_t, ctx.w_dtype, backend)
        db = dy.float().sum(0).to(ctx.w_dtype) if ctx.has_bias else None
        return dx, dw, db, None, None

