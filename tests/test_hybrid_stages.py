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
from autoparallel.costmodel import gemm_precision, pipeline, stages
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_plan, plan_columns
from autoparallel.costmodel.layer_kinds import STAGE_KINDS
from autoparallel.report import hybrid_export
from autoparallel.specs.plan import Plan
from tests.test_hybrid_costmodel import NANO_PATTERN, _moe_pair, nano

REL = 1e-12


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
    assert x.stage_kinds.shape == (3, 4, 4)  # E * M -: no BF16 end layers set
    np.testing.assert_array_equal(x.stage_kinds[..., 0], x.stage_kinds[..., 2])
    assert dataclasses.asdict(plans[0]) == dataclasses.asdict(plans[2])
    assert x.stage_kinds[0, STAGE_KINDS.index("*"), 3] == 6  # pp 1: every attention layer


def _super(hw, pp, end=14):
    cols = plan_columns([Plan(tp=1, pp=pp, dp=64 // pp, ep=8, mbs=1, gbs=512, sp=False, precision="nvfp4")])
    cols["quant_recipe"] = np.array(["nemotronh-te-quant"], dtype=object)
    cols["num_layers_at_end_in_bf16"] = np.array([end], dtype=object)
    return candidates(io.load_model("nemotron-3-super"), hw, cols)


def test_bf16_end_layers_sit_on_the_last_stage():
    """Super's 88 layers on 4 stages of 22: the last 14 (EMEMEM*EMEMEMEME: 7 E, 6 M, one *,
    counted by hand in tests/test_gemm_precision.py) are BF16 and all on the last stage; the
    first and middle stages hold none."""
    hw = io.load_hardware("gb300")
    model = io.load_model("nemotron-3-super")
    x = _super(hw, 4)
    counts = {kind: x.stage_kinds[:, k, 0].tolist() for k, kind in enumerate(STAGE_KINDS) if x.stage_kinds[:, k, 0].any()}
    assert counts["E bf16"] == [0, 0, 7] and counts["M bf16"] == [0, 0, 6] and counts["* bf16"] == [0, 0, 1]
    last = model.hybrid_layer_pattern[66:]
    assert counts["E"][2] == last.count("E") - 7 and counts["M"][2] == last.count("M") - 6
    layers = lt.layers(x)
    times = stages.stage_times(x, layers)
    # The last stage's layers: its quantized kinds, and its BF16 ones at BF16 (each kind priced with
    # no quantized share).
    bf16 = lt.kind_candidates(x, np.zeros_like(x.quantized_fraction))
    expected = sum(counts[kind][2] * (lt.HYBRID_LAYERS[kind[0]](bf16) if kind.endswith(" bf16") else layers.kinds[kind])["time"]
                   for kind in counts)
    assert times.last[0] - times.pp_comm[0] - times.logits[0] == pytest.approx(expected[0], rel=REL)
    # The first stage holds no BF16 layer: its quantized kinds alone.
    first = sum(counts[kind][0] * layers.kinds[kind]["time"] for kind in counts if not kind.endswith(" bf16"))
    assert times.first[0] - times.pp_comm[0] - times.offload[0] == pytest.approx(first[0], rel=REL)
    assert layers.kinds["E bf16"]["time"][0] != layers.kinds["E"]["time"][0]


def test_bf16_end_layers_on_one_stage_price_as_the_mixed_share():
    """PP 1: the BF16 end layers priced apart give the figures of the kinds priced at their mixed
    quantized share (each term linear in the share: to 1e-9)."""
    hw = io.load_hardware("gb300")
    x = _super(hw, 1)
    layers = lt.layers(x)
    n, n_moe, kinds = x.stage_layer_counts[0]
    for kind in "ME":
        mixed = lt.HYBRID_LAYERS[kind](lt.kind_candidates(x, gemm_precision.kind_fraction(x, kind)))
        k, e = STAGE_KINDS.index(kind), STAGE_KINDS.index(kind + " bf16")
        apart = (kinds[k] * layers.kinds[kind]["time"] + kinds[e] * layers.kinds[kind + " bf16"]["time"])
        assert apart[0] == pytest.approx((kinds[k] + kinds[e])[0] * mixed["time"][0], rel=1e-9)
