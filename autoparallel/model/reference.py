"""Pure-PyTorch twins of the CUDA kernels in ``autoparallel/kernels/``.

Each function here is both the CPU path and the test oracle of its kernel: the kernel must match
it bit for bit on casts and exactly on amax. They are written for clarity, not speed, and keep
the kernels' arithmetic order (fp32 multiply by the scale, then a saturating cast) so that
"bit-exact" is a fair demand.

Decisions shared with the kernels (tests/kernels/test_reference.py pins each one):

* Casts saturate: finite values beyond the format's max and +-inf become +-max, for E4M3 and for
  E5M2 (torch's own E5M2 cast overflows to inf, so the clamp is explicit here).
* NaN in gives NaN out, at the same position. amax propagates NaN, and a NaN, inf or zero amax
  keeps the previous scale (1.0 when there is none), so one bad value cannot poison the scale of
  later steps; the NaN itself still reaches the output, where the training loop sees it.
* Scales are fp32: scale = fp8_max / amax * 2**-margin; the GEMMs take scale_inv = 1 / scale.
  The quotient is tensor / tensor on purpose: torch evaluates ``python_float / tensor`` as a
  reciprocal times the float, which differs from CUDA's correctly rounded division in the last
  bit for about a quarter of inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def saturating_cast(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | float = 1.0
                    ) -> torch.Tensor:
    """x * scale in fp32, clamped to +-fp8_max (NaN passes through), cast to ``dtype``."""
    limit = fp8_max(dtype)
    scaled = x.float()
    # x.float() copies a non-fp32 x: scale and clamp that copy in place (same arithmetic, two
    # fewer full-size temporaries); an fp32 x is x itself, never written to.
    scaled = scaled.mul_(scale) if scaled is not x else scaled * scale
    return scaled.clamp_(-limit, limit).to(dtype)


def fp8_to_float(q: torch.Tensor) -> torch.Tensor:
    """FP8 -> fp32 by a 256-entry table built from torch's own conversion (exact, incl. NaN).

    Same values as ``q.float()``, about twice as fast on CPU, where torch converts FP8 element
    by element; the emulated GEMMs dequantize every operand, so this is their hot spot.
    """
    return _looked_up(_fp8_table(q.dtype, q.device), q)


def fp8_to_float_scaled(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """``fp8_to_float(q) * scale_inv`` for one scalar ``scale_inv``, bit for bit, with the
    multiply done on the 256-entry table instead of on every element (each element is still
    the fp32 product table[code] * scale_inv)."""
    return _looked_up(_fp8_table(q.dtype, q.device) * scale_inv.reshape(()), q)


def _looked_up(table: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``table[code]`` of each FP8 code of ``q``, in ``q``'s shape."""
    codes = q.contiguous().view(torch.uint8).flatten().int()
    return table.index_select(0, codes).view(q.shape)


_FP8_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _fp8_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 256 fp32 values of an FP8 format's codes, built once per (format, device); callers
    only read it."""
    key = (dtype, device)
    table = _FP8_TABLES.get(key)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).view(dtype).float().to(device)
        _FP8_TABLES[key] = table
    return table


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as an fp32 scalar tensor; NaN if any element is NaN; 0 for an empty tensor."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().float()


def compute_scale(amax_value: torch.Tensor, dtype: torch.dtype, margin: int = 0,
                  previous: torch.Tensor | float = 1.0) -> torch.Tensor:
    """fp8_max / amax * 2**-margin in fp32; keeps ``previous`` where amax is 0, inf or NaN."""
    amax_value = amax_value.float()
    scale = (torch.tensor(fp8_max(dtype), dtype=torch.float32, device=amax_value.device)
             / amax_value) * (2.0 ** -margin)
    good = torch.isfinite(amax_value) & (amax_value > 0)
    previous = torch.as_tensor(previous, dtype=torch.float32, device=amax_value.device)
    return torch.where(good, scale, previous)


def _fold_amax(a: torch.Tensor, amax_out: torch.Tensor | None) -> torch.Tensor:
    """``a`` itself, or ``amax_out`` updated in place to max(amax_out, a) (NaN wins), as the
    kernels do when they accumulate into a running amax such as a delayed-scaling history slot."""
    if amax_out is None:
        return a
    torch.maximum(amax_out, a, out=amax_out)
    return amax_out


def cast_amax(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor,
              amax_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Delayed scaling's one pass: cast with a known scale and record this tensor's amax."""
    return saturating_cast(x, dtype, scale), _fold_amax(amax(x), amax_out)


