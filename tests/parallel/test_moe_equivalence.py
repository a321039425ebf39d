"""Mixture-of-experts layouts train like the single-process model (CPU, gloo): expert parallel
alone, with tensor + sequence parallel, with pipeline parallel and with the experts replicated
over TP (ep 1). The all-to-alls move every (token, expert) copy to the rank holding that expert
and back, so only the summation order differs: the tolerances of tests/parallel/test_equivalence.py
(loss of steps 1 and 2 within 1e-5 relative, step 2 after the sharded AdamW of the dense and the
expert weights with one clipping norm; every gradient of step 1 within 1e-4 of its largest entry).
"""

import pytest
import torch

from autoparallel.model.moe import MoeMlp
from autoparallel.model.transformer import Mlp, Transformer
from autoparallel.parallel import check, spawn
from autoparallel.parallel.parallelize import StepConfig, check_plan
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SPEC = ModelSpec(name="moe-equiv", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
                 num_query_groups=4, vocab_size=128, seq_length=16, activation="swiglu", normalization="rmsnorm",
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32,
                 moe_layer_freq="([0]*1+[1]*3)")
CONFIG = StepConfig(autocast_bf16=False)
LOSS_RTOL, GRAD_TOL = 1e-5, 1e-4

LAYOUTS = {
    2: [Plan(tp=1, pp=1, dp=2, ep=2, gbs=8), Plan(tp=2, pp=1, dp=1, ep=1, sp=True, gbs=8)],
    4: [Plan(tp=2, pp=1, dp=2, ep=2, sp=True, gbs=8), Plan(tp=1, pp=1, dp=4, ep=4, gbs=8, mbs=2),
        Plan(tp=1, pp=2, dp=2, ep=2, gbs=8, recompute="full")],
}
CASES = [(w, k) for w, plans in LAYOUTS.items() for k in range(len(plans))]


def _name(plan: Plan) -> str:
    return f"tp{plan.tp}-pp{plan.pp}-dp{plan.dp}-ep{plan.ep}" + ("-sp" if plan.sp else "") + (
        f"-{plan.recompute}" if plan.recompute != "none" else "")


@pytest.fixture(scope="module")
def runs():
    out = {}
    for world, plans in LAYOUTS.items():
        result = spawn.run(check.run_cases, world, (SPEC, plans, CONFIG), timeout=240)
        assert result.ok, result.reason
        out[world] = result.values
    return out


@pytest.mark.parametrize("world,k", CASES, ids=[_name(LAYOUTS[w][k]) for w, k in CASES])
def test_moe_layout_matches_single_process(runs, world, k):
    plan = LAYOUTS[world][k]
    ref = check.reference(SPEC, plan, CONFIG)
    values = [v[k] for v in runs[world]]
    assert values[0]["losses"] == pytest.approx(ref["losses"], rel=LOSS_RTOL)
    merged = {}
    for v in values:
        merged.update(v["grads"])
    assert set(merged) == set(ref["grads"])  # every expert on some rank
    for name, g in ref["grads"].items():
        err = float((merged[name] - g).abs().max() / g.abs().max())
        assert err < GRAD_TOL, f"{name}: gradient error {err:.2e}"


def test_moe_mlp_sends_each_token_to_its_top_k_experts():
    torch.manual_seed(0)
    layer = Transformer(SPEC).layers[1].mlp
    assert isinstance(layer, MoeMlp) and set(layer.experts) == {"0", "1", "2", "3"}
    x = torch.randn(2, 5, SPEC.hidden_size)
    tokens = x.reshape(-1, SPEC.hidden_size)
    logits = tokens @ layer.router.weight.t()
    expected = layer.shared_experts(tokens)
    for t in range(tokens.shape[0]):
        top, ids = logits[t].topk(SPEC.moe_router_topk)
        for w, e in zip(torch.softmax(top, -1), ids):
            expected[t] += w * layer.experts[str(int(e))](tokens[t:t + 1])[0]
    torch.testing.assert_close(layer(x).reshape(-1, SPEC.hidden_size), expected, rtol=1e-5, atol=1e-6)


def test_dense_first_layers_stay_dense():
    model = Transformer(SPEC)
    assert isinstance(model.layers[0].mlp, Mlp) and all(isinstance(layer.mlp, MoeMlp) for layer in model.layers[1:])
    assert sum(p.numel() for p in model.parameters() if p.dim() == 2) == SPEC.num_parameters


def test_moe_rules_of_the_built_in_model():
    check_plan(SPEC, Plan(tp=1, pp=1, dp=2, ep=2, gbs=8), 2)  # runnable
    with pytest.raises(NotImplementedError, match="expert tensor parallel"):
        check_plan(SPEC, Plan(tp=2, pp=1, dp=1, ep=1, etp=2, sp=True, gbs=8), 2)
    with pytest.raises(ValueError, match="needs sequence parallel"):
        check_plan(SPEC, Plan(tp=2, pp=1, dp=1, gbs=8), 2)
