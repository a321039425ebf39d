"""The kernels' pure-PyTorch twins: cast semantics against torch's own float8 casts and against
an independent round-to-nearest-even model, exact amax, blockwise and delayed-update rules."""

import numpy as np
import pytest
import torch

from autoparallel.model import reference as R

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = [E4M3, E5M2]


def bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def all_bf16() -> torch.Tensor:
    """Every bfloat16 bit pattern: zeros, subnormals, normals, +-inf, NaNs."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """Zeros, both formats' subnormals, every representable value and every midpoint between
    neighbours (ties), values just beyond max, inf and NaN."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).double()
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    nudged = torch.cat([mids * (1 + 2.0 ** -20), mids * (1 - 2.0 ** -20)])
    limit = R.fp8_max(dtype)
    extra = torch.tensor([0.0, -0.0, limit * 1.03, limit * 1.04, limit * 1.1, limit * 2, 1e30,
                          float("inf"), float("-inf"), float("nan"), 2.0 ** -20, -(2.0 ** -20)],
                         dtype=torch.float64)
    return torch.cat([finite, mids, nudged, extra]).float()


def rne_oracle(x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Independent model of a saturating round-to-nearest-even cast, from the code table."""
    codes = torch.arange(128, dtype=torch.uint8)  # non-negative codes
    values = codes.view(dtype).double().numpy()
    keep = np.isfinite(values)
    pos_vals, pos_codes = values[keep], codes.numpy()[keep]
    order = np.argsort(pos_vals)
    pos_vals, pos_codes = pos_vals[order], pos_codes[order]
    xs = x.double().numpy()
    out = np.empty(xs.shape, dtype=np.uint8)
    for i, v in enumerate(xs):
        if np.isnan(v):
            out[i] = 0x7F
            continue
        mag = min(abs(v), pos_vals[-1])  # saturate (inf too)
        j = np.searchsorted(pos_vals, mag)
        if j < len(pos_vals) and pos_vals[j] == mag:
            code = pos_codes[j]
        else:
            lo, hi = pos_vals[j - 1], pos_vals[j]
            if mag - lo < hi - mag:
                code = pos_codes[j - 1]
            elif hi - mag < mag - lo:
                code = pos_codes[j]
            else:  # tie: the even code (mantissa LSB 0)
                code = pos_codes[j - 1] if pos_codes[j - 1] % 2 == 0 else pos_codes[j]
        out[i] = code | (0x80 if np.signbit(v) else 0)
    return out


def assert_same_cast(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Bit-exact, except that NaN payloads and signs may differ: NaN positions must match."""
    nan_ours, nan_theirs = torch.isnan(ours.float()), torch.isnan(theirs.float())
    assert torch.equal(nan_ours, nan_theirs)
    assert torch.equal(bits(ours)[~nan_ours], bits(theirs)[~nan_theirs])


@pytest.mark.parametrize("dtype", FORMATS)
def test_cast_matches_torch_on_every_bf16_pattern(dtype):
    x = all_bf16()
    ours = R.saturating_cast(x, dtype)
    limit = R.fp8_max(dtype)
    finite = torch.isfinite(x)
    # torch saturates E4M3 itself; for E5M2 it overflows to inf, so compare after the clamp.
    theirs = torch.where(finite, x.float().clamp(-limit, limit), x.float()).to(dtype)
    inf = torch.isinf(x)
    assert_same_cast(ours[~inf], theirs[~inf])
    assert (ours[inf].float().abs() == limit).all()  # +-inf saturates to +-max


@pytest.mark.parametrize("dtype", FORMATS)
def test_cast_matches_torch_on_random_fp32(dtype):
    g = torch.Generator().manual_seed(0)
    limit = R.fp8_max(dtype)
    x = torch.randn(200_000, generator=g) * torch.exp2(torch.randint(-24, 12, (200_000,),
                                                                     generator=g).float())
    x = x.clamp(-limit * 1.2, limit * 1.2)
    ours = R.saturating_cast(x, dtype)
    theirs = x.clamp(-limit, limit).to(dtype)
    assert torch.equal(bits(ours), bits(theirs))


@pytest.mark.parametrize("dtype", FORMATS)
def test_cast_matches_independent_rne_model_on_edges(dtype):
    x = edge_values(dtype)
    ours = R.saturating_cast(x, dtype)
    expected = torch.from_numpy(rne_oracle(x, dtype)).view(dtype)
    assert_same_cast(ours, expected)


@pytest.mark.parametrize("dtype", FORMATS)
def test_saturation_zeros_subnormals_nan(dtype):
    limit = R.fp8_max(dtype)
    tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal of either format
    x = torch.tensor([0.0, -0.0, limit * 4, -limit * 4, float("inf"), float("-inf"), tiny,
                      tiny / 4.1, float("nan")])
    q = R.saturating_cast(x, dtype).float()
    assert bits(R.saturating_cast(x[:2], dtype)).tolist() == [0x00, 0x80]  # signed zeros kept
    assert q[2:6].tolist() == [limit, -limit, limit, -limit]
    assert q[6].item() > 0 and q[7].item() == 0  # subnormal kept; below half of it flushes
    assert torch.isnan(q[8])  # NaN in, NaN out


def test_e5m2_clamp_is_needed_and_e4m3_saturates_in_torch():
    """Pins the torch behaviour the references rely on (DESIGN.md §6)."""
    big = torch.tensor([1e6, float("inf")])
    assert torch.isinf(big.to(E5M2).float()).all()
    assert (big.to(E4M3).float() == 448).all()


@pytest.mark.parametrize("dtype", FORMATS)
def test_fp8_to_float_table_is_exact(dtype):
    q = torch.arange(256, dtype=torch.uint8).view(dtype)
    ours, theirs = R.fp8_to_float(q), q.float()
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    keep = ~torch.isnan(theirs)
    assert torch.equal(ours[keep].view(torch.int32), theirs[keep].view(torch.int32))


def test_amax_is_exact_and_propagates_nan():
    x = torch.randn(1000, dtype=torch.float64).float()
    x[123] = -7.25
    assert R.amax(x).item() == 7.25
    assert R.amax(x.bfloat16()).dtype == torch.float32
    x[5] = float("nan")
    assert torch.isnan(R.amax(x))
    assert R.amax(torch.empty(0)).item() == 0.0


def test_compute_scale_rules():
    s = R.compute_scale(torch.tensor(2.0), E4M3, margin=1)
    assert s.item() == 448 / 2 / 2
    for bad in (0.0, float("inf"), float("nan")):
        assert R.compute_scale(torch.tensor(bad), E4M3, 0, previous=3.0).item() == 3.0
    assert R.compute_scale(torch.tensor(1.0), E5M2, margin=-2).item() == 57344 * 4


def test_current_scale_cast_maps_amax_to_max():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 1e-3
    q, scale_inv, a = R.current_scale_cast(x, E4M3)
    assert q.float().abs().max().item() == 448.0
    # the half-ulp bound holds in E4M3's normal range (subnormals carry fewer bits)
    normal = q.float().abs() >= torch.finfo(E4M3).smallest_normal
    assert torch.allclose((q.float() * scale_inv)[normal], x[normal], rtol=2 ** -4, atol=0)


def test_cast_transpose_gives_both_layouts():
    x = torch.randn(48, 80)
    q, q_t, a = R.cast_transpose(x, E4M3, torch.tensor(3.0))
    assert q_t.is_contiguous() and q_t.shape == (80, 48)
    assert torch.equal(bits(q_t), bits(q).t())
    assert torch.equal(bits(q), bits(R.saturating_cast(x, E4M3, 3.0)))
    assert a.item() == x.abs().max().item()


def naive_blocks(x, dtype, br, bc):
    """Loop-by-loop oracle for the blockwise casts."""
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=dtype)
    s_inv = torch.empty(-(-rows // br), -(-cols // bc))
    for i in range(0, rows, br):
        for j in range(0, cols, bc):
            block = x[i:i + br, j:j + bc]
            a = block.abs().max()
            # A tensor / tensor division: torch computes ``python_float / tensor`` as
            # reciprocal-and-multiply, which is not the correctly rounded quotient CUDA gives.
            limit = torch.tensor(R.fp8_max(dtype))
            scale = limit / a if a > 0 and torch.isfinite(a) else torch.tensor(1.0)
            q[i:i + br, j:j + bc] = R.saturating_cast(block, dtype, scale)
            s_inv[i // br, j // bc] = 1 / torch.as_tensor(scale, dtype=torch.float32)
    return q, s_inv


@pytest.mark.parametrize("shape", [(4, 256), (3, 300), (130, 200)])
def test_blockwise_1x128_matches_naive(shape):
    x = torch.randn(*shape) * torch.logspace(-3, 3, shape[1])  # scales vary along a row
    x[0, :128] = 0.0  # an all-zero tile keeps scale 1
    q, s = R.blockwise_cast_1d(x, E4M3)
    q2, s2 = naive_blocks(x, E4M3, 1, 128)
    assert torch.equal(bits(q), bits(q2)) and torch.equal(s, s2)
    assert s[0, 0].item() == 1.0


def test_blockwise_128x128_matches_naive():
    x = torch.randn(300, 260)
    x[130:, :] *= 1e4
    q, s = R.blockwise_cast_2d(x, E4M3)
    q2, s2 = naive_blocks(x, E4M3, 128, 128)
    assert s.shape == (3, 3)
    assert torch.equal(bits(q), bits(q2)) and torch.equal(s, s2)


def test_blockwise_beats_tensorwise_on_outliers():
    """The reason blockwise exists: one outlier tile does not crush the rest to zero."""
    x = torch.randn(8, 1024) * 1e-2
    x[0, 0] = 1e4
    blk, s = R.blockwise_cast_1d(x, E4M3)
    tw, s_inv, _ = R.current_scale_cast(x, E4M3)
    err_blk = ((blk.float().view(8, 8, 128) * s.unsqueeze(2)).view(8, 1024) - x)[1:].norm()
    err_tw = (tw.float() * s_inv - x)[1:].norm()
    assert err_blk < err_tw / 10


def naive_delayed(history, scale, maxes, margin, algo):
    """Column by column; history is [L, n] (row 0 = this step), TransformerEngine's layout."""
    h, s = history.clone(), scale.clone()
    for i in range(h.shape[1]):
        if not torch.isfinite(h[0, i]):
            h[0, i] = 0.0  # a step that saw inf / NaN leaves no trace
        a = h[:, i].max() if algo == "max" else h[0, i]
        if torch.isfinite(a) and a > 0:
            s[i] = maxes[i] / a * 2.0 ** -margin  # 0-dim tensors: a true division
        h[:, i] = torch.cat([h[1:, i], h[:1, i]])
        h[0, i] = 0
    return h, s


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 4, 16])
def test_delayed_scaling_update_matches_naive(algo, length):
    g = torch.Generator().manual_seed(length)
    h = torch.rand(length, 6, generator=g) * 10
    h[:, 1] = 0.0                    # nothing seen: keep the old scale
    h[0, 2] = float("inf")           # non-finite: recorded as 0
    h[:, 5] = 0.0
    h[0, 5] = float("nan")           # non-finite and nothing else: keep the old scale
    s = torch.arange(1.0, 7.0)
    s_inv = torch.zeros(6)
    maxes = torch.tensor([448.0, 57344.0, 448.0, 448.0, 57344.0, 448.0])
    expect_h, expect_s = naive_delayed(h, s, maxes, 1, algo)
    R.delayed_scaling_update(h, s, s_inv, maxes, 1, algo)
    assert torch.equal(h, expect_h) and torch.equal(s, expect_s)
    assert torch.equal(s_inv, s.reciprocal())
    assert s[1].item() == 2.0 and s[5].item() == 6.0
    assert (h[0] == 0).all() and torch.isfinite(h).all()
    if length == 1 or algo == "most_recent":
        assert s[2].item() == 3.0  # the inf step counted as 0: nothing else to go by


def test_delayed_scaling_update_rejects_unknown_algo():
    with pytest.raises(ValueError, match="amax_compute_algo='mean'"):
        R.delayed_scaling_update(torch.zeros(2, 1), torch.ones(1), torch.ones(1), torch.ones(1),
                                 0, "mean")


def test_accumulating_casts_fold_into_a_running_amax():
    """Delayed scaling's micro-batches share one history slot: the kernels max into it."""
    slot = torch.tensor(3.0)
    x = torch.randn(16, 32)
    x[2, 3] = -5.0
    R.cast_amax(x, E4M3, torch.tensor(1.0), slot)
    assert slot.item() == 5.0
    R.cast_transpose(x * 0.1, E4M3, torch.tensor(1.0), slot)
    assert slot.item() == 5.0  # smaller: the slot keeps the max


def test_blockwise_cast_transpose_tiles_both_ways():
    x = torch.randn(256, 384) * torch.logspace(-2, 2, 384)
    q, s, q_t, s_t = R.blockwise_cast_transpose_1d(x, E4M3)
    assert torch.equal(bits(q), bits(R.blockwise_cast_1d(x, E4M3)[0]))
    assert s.shape == (256, 3) and s_t.shape == (384, 2)
    q2, s2 = naive_blocks(x.t().contiguous(), E4M3, 1, 128)
    assert torch.equal(bits(q_t), bits(q2)) and torch.equal(s_t, s2)
