"""The MoE MLP of the built-in transformer in one process: routing, layer pattern, FP8 padding."""

import dataclasses

import pytest
import torch

from autoparallel.model import moe
from autoparallel.model.fp8 import Fp8Linear
from autoparallel.model.moe import MoeMlp
from autoparallel.model.recipes import CurrentScaling, Fp8Policy
from autoparallel.model.transformer import Mlp, Transformer, cast_parameters
from autoparallel.specs.model import ModelSpec

SPEC = ModelSpec(name="moe-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                 num_attention_heads=8, num_query_groups=4, vocab_size=128, seq_length=16,
                 activation="swiglu", normalization="rmsnorm", num_experts=4, moe_router_topk=2,
                 moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
                 moe_layer_freq="([0]*1+[1]*1)")


def test_each_token_reaches_its_top_k_experts_and_the_shared_expert():
    layer = Transformer(SPEC, seed=0).layers[1].mlp
    assert isinstance(layer, MoeMlp) and set(layer.experts) == {"0", "1", "2", "3"}
    x = torch.randn(2, 5, SPEC.hidden_size, generator=torch.Generator().manual_seed(0))
    tokens = x.reshape(-1, SPEC.hidden_size)
    logits = tokens @ layer.router.weight.t()
    expected = layer.shared_experts(tokens)
    for t in range(tokens.shape[0]):
        top, ids = logits[t].topk(SPEC.moe_router_topk)
        for w, e in zip(torch.softmax(top, -1), ids):
            expected[t] += w * layer.experts[str(int(e))](tokens[t:t + 1])[0]
    torch.testing.assert_close(layer(x).reshape(-1, SPEC.hidden_size), expected,
                               rtol=1e-5, atol=1e-6)


def test_dense_first_layers_stay_dense_and_parameters_match_the_spec():
    model = Transformer(SPEC)
    assert isinstance(model.layers[0].mlp, Mlp) and isinstance(model.layers[1].mlp, MoeMlp)
    assert sum(p.numel() for p in model.parameters() if p.dim() == 2) == SPEC.num_parameters
    names = dict(model.named_parameters())
    assert names["layers.1.mlp.experts.3.w1.weight"].shape == (2 * 32, 64)  # [gate; up]
    assert names["layers.1.mlp.shared_experts.w2.weight"].shape == (64, 64)
    assert names["layers.1.mlp.router.weight"].shape == (4, 64)


def test_forced_load_balancing_routes_at_random():
    tokens = torch.randn(4096, SPEC.hidden_size).abs()
    counts = {}
    for forced in (False, True):
        spec = dataclasses.replace(SPEC, moe_router_force_load_balancing=forced)
        layer = Transformer(spec, seed=0).layers[1].mlp
        layer.router.weight.data.zero_()[0] = 1.0  # every token's largest logit: expert 0
        counts[forced] = torch.bincount(layer.route(tokens)[0].reshape(-1), minlength=4)
    assert counts[False][0] == len(tokens)
    assert counts[True].min() > 0.9 * counts[True].float().mean()


def test_native_fp8_experts_get_their_rows_padded_to_a_multiple_of_16(monkeypatch):
    """torch._scaled_mm takes M in multiples of 16; an expert's token count is anything, so its
    rows are zero-padded (TransformerEngine's Fp8Padding) and the padding sliced off."""
    policy = Fp8Policy(CurrentScaling())
    model = cast_parameters(Transformer(SPEC, policy, seed=0), torch.bfloat16)
    layer = model.layers[1].mlp
    fp8 = [m for m in layer.experts.modules() if isinstance(m, Fp8Linear)]
    assert fp8
    x = torch.randn(1, 7, SPEC.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    emulated = layer(x)
    for m in fp8:
        m.gemm_backend = "scaled_mm"
    native = layer(x)  # 14 (token, expert) rows over 4 experts: none a multiple of 16
    native.float().sum().backward()
    torch.testing.assert_close(native, emulated, rtol=0.05, atol=0.02)
    assert x.grad is not None and torch.isfinite(x.grad).all()
    monkeypatch.setattr(moe, "_row_multiple", lambda expert, device: 1)
    with pytest.raises(ValueError, match="divisible by 16"):
        layer(x)
