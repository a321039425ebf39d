"""Every layout of world size up to 4 trains like the single-process model (CPU, gloo).

One spawned job per world size runs all of that size's layouts in the same processes (new
groups per layout), so the whole file costs two process launches. Tolerances, fp32 (no autocast):
loss of steps 1 and 2 within 1e-5 relative (step 2 checks the sharded AdamW and the parameter
all-gather), every gradient of step 1 within 1e-4 of the largest entry of that tensor. FP8
delayed scaling (emulated GEMMs): loss within 2e-2 relative and, after the amax reduction over
TP and DP, every weight scale within 1e-3 of the single-process one (without the reduction a
TP shard's weight scale comes from its slice's amax) and the input / gradient scales, which
depend on upstream FP8 rounding, within 15 %. Context parallel layouts (cp = 2 and 4, alone and
with TP, SP, DP, PP, recompute and FP8) are held to the same tolerances: the ring attention
merges per-block softmaxes in fp32, which changes only the summation order.
"""

import pytest
import torch

from autoparallel.parallel import check, spawn
from autoparallel.parallel.parallelize import StepConfig
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SPEC = ModelSpec(name="equiv", num_layers=4, hidden_size=64, ffn_hidden_size=128,
                 num_attention_heads=8, num_query_groups=4, vocab_size=128, seq_length=16,
                 activation="swiglu", normalization="rmsnorm")
CONFIG = StepConfig(bf16=False)
LOSS_RTOL, GRAD_TOL = 1e-5, 1e-4
FP8_LOSS_RTOL, FP8_ACT_SCALE_RTOL = 2e-2, 0.15


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


def _name(plan: Plan) -> str:
    text = f"tp{plan.tp}-pp{plan.pp}-vp{plan.vp}-cp{plan.cp}-dp{plan.dp}-mbs{plan.mbs}"
    text += "-sp" if plan.sp else ""
    text += f"-{plan.recompute}" if plan.recompute != "none" else ""
    text += "" if plan.distributed_optimizer else "-allreduce"
    return text + (f"-{plan.precision}" if plan.is_fp8 else "")


@pytest.fixture(scope="module")
def runs():
    out = {}
    for world, plans in LAYOUTS.items():
        result = spawn.run(check.run_cases, world, (SPEC, plans, CONFIG), timeout=240)
        assert result.ok, result.reason
        out[world] = result.values
    return out


CASES = [(w, k) for w, plans in LAYOUTS.items() for k in range(len(plans))]


@pytest.mark.parametrize("world,k", CASES, ids=[_name(LAYOUTS[w][k]) for w, k in CASES])
def test_layout_matches_single_process(runs, world, k):
    plan = LAYOUTS[world][k]
    ref = check.reference(SPEC, plan, CONFIG)
    values = [v[k] for v in runs[world]]
    for v in values:  # every rank reports the same global loss
        assert v["losses"] == pytest.approx(values[0]["losses"], rel=1e-6)
    if plan.is_fp8:
        assert values[0]["losses"] == pytest.approx(ref["losses"], rel=FP8_LOSS_RTOL)
        for v in values:
            for name, scale in v["scales"].items():
                # weight scales: the same tensor's amax; input and grad_output scales differ by
                # the FP8 rounding upstream in step 1 (shard-wise first casts): looser bound
                torch.testing.assert_close(scale[1], ref["scales"][name][1], rtol=1e-3, atol=0)
                # each DP (and CP) rank's loss is the mean over its own tokens (DP x CP
                # averages the gradients afterwards), so its output gradients, and their amax,
                # are dp*cp times the single-process ones
                scale = scale * torch.tensor([1.0, 1.0, plan.dp * plan.cp])
                torch.testing.assert_close(scale, ref["scales"][name],
                                           rtol=FP8_ACT_SCALE_RTOL, atol=0)
        assert ref["scales"]
        return
    assert values[0]["losses"] == pytest.approx(ref["losses"], rel=LOSS_RTOL)
    merged = {}
    for v in values:
        merged.update(v["grads"])
    assert set(merged) == set(ref["grads"])
    for name, g in ref["grads"].items():
        err = float((merged[name] - g).abs().max() / g.abs().max())
        assert err < GRAD_TOL, f"{name}: gradient error {err:.2e}"


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
