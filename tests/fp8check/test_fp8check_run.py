"""The check end to end on a tiny proxy: a healthy recipe is ok; recipes damaged on purpose
(overflow everywhere, overflow in one layer, underflow in one layer) are rejected or get the
damaged layer kept in BF16, and the damaged layer is named."""

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from autoparallel import io  # noqa: E402
from autoparallel.fp8check import verdict as V  # noqa: E402
from autoparallel.fp8check.check import run_check  # noqa: E402
from autoparallel.fp8check.proxy import proxy_spec  # noqa: E402
from autoparallel.fp8check.report import verdict_rows, write_check_folder  # noqa: E402
from autoparallel.fp8check.runner import run_policy  # noqa: E402
from autoparallel.model.recipes import CurrentScaling, DelayedScaling  # noqa: E402

MODEL = io.load_model("llama3-70b")


def test_runs_see_identical_data_and_initialisation(tiny_settings):
    spec = proxy_spec(MODEL, tiny_settings.proxy)
    a = run_policy(spec, None, tiny_settings.run)
    b = run_policy(spec, None, tiny_settings.run)
    fp8 = run_policy(spec, CurrentScaling(), tiny_settings.run)
    assert a.losses == b.losses and a.stats.empty
    assert fp8.losses[0] == pytest.approx(a.losses[0], rel=2e-3)   # same weights, same batch
    assert fp8.losses != a.losses
    recorded = sorted(fp8.stats.step.unique())
    assert recorded == list(range(0, tiny_settings.run.steps, tiny_settings.run.stats_every))
    # swiglu + GQA proxy: 4 FP8 Linears per layer (QKV and gate/up fused), 3 tensors each,
    # every layer present
    per_step = fp8.stats[fp8.stats.step == 0]
    assert len(per_step) == 4 * 4 * 3 and sorted(per_step.layer_index.unique()) == [0, 1, 2, 3]


def test_healthy_recipes_are_ok(tiny_settings):
    result = run_check(MODEL, tiny_settings, recipes=["fp8-current", "fp8-blockwise"])
    for label in ("fp8-current", "fp8-blockwise"):
        v = result.verdicts[label]
        assert v.status == V.OK, v.text
        assert abs(v.loss_gap_pct) < tiny_settings.thresholds.max_loss_gap_pct
        assert len(result.runs[label]) == 1            # no re-run needed


def test_overflow_everywhere_is_rejected(tiny_settings):
    result = run_check(MODEL, tiny_settings, recipes={"broken": DelayedScaling(margin=-6)})
    v = result.verdicts["broken"]
    assert v.status == V.REJECT and "overflow" in v.reason
    assert "more than 2 layers" in v.reason and v.reruns == 0
    summary = result.summary("broken")
    assert (summary.groupby("layer_index").overflow_pct.max() > 50).all()


def test_overflow_in_one_layer_keeps_that_layer_in_bf16(tiny_settings, tmp_path):
    result = run_check(MODEL, tiny_settings, recipes={"fp8-current": CurrentScaling()},
                       module_recipes={"layers.1.mlp.w2": CurrentScaling(margin=-6)})
    v = result.verdicts["fp8-current"]
    assert v.status == V.OK_BF16 and v.bf16_layers == (1,), v.text
    assert v.text == "ok with BF16 layers [1]"
    assert v.worst.startswith("layers.1.mlp.w2") and "overflow" in v.worst
    assert abs(v.gap_with_bf16_layers_pct) <= tiny_settings.thresholds.max_loss_gap_pct
    rerun = result.runs["fp8-current"][1]
    assert rerun.bf16_layers == (1,) and 1 not in set(rerun.stats.layer_index)

    row = verdict_rows(result)[0]
    assert row["worst_overflow"].startswith("layers.1.mlp.w2")
    run_dir = write_check_folder(result, tmp_path, ["test"], plots=True)
    stats = pd.read_csv(run_dir / "stats.csv")
    assert {"recipe", "bf16_layers", "layer", "tensor", "mse", "cos_sim", "underflow_pct",
            "overflow_pct", "amax", "scale", "delayed_current_ratio"} <= set(stats.columns)
    assert set(stats.bf16_layers) == {"[]", "[1]"}
    for png in ("loss_curves.png", "underflow_heatmap.png"):
        assert (run_dir / png).read_bytes()[:4] == b"\x89PNG"
    assert "ok with BF16 layers [1]" in (run_dir / "verdicts.md").read_text()


def test_underflow_in_one_layer_is_found_and_named(tiny_settings):
    result = run_check(MODEL, tiny_settings, recipes={"fp8-current": CurrentScaling()},
                       module_recipes={"layers.2.*": CurrentScaling(margin=14)})
    v = result.verdicts["fp8-current"]
    assert v.status == V.OK_BF16 and v.bf16_layers == (2,), v.text
    assert v.worst.startswith("layers.2.") and "underflow" in v.worst
    summary = result.summary("fp8-current")
    worst = summary.loc[summary.underflow_pct.idxmax()]
    assert worst.layer_index == 2 and worst.underflow_pct > tiny_settings.thresholds.max_underflow_pct
