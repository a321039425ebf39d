"""The pure-PyTorch NVFP4 / MXFP8 casts, RHT and stochastic rounding (the oracle of MxLinear)."""

import math

import pytest
import torch

from autoparallel.model import microscaling as M
from autoparallel.model.mx_linear import _swizzle

torch.set_num_threads(1)


def test_e2m1_round_to_nearest_even_saturates_and_keeps_nan():
    grid = torch.tensor(M.E2M1_GRID)
    assert torch.equal(M.e2m1_round(grid), grid)
    assert torch.equal(M.e2m1_round(-grid), -grid)
    # midpoints go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert M.e2m1_round(mids).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert M.e2m1_round(torch.tensor([0.26, 5.01, 100.0, -7.0])).tolist() == [0.5, 6.0, 6.0, -6.0]
    assert math.isnan(M.e2m1_round(torch.tensor([float("nan")])).item())


def test_stochastic_rounding_is_unbiased_and_nearest_is_not():
    x = torch.full((200_000,), 2.6)
    g = torch.Generator().manual_seed(0)
    sr = M.e2m1_round(x, stochastic=True, generator=g)
    assert set(sr.unique().tolist()) == {2.0, 3.0}
    assert abs(sr.mean().item() - 2.6) < 0.01
    assert M.e2m1_round(x).mean().item() == 3.0


def test_nvfp4_two_level_scales():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 64, generator=g) * 3.0
    q = M.nvfp4_cast(x)
    amax = x.abs().max()
    assert torch.allclose(q.global_inv, amax / (448.0 * 6.0))
    assert q.scale.shape == (32, 4)
    # block scales are E4M3 numbers; values are on the E2M1 grid; no block exceeds its amax much
    e4m3 = q.scale.to(torch.float8_e4m3fn).float()
    assert torch.equal(e4m3, q.scale)
    assert set(q.values.abs().unique().tolist()) <= set(M.E2M1_GRID)
    rel = ((q.dequantize() - x).norm() / x.norm()).item()
    assert 0.03 < rel < 0.15  # 4-bit: a few % error, far more than E4M3's ~2 %


def test_nvfp4_2d_weight_blocks_are_one_quantization_in_both_layouts():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 32, generator=g)
    q = M.nvfp4_cast(w, (16, 16))
    assert q.scale.shape == (3, 2)
    assert torch.equal(q.t().dequantize(), q.dequantize().t())


def test_nvfp4_flushes_a_block_whose_scale_underflows_e4m3():
    x = torch.full((1, 32), 1e-6)
    x[0, 16] = 1e4  # second block's amax sets the global scale; the first block's is below E4M3
    q = M.nvfp4_cast(x)
    assert q.scale[0, 0].item() == 0.0 and (q.dequantize()[0, :16] == 0).all()
    assert q.dequantize()[0, 16].item() == pytest.approx(1e4, rel=0.07)


def test_mxfp8_power_of_two_scales_never_clip():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 96, generator=g) * torch.logspace(-3, 3, 96)
    q = M.mxfp8_cast(x)
    assert q.scale.shape == (8, 3)
    assert torch.equal(torch.exp2(torch.log2(q.scale).round()), q.scale)
    assert q.values.abs().max().item() <= 448.0
    per_block = ((q.dequantize() - x).abs().view(8, 3, 32).amax(2)
                 / x.abs().view(8, 3, 32).amax(2))
    assert per_block.max().item() <= 2 ** -4  # E4M3 half-ulp, relative to the block amax


def test_rht_is_orthogonal_and_keeps_the_gemm():
    h = M.hadamard(16)
    assert torch.allclose(h @ h.t(), torch.eye(16), atol=1e-6)
    signs = M.random_signs(torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, 64, generator=g), torch.randn(5, 64, generator=g)
    assert torch.allclose(M.rht(a, signs) @ M.rht(b, signs).t(), a @ b.t(), atol=1e-4)
    with pytest.raises(ValueError, match="multiple of 16"):
        M.rht(torch.randn(2, 24), signs)


def test_rounding_bias_averages_stochastic_rounding_away_but_not_nearest():
    """A tensor already on the grid (a 6 in every block, so the scales are exact) has no error
    either way; a Gaussian one keeps round-to-nearest's error while the mean of 32 stochastic
    casts falls as 1 / sqrt(32) (about 1.45 / sqrt(32) = 0.26 of it)."""
    g = torch.Generator().manual_seed(0)
    grid = torch.tensor(M.E2M1_GRID)[torch.randint(0, 8, (32, 64), generator=g)]
    grid[:, ::16] = 6.0
    torch.manual_seed(0)
    assert M.rounding_bias(grid, draws=4) == (0.0, 0.0)
    stochastic, nearest = M.rounding_bias(torch.randn(64, 256, generator=g), draws=32)
    assert 0.05 < nearest < 0.15 and stochastic < 0.35 * nearest

def test_codes_and_swizzle_layout():
    q = M.nvfp4_cast(torch.tensor([[0.0, -0.5, 1.0, -6.0] * 4]))
    codes = q.codes()[0, :4].tolist()
    assert codes == [0, 8 | 1, 2, 8 | 7]
    # cuBLAS's 128x4 tile: scale (r, c) at (r % 32) * 16 + (r // 32) * 4 + c
    s = torch.arange(128 * 4, dtype=torch.float32).view(128, 4)
    flat = _swizzle(s)
    for r, c in ((0, 0), (1, 0), (31, 3), (32, 0), (100, 2), (127, 3)):
        assert flat[(r % 32) * 16 + (r // 32) * 4 + c].item() == s[r, c].item()
    assert _swizzle(torch.ones(130, 5)).numel() == 256 * 8  # padded to whole tiles
