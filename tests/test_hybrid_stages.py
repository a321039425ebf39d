"""A hybrid model's pipeline stages priced from the layers each holds (``pipeline.stage_kind_counts``,
``Candidates.stage_kinds``, ``Layers.on``), not from the pattern's average mix.

The counts below are counted by hand from the stage slices written out here (Megatron-LM gives
each virtual stage v = chunk * pp + rank the next contiguous slice of the pattern), not by the
code under test.
"""

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import pipeline, stages
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_plan, plan_columns
from autoparallel.costmodel.layer_kinds import STAGE_KINDS
from autoparallel.report import hybrid_export
from autoparallel.specs.plan import Plan
from tests.test_hybrid_costmodel import NANO_PATTERN, _moe_pair, nano

REL = 1e-12


@pytest.fixture(scope="module")
def hw():
    return io.load_hardware("h100-sxm")


def _counts(pattern, pp, vp, first=0, last=0):
    """(first, middle, last) stage's {kind: count} from ``stage_kind_counts``."""
    a = lambda v: np.array([v])  # noqa: E731
    counts = pipeline.stage_kind_counts(pattern, STAGE_KINDS, a(pp), a(vp), a(first), a(last), a(0), a(0), a(""))
    return [{kind: int(counts[i, k, 0]) for k, kind in enumerate(STAGE_KINDS) if counts[i, k, 0]} for i in range(3)]


def test_nano_pp2_stages_hold_their_halves():
    """First half MEMEM*EMEMEM*EMEMEM*EMEMEM: M at 0 2 4 7 9 11 14 16 18 21 23 25 (12), * at 5 12
    19 (3), E 11; the second half the rest of Nano's 23 M, 6 *, 23 E."""
    assert NANO_PATTERN[:26] == "MEMEM*EMEMEM*EMEMEM*EMEMEM"
    first, _, last = _counts(NANO_PATTERN, 2, 1)
    assert first == {"M": 12, "*": 3, "E": 11}
    assert last == {"M": 11, "*": 3, "E": 12}


def test_nano_pp4_middle_is_the_heavier_one():
    """Quarters of 13: MEMEM*EMEMEM* (M6 *2 E5), EMEMEM*EMEMEM (M6 *1 E6), *EMEMEM*EMEME (M5 *2
    E6), MEM*EMEMEMEME (M6 *1 E6). Of the two middle stages (both E6) the one with the second
    attention layer is priced."""
    assert [NANO_PATTERN[13 * i:13 * i + 13] for i in range(4)] == [
        "MEMEM*EMEMEM*", "EMEMEM*EMEMEM", "*EMEMEM*EMEME", "MEM*EMEMEMEME"]
    assert _counts(NANO_PATTERN, 4, 1) == [{"M": 6, "*": 2, "E": 5}, {"M": 5, "*": 2, "E": 6},
                                           {"M": 6, "*": 1, "E": 6}]


def test_nano_pp4_vp2_ranks_sum_their_two_chunks():
    """First and last stage 14 layers, middle ones 12, in two chunks each: virtual stages of
    7 6 6 7 | 7 6 6 7 layers. Rank 0: MEMEM*E + *EMEMEM (M6 *2 E6); rank 1: MEMEM* + *EMEME
    (M5 *2 E5); rank 2: EMEMEM + MEM*EM (M6 *1 E5); rank 3: *EMEMEM + EMEMEME (M6 *1 E7). Of the
    middle ranks (both E5) the one with two attention layers is priced."""
    sizes = pipeline.virtual_stage_sizes(52, 4, 2, 14, 14, False, False)
    assert sizes == [7, 6, 6, 7, 7, 6, 6, 7]
    ends = np.cumsum(sizes)
    slices = [NANO_PATTERN[e - s:e] for e, s in zip(ends, sizes)]
    assert slices == ["MEMEM*E", "MEMEM*", "EMEMEM", "*EMEMEM", "*EMEMEM", "*EMEME", "MEM*EM", "EMEMEME"]
    assert _counts(NANO_PATTERN, 4, 2, 14, 14) == [{"M": 6, "*": 2, "E": 6}, {"M": 5, "*": 2, "E": 5},
                                                   {"M": 6, "*": 1, "E": 7}]


def test_export_pipes_hold_the_priced_stages():
    """The | marks Megatron-LM reads (``hybrid_export.layer_pattern``) cut the pattern where the
    priced stages are cut: each rank's slices (r, r + pp, ...) hold the counts priced."""
    for pp, vp in ((2, 1), (4, 1), (2, 2), (13, 1)):
        exported = hybrid_export.layer_pattern(nano(), Plan(tp=1, pp=pp, vp=vp, dp=1, ep=1, mbs=1, gbs=64))
        ranks = ["".join(exported.split("|")[r::pp]) for r in range(pp)]
        first, middle, last = _counts(NANO_PATTERN, pp, vp)
        assert first == {k: ranks[0].count(k) for k in STAGE_KINDS if ranks[0].count(k)}
        assert last == {k: ranks[-1].count(k) for k in STAGE_KINDS if ranks[-1].count(k)}
        assert middle in [{k: r.count(k) for k in STAGE_KINDS if r.count(k)} for r in ranks[1:-1] or ranks[:1]]


