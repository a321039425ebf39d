"""The FP8 Linear against a float64 reference, its delayed-scaling state, and the _scaled_mm path.

Error bound: RNE into a format with m mantissa bits moves each normal value by at most
u = 2^-(m+1) of itself (E4M3: 2^-4, E5M2: 2^-3). A GEMM of two such operands then has a
norm-wise relative error of about sqrt(u_a^2 + u_b^2) at worst (independent errors, no
cancellation); the measured figures sit at roughly 40 % of it. The lower bound (a twentieth of
it) proves FP8 really ran.
"""

import math

import pytest
import torch

from autoparallel.model.fp8 import Fp8Linear, Fp8Tensor, fp8_gemm, update_fp8_scales
from autoparallel.model.recipes import BlockwiseScaling, CurrentScaling, DelayedScaling

U = {"E4M3": 2.0 ** -4, "E5M2": 2.0 ** -3}
RECIPES = {
    "delayed-hybrid": DelayedScaling(),
    "delayed-e4m3": DelayedScaling(fp8_format="E4M3"),
    "current-hybrid": CurrentScaling(),
    "blockwise": BlockwiseScaling(),
}


def bound(a: str, b: str) -> float:
    return math.sqrt(U[a] ** 2 + U[b] ** 2)


def bounds(recipe) -> dict[str, float]:
    grad = "E5M2" if recipe.fp8_format == "HYBRID" else "E4M3"
    return {"y": bound("E4M3", "E4M3"), "dx": bound(grad, "E4M3"), "dw": bound(grad, "E4M3")}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def run_against_float64(recipe, backend="emulate", shape=(96, 256, 160), steps=3, seed=0):
    """Relative errors of y, dx, dw (and db) after ``steps`` steps of delayed-state updates."""
    torch.manual_seed(seed)
    m, k, n = shape
    layer = Fp8Linear(k, n, recipe, bias=True, gemm_backend=backend)
    ref = torch.nn.Linear(k, n, bias=True).double()
    ref.load_state_dict({"weight": layer.weight.double(), "bias": layer.bias.double()})
    for _ in range(steps):
        x = torch.randn(m, k) * 3
        g = torch.randn(m, n) * 1e-4
        layer.zero_grad()
        x.requires_grad_(True)
        y = layer(x)
        y.backward(g)
        update_fp8_scales(layer)
    xd = x.detach().double().requires_grad_(True)
    ref(xd).backward(g.double())
    return {"y": rel(y, ref(xd)), "dx": rel(x.grad, xd.grad), "dw": rel(layer.weight.grad,
                                                                          ref.weight.grad),
            "db": rel(layer.bias.grad, ref.bias.grad)}


@pytest.mark.parametrize("name", RECIPES)
def test_errors_within_the_format_bound(name):
    recipe = RECIPES[name]
    errors = run_against_float64(recipe)
    for key, limit in bounds(recipe).items():
        assert errors[key] <= limit, (key, errors[key], limit)
        assert errors[key] >= limit / 20, (key, errors[key], "FP8 did not quantize?")
    assert errors["db"] < 1e-6  # the bias gradient is a plain sum, not an FP8 GEMM


def test_elementwise_round_trip_bound():
    layer = Fp8Linear(256, 32, CurrentScaling())
    x = torch.randn(64, 256)
    xq, _ = layer.quantize(x, "input")
    normal = x.abs() * (1 / xq.scale_inv) >= torch.finfo(torch.float8_e4m3fn).smallest_normal
    err = ((xq.dequantize() - x).abs() / x.abs())[normal]
    assert err.max().item() <= 2.0 ** -4
    dq, _ = layer.quantize(x, "grad_output")
    assert dq.data.dtype == torch.float8_e5m2


@pytest.mark.parametrize("name", ["delayed-hybrid", "current-hybrid"])
def test_scaled_mm_path_matches_emulation(name):
    """torch._scaled_mm (emulated by torch on CPU, slow: small shapes) vs our emulation.

    Same FP8 operands, so the only differences are accumulation order and bf16 rounding of y.
    """
    recipe = RECIPES[name]
    got = run_against_float64(recipe, backend="scaled_mm", shape=(32, 64, 48), steps=2)
    want = run_against_float64(recipe, backend="emulate", shape=(32, 64, 48), steps=2)
    for key in ("y", "dx", "dw"):
        assert got[key] == pytest.approx(want[key], rel=0.05, abs=1e-3), key


