"""The serving cost model against published measurements, with the issue's tolerances.

Issue 16: TensorRT-LLM's in-flight batching rows on H100 and H200 (FP8 and FP16) within 15 %
mean |error| in sample and 25 % leave-one-model-out; FasterTransformer's rows within 10 %.
A target not met is a strict expected failure quoting today's figure (FIGURES), beside a
regression guard at that figure (named so: it is not a target).
"""

import re

import pandas as pd
import pytest

from autoparallel import io
from autoparallel.serve.assumptions import ASSUMPTIONS
from autoparallel.serve.fit import fit_rows
from autoparallel.serve.measured import (SERVING_RUNS, load_serving_runs, not_predicted_serving_rows)
from autoparallel.serve.validate import by_engine, fastertransformer_report, ft_summary

TARGET = ("h100-sxm", "h200")
# Today's figures (mean |error| %, H100 and H200 rows, 2026-11-27): the expected failures' reasons
# and the regression guards' bounds; update them here when the serving model moves (24.95 / 31.41
# before the MoE plugin's bytes were priced, session 39; 24.9 / 31.3 before the gated activation's
# pass was priced for dense and MoE layers alike and every engine refitted, session 40; held out
# 31.7 before the fit tried fixed starts besides its own and kept the lowest training cost, session
# 41: the cold Llama-2-70B / Falcon-180B / GPT-J refits had stopped in higher-loss minima; 25.0 / 31.8
# before a one-GPU engine's KV pool left 1.32 GiB beside its tensors instead of the 4 GiB reserve and
# every engine was refitted, session 41: loosened; 25.4 / 32.1 before 0.10's decode attention read the
# KV cache once per query head outside XQA's shapes (masked-MHA fallback), session 44: tightened, and
# the issue's target is met).
FIGURES = {"trtllm-0.10": {"in_sample": 13.4, "held_out": 15.7}}


@pytest.fixture(scope="module")
def report(held_out):
    return held_out


@pytest.fixture(scope="module")
def ft():
    return fastertransformer_report()


def _mean_abs(frame, column):
    return frame[column].abs().mean()


def _rows(report, engine):
    rows = report[(report["engine"] == engine) & report["hardware"].isin(TARGET)]
    assert set(rows["weight_precision"]) == {"fp8", "fp16"} and set(rows["hardware"]) == set(TARGET)
    return rows


def test_trtllm_inflight_rows_within_issue_tolerance(report):
    rows = _rows(report, "tensorrt-llm")  # TensorRT-LLM 0.12 (trtllm-bench), the engine the search uses
    assert len(rows) >= 130
    assert _mean_abs(rows, "error_pct") <= 15.0
    assert _mean_abs(rows, "lomo_pct") <= 25.0


_TRT010 = FIGURES["trtllm-0.10"]


def test_trtllm_010_rows_target(report):
    """Issue 16 target: gptManagerBenchmark's rows, 142 with Mixtral-8x7B's, within 15 % in sample
    and 25 % held out (from a cold start, issue 28). Met once 0.10's decode attention falls back to
    masked MHA (one KV read per query head) for Falcon-180B, Llama-3-8B and Mixtral (session 44);
    before, their long outputs missed by up to +249 %."""
    rows = _rows(report, "tensorrt-llm-0.10")
    assert _mean_abs(rows, "error_pct") <= 15.0 and _mean_abs(rows, "lomo_pct") <= 25.0


def test_trtllm_010_rows_regression_guard(report):
    rows = _rows(report, "tensorrt-llm-0.10")
    assert _mean_abs(rows, "error_pct") <= _TRT010["in_sample"] + 0.1
    assert _mean_abs(rows, "lomo_pct") <= _TRT010["held_out"] + 0.1


def test_fastertransformer_rows_stay_within_ten_percent(ft, report):
    s = ft_summary(ft)
    assert s["rows"] >= 300
    assert s["mean_abs_error_pct"] <= 10.0
    assert s["measured_rows_predicted_to_fit"] == s["rows"]  # every published layout fits
    assert s["oom_rows_predicted_not_to_fit"] >= s["oom_rows"] // 2
    held = report[report["engine"] == "fastertransformer"]
    assert len(held) == s["rows"] and held["lomo_pct"].notna().all()


def test_held_out_error_is_computed_for_every_row(report):
    assert report["lomo_pct"].notna().all()
    # a refit that never saw a model predicts it no better than the fit that did, on average
    for engine, rows in report[report["fitted_on"]].groupby("engine"):
        assert _mean_abs(rows, "lomo_pct") >= _mean_abs(rows, "error_pct") - 0.5, engine


