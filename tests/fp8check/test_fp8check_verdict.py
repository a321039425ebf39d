"""The decision rule on constructed statistics (no training)."""

import math

import pandas as pd
import pytest

from autoparallel.fp8check import verdict as V
from autoparallel.fp8check.settings import Thresholds

TH = Thresholds(max_loss_gap_pct=3.0, max_underflow_pct=5.0, max_overflow_pct=0.5)
MODULES = ("attention.wq", "mlp.w2")
TENSORS = ("input", "weight", "grad_output")


def summary_with(damage: dict | None = None, layers: int = 4) -> pd.DataFrame:
    """A healthy per-(module, tensor) summary; ``damage`` maps (layer, module, tensor) to
    {column: value} overrides."""
    rows = []
    for i in range(layers):
        for m in MODULES:
            for t in TENSORS:
                rows.append({"layer": f"layers.{i}.{m}", "layer_index": i, "tensor": t,
                             "format": "E4M3", "steps": 5, "mse": 1e-4, "cos_sim": 0.999 - i * 1e-4,
                             "underflow_pct": 0.01, "max_underflow_pct": 0.02,
                             "overflow_pct": 0.0, "max_overflow_pct": 0.0, "amax": 1.0,
                             "scale": 448.0, "delayed_current_ratio": 1.0})
    frame = pd.DataFrame(rows)
    for (i, m, t), values in (damage or {}).items():
        where = (frame.layer == f"layers.{i}.{m}") & (frame.tensor == t)
        for k, v in values.items():
            frame.loc[where, k] = v
    return frame


def test_summarize_averages_steps_per_layer_and_tensor():
    steps = pd.DataFrame({"step": [0, 10, 0, 10], "layer": ["layers.0.mlp.w2"] * 4,
                          "layer_index": [0] * 4, "tensor": ["input", "input", "weight", "weight"],
                          "format": ["E4M3"] * 4, "mse": [1.0, 3.0, 2.0, 2.0],
                          "cos_sim": [0.9, 0.8, 1.0, 1.0], "underflow_pct": [0.0, 10.0, 0.0, 0.0],
                          "overflow_pct": [1.0, 0.0, 0.0, 0.0], "amax": [1.0, 5.0, 2.0, 2.0],
                          "scale": [1.0, 2.0, 1.0, 1.0], "delayed_current_ratio": [1.0] * 4,
                          "numel": [4] * 4})
    s = V.summarize(steps).set_index("tensor")
    assert s.loc["input", "mse"] == 2.0 and s.loc["input", "cos_sim"] == 0.8
    assert s.loc["input", "underflow_pct"] == 5.0 and s.loc["input", "max_underflow_pct"] == 10.0
    assert s.loc["input", "amax"] == 5.0 and s.loc["input", "steps"] == 2
    assert V.summarize(steps.iloc[:0]).empty


def test_damaged_names_the_layer_tensor_and_problem():
    s = summary_with({(2, "mlp.w2", "input"): {"overflow_pct": 40.0},
                      (1, "attention.wq", "grad_output"): {"underflow_pct": 12.0}})
    bad = V.damaged(s, TH)
    assert list(bad.layer) == ["layers.2.mlp.w2", "layers.1.attention.wq"]   # worst first
    assert bad.iloc[0].problem == "overflow 40.00 %" and bad.iloc[1].problem == "underflow 12.00 %"
    assert "layers.2.mlp.w2 input overflow 40.00 %" in V.describe_damage(bad)


def test_thresholds_are_strict_upper_bounds():
    at = summary_with({(0, "mlp.w2", "input"): {"overflow_pct": 0.5, "underflow_pct": 5.0}})
    assert V.damaged(at, TH).empty
    above = summary_with({(0, "mlp.w2", "input"): {"underflow_pct": 5.01}})
    assert len(V.damaged(above, TH)) == 1


def test_failures_of_gap_divergence_and_damage():
    healthy = V.damaged(summary_with(), TH)
    assert V.failures(2.9, healthy, TH) == []
    assert V.failures(3.1, healthy, TH) == ["loss gap +3.10 % > 3 %"]
    assert V.failures(V.loss_gap_pct(math.nan, 1.0), healthy, TH) == ["diverged (non-finite loss)"]
    assert V.loss_gap_pct(1.05, 1.0) == pytest.approx(5.0)
    bad = V.damaged(summary_with({(3, "mlp.w2", "weight"): {"overflow_pct": 9.0}}), TH)
    why = V.failures(0.0, bad, TH)
    assert len(why) == 1 and "1 layer(s)" in why[0] and "layers.3.mlp.w2" in why[0]


def test_candidate_sets_start_with_the_damaged_layer_and_always_contain_it():
    s = summary_with({(2, "mlp.w2", "input"): {"overflow_pct": 40.0}})
    sets = V.candidate_sets(s, V.damaged(s, TH), 4, TH, max_layers=2)
    assert sets[0] == (2,)
    assert all(2 in c for c in sets) and [len(c) for c in sets] == sorted(len(c) for c in sets)
    assert max(len(c) for c in sets) == 2 and len(set(sets)) == len(sets)


def test_candidate_sets_without_damage_try_the_worst_layer_then_the_edges():
    s = summary_with({(1, "mlp.w2", "input"): {"underflow_pct": 4.0}})   # below the threshold
    sets = V.candidate_sets(s, V.damaged(s, TH), 4, TH, max_layers=2)
    assert sets[:2] == [(1,), (0,)] and (0, 3) in sets


def test_too_many_damaged_layers_leave_no_candidate():
    damage = {(i, "mlp.w2", "input"): {"overflow_pct": 90.0} for i in range(3)}
    s = summary_with(damage)
    assert V.candidate_sets(s, V.damaged(s, TH), 4, TH, max_layers=2) == []
    assert V.candidate_sets(s, V.damaged(s, TH), 4, TH, max_layers=3) == [(0, 1, 2)]


def test_verdict_text():
    assert V.Verdict("fp8-current", V.OK, 0.2).text == "ok"
    assert V.Verdict("fp8-current", V.OK_BF16, 5.0, (0, 3)).text == "ok with BF16 layers [0, 3]"
    assert V.Verdict("x", V.REJECT, 9.0, reason="loss gap +9 %").text == "reject: loss gap +9 %"
