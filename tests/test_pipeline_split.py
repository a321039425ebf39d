"""Uneven pipeline stages as Megatron-LM makes them, and their pricing stage by stage."""

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import pipeline
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.specs.plan import Plan


def megatron_accepts(layers: int, pp: int, vp: int, split) -> bool:
    """The checks of Megatron-LM's TransformerConfig.__post_init__ on a pipeline split."""
    first, last, embedding, loss, layout = split
    if layout:  # PipelineParallelLayerLayout: a multiple of pp stages holding every decoder layer once
        sizes = pipeline.layout_stage_sizes(layout)
        return len(sizes) == pp * vp and sum(sizes) == layers and layout.startswith("E") and layout.endswith("L")
    if first or last:
        middle_stages = pp - bool(first) - bool(last)
        middle_layers = layers - first - last
        if any(n % vp for n in (first, last) if n) or middle_layers < 0:
            return False
        return middle_stages == 0 and middle_layers == 0 or (
            middle_stages > 0 and middle_layers % middle_stages == 0 and (middle_layers // middle_stages) % vp == 0)
    slots = layers + embedding + loss
    return slots % pp == 0 and (slots // pp) % vp == 0


@pytest.mark.parametrize("layers, pp, vp", [(126, 8, 8), (126, 8, 1), (126, 8, 3), (126, 16, 4), (80, 8, 5),
                                            (96, 8, 7), (61, 4, 4), (61, 2, 1), (32, 3, 1), (94, 4, 12)])
def test_every_split_offered_is_one_megatron_accepts(layers, pp, vp):
    for split in pipeline.splits(layers, pp, vp, layouts=True):
        assert megatron_accepts(layers, pp, vp, split), split
        stages = pipeline.stage_layers(layers, np.array([pp]), np.array([vp]),
                                       *(np.array([v], dtype=object if isinstance(v, str) else float) for v in split))
        first, middle, last = (float(s[0]) for s in stages)
        if split[4]:  # a flexible layout's middle stages may differ: "middle" is the fullest
            assert first + (pp - 2) * middle + last >= layers
        else:
            assert first + (pp - 2) * middle + last == layers if pp > 1 else first == layers
        assert min(first, last) >= 1 and (pp < 3 or middle >= 1)


def test_405b_on_8_stages_of_8_chunks_counts_embedding_and_loss_as_layers():
    # NVIDIA's Llama-3.1 405B layout (TP8 PP8 VP8): (126 + 2) / 64 = 2 slots a chunk.
    assert pipeline.splits(126, 8, 8) == [(0, 0, True, True, "")]
    first, middle, last = pipeline.stage_layers(126, np.array([8]), np.array([8]), [0], [0], [1], [1])
    assert (first[0], middle[0], last[0]) == (15, 16, 15)


def test_an_even_split_is_the_only_one_offered_when_it_exists():
    assert pipeline.splits(96, 8, 6) == [pipeline.EVEN]
    assert pipeline.splits(126, 8, 8, uneven=False) == []


def test_stages_hold_megatrons_warm_up():
    # Interleaved 1F1B: stage i warms up 2(pp-i-1) + (vp-1)pp chunk-micro-batches, holds one more.
    assert pipeline.inflight_chunks(8, 5, 64, 0) == 2 * 7 + 4 * 8 + 1
    assert pipeline.inflight_chunks(8, 5, 64, 7) == 4 * 8 + 1
    assert pipeline.inflight_chunks(8, 1, 64, 0) == 8 and pipeline.inflight_chunks(8, 1, 64, 7) == 1
    assert pipeline.inflight_chunks(8, 5, 2, 0) == 2 * 5  # capped by what the step has


def test_equal_stages_give_the_textbook_bubble():
    m, vp, stage = 64, 4, 0.1
    assert pipeline.schedule_time(m, vp, stage, 8 * stage) == pytest.approx((m + 7 / vp) * stage)


def _405b(**kw):
    base = dict(tp=8, pp=8, vp=8, cp=2, dp=8, gbs=512, mbs=1, sp=True, precision="fp8-current",
                tp_comm_overlap=True, grad_reduce_in_fp32=False, account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    return Plan(**{**base, **kw})


def test_nvidias_405b_layout_fits_an_h100():
    r = estimate_plan(io.load_model("llama3.1-405b"), io.load_hardware("h100-sxm"), _405b())
    assert r["fits"] and r["peak_memory_gib"] < 76.0


def test_the_slowest_stage_sets_the_pace():
    model, hw = io.load_model("llama3.1-405b"), io.load_hardware("h100-sxm")
    accounted = estimate_plan(model, hw, _405b())
    # The same 126 layers with the first and last stages as heavy as the middle ones would need
    # vp=1 (126 % 8 != 0 for vp=8); compare instead a layout whose last stage carries 2 more layers.
    heavy_last = estimate_plan(model, hw, _405b(vp=1, account_for_embedding_in_pipeline_split=False,
                                                account_for_loss_in_pipeline_split=False,
                                                num_layers_in_first_pipeline_stage=12,
                                                num_layers_in_last_pipeline_stage=18))
    light_last = estimate_plan(model, hw, _405b(vp=1, account_for_embedding_in_pipeline_split=False,
                                                account_for_loss_in_pipeline_split=False,
                                                num_layers_in_first_pipeline_stage=15,
                                                num_layers_in_last_pipeline_stage=15))
    assert heavy_last["step_time_s"] > light_last["step_time_s"]
    assert accounted["step_time_s"] < light_last["step_time_s"]  # interleaving shrinks the bubble


def test_flexible_layout_only_where_no_other_split_fits():
    """DeepSeek-V3's 61 layers on 4 x 4 virtual stages: only Megatron's flexible layout."""
    assert pipeline.splits(61, 4, 4) == []
    assert pipeline.splits(61, 4, 4, layouts=True) == [(0, 0, False, False, "Et*3|(t*4|)*14t*2L")]
    assert pipeline.splits(96, 8, 6, layouts=True) == [pipeline.EVEN]


def test_balanced_layouts_place_mtp_before_the_loss():
    assert pipeline.balanced_layout(61, 32, mtp=1) == "Et|(t*2|)*30mL"  # NVIDIA's DeepSeek-V3 recipe
    assert pipeline.balanced_layout(61, 16) == "Et*3|(t*4|)*14t*2L"
    assert pipeline.layout_stage_sizes("Et|(t*2|)*30mL") == [1] + [2] * 30 + [0]


@pytest.mark.parametrize("layout, error", [
    ("Et|(tt|)*30mL", ""),
    ("Et|(tt|)*30L", "has 0 MTP layers (m), the model 1"),
    ("Et|(tt|)*29mL", "has 59 decoder layers (t), the model 61"),
    ("tE|(tt|)*30mL", "must start with the embedding E and end with the loss L"),
    ("Et|(tx|)*30mL", "unknown symbol(s) 'x'; known:"),
    ("Emt|(tt|)*30L", "places decoder layers after an MTP layer"),
    ("E(t)*99999999L", "unrolls to more than"),
    ("(tt|", "unbalanced parentheses"),
    ("E(t|)*-3L", "a repeat is (stages)*N or t*N"),
    ("Et*16|\x1bt*16L", "unknown symbol(s) '\\x1b'"),
    ("Et*16 | t*16L", "unknown symbol(s) ' '; known:"),  # a space was shown as nothing (session 55)
    ("EXt*16yL", "unknown symbol(s) 'X', 'y'; known:"),
])
def test_a_pinned_layout_is_checked_as_megatron_checks_it(layout, error):
    got = pipeline.layout_error(layout, 61, 1)
    assert (error in got) if error else got == ""


def test_a_pinned_layout_sets_pp_and_vp():
    from autoparallel.space import generate, load_space
    model = dataclasses.replace(io.load_model("deepseek-v3"), mtp_num_layers=1)
    space = dataclasses.replace(load_space().pinned(pipeline_layout="Et|(tt|)*30mL", tp=1, ep=8, mbs=1,
                                                    precision="bf16", recompute="full"), pp=(2, 8, 16, 64))
    out = generate(model, io.load_hardware("gb300"), 256, 4096, space)
    valid = out[out.reason == ""]
    assert set(zip(valid.pp, valid.vp)) == {(2, 16), (8, 4), (16, 2)}
    assert (valid.pipeline_model_parallel_layout == "Et|(tt|)*30mL").all()
    assert out.reason.str.contains("32 virtual stages, not divisible by pp=64").any()


@pytest.mark.parametrize("layers, pp, vp", [(126, 8, 1), (126, 8, 2), (96, 8, 12), (61, 4, 1), (80, 6, 2),
                                            (126, 16, 8)])
def test_a_pinned_split_is_refused_exactly_where_megatron_refuses_it(layers, pp, vp):
    """Issue 23: each split a user can pin (first/last sizes, accounted embedding/loss) against the
    checks of TransformerConfig.__post_init__ (``megatron_accepts``). An accounted split may leave
    the embedding or the loss alone in a chunk (get_num_layers_to_build asserts >= 0 layers):
    NVIDIA runs Llama 3.1 405B so on PP16 VP8 (Megatron-Bridge 26.02-26.06 summaries)."""
    candidates = [(f, l, False, False, "") for f in range(0, 20) for l in range(0, 20)]
    candidates += [(0, 0, e, lo, "") for e in (False, True) for lo in (False, True)]
    for split in candidates:
        error = pipeline.split_error(layers, pp, vp, split)
        assert (error == "") == megatron_accepts(layers, pp, vp, split), (split, error)
    if (layers, pp, vp) == (126, 16, 8):
        assert pipeline.split_error(layers, pp, vp, (0, 0, True, True, "")) == ""


def test_a_pinned_split_is_the_only_split_searched():
    from autoparallel.space import SearchSpace, generate
    model, hw = io.load_model("llama3.1-405b"), io.load_hardware("h100-sxm")
    space = SearchSpace(tp=(8,), pp=(8, 16), mbs=(1,), recompute=("none",)).pinned(
        num_layers_in_first_pipeline_stage=15, num_layers_in_last_pipeline_stage=15)
    out = generate(model, hw, 1024, 512, space)
    ok = out[out.reason == ""]
    assert set(ok.pp) == {8} and set(ok.vp) == {1}  # 96 middle layers over 6 stages; pp 16 leaves 96/14
    assert (ok.num_layers_in_first_pipeline_stage == 15).all() and (ok.num_layers_in_last_pipeline_stage == 15).all()
    assert "must be divisible by the middle pipeline model parallel size 14" in " ".join(out.reason)


def test_the_offered_layout_balances_the_ranks_with_the_head_counted_as_work():
    """The last rank runs the output layer and loss (one layer's work) and each MTP module (two):
    where moving one of its decoder layers to the first stage lightens the busiest rank, that
    layout is offered instead of the slot-balanced one (one layout per pp x vp either way)."""
    # pp 16: NVIDIA's DeepSeek-V3 GB200/GB300 layout; busiest rank 2 + 3 -> 4 (+ 3) work
    assert pipeline.rank_balanced_layout(61, 16, 1, mtp=1) == "Et*4|(t*4|)*14tmL"
    assert pipeline.splits(61, 8, 4, layouts=True, mtp=1) == [
        (0, 0, False, False, pipeline.rank_balanced_layout(61, 8, 4, mtp=1))]
    # pp 16 x vp 2: rank 15 holds virtual stages 15 and 31 ("tt" and "mL": 2 + 3 work)
    lighter = pipeline.rank_balanced_layout(61, 16, 2, mtp=1)
    assert lighter == "Et*2|(t*2|)*14t|(t*2|)*15mL"
    sizes = pipeline.layout_stage_sizes(lighter)
    assert sum(sizes) == 61 and sizes[15] + sizes[31] == 1 and sizes[0] + sizes[16] == 4
    # a tie keeps the slot-balanced layout: 61 layers on 4 x 4 without MTP (15 and 15)
    assert pipeline.rank_balanced_layout(61, 4, 4) == pipeline.balanced_layout(61, 16)
    # nothing to move: the last rank holds only the head
    assert pipeline.rank_balanced_layout(61, 32, 1, mtp=1) == "Et|(t*2|)*30mL"


def test_accounting_pinned_off_keeps_the_other_uneven_splits():
    """--no-account-for-embedding-in-pipeline-split is Megatron's default: 126 layers on pp 8 still
    get the explicit first/last stage sizes (it used to pin an empty split and refuse them all)."""
    from autoparallel.space import SearchSpace, generate
    model, hw = io.load_model("llama3.1-405b"), io.load_hardware("h100-sxm")
    space = SearchSpace().pinned(tp=8, pp=8, vp=1, cp=1, mbs=1, account_for_embedding_in_pipeline_split=False)
    valid = generate(model, hw, 576, 504, space)
    valid = valid[valid.reason == ""]
    assert len(valid) and not valid.account_for_embedding_in_pipeline_split.any()
    assert (valid.num_layers_in_first_pipeline_stage > 0).all()