def _stage_time(layers, counts):
    return sum(n * layers.kinds[kind]["time"] for kind, n in counts.items())


def test_slowest_stage_drives_the_step(hw):
    """Nano PP4: each priced stage's layer time is its own kinds' sum, and the step's bottleneck
    is the slowest of them (the last stage with the head), not the pattern mean's."""
    x = candidates(nano(), hw, plan_columns([Plan(tp=2, pp=4, dp=1, ep=2, mbs=1, gbs=16, sp=True)]))
    layers = lt.layers(x)
    times = stages.stage_times(x, layers)
    first, middle, last = _counts(NANO_PATTERN, 4, 1)
    assert times.first[0] - times.pp_comm[0] - times.offload[0] == pytest.approx(_stage_time(layers, first), rel=REL)
    assert times.middle[0] - times.pp_comm[0] == pytest.approx(_stage_time(layers, middle), rel=REL)
    assert times.last[0] - times.pp_comm[0] - times.logits[0] == pytest.approx(_stage_time(layers, last), rel=REL)
    # Against the pattern's mix (8 non-E layers at Nano's 23 M : 6 *): 2 - 8 * 6/29 attention layers
    # more, as many Mamba layers fewer.
    mean_first = layers.on("time", x.first_layers, x.first_moe)[0]
    attention, mamba = layers.kinds["*"]["time"][0], layers.kinds["M"]["time"][0]
    assert _stage_time(layers, first)[0] - mean_first == pytest.approx((2 - 8 * 6 / 29) * (attention - mamba), rel=1e-6)
    step = estimate_plan(nano(), hw, Plan(tp=2, pp=4, dp=1, ep=2, mbs=1, gbs=16, sp=True))
    slowest = max(times.first[0], times.middle[0], times.last[0])
    m = 16
    assert step["step_time_s"] >= m * slowest


def test_all_attention_in_one_stage(hw):
    """A pattern whose two attention layers both sit in the first of four stages: that stage
    carries both attention layers' time, the others Mamba layers in their place."""
    pattern = "*-*-" + "M-M-" * 3
    model = nano(hybrid_layer_pattern=pattern, num_layers=16, num_experts=None, moe_router_topk=None,
                 moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None)
    assert _counts(pattern, 4, 1) == [{"*": 2, "-": 2}, {"M": 2, "-": 2}, {"M": 2, "-": 2}]
    x = candidates(model, hw, plan_columns([Plan(tp=2, pp=4, dp=1, mbs=1, gbs=16, sp=True)]))
    layers = lt.layers(x)
    times = stages.stage_times(x, layers)
    attention, mamba = layers.kinds["*"]["time"][0], layers.kinds["M"]["time"][0]
    assert times.first[0] - times.offload[0] - times.middle[0] == pytest.approx(2 * (attention - mamba), rel=1e-9)
    assert attention > mamba and times.first[0] > times.middle[0]


@pytest.mark.parametrize("pp,vp", [(1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (2, 2), (2, 3), (3, 2), (4, 3)])
def test_stages_of_the_pattern_mix_price_as_before(pp, vp, hw):
    """Where every stage holds the pattern's own mix ("*E" x 12: each stage whole "*E" pairs), the
    stage counts give the pattern-mix prices to 1e-12, for every pp and vp."""
    _, model = _moe_pair()
    x = candidates(model, hw, plan_columns([Plan(tp=2, pp=pp, vp=vp, dp=1, ep=2, mbs=1, gbs=24, sp=True)]))
    layers = lt.layers(x)
    for n, n_moe, kinds in x.stage_layer_counts:
        for key in ("time", "compute", "params", "stored"):
            assert layers.on(key, n, n_moe, kinds)[0] == pytest.approx(layers.on(key, n, n_moe)[0], rel=REL)


def test_standard_models_have_no_stage_kinds(hw):
    """A standard model keeps the dense / MoE pricing: no per-kind counts to read."""
    standard, _ = _moe_pair()
    x = candidates(standard, hw, plan_columns([Plan(tp=2, pp=2, dp=1, ep=2, mbs=1, gbs=16, sp=True)]))
    assert x.stage_kinds is None and [k for _, _, k in x.stage_layer_counts] == [None] * 3


def test_search_structures_gather_the_counts(hw):
    """The search prices per structure and gathers: the (3, kinds, plans) counts follow their rows."""
    plans = [Plan(tp=2, pp=pp, dp=1, ep=2, mbs=1, gbs=16, sp=True) for pp in (4, 2, 4, 1)]
    x = candidates(nano(), hw, plan_columns(plans))
    assert x.stage_kinds.shape == (3, len(STAGE_KINDS), 4)
    np.testing.assert_array_equal(x.stage_kinds[..., 0], x.stage_kinds[..., 2])
    assert dataclasses.asdict(plans[0]) == dataclasses.asdict(plans[2])
    assert x.stage_kinds[0, STAGE_KINDS.index("*"), 3] == 6  # pp 1: every attention layer
