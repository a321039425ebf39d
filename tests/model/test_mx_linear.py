"""MxLinear (MXFP8 / NVFP4): the emulated GEMMs are exactly the block-scaled casts' products, the
gradients stay close to BF16's, stochastic rounding makes the weight gradient unbiased, the
transformer builds it from the policy, and the GPU path (sm_100) is checked against the CPU
reference where it exists.

    python -m pytest tests/model/test_mx_linear.py -v        # GPU tests skip with their reason
"""

import pytest
import torch
from torch import nn

from autoparallel.model import microscaling as M
from autoparallel.model.mx_linear import MxLinear, MxUnsupported, native_gemm, native_support
from autoparallel.model.recipes import Fp8Policy, Mxfp8BlockScaling, Nvfp4BlockScaling
from autoparallel.model.transformer import TINY, Transformer

torch.set_num_threads(1)


def _pair(recipe, k=64, n=48, m=32, seed=0):
    torch.manual_seed(seed)
    layer = MxLinear(k, n, recipe)
    ref = nn.Linear(k, n, bias=False)
    ref.weight.data.copy_(layer.weight.data)
    x = torch.randn(m, k)
    return layer, ref, x


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_mxfp8_fprop_is_the_product_of_the_casts():
    layer, _, x = _pair(Mxfp8BlockScaling())
    want = M.mxfp8_cast(x).dequantize() @ M.mxfp8_cast(layer.weight.detach()).dequantize().t()
    assert torch.equal(layer(x), want)


def test_nvfp4_fprop_uses_16x16_weight_blocks():
    layer, _, x = _pair(Nvfp4BlockScaling())
    w = M.nvfp4_cast(layer.weight.detach(), (16, 16))
    assert torch.equal(layer(x), M.nvfp4_cast(x).dequantize() @ w.dequantize().t())


@pytest.mark.parametrize("recipe, bound", [(Mxfp8BlockScaling(), 0.06),
                                           (Nvfp4BlockScaling(), 0.25),
                                           (Nvfp4BlockScaling(random_hadamard=False,
                                                              stochastic_rounding=False), 0.25)])
def test_forward_and_gradients_close_to_full_precision(recipe, bound):
    layer, ref, x = _pair(recipe)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(32, 48)
    y = layer(xa)
    y.backward(dy)
    ref(xb).backward(dy)
    assert _rel(y, ref(x)) < bound
    assert _rel(xa.grad, xb.grad) < bound
    assert _rel(layer.weight.grad, ref.weight.grad) < bound


def test_stochastic_rounding_makes_wgrad_unbiased():
    """The mean of many NVFP4 weight gradients converges to the exact one with stochastic
    rounding; with round-to-nearest the error of the mean stays at the bias. X is drawn from
    the E2M1 grid with a 6 in every block of 16 both ways, so X itself quantizes exactly and
    only dY's rounding is left."""
    grid = torch.tensor(M.E2M1_GRID)

    def mean_error(recipe):
        layer, ref, _ = _pair(recipe, seed=1)
        g = torch.Generator().manual_seed(2)
        x = grid[torch.randint(0, 8, (32, 64), generator=g)]
        x[::16, :], x[:, ::16] = 6.0, 6.0
        dy = torch.randn(32, 48, generator=g) * 0.01
        ref(x).backward(dy)
        total = torch.zeros_like(ref.weight)
        for _ in range(64):
            layer.weight.grad = None
            layer(x).backward(dy)
            total += layer.weight.grad
        return _rel(total / 64, ref.weight.grad)
    torch.manual_seed(3)
    sr = mean_error(Nvfp4BlockScaling(random_hadamard=False))
    rtn = mean_error(Nvfp4BlockScaling(random_hadamard=False, stochastic_rounding=False))
    assert sr < 0.5 * rtn


def test_observer_sees_every_quantization():
    layer, _, x = _pair(Nvfp4BlockScaling())
    seen = []
    layer.observer = lambda name, role, hp, q, cur: seen.append((role, q.fmt, q.block))
    layer(x.requires_grad_()).sum().backward()
    assert seen == [("input", "E2M1", (1, 16)), ("weight", "E2M1", (16, 16)),
                    ("input_t", "E2M1", (1, 16)), ("grad_output", "E2M1", (1, 16)),
                    ("grad_output_t", "E2M1", (1, 16))]


def test_transformer_builds_mx_linears_from_the_policy_and_trains():
    model = Transformer(TINY, Fp8Policy(Nvfp4BlockScaling(), bf16_last_layers=1))
    kinds = {type(m).__name__ for n, m in model.named_modules()
             if n.startswith("layers.0.") and isinstance(m, (nn.Linear, MxLinear))}
    last = {type(m).__name__ for n, m in model.named_modules()
            if n.startswith(f"layers.{TINY.num_layers - 1}.") and isinstance(m, (nn.Linear, MxLinear))}
    assert kinds == {"MxLinear"} and last == {"Linear"}
    from autoparallel.model.train import TrainConfig, train
    result = train(model.policy, TrainConfig(steps=3, batch_size=2, seq_length=16), TINY,
                   model=model)
    assert all(torch.isfinite(torch.tensor(result.losses)))


def test_cpu_emulates_and_rejects_bad_arguments():
    assert native_gemm(torch.device("cpu"), "E2M1") is False
    with pytest.raises(ValueError, match="not a microscaled recipe"):
        MxLinear(16, 16, None)
    with pytest.raises(ValueError, match="gemm_backend='fast' is not valid"):
        MxLinear(16, 16, Mxfp8BlockScaling(), gemm_backend="fast")


def _blackwell_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    cap = torch.cuda.get_device_capability()
    if cap < (10, 0):
        return f"FP4 / MXFP8 GEMMs need sm_100 (Blackwell); this GPU is sm_{cap[0]}{cap[1]}"
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [Mxfp8BlockScaling(), Nvfp4BlockScaling()])
def test_gpu_gemms_match_the_cpu_reference(recipe):
    why = _blackwell_reason()
    if why:
        pytest.skip(why)
    fmt = "E2M1" if isinstance(recipe, Nvfp4BlockScaling) else "E4M3"
    unsupported = native_support(f"cuda:{torch.cuda.current_device()}", fmt)
    if unsupported:
        pytest.fail(f"torch {torch.__version__} on Blackwell cannot run {fmt} GEMMs: {unsupported}")
    layer = MxLinear(256, 128, recipe).cuda()
    x = torch.randn(128, 256, device="cuda")
    emulated = MxLinear(256, 128, recipe, gemm_backend="emulate").cuda()
    emulated.load_state_dict(layer.state_dict())
    assert _rel(layer(x), emulated(x)) < 1e-2


@pytest.mark.gpu
def test_gpu_before_blackwell_is_an_error_not_an_emulation():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs microscaled GEMMs")
    with pytest.raises(MxUnsupported, match="need Blackwell"):
        native_gemm(torch.device("cuda"), "E2M1")
