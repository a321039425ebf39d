"""Every layout of world size up to 4 trains like the single-process model (CPU, gloo).

One spawned job per world size runs all of that size's layouts in the same processes (new groups
per layout), so the whole file costs two process launches. Tolerances (``check.TOLERANCES``,
applied by ``check.mismatches``), fp32 (no autocast): every rank reports the same loss (1e-6);
loss of steps 1 and 2 within 1e-5 relative (step 2 checks the sharded AdamW and the parameter
all-gather), the global gradient norm that clipping used within 1e-5, every gradient of step 1
within 1e-4 of the largest entry of that tensor. FP8 delayed scaling (emulated GEMMs): loss
within 2e-2 relative and, after the amax reduction over TP and DP, every weight scale within
1e-3 of the single-process one (without the reduction a TP shard's weight scale comes from its
slice's amax) and the input / gradient scales, which depend on upstream FP8 rounding, within
15 %. Context parallel layouts (cp = 2 and 4, alone and with TP, SP, DP, PP, recompute and FP8) are
held to the same tolerances: the ring attention merges per-block softmaxes in fp32, which
changes only the summation order.
"""

import pytest

from autoparallel.parallel import check
from autoparallel.parallel.parallelize import StepConfig
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SPEC = ModelSpec(name="equiv", num_layers=4, hidden_size=64, ffn_hidden_size=128,
                 num_attention_heads=8, num_query_groups=4, vocab_size=128, seq_length=16,
                 activation="swiglu", normalization="rmsnorm")
CONFIG = StepConfig(bf16=False)


def P(tp=1, pp=1, dp=1, **kw) -> Plan:
    kw.setdefault("gbs", 8)
    return Plan(tp=tp, pp=pp, dp=dp, **kw)


LAYOUTS = {
    2: [P(tp=2), P(tp=2, sp=True, recompute="selective"), P(pp=2, recompute="full"),
        P(pp=2, vp=2, mbs=2), P(dp=2), P(dp=2, mbs=2, distributed_optimizer=False),
        P(tp=2, sp=True, precision="fp8-delayed"), P(tp=2, sp=True, recompute="full"),
        P(cp=2), P(cp=2, mbs=2, recompute="selective"),
        P(cp=2, recompute="full", distributed_optimizer=False)],
    4: [P(tp=2, dp=2, sp=True), P(tp=2, pp=2, sp=True, recompute="selective"),
        P(pp=2, dp=2, vp=2, recompute="full", recompute_num_layers=1), P(tp=4, sp=True),
        P(pp=4), P(dp=4, mbs=2), P(tp=2, dp=2, precision="fp8-delayed"),
        P(cp=4), P(tp=2, cp=2), P(tp=2, cp=2, sp=True, recompute="selective"),
        P(cp=2, dp=2, mbs=2), P(cp=2, pp=2, recompute="full"),
        P(cp=2, dp=2, precision="fp8-delayed")],
}


@pytest.fixture(scope="module")
def runs():
    return check.run_layouts(SPEC, LAYOUTS, CONFIG)


CASES = [(w, k) for w, plans in LAYOUTS.items() for k in range(len(plans))]


@pytest.mark.parametrize("world,k", CASES,
                         ids=[check.layout_name(LAYOUTS[w][k]) for w, k in CASES])
def test_layout_matches_single_process(runs, world, k):
    plan = LAYOUTS[world][k]
    ref = check.reference(SPEC, plan, CONFIG)
    problems = check.mismatches(plan, [v[k] for v in runs[world]], ref)
    assert not problems, problems


def test_schedules_cover_every_step_once():
    from autoparallel.parallel.pipeline import schedule
    for pp, vp, m in ((2, 1, 4), (4, 1, 2), (2, 2, 4), (4, 2, 8)):
        for rank in range(pp):
            ops = schedule(pp, vp, rank, m)
            fwd = [(o.chunk, o.microbatch) for o in ops if o.kind == "F"]
            bwd = [(o.chunk, o.microbatch) for o in ops if o.kind == "B"]
            assert sorted(fwd) == sorted(bwd) == sorted((c, i) for c in range(vp)
                                                        for i in range(m))
            for o in ops:  # a backward never precedes its forward
                if o.kind == "B":
                    assert ops.index(type(o)("F", o.chunk, o.microbatch)) < ops.index(o)
    with pytest.raises(ValueError, match="divisible by pp"):
        schedule(2, 2, 0, 3)


def test_context_parallel_rules_are_checked_with_their_reason():
    from autoparallel.parallel.parallelize import check_plan
    check_plan(SPEC, Plan(tp=1, pp=1, dp=1, cp=2, gbs=8), 2)  # runnable
    with pytest.raises(ValueError, match="2\\*cp=32"):  # seq 16 in 32 chunks
        check_plan(SPEC, Plan(tp=1, pp=1, dp=1, cp=16, gbs=8), 16)
    with pytest.raises(ValueError, match="seq_length/cp=4 is not divisible by tp=8"):
        check_plan(SPEC, Plan(tp=8, pp=1, dp=1, cp=4, sp=True, gbs=8), 32)
    with pytest.raises(NotImplementedError, match="expert parallel"):
        check_plan(SPEC, Plan(tp=1, pp=1, dp=2, ep=2, gbs=8), 2)