def test_scaled_mm_rejects_unaligned_shapes():
    a = Fp8Tensor(torch.zeros(8, 24).to(torch.float8_e4m3fn), torch.tensor(1.0))
    b = Fp8Tensor(torch.zeros(24, 16).to(torch.float8_e4m3fn), torch.tensor(1.0))
    with pytest.raises(ValueError, match="divisible by 16"):
        fp8_gemm(a, b, torch.float32, "scaled_mm")
    assert fp8_gemm(a, b, torch.float32, "auto").shape == (8, 16)  # CPU: emulated


def test_delayed_state_updates_and_round_trips_through_state_dict():
    torch.manual_seed(0)
    recipe = DelayedScaling(amax_history_len=4, margin=1)
    layer = Fp8Linear(64, 32, recipe)
    amaxes = []
    for step in range(3):
        x = torch.randn(16, 64) * (step + 1)
        amaxes.append(x.abs().max())
        layer(x).sum().backward()
        update_fp8_scales(layer)
    history = layer.amax_history
    assert torch.equal(history[0, -3:], torch.stack(amaxes))  # newest last, column 0 cleared
    assert history[0, 0] == 0
    expect = torch.tensor(448.0) / max(amaxes) / 2
    assert layer.scale[0].item() == pytest.approx(expect.item(), rel=1e-6)
    assert bool(layer.scales_initialized)

    clone = Fp8Linear(64, 32, recipe)
    clone.load_state_dict(layer.state_dict())
    assert torch.equal(clone.amax_history, layer.amax_history)
    x = torch.randn(16, 64)
    assert torch.equal(clone(x), layer(x))  # same scales -> same FP8 operands


def test_first_step_scales_from_the_tensor_not_one():
    layer = Fp8Linear(64, 32, DelayedScaling())
    x = torch.randn(16, 64, requires_grad=True)
    layer(x).backward(torch.full((16, 32), 1e-6))  # would underflow E5M2 at scale 1
    assert x.grad.abs().sum() > 0


def test_nan_in_gives_nan_out_and_does_not_poison_the_scale():
    layer = Fp8Linear(32, 16, DelayedScaling(amax_history_len=2))
    layer(torch.randn(4, 32)).sum().backward()
    update_fp8_scales(layer)
    good_scale = layer.scale.clone()
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    y = layer(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2, 3]]).all()
    y.sum().backward()
    update_fp8_scales(layer)
    assert torch.equal(layer.scale[0], good_scale[0])  # NaN amax keeps the previous scale
    assert torch.isfinite(layer.amax_history).all()  # ...and is not recorded
    layer(torch.full((4, 32), 100.0)).sum().backward()
    update_fp8_scales(layer)
    assert layer.scale[0].item() == pytest.approx(4.48)  # the next finite amax rules again


def test_autocast_output_is_bf16_and_module_is_linear_shaped():
    layer = Fp8Linear(64, 48, CurrentScaling())
    assert layer.weight.shape == torch.nn.Linear(64, 48).weight.shape
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(torch.randn(2, 5, 64))
    assert y.shape == (2, 5, 48) and y.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="gemm_backend='cublas' is not valid"):
        Fp8Linear(64, 48, CurrentScaling(), gemm_backend="cublas")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["delayed-hybrid", "current-hybrid"])
