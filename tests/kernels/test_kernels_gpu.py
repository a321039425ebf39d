"""CUDA kernels against their references: bit-exact casts, exact amax, same scales.

Runs only where torch sees a GPU (and nvcc can build the extension):
    python -m pytest tests/kernels/test_kernels_gpu.py -m gpu -v
"""

import ctypes

import pytest
import torch

from autoparallel.model import kernels, reference as R

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
INPUTS = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    module, status = kernels.load()
    if module is None:
        pytest.fail(f"kernels did not build on a CUDA machine: {status.reason}")
    return kernels.CudaOps(module)


def nasty(shape, dtype, seed=0):
    """Normal values over a wide range plus zeros, ties, huge values, inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-20, 14, shape, generator=g))
    flat = x.view(-1)
    flat[:8] = torch.tensor([0.0, -0.0, 1e9, -1e9, float("inf"), float("-inf"), 2.0 ** -12,
                             float("nan")])
    return x.to(dtype).cuda()


def same_amax(a, b):
    assert torch.equal(a, b) or (torch.isnan(a) and torch.isnan(b))


def same_bits(a, b):
    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(nan_a, nan_b)
    assert torch.equal(a.view(torch.uint8)[~nan_a], b.view(torch.uint8)[~nan_b])


# (1000, 257): scalar tails and odd rows; (512, 1024): the 16-wide vector paths.
SHAPES = [(1000, 257), (512, 1024)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", INPUTS)
def test_cast_amax(ops, fmt, dtype, shape):
    x = nasty(shape, dtype)
    scale = torch.tensor(0.37, device="cuda")
    q, a = ops.cast_amax(x, fmt, scale)
    q_ref, a_ref = R.cast_amax(x, fmt, scale)
    same_bits(q, q_ref)
    same_amax(a, a_ref)


def test_cast_accumulates_into_a_history_slot(ops):
    history = torch.zeros(4, 3, device="cuda")
    history[0, 1] = 7.0
    x = torch.randn(256, 64, device="cuda")
    ops.cast_amax(x, torch.float8_e4m3fn, torch.tensor(1.0, device="cuda"), history[0, 1])
    assert history[0, 1].item() == 7.0  # smaller amax: the running max stays
    ops.cast_transpose(x * 100, torch.float8_e4m3fn, torch.tensor(1.0, device="cuda"),
                       history[0, 1])
    assert history[0, 1].item() == (x * 100).abs().max().item()
    assert history.count_nonzero().item() == 1  # only that slot was written


@pytest.mark.parametrize("shape", [(333, 517), (256, 512)])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", INPUTS)
def test_current_scale_cast(ops, fmt, dtype, shape):
    x = (torch.randn(*shape) * 1e-3).to(dtype).cuda()
    got, ref = ops.current_scale_cast(x, fmt, 1), R.current_scale_cast(x, fmt, 1)
    same_bits(got[0], ref[0])
    assert got[1].item() == ref[1].item() and got[2].item() == ref[2].item()
    got_t = ops.current_scale_cast_transpose(x, fmt, 1)
    ref_t = R.current_scale_cast_transpose(x, fmt, 1)
    same_bits(got_t[0], ref_t[0])
    same_bits(got_t[1], ref_t[1])
    assert got_t[2].item() == ref_t[2].item() and got_t[3].item() == ref_t[3].item()


def test_amax_propagates_nan(ops):
    x = torch.randn(10_000, device="cuda")
    assert ops.amax(x).item() == R.amax(x).item()
    x[777] = float("nan")
    assert torch.isnan(ops.amax(x))


@pytest.mark.parametrize("shape", [(64, 64), (1000, 257), (3, 4096), (208, 336), (4096, 16)])
@pytest.mark.parametrize("dtype", INPUTS)
def test_cast_transpose(ops, shape, dtype):
    x = nasty(shape, dtype, seed=1)
    scale = torch.tensor(2.0, device="cuda")
    got, ref = ops.cast_transpose(x, torch.float8_e4m3fn, scale), R.cast_transpose(
        x, torch.float8_e4m3fn, scale)
    same_bits(got[0], ref[0])
    same_bits(got[1], ref[1])
    same_amax(got[2], ref[2])


@pytest.mark.parametrize("shape", [(256, 1024), (37, 300), (1, 128), (200, 272), (384, 208)])
@pytest.mark.parametrize("dtype", INPUTS)
def test_blockwise(ops, shape, dtype):
    x = nasty(shape, dtype, seed=2)
    x[~torch.isfinite(x)] = 3.0  # tiles with inf / NaN keep scale 1 in both; keep scales varied
    for fn in ("blockwise_cast_1d", "blockwise_cast_2d", "blockwise_cast_transpose_1d"):
        got = getattr(ops, fn)(x, torch.float8_e4m3fn)
        ref = getattr(R, fn)(x, torch.float8_e4m3fn)
        for g, r in zip(got[0::2], ref[0::2]):
            same_bits(g, r)
        for g, r in zip(got[1::2], ref[1::2]):
            assert torch.equal(g, r), fn  # values; the 1x128 scales are outer-dim-major
    assert ops.blockwise_cast_1d(x, torch.float8_e4m3fn)[1].stride(0) == 1


class Poisoned:
    """An output buffer the test owns, for the C launchers (the torch binding allocates its own,
    which may hold a previous call's correct bytes): ``nbytes`` between two guards, all 0xff --
    NaN as FP8 in either format and as fp32 -- so an element the kernel never wrote stays NaN
    (the references below have none) and a write past either end shows in a guard."""

    GUARD = 256  # keeps the body 16-byte aligned

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.raw = torch.full((nbytes + 2 * self.GUARD,), 0xFF, dtype=torch.uint8, device="cuda")

    @property
    def ptr(self):
        return self.raw.data_ptr() + self.GUARD

    def view(self, dtype, *shape):
        return self.raw[self.GUARD:self.GUARD + self.nbytes].view(dtype).view(*shape)

    def untouched(self, body=False):
        parts = [self.raw] if body else [self.raw[:self.GUARD], self.raw[self.GUARD + self.nbytes:]]
        return all(bool((p == 0xFF).all()) for p in parts)


@pytest.fixture(scope="module")
def launchers():
    """The extern "C" launchers of the built extension (fp8_kernels.h), through ctypes."""
    module, status = kernels.load()
    if module is None:
        pytest.fail(f"kernels did not build on a CUDA machine: {status.reason}")
    lib = ctypes.CDLL(module.__file__)
    head = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    outs = {"ap_blockwise_cast_1x128": 2, "ap_blockwise_cast_128x128": 2,
            "ap_blockwise_cast_transpose_1x128": 4}
    for name, n in outs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = head + [ctypes.c_void_p] * (n + 1), ctypes.c_int
    return lib


def call(launcher, x, fmt, *buffers):
    """Launch on torch's current stream, wait, and return the cudaError_t."""
    code = 0 if x.dtype == torch.float32 else 1
    err = launcher(x.data_ptr(), code, x.shape[0], x.shape[1], kernels.FP8_CODES[fmt],
                   *(b.ptr for b in buffers), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return err


def check_blockwise_poisoned(launchers, x, fmt, transposing=True):
    """Every output element and scale of the three blockwise launchers written, bit-identical to
    the reference, nothing written outside the outputs (the transposing cast, which takes only
    dims that are multiples of 16, must refuse other shapes and write nothing)."""
    rows, cols = x.shape
    tr, tc = -(-rows // 128), -(-cols // 128)
    q = Poisoned(rows * cols)
    s = Poisoned(4 * rows * tc)
    assert call(launchers.ap_blockwise_cast_1x128, x, fmt, q, s) == 0
    ref_q, ref_s = R.blockwise_cast_1d(x, fmt)
    same_bits(q.view(fmt, rows, cols), ref_q)
    assert torch.equal(s.view(torch.float32, tc, rows).t(), ref_s)
    assert q.untouched() and s.untouched()

    q, s = Poisoned(rows * cols), Poisoned(4 * tr * tc)
    assert call(launchers.ap_blockwise_cast_128x128, x, fmt, q, s) == 0
    ref_q, ref_s = R.blockwise_cast_2d(x, fmt)
    same_bits(q.view(fmt, rows, cols), ref_q)
    assert torch.equal(s.view(torch.float32, tr, tc), ref_s)
    assert q.untouched() and s.untouched()

    if not transposing:
        return
    q, s = Poisoned(rows * cols), Poisoned(4 * rows * tc)
    qt, st = Poisoned(rows * cols), Poisoned(4 * cols * tr)
    err = call(launchers.ap_blockwise_cast_transpose_1x128, x, fmt, q, s, qt, st)
    if rows % 16 or cols % 16:
        assert err != 0 and all(b.untouched(body=True) for b in (q, s, qt, st))
        return
    assert err == 0
    ref = R.blockwise_cast_transpose_1d(x, fmt)
    same_bits(q.view(fmt, rows, cols), ref[0])
    assert torch.equal(s.view(torch.float32, tc, rows).t(), ref[1])
    same_bits(qt.view(fmt, cols, rows), ref[2])
    assert torch.equal(st.view(torch.float32, tr, cols).t(), ref[3])
    assert all(b.untouched() for b in (q, s, qt, st))


# Multiples of 128; multiples of 16 with ragged 128-tiles (the vector paths' partial tiles and
# the transposing cast's zero-filled staging); neither (the per-element 1x128 / 128x128 kernels;
# the transposing cast refuses them).
POISON_SHAPES = [(128, 128), (256, 384), (640, 256), (208, 336), (16, 16), (48, 400), (400, 48),
                 (37, 300), (130, 129)]


@pytest.mark.parametrize("shape", POISON_SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", INPUTS)
def test_blockwise_writes_every_output_element(launchers, shape, fmt, dtype):
    x = nasty(shape, dtype, seed=3)
    x[~torch.isfinite(x)] = -5.0  # finite input: the references hold no NaN, the poison does
    x[:16, :128] = 0.0  # all-zero 1x128 tiles along rows ...
    x[:, 16:18] = 0.0  # ... and along columns: scale 1 both ways
    check_blockwise_poisoned(launchers, x, fmt)


def test_blockwise_grid_stride(launchers):
    """More 128x128 tiles (129 x 128) than the 16,384 blocks the launchers start: the second
    pass of the blocks' loop (and its reuse of the staging tile) writes the rest."""
    x = torch.randn(129 * 128, 128 * 128, device="cuda").to(torch.bfloat16)
    check_blockwise_poisoned(launchers, x, torch.float8_e4m3fn)


@pytest.mark.parametrize("length", [1, 1024])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_update(ops, algo, length):
    h = torch.rand(length, 300, device="cuda") * 100
    h[:, 3] = 0.0
    h[0, 4] = float("nan")
    h[0, 5] = float("inf")
    s = torch.rand(300, device="cuda") + 0.5
    s_inv = torch.zeros(300, device="cuda")
    maxes = torch.full((300,), 448.0, device="cuda")
    h2, s2, s_inv2 = h.clone(), s.clone(), s_inv.clone()
    ops.delayed_scaling_update(h, s, s_inv, maxes, 2, algo)
    R.delayed_scaling_update(h2, s2, s_inv2, maxes, 2, algo)
    assert torch.equal(h, h2) and torch.isfinite(h).all()  # non-finite amaxes recorded as 0
    assert torch.equal(s, s2) and torch.equal(s_inv, s_inv2)


def poisoned_alloc(shape, dtype):
    """Leave NaN in the caching allocator's next block of this size, so an output element the
    kernel never writes shows up as NaN (the binding allocates with at::empty)."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    torch.cuda.synchronize()


# (1000, 2 x 257): odd F, the per-element path; (512, 2 x 1024) and 3-D (2, 64, 2 x 3584): vectors.
SWIGLU_SHAPES = [(1000, 514), (512, 2048), (2, 64, 7168)]


def swiglu_input(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, generator=g) * 4  # past |x| = 10 too, where exp(-x) is large
    h.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    return h.to(dtype).cuda()


@pytest.mark.parametrize("shape", SWIGLU_SHAPES)
@pytest.mark.parametrize("dtype", INPUTS)
def test_swiglu_forward_and_backward_match_the_reference(ops, shape, dtype):
    h = swiglu_input(shape, dtype, seed=3)
    dy = swiglu_input((*shape[:-1], shape[-1] // 2), dtype, seed=4)
    poisoned_alloc(dy.shape, dtype)
    y = ops.swiglu(h)
    poisoned_alloc(h.shape, dtype)
    dh = ops.swiglu_backward(h, dy)
    assert y.shape == dy.shape and dh.shape == h.shape
    assert not y.isnan().any() and not dh.isnan().any()  # every element written
    y_ref, dh_ref = R.swiglu(h), R.swiglu_backward(h, dy)
    # The kernel repeats the reference's operations one by one; only expf could differ.
    tol = {"rtol": 2 ** -7, "atol": 1e-30} if dtype == torch.bfloat16 else {"rtol": 1e-6,
                                                                            "atol": 1e-30}
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(dh, dh_ref, **tol)
    assert (y == y_ref).float().mean() > 0.999 and (dh == dh_ref).float().mean() > 0.999


def test_the_mlp_runs_the_swiglu_kernels_under_autograd(ops):
    from autoparallel.model.transformer import _SwiGLU
    h = swiglu_input((4, 96, 512), torch.bfloat16, seed=5).requires_grad_()
    dy = swiglu_input((4, 96, 256), torch.bfloat16, seed=6)
    _SwiGLU.apply(h).backward(dy)
    torch.testing.assert_close(h.grad, R.swiglu_backward(h.detach(), dy), rtol=2 ** -7,
                               atol=1e-30)
