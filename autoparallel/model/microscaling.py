"""Microscaled formats in pure PyTorch: NVFP4 and MXFP8 casts, the random Hadamard transform and
stochastic rounding (issue 23 item 2).

These functions are the numerics of ``MxLinear`` on CPU and the oracle its GPU path is checked
against, written after TransformerEngine's NVFP4BlockScaling / MXFP8BlockScaling recipes and
NVIDIA's NVFP4 pre-training report (arXiv 2509.25149):

* **NVFP4**: E2M1 values (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), one E4M3 decode scale per block of 16
  along the GEMM's contracted dim (16x16 blocks for weights, so W and W^T are one quantization),
  and a per-tensor FP32 scale s_global = 448 * 6 / amax that places the block scales inside
  E4M3's range. x ~= e2m1 * s_block / s_global, s_block = E4M3(amax_block / 6 * s_global). A
  block whose scale underflows E4M3 is flushed whole: NVFP4's own underflow.
* **MXFP8**: E4M3 values, one E8M0 (power-of-two) scale per block of 32. The exponent is
  rounded up (ceil(log2(amax_block / 448))) as TransformerEngine does, so no value clips.
* **RHT**: each run of 16 elements along the contracted dim times H16 * S (H16 the normalised
  Sylvester Hadamard matrix, S random +-1 signs: TransformerEngine draws them per step, MxLinear
  per layer call). Applied to both operands of the wgrad GEMM it leaves the product unchanged
  and spreads a token's outlier over 16 values.
* **Stochastic rounding** (gradients): up with probability (x - lo) / (hi - lo), so that the
  quantized gradient is unbiased; round-to-nearest-even otherwise.

Values are kept as fp32 numbers on the format's grid (the bit-exact values a GPU kernel would
store); ``BlockScaled.codes`` gives the E2M1 codes for packing two per byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autoparallel.model.reference import fp8_to_float, saturating_cast

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP8_BLOCK = 32
HADAMARD_SIZE = 16


@dataclass
class BlockScaled:
    """A 2-D tensor as grid ``values`` times a decode scale per ``block`` times ``global_inv``.

    ``scale`` holds one fp32 number per block ([rows / br, cols / bc], exactly representable in
    the scale format); ``fmt`` names the element format ("E2M1" or "E4M3")."""

    values: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    global_inv: torch.Tensor
    fmt: str

    def t(self) -> "BlockScaled":
        return BlockScaled(self.values.t(), self.scale.t(), self.block[::-1], self.global_inv,
                           self.fmt)

    def element_scale(self) -> torch.Tensor:
        """The decode scale of every element (block scale x global), in x's shape."""
        (rows, cols), (br, bc) = self.values.shape, self.block
        full = self.scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
        return full * self.global_inv

    def dequantize(self) -> torch.Tensor:
        return self.values * self.element_scale()

    def codes(self) -> torch.Tensor:
        """E2M1 codes (uint8, sign in bit 3) of an NVFP4 tensor, for packing two per byte."""
        if self.fmt != "E2M1":
            raise ValueError(f"codes() is for E2M1 values, not {self.fmt}")
        grid = torch.tensor(E2M1_GRID, device=self.values.device)
        index = torch.bucketize(self.values.abs(), grid).to(torch.uint8)
        return index | (self.values < 0).to(torch.uint8) << 3


