"""Mixture-of-experts layouts train like the single-process model (CPU, gloo).

Expert parallel over DP (ep 2), over the TP ranks with sequence parallel (ep 2 x tp 2), over
CP, with the experts replicated over TP (ep 1 x tp 2, full recompute), with an all-reduce
optimizer, with FP8 delayed scaling; on four ranks ep 2 x tp 2 x dp 2 (the experts' AdamW
sharded over an expert-data-parallel group of 2), ep 4 across TP and DP, and ep 2 x pp 2 (one
stage dense, the other MoE). The all-to-alls move every (token, expert) row to the rank holding
that expert and back, so only the summation order differs: the tolerances of
``test_equivalence.py`` (``check.mismatches``): step 2's loss follows the dense and the expert
AdamW, the global gradient norm is the one both clipped by, and under FP8 the routed experts'
weight scales come from the amax reduced over their expert-data-parallel group.
"""

import dataclasses

import pytest

from autoparallel.model.transformer import Transformer
from autoparallel.parallel import check
from autoparallel.parallel.parallelize import StepConfig, check_plan
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SPEC = ModelSpec(name="moe-equiv", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                 num_attention_heads=8, num_query_groups=4, vocab_size=128, seq_length=16,
                 activation="swiglu", normalization="rmsnorm", num_experts=4, moe_router_topk=2,
                 moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
                 moe_layer_freq="([0]*1+[1]*1)")
CONFIG = StepConfig(bf16=False)


def P(tp=1, pp=1, dp=1, **kw) -> Plan:
    kw.setdefault("gbs", 8)
    return Plan(tp=tp, pp=pp, dp=dp, **kw)


LAYOUTS = {
    2: [P(dp=2, ep=2), P(tp=2, sp=True, ep=2), P(tp=2, sp=True, recompute="full"),
        P(dp=2, ep=2, mbs=2, distributed_optimizer=False), P(cp=2, ep=2),
        P(dp=2, ep=2, precision="fp8-delayed")],
    4: [P(tp=2, dp=2, ep=2, sp=True), P(tp=2, dp=2, ep=4, sp=True),
        P(pp=2, dp=2, ep=2, recompute="full")],
}
CASES = [(w, k) for w, plans in LAYOUTS.items() for k in range(len(plans))]


@pytest.fixture(scope="module")
def runs():
    return check.run_layouts(SPEC, LAYOUTS, CONFIG)


@pytest.mark.parametrize("world,k", CASES,
                         ids=[check.layout_name(LAYOUTS[w][k]) for w, k in CASES])
def test_moe_layout_matches_single_process(runs, world, k):
    plan = LAYOUTS[world][k]
    ref = check.reference(SPEC, plan, CONFIG)
    values = [v[k] for v in runs[world]]
    problems = check.mismatches(plan, values, ref)
    assert not problems, problems
    if plan.is_fp8:  # each rank's experts scaled from the amax of all the tokens they took
        assert any(".experts." in name for name in values[0]["scales"])


def test_moe_rules_of_the_built_in_model():
    check_plan(SPEC, P(dp=2, ep=2), 2)  # runnable
    with pytest.raises(NotImplementedError, match="expert tensor parallel"):
        check_plan(SPEC, P(tp=2, ep=1, etp=2, sp=True), 2)
    with pytest.raises(ValueError, match="needs sequence parallel"):
        check_plan(SPEC, P(tp=2), 2)
    with pytest.raises(ValueError, match="ep=8 does not divide num_experts=4"):
        check_plan(SPEC, P(dp=8, ep=8), 8)
    with pytest.raises(ValueError, match="does not divide the 2 ranks of a pipeline stage"):
        check_plan(SPEC, P(tp=2, pp=2, ep=4, sp=True), 4)
    with pytest.raises(NotImplementedError, match="dropless only"):
        check_plan(dataclasses.replace(SPEC, moe_expert_capacity_factor=1.0), P(dp=2, ep=2), 2)
    mla = dataclasses.replace(SPEC, multi_latent_attention=True, num_query_groups=None)
    with pytest.raises(NotImplementedError, match="multi-latent attention"):
        Transformer(mla)