def test_gpu_uses_scaled_mm_and_stays_within_bounds(name, monkeypatch):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torch._scaled_mm needs sm89+")
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    recipe = RECIPES[name]
    torch.manual_seed(0)
    layer = Fp8Linear(512, 256, recipe, bias=True).cuda()
    ref = torch.nn.Linear(512, 256, bias=True).cuda().double()
    ref.load_state_dict({"weight": layer.weight.double(), "bias": layer.bias.double()})
    x = (torch.randn(128, 512, device="cuda") * 3).requires_grad_(True)
    g = torch.randn(128, 256, device="cuda") * 1e-4
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    y.backward(g)
    assert len(calls) == 3  # fprop, dgrad, wgrad
    xd = x.detach().double().requires_grad_(True)
    ref(xd).backward(g.double())
    limits = bounds(recipe)
    assert rel(y, ref(xd)) <= limits["y"] + 2 ** -8  # plus bf16 output rounding
    assert rel(x.grad, xd.grad) <= limits["dx"]
    assert rel(layer.weight.grad, ref.weight.grad) <= limits["dw"]


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("backend", ["emulate", "scaled_mm"])
def test_backward_keeps_one_fp8_copy_of_the_input(name, backend):
    """Backward keeps only the FP8 X its wgrad GEMM reads (1 byte per element), through
    save_for_backward so that checkpointing and activation-memory measurement see it; the FP8
    weight is cached model state, not an activation."""
    recipe = RECIPES[name]
    if backend == "scaled_mm" and isinstance(recipe, BlockwiseScaling):
        pytest.skip("CPU torch._scaled_mm has no block scales (covered by the GPU tests)")
    layer = Fp8Linear(256, 128, recipe, gemm_backend=backend)
    x = torch.randn(64, 256, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = layer(x)
    fp8 = [t for t in saved if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    assert [t.numel() for t in fp8] == [64 * 256]
    scales = sum(t.numel() for t in saved if t.dtype == torch.float32)
    # one scale (tensorwise), or one per 1x128 tile of X^T: 256 rows of 64 tokens
    assert scales == (256 if isinstance(recipe, BlockwiseScaling) else 1)
    y.sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_delayed_scales_reach_the_gemm_16_byte_aligned():
    """cuBLASLt refuses an FP8 GEMM whose scale pointer is not 16-byte aligned
    (CUBLAS_STATUS_NOT_SUPPORTED, seen on an H100 when the packed scale_inv was [3n]): every
    packed scale_inv value has its own slot, and an unaligned scale is copied before the GEMM."""
    from autoparallel.model.fp8 import SCALE_ALIGN_BYTES, _aligned_scale
    layers = torch.nn.Sequential(*(Fp8Linear(64, 64, DelayedScaling()) for _ in range(3)))
    for _ in range(2):
        layers(torch.randn(16, 64)).sum().backward()
        update_fp8_scales(layers)
    for layer in layers:
        assert torch.equal(layer.scale_inv, layer.scale.reciprocal())
        assert all(layer.scale_inv[i].data_ptr() % SCALE_ALIGN_BYTES == 0 for i in range(3))
    packed = torch.ones(8)
    assert _aligned_scale(packed[1]).data_ptr() % SCALE_ALIGN_BYTES == 0
    assert _aligned_scale(packed[4]).data_ptr() == packed[4].data_ptr()


@pytest.mark.parametrize("layout, shape, stride", [("padded", (4, 3), (1, 4)),
                                                   ("bare", (2, 3), (1, 2))])
def test_b_block_scales_in_each_layout_torch_has_taken(layout, shape, stride):
    """B's 128x128 scales ([K/128, N/128] = [2, 3]) with the K-block count padded to a multiple
    of 4 in memory (PyTorch #166752) or not; the values read back are the grid's."""
    from autoparallel.model.fp8 import _b_blocks
    grid = torch.arange(6.0).reshape(3, 2).t()  # any strides in
    out = _b_blocks(grid, layout)
    assert (tuple(out.shape), out.stride()) == (shape, stride)
    assert torch.equal(out[:2], grid)


def test_zero_padding_k_leaves_a_blockwise_product_unchanged():
    """K/128 = 10 blocks padded to 12 with zero FP8 data and unit scales (what a torch that
    takes only the bare 128x128 B grid needs): same product, the layouts torch._scaled_mm takes."""
    from autoparallel.model import reference as R
    from autoparallel.model.fp8 import _b_blocks, _scale_for_scaled_mm, _zero_pad_k
    e4m3 = torch.float8_e4m3fn
    a, w = torch.randn(256, 1280), torch.randn(384, 1280)
    fa = Fp8Tensor(*R.blockwise_cast_1d(a, e4m3), (1, 128))
    fb = Fp8Tensor(*R.blockwise_cast_2d(w, e4m3), (128, 128)).t()  # B = W^T, [K, N]
    want = fa.dequantize() @ fb.dequantize()
    sa = _scale_for_scaled_mm(fa.scale_inv, (1, 128), "a", "bare")
    sb = _b_blocks(fb.scale_inv, "bare")
    db = fb.data.t().contiguous().t()
    (da, sa), (db, sb) = _zero_pad_k(fa.data.contiguous(), sa, db, sb)
    assert da.shape == (256, 1536) and db.shape == (1536, 384) and db.stride() == (1, 1536)
    assert sa.shape == (256, 12) and sa.stride() == (1, 256)
    assert sb.shape == (12, 3) and sb.stride() == (1, 12)
    got = Fp8Tensor(da, sa, (1, 128)).dequantize() @ Fp8Tensor(db, sb, (128, 128)).dequantize()
    assert torch.equal(got, want)