def e2m1_round(x: torch.Tensor, stochastic: bool = False,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """x (already scaled) onto the E2M1 grid, saturating at +-6; NaN stays NaN.

    The grid's spacing is 0.5 below 2, 1 below 4 and 2 up to 6, so a value is a multiple of its
    spacing: round to nearest with ties to even (the even multiple is the even E2M1 code, as
    the hardware cast), or stochastically up with probability (x - lo) / (hi - lo)."""
    a = x.float().abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    units = a / step
    if stochastic:
        lo = torch.floor(units)
        draw = torch.rand(a.shape, generator=generator, device=x.device)
        units = lo + (draw < units - lo).float()
    else:
        units = torch.round(units)
    return torch.where(torch.isnan(x), x.float(), torch.copysign(units * step, x.float()))


def _blocks(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """x padded with zeros to whole blocks, viewed as [rows / br, br, cols / bc, bc]."""
    if x.dim() != 2:
        raise ValueError(f"microscaled casts take a 2-D tensor, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    padded = F.pad(x.float(), (0, pc - cols, 0, pr - rows))
    return padded.view(pr // br, br, pc // bc, bc)


def _per_element(scale: torch.Tensor, blocks: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    full = scale[:, None, :, None].expand_as(blocks).reshape(blocks.shape[0] * blocks.shape[1], -1)
    return full[:shape[0], :shape[1]]


def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor encode scale 448 * 6 / amax (1 for a zero or non-finite amax)."""
    amax = amax.float()
    good = torch.isfinite(amax) & (amax > 0)
    return torch.where(good, (E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax))


def nvfp4_cast(x: torch.Tensor, block: tuple[int, int] = (1, NVFP4_BLOCK),
               stochastic: bool = False, generator: torch.Generator | None = None,
               amax: torch.Tensor | None = None) -> BlockScaled:
    """NVFP4 of a 2-D tensor: (1, 16) blocks along the last dim, or (16, 16) for weights.

    ``amax`` overrides the tensor's own (the amax reduced across ranks, in TransformerEngine)."""
    br, bc = block
    blocks = _blocks(x, br, bc)
    s_enc = global_scale(x.detach().float().abs().amax() if amax is None else amax)
    block_amax = blocks.abs().amax(dim=(1, 3))
    stored = fp8_to_float(saturating_cast(block_amax / E2M1_MAX * s_enc, torch.float8_e4m3fn))
    per = _per_element(stored, blocks, x.shape)
    ratio = torch.where(per > 0, s_enc / per, torch.zeros_like(per))
    values = e2m1_round(x.float() * ratio, stochastic, generator)
    return BlockScaled(values, stored, block, s_enc.reciprocal(), "E2M1")


def rounding_bias(g: torch.Tensor, draws: int = 32) -> tuple[float, float]:
    """(stochastic, nearest): how far from E[cast] the NVFP4 cast of g lands, relative to |g|.

    The reference is g clamped to +-6 per element on its block scales, not g: a block's largest
    value can exceed 6 after its E4M3 scale is rounded to nearest and then saturates, an error
    both roundings share. The stochastic figure is the mean of ``draws`` casts (unbiased: it
    shrinks as 1/sqrt(draws)); the nearest figure is round-to-nearest's deterministic error,
    which no number of casts averages away. Draws from torch's global generator."""
    nearest = nvfp4_cast(g)
    scale = nearest.element_scale()
    clamped = (g.float() / scale).clamp(-E2M1_MAX, E2M1_MAX) * scale
    mean = sum(nvfp4_cast(g, stochastic=True).dequantize() for _ in range(draws)) / draws
    norm = g.float().norm()
    return (((mean - clamped).norm() / norm).item(),
            ((nearest.dequantize() - clamped).norm() / norm).item())


def mxfp8_cast(x: torch.Tensor, block: int = MXFP8_BLOCK) -> BlockScaled:
    """MXFP8 of a 2-D tensor: E4M3 values, a power-of-two scale per 1 x ``block`` run."""
    blocks = _blocks(x, 1, block)
    block_amax = blocks.abs().amax(dim=(1, 3))
    exponent = torch.ceil(torch.log2(block_amax / E4M3_MAX)).clamp(-127, 127)
    scale = torch.where(block_amax > 0, torch.exp2(exponent), torch.ones_like(block_amax))
    per = _per_element(scale, blocks, x.shape)
    values = fp8_to_float(saturating_cast(x.float() / per, torch.float8_e4m3fn))
    return BlockScaled(values, scale, (1, block), torch.ones((), device=x.device), "E4M3")


def hadamard(size: int = HADAMARD_SIZE, device=None) -> torch.Tensor:
    """The Sylvester Hadamard matrix of ``size`` (a power of two), scaled to be orthonormal."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"Hadamard size {size} must be a power of two")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / size ** 0.5


def random_signs(generator: torch.Generator | None = None, size: int = HADAMARD_SIZE,
                 device=None) -> torch.Tensor:
    """The diagonal of S: random +-1 (from ``generator``, or torch's global generator)."""
    draw = torch.randint(0, 2, (size,), generator=generator)
    return (draw * 2 - 1).float().to(device)


def rht(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Each run of 16 elements along the last dim times H16 * S (orthogonal, so applying it to
    both operands along their contracted dim leaves the GEMM's result unchanged)."""
    size = signs.numel()
    rows, cols = x.shape
    if cols % size:
        raise ValueError(f"the random Hadamard transform needs the contracted dim ({cols}) to be "
                         f"a multiple of {size}")
    matrix = hadamard(size, x.device) * signs.to(x.device)
    return (x.float().reshape(rows, cols // size, size) @ matrix).reshape(rows, cols)


__all__ = ["BlockScaled", "e2m1_round", "hadamard", "mxfp8_cast", "nvfp4_cast", "random_signs",
           "rht", "rounding_bias"]
