"""The decoder built from a ModelSpec: shapes, parameter count, FP8 placement, recompute."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from autoparallel.model.fp8 import Fp8Linear
from autoparallel.model.recipes import CurrentScaling, DelayedScaling, Fp8Policy
from autoparallel.model.transformer import TINY, Recompute, Transformer

SMALL = dataclasses.replace(TINY, name="small", num_layers=3, hidden_size=64, ffn_hidden_size=128,
                            seq_length=32)


def tokens(batch=2, seq=16, vocab=256, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model, x):
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())
    model.zero_grad()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("activation", ["gelu", "swiglu", "squared_relu"])
@pytest.mark.parametrize("normalization", ["layernorm", "rmsnorm"])
def test_forward_shapes_and_parameter_count(activation, normalization):
    spec = dataclasses.replace(SMALL, activation=activation, normalization=normalization)
    model = Transformer(spec)
    assert model(tokens()).shape == (2, 16, 256)
    # The cost model's parameter count (ModelSpec) leaves out norms and biases; so do we here.
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    assert matrices == spec.num_parameters


def test_gqa_mha_and_tied_embeddings():
    mha = dataclasses.replace(SMALL, num_query_groups=None)
    assert Transformer(mha).layers[0].attention.wqkv.weight.shape == (3 * 64, 64)
    gqa = Transformer(SMALL)
    # fused Q, K, V: 64 query rows + 2 groups x head_dim 16 for K and for V
    assert gqa.layers[0].attention.wqkv.weight.shape == (64 + 2 * 32, 64)
    tied = Transformer(dataclasses.replace(SMALL, tie_embeddings=True))
    assert tied.output.weight is tied.tok_embeddings.weight
    assert sum(p.numel() for p in tied.parameters() if p.dim() == 2) == dataclasses.replace(
        SMALL, tie_embeddings=True).num_parameters


def test_causal():
    model = Transformer(SMALL).eval()
    x = tokens()
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256
    assert torch.allclose(model(x)[:, :10], model(y)[:, :10], atol=1e-5)
    assert not torch.allclose(model(x)[:, 10:], model(y)[:, 10:], atol=1e-5)


def test_policy_places_fp8_layers():
    policy = Fp8Policy(CurrentScaling(), bf16_first_layers=1, bf16_modules=("*.mlp.w2",))
    model = Transformer(SMALL, policy)
    fp8 = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert "layers.1.attention.wqkv" in fp8 and "layers.2.mlp.w1" in fp8
    assert not any(n.startswith("layers.0.") for n in fp8)
    assert not any(n.endswith("mlp.w2") for n in fp8)
    assert "output" not in fp8
    assert len(fp8) == 2 * 4 - 2  # wqkv wo w1 w2 in layers 1-2, minus two w2
    assert model(tokens()).shape == (2, 16, 256)


def test_two_models_with_different_recipes_coexist():
    torch.manual_seed(0)
    a = Transformer(SMALL, Fp8Policy(DelayedScaling()))
    torch.manual_seed(0)
    b = Transformer(SMALL, Fp8Policy(CurrentScaling()))
    assert a.layers[0].mlp.w1.recipe != b.layers[0].mlp.w1.recipe
    assert isinstance(a.layers[0].mlp.w1.recipe, DelayedScaling)


@pytest.mark.parametrize("recompute", [Recompute("selective"), Recompute("full"),
                                       Recompute("full", full_layers=2)])
@pytest.mark.parametrize("policy", [Fp8Policy(), Fp8Policy(CurrentScaling())])
def test_recompute_gives_the_same_gradients_and_saves_memory(recompute, policy):
    x = tokens()
    torch.manual_seed(0)
    base = Transformer(SMALL, policy)
    torch.manual_seed(0)
    model = Transformer(SMALL, policy, recompute)
    loss_a, grads_a = loss_and_grads(base, x)
    loss_b, grads_b = loss_and_grads(model, x)
    assert loss_a == loss_b
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7), name
    assert saved_bytes(model, x) < saved_bytes(base, x)


def saved_bytes(model, x) -> int:
    """Bytes autograd keeps for backward (DESIGN.md §7's exact activation measurement)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    return total


def test_full_recompute_of_first_n_layers():
    model = Transformer(SMALL, recompute=Recompute("full", full_layers=2))
    assert [layer.full_recompute for layer in model.layers] == [True, True, False]


def test_validation():
    with pytest.raises(ValueError, match="recompute mode='some' is not valid"):
        Recompute("some")
    with pytest.raises(ValueError, match="full_layers=2 only applies to mode='full'"):
        Recompute("selective", full_layers=2)
    mla = dataclasses.replace(SMALL, multi_latent_attention=True, num_query_groups=None)
    with pytest.raises(NotImplementedError, match="multi-latent attention"):
        Transformer(mla)
    with pytest.raises(ValueError, match="exceeds seq_length=32"):
        Transformer(SMALL)(tokens(seq=33))


def test_state_dict_keys_are_nn_linear_compatible():
    """Parallel wrappers shard by name and shape: an FP8 model's weights load into a BF16 one."""
    fp8 = Transformer(SMALL, Fp8Policy(DelayedScaling()))
    bf16 = Transformer(SMALL)
    state = {k: v for k, v in fp8.state_dict().items()
             if not k.endswith(("amax_history", "scale", "scales_initialized"))}
    bf16.load_state_dict(state)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_fused_norm_on_gpu_matches_its_fp32_twin(kind):
    """On a GPU the norm runs torch's fused kernel; the FP32 autograd function is its oracle."""
    from autoparallel.model.transformer import Norm, _NormFunction
    norm = Norm(1024, kind).cuda().to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    got = norm(x)
    (dx, dw) = torch.autograd.grad(got, (x, norm.weight), dy)
    want = _NormFunction.apply(x, norm.weight, norm.bias, norm.eps, norm.rms)
    (dx_ref, dw_ref) = torch.autograd.grad(want, (x, norm.weight), dy)
    assert got.dtype == torch.bfloat16
    for a, b in ((got, want), (dx, dx_ref), (dw, dw_ref)):
        err = float((a.float() - b.float()).norm() / b.float().norm())
        assert err < 1e-2, err


def test_rotary_forward_and_backward_match_the_pairwise_formula():
    """apply_rotary (a complex product, its backward the opposite rotation) against autograd
    through the textbook formula on the (even, odd) pairs, on a strided view as the QKV split
    gives it."""
    from autoparallel.model.transformer import apply_rotary, rotary_tables

    def textbook(x, cos, sin):
        cos, sin = cos.view(cos.shape[0], 1, 1, -1), sin.view(sin.shape[0], 1, 1, -1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    cos, sin = rotary_tables(16, 8)
    qkv = torch.randn(2, 16, 3, 4, 8, requires_grad=True)
    q = qkv.split((2, 1, 1), dim=3)[0]
    dy = torch.randn(2, 16, 3, 2, 8)
    got = apply_rotary(q, cos, sin)
    want = textbook(q, cos, sin)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, qkv, dy)[0],
                               torch.autograd.grad(want, qkv, dy)[0])


@pytest.mark.slow
def test_compiled_layer_matches_the_eager_one():
    """``profile_layer(..., compile=True)``'s path: under torch.compile the rotary is written out
    (Inductor has no complex codegen); output and input gradient match the eager layer."""
    from autoparallel.model.recipes import Fp8Policy
    from autoparallel.model.transformer import TransformerLayer, rotary_tables
    from autoparallel.specs.model import ModelSpec
    spec = ModelSpec(name="l", num_layers=1, hidden_size=256, ffn_hidden_size=512,
                     num_attention_heads=4, num_query_groups=2, vocab_size=8, seq_length=64,
                     activation="swiglu", normalization="rmsnorm")
    torch.manual_seed(0)
    layer = TransformerLayer(spec, Fp8Policy(None), 0, Recompute())
    cos, sin = rotary_tables(64, 64)
    x = torch.randn(2, 64, 256, requires_grad=True)
    want = layer(x, cos, sin)
    got = torch.compile(layer)(x, cos, sin)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0],
                               torch.autograd.grad(want.sum(), x)[0])
