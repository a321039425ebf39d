"""DeepSeek-V4's pipeline stages priced from their own layers' compress ratios (``Candidates.stage_ratios``,
``layer_time.dsv4_ratio_layers``, ``Layers.moe_by_ratio``), not from the model's mean ratio mix.

The counts are by hand from the layer slices written out here (Megatron-LM gives virtual stage
v = chunk * pp + rank the next contiguous slice; the layout's E and L hold no decoder layer)."""

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel import stages
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import plan_columns
from autoparallel.specs.plan import Plan

PRO_LAYOUT = "Et*4|(tttt|)*14tmL"


def _recipe(dsv4_pro, gb300):
    plan = Plan(tp=1, pp=4, vp=4, dp=64, ep=64, mbs=1, gbs=4096, precision="mxfp8",
                pipeline_model_parallel_layout=PRO_LAYOUT)
    return candidates(dsv4_pro, gb300, plan_columns([plan]))


def test_pro_recipe_ranks_hold_their_own_ratios(dsv4_pro, gb300):
    """Virtual stages: 0 = layers 0-3 (128 128 4 128), 1-14 = four layers each from 4 (4 128 4 128),
    15 = layer 60 (4) and the MTP. Rank 0 holds stages 0 4 8 12: 1 + 2 + 2 + 2 = 7 ratio-4 and 9
    ratio-128 layers; ranks 1 and 2 (16 layers) 8 and 8; rank 3 stages 3 7 11 15: 2 + 2 + 2 + 1 = 7
    and 6. The model's mix is 30 / 31 of 61."""
    ratios = dsv4_pro.dsv4_decoder_ratios
    assert ratios[:4] == (128, 128, 4, 128) and ratios[4:8] == (4, 128, 4, 128) and ratios[60] == 4
    x = _recipe(dsv4_pro, gb300)
    assert dsv4_pro.dsv4_ratio_classes == (4, 128)
    assert x.stage_ratios[..., 0].tolist() == [[7, 9], [8, 8], [7, 6]]
    assert (x.first_layers[0], x.middle_layers[0], x.last_layers[0]) == (16, 16, 13)


def test_each_stage_sums_its_ratio_classes(dsv4_pro, gb300):
    """A stage's time is its layers' own: each class's count times that class's layer (every decoder
    layer at that ratio, ``ModelSpec.dsv4_uniform``), to rounding; the first rank (7 of 16 layers
    CSA with its indexer) differs from the mean-mix pricing by the hand amount."""
    x = _recipe(dsv4_pro, gb300)
    layers = lt.layers(x)
    per_class = {r: lt.layers(dataclasses.replace(x, model=dsv4_pro.dsv4_uniform(r), stage_ratios=None)).moe["time"]
                 for r in (4, 128)}
    for (n, n_moe, counts) in x.stage_layer_counts:
        by_hand = counts[0] * per_class[4] + counts[1] * per_class[128]
        assert layers.on("time", n, n_moe, counts) == pytest.approx(by_hand, rel=1e-9)
    assert per_class[4][0] > per_class[128][0]  # CSA's indexer, top-k and loss
    mean = layers.moe["time"][0]
    shift = (7 - 16 * 30 / 61) * (per_class[4][0] - mean) + (9 - 16 * 31 / 61) * (per_class[128][0] - mean)
    first = layers.on("time", x.first_layers, x.first_moe, x.stage_ratios[0])[0]
    assert first - 16 * mean == pytest.approx(shift, rel=1e-6) and shift < 0
    assert stages.stage_times(x, layers).first[0] < stages.stage_times(x, layers).middle[0]


def test_pp1_figures_do_not_move(gb300):
    """At pp 1 the one stage holds the model's mix: Flash's estimate is the mean-mix pricing bit for bit,
    priced alone or beside a pipelined plan (whose ratio layers are then priced)."""
    flash = io.load_model("deepseek-v4-flash")
    pp1 = Plan(tp=1, pp=1, dp=128, ep=64, mbs=1, gbs=2048, precision="mxfp8")
    pp4 = dataclasses.replace(pp1, pp=4, dp=32, ep=32)
    alone = candidates(flash, gb300, plan_columns([pp1]))
    assert lt.layers(alone).ratios is None
    both = candidates(flash, gb300, plan_columns([pp1, pp4]))
    mixed = lt.layers(both)
    assert mixed.ratios is not None and set(mixed.ratios) == {4, 128, 0}
    n, n_moe, counts = both.stage_layer_counts[0]
    single = lt.layers(alone)
    assert mixed.on("time", n, n_moe, counts)[0] == single.on("time", alone.first_layers, alone.first_moe, None)[0]
    assert stages.stage_times(both, mixed).first[0] == stages.stage_times(alone, single).first[0]


def test_ratios_only_for_deepseek_v4(gb300):
    """A standard MoE model has no ratio classes on its stages."""
    x = candidates(io.load_model("deepseek-v3"), gb300, plan_columns([Plan(tp=1, pp=4, dp=64, ep=64, mbs=1, gbs=4096)]))
    assert x.stage_ratios is None and lt.layers(x).ratios is None