def current_scale_cast(x: torch.Tensor, dtype: torch.dtype, margin: int = 0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Current (tensorwise) scaling: amax, scale, cast. Returns (fp8, scale_inv, amax)."""
    a = amax(x)
    scale = compute_scale(a, dtype, margin)
    return saturating_cast(x, dtype, scale), scale.reciprocal(), a


def _check_2d(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} takes a 2-D tensor, got shape {tuple(x.shape)}")


def cast_transpose(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor,
                   amax_out: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cast a 2-D tensor once into both layouts: (fp8 row-major, fp8 of x.T row-major, amax)."""
    _check_2d("cast_transpose", x)
    q = saturating_cast(x, dtype, scale)
    return q, q.t().contiguous(), _fold_amax(amax(x), amax_out)


def current_scale_cast_transpose(x: torch.Tensor, dtype: torch.dtype, margin: int = 0
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """Current scaling into both layouts: (fp8, fp8 of x.T, scale_inv, amax)."""
    _check_2d("current_scale_cast_transpose", x)
    q, scale_inv, a = current_scale_cast(x, dtype, margin)
    return q, q.t().contiguous(), scale_inv, a


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return F.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


def _ceil(n: int, block: int) -> int:
    return -(-n // block) * block


def _block_scale(block_amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # An all-zero block keeps scale 1 (its values cast to zero either way).
    return compute_scale(block_amax, dtype, 0, 1.0)


def blockwise_cast_1d(x: torch.Tensor, dtype: torch.dtype, block: int = 128
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """1 x ``block`` tiles along the last dim of a 2-D tensor (a ragged last tile is allowed).

    Returns (fp8 of x's shape, scale_inv of shape [rows, ceil(cols / block)]).
    """
    _check_2d("blockwise_cast_1d", x)
    rows, cols = x.shape
    tiles = _pad_to(x.float(), rows, _ceil(cols, block)).view(rows, -1, block)
    scale = _block_scale(tiles.abs().amax(dim=2), dtype)
    q = saturating_cast(tiles, dtype, scale.unsqueeze(2)).view(rows, -1)[:, :cols]
    return q.contiguous(), scale.reciprocal()


def blockwise_cast_transpose_1d(x: torch.Tensor, dtype: torch.dtype, block: int = 128
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                           torch.Tensor]:
    """1 x ``block`` tiles along rows and along columns, from one read on a GPU.

    Returns (fp8 x, its scale_inv [rows, tiles], fp8 of x.T, its scale_inv [cols, tiles]): the
    rowwise copy feeds the GEMMs that contract x's last dim, the columnwise one (x.T, tiled
    along x's rows) the weight-gradient GEMM that contracts its first.
    """
    _check_2d("blockwise_cast_transpose_1d", x)
    return (*blockwise_cast_1d(x, dtype, block), *blockwise_cast_1d(x.t(), dtype, block))


def blockwise_cast_2d(x: torch.Tensor, dtype: torch.dtype, block: int = 128
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``block`` x ``block`` blocks of a 2-D tensor (weights).

    Returns (fp8 of x's shape, scale_inv of shape [ceil(rows / block), ceil(cols / block)]).
    """
    _check_2d("blockwise_cast_2d", x)
    rows, cols = x.shape
    pr, pc = _ceil(rows, block), _ceil(cols, block)
    blocks = _pad_to(x.float(), pr, pc).view(pr // block, block, pc // block, block)
    scale = _block_scale(blocks.abs().amax(dim=(1, 3)), dtype)
    q = saturating_cast(blocks, dtype, scale[:, None, :, None]).view(pr, pc)[:rows, :cols]
    return q.contiguous(), scale.reciprocal()


def delayed_scaling_update(amax_history: torch.Tensor, scale: torch.Tensor,
                           scale_inv: torch.Tensor, fp8_maxes: torch.Tensor, margin: int,
                           algo: str) -> None:
    """Update many delayed-scaling states at once, in place (TransformerEngine's layout).

    ``amax_history`` is [L, n]: row 0 holds this step's amax of each of the n tensors, rows 1..
    the earlier steps, oldest first. A non-finite amax in row 0 counts as 0 (a step that saw inf
    or NaN leaves no trace). For each tensor: amax = max over its column (or row 0 for
    ``most_recent``), scale = fp8_max / amax * 2**-margin unless that amax is 0 or non-finite,
    scale_inv = 1 / scale; then the column rolls up by one (this step's amax moves to the end)
    and row 0 is zeroed.
    """
    if algo not in ("max", "most_recent"):
        raise ValueError(f"amax_compute_algo={algo!r} is not valid; choose one of max, most_recent")
    now = amax_history[0]
    now.copy_(torch.where(torch.isfinite(now), now, torch.zeros_like(now)))
    window = amax_history.amax(dim=0) if algo == "max" else now.clone()
    new_scale = (fp8_maxes.float() / window) * (2.0 ** -margin)
    good = torch.isfinite(window) & (window > 0)
    scale.copy_(torch.where(good, new_scale, scale))
    scale_inv.copy_(scale.reciprocal())
    amax_history.copy_(torch.roll(amax_history, -1, dims=0))
    amax_history[0] = 0.0


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of h = [gate | up] along the last dim (kernels/swiglu.cu's forward)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_backward(h: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """d(h) = [d(gate) | d(up)] in FP32 (at least), each product and sum rounded on its own,
    in this order: the kernel repeats it operation by operation. The order is kept because the
    NVFP4 training trajectories depend on it: rewritten with ``silu_backward`` (same formula,
    other rounding order) the seed-0 stochastic-rounding ablation moved from +2.2 to +0.2 points
    (``benchmarks/bench_nvfp4_ablation.py``; a loss-level result whose sign also follows the
    CPU, benchmarks/RESULTS.md session 39)."""
    gate, up = h.chunk(2, dim=-1)
    dtype = torch.promote_types(h.dtype, torch.float32)
    g, gate_f, up_f = grad.to(dtype), gate.to(dtype), up.to(dtype)
    sig = torch.sigmoid(gate_f)
    dgate = g * up_f * sig * (1 + gate_f * (1 - sig))
    return torch.cat([dgate.to(h.dtype), (g * gate_f * sig).to(h.dtype)], dim=-1)