def test_fit_recorded_in_yaml_matches(report):
    text = ASSUMPTIONS.read_text()
    for row in by_engine(report).itertuples():
        if not row.rows_used_by_fit:
            continue
        recorded = float(re.search(rf"  {re.escape(row.engine)}:  # \d+ rows .*?mean \|error\| ([0-9.]+) %", text)[1])
        assert row.in_sample_pct == pytest.approx(recorded, abs=0.15), row.engine


def test_every_serving_row_is_predicted_or_has_a_reason():
    total = len(pd.read_csv(SERVING_RUNS))
    predicted = sum(len(m.predicted_rows) for m in load_serving_runs())
    skipped = not_predicted_serving_rows()
    assert predicted + len(skipped) == total
    assert (skipped["reason"] != "").all()
    in_flight = sum(len(m.predicted_rows[m.predicted_rows["model"] == "Mixtral-8x7B"]) for m in load_serving_runs())
    assert in_flight == 20  # MoE serving: TensorRT-LLM 0.10's Mixtral-8x7B table is predicted


def test_fits_use_the_target_gpus_only():
    for measured in load_serving_runs():
        assert set(fit_rows(measured)["hardware"]) == set(TARGET)


def test_validation_hardware_presets_exist():
    for name in ("l40s", "gh200"):
        hw = io.load_hardware(name)
        assert hw.supports_fp8 and hw.source


def test_held_out_refits_start_from_the_uncalibrated_constants(monkeypatch):
    """Issue 28 item 2: a refit that started from the fit that saw every row would carry what the
    held-out model taught it; each starts where the shipped fit starts, without that model's rows."""
    from autoparallel.costmodel.inference import InferenceEfficiency
    from autoparallel.serve import fit as serve_fit
    calls = []

    def recording_fit(measured, rows, start, tol=1e-4):
        calls.append((set(rows["model"]), start, tol))
        return start
    monkeypatch.setattr(serve_fit, "fit", recording_fit)
    measured = load_serving_runs()[-1]
    serve_fit.leave_one_model_out(measured)
    models = set(measured.predicted_rows["model"])
    assert len(calls) == len(models)
    for (seen, start, tol), held in zip(calls, measured.predicted_rows["model"].unique()):
        assert held not in seen and seen == set(fit_rows(measured)["model"]) - {held}
        assert start == InferenceEfficiency() and tol == 1e-4


def test_the_mlperf_simulation_runs_under_a_progress_display(monkeypatch):
    """`validate --inference` simulated the MLPerf runs for about half a minute with nothing on the
    terminal after the refits' bar had gone: the simulation now runs under a bar of its own."""
    import pandas as pd

    from autoparallel.serve import validate as serve_validate
    live, seen = [], []

    class Recording:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            live.append(1)
            return self

        def __exit__(self, *exc):
            live.pop()

        def add_task(self, *args, **kwargs):
            return 0

        def advance(self, *args, **kwargs):
            pass
    monkeypatch.setattr(serve_validate, "transient_progress", Recording)
    for name in ("fastertransformer_report", "held_out_report", "not_predicted_serving_rows", "print_report",
                 "print_mlperf"):
        monkeypatch.setattr(serve_validate, name, lambda *a, **k: pd.DataFrame())
    monkeypatch.setattr(serve_validate, "mlperf_report",
                        lambda cross: seen.append(bool(live)) or (pd.DataFrame(), pd.Series(dtype=object)))
    monkeypatch.setattr(serve_validate, "held_out_mlperf_reports", lambda: seen.append(bool(live)) or [])
    assert serve_validate.run(None, False, None) == 0 and seen == [True, True] and not live


def test_the_per_model_table_never_cuts_a_name_at_80_columns():
    """At 80 columns `validate --inference` printed "tensorrt-…", "a100-sxm…", "Llama-2-7…" (7B and
    70B alike), "nan" for LOMO without cross-validation, and a narrowed table pointed at a --wide
    that validate does not have (session 47)."""
    import io as stdio

    from rich.console import Console

    from autoparallel.serve import validate as serve_validate
    report = pd.DataFrame({"engine": ["tensorrt-llm-0.10"] * 2 + ["fastertransformer"],
                           "hardware": ["a100-sxm-80g"] * 3, "model": ["Llama-2-70B", "Llama-2-7B", "GPT-3-175B"],
                           "error_pct": [5.0, -7.0, 3.0], "lomo_pct": [float("nan")] * 3})
    for width in (80, 200):
        out = stdio.StringIO()
        serve_validate._by_model_table(report, Console(file=out, width=width, force_terminal=True, color_system=None))
        text = out.getvalue()
        assert "…" not in text and "nan" not in text and "--wide" not in text
        assert all(w in text for w in ("tensorrt-llm-0.10", "a100-sxm-80g", "Llama-2-70B", "Llama-2-7B"))
        assert max(map(len, text.splitlines())) <= width
        assert ("not shown here (see --json): max in-sample %" in text) == (width == 80)
