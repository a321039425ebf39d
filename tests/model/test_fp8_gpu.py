"""The FP8 Linear on a GPU: no host synchronisation in its steady state, blockwise GEMMs through
torch._scaled_mm with block scales (never dequantize-and-multiply), errors within the format
bound. Skipped, with the reason, where torch sees no GPU:

    python -m pytest tests/model/test_fp8_gpu.py -m gpu -v
"""

import pytest
import torch

from autoparallel.model import fp8 as F8
from autoparallel.model.fp8 import Fp8Linear, Fp8Tensor, Fp8Unsupported, update_fp8_scales
from autoparallel.model.recipes import BlockwiseScaling, CurrentScaling, DelayedScaling

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RECIPES = {"delayed": DelayedScaling(), "current": CurrentScaling(),
           "blockwise": BlockwiseScaling()}


def _needs_native(recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need sm89+")
    if isinstance(recipe, BlockwiseScaling):
        why = F8.blockwise_support(f"cuda:{torch.cuda.current_device()}", "1x128", "128x128")
        why = why or F8.blockwise_support(f"cuda:{torch.cuda.current_device()}", "1x128",
                                          "1x128")
        if why is not None:
            pytest.skip(f"this torch / GPU has no block-scaled torch._scaled_mm: {why}")


def _layer(recipe, k=1024, n=768):
    torch.manual_seed(0)
    return Fp8Linear(k, n, recipe).cuda().to(torch.bfloat16)


@pytest.mark.parametrize("name", RECIPES)
def test_steady_state_never_waits_for_the_gpu(name):
    recipe = RECIPES[name]
    _needs_native(recipe)
    layer = _layer(recipe)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # first step (self-scaled), then delayed scales
        layer(x).sum().backward()
        update_fp8_scales(layer)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # micro-batches, then the per-step update
            layer(x).sum().backward()
        update_fp8_scales(layer)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name", RECIPES)
def test_gemms_run_on_scaled_mm_and_stay_within_bounds(name, monkeypatch):
    recipe = RECIPES[name]
    _needs_native(recipe)
    calls, real = [], torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(1) or real(*a, **k))

    def refuse(self):
        raise AssertionError("dequantized on a GPU")
    monkeypatch.setattr(Fp8Tensor, "dequantize", refuse)
    layer = _layer(recipe)
    ref = torch.nn.Linear(1024, 768, bias=False).cuda().double()
    ref.weight.data.copy_(layer.weight.double())
    x = (torch.randn(512, 1024, device="cuda") * 3).to(torch.bfloat16).requires_grad_(True)
    g = (torch.randn(512, 768, device="cuda") * 1e-4).to(torch.bfloat16)
    y = layer(x)
    y.backward(g)
    assert len(calls) == 3  # fprop, dgrad, wgrad
    xd = x.detach().double().requires_grad_(True)
    yd = ref(xd)
    yd.backward(g.double())
    grad_format = "E5M2" if recipe.fp8_format == "HYBRID" else "E4M3"
    u = {"E4M3": 2.0 ** -4, "E5M2": 2.0 ** -3}
    bound = (u["E4M3"] ** 2 + u[grad_format] ** 2) ** 0.5 + 2 ** -7  # plus BF16 rounding

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())
    assert rel(y, yd) <= (2 * u["E4M3"] ** 2) ** 0.5 + 2 ** -7
    assert rel(x.grad, xd.grad) <= bound
    assert rel(layer.weight.grad, ref.weight.grad) <= bound


def test_auto_never_emulates_blockwise_on_a_gpu():
    device = f"cuda:{torch.cuda.current_device()}"
    supported = all(F8.blockwise_support(device, a, b) is None
                    for a, b in (("1x128", "128x128"), ("1x128", "1x128")))
    layer = _layer(BlockwiseScaling())
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    if supported:
        assert layer(x).shape == (256, 768)
    else:
        with pytest.raises(Fp8Unsupported, match="blockwise"):
            layer(x)
    emulated = Fp8Linear(1024, 768, BlockwiseScaling(), gemm_backend="emulate").cuda()
    assert emulated(x.float()).shape == (256, 768)  # numerics studies may still ask for it
