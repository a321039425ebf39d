"""Predict published training runs and measure the error, each metric counted as its source counts.

The runs are the rows of ``training_runs.csv``, ``training_runs_more.csv`` and
``training_runs_papers.csv`` (shipped in ``autoparallel/data/``), dense and mixture-of-experts,
reported apart (``kind``), and MLPerf Training's GPT-3 submissions (``mlperf_training_gpt3.csv``,
kind ``mlperf``: every knob pinned as submitted; predicted, never fitted, not even in the refits) and
NVIDIA's runs newer than the fit (``training_runs_newer.csv``: Megatron-Bridge's summaries after
25.11 and Megatron-LM's DeepSeek-V3 GB200 guide, kinds ``dense-newer`` / ``moe-newer``, never
fitted either). Each row pins the layout it states; what the source leaves unstated (recompute, CPU
offload and overlap for NeMo) is taken from what the source documents: the recipe the row ran
(``data/recipe_settings.yaml``), else the source's defaults (``search_spaces/validation.yaml``);
only what nothing documents (Narayanan's micro-batch size, the newer releases' recipes not read
yet) is searched, the fastest layout that fits taken, since the authors tuned their runs. Each row
reports the variant it was priced in (``variant``: every knob with where its value came from). A
layout fits only if it fits in that variant: the cost model must say every published layout fits
as run.

Two errors are reported. *In-sample*: with the constants shipped in the hardware presets, which
were fitted on these very rows. *Leave-one-model-out*: for every model architecture, the
constants of each GPU family that ran it are refitted without that model's rows and its rows
are predicted with them: the error a user's next model should expect. A MoE model's rows are
predicted with the MoE constants (``calibrate.MOE_FITTED``, fitted on the MoE rows of every GPU
together) refitted without that model; the dense constants never saw a MoE row.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.measured_runs import PreparedRow, load_runs, predict_row, validation_runs


def _refit_and_predict(rows: list[PreparedRow], group: str, family: str) -> dict[str, dict]:
    """One fold: refit ``family`` without ``group``'s rows, predict them."""
    members = [p for p in rows if p.family == family and not p.model.is_moe]
    rest = [p for p in members if p.model_group != group and not p.validation_only]
    start = calibrate.uncalibrated(io.load_hardware(family).efficiency)
    fitted = calibrate.fit(rest, start).values if rest else {}
    efficiency = dataclasses.replace(start, **fitted)
    return {p.id: predict_row(p, efficiency) for p in members if p.model_group == group}


def _refit_moe_and_predict(rows: list[PreparedRow], group: str, _family: str = "") -> dict[str, dict]:
    """One MoE fold: the MoE constants refitted on the other MoE models' rows (every GPU), from
    their uncalibrated values; the shipped dense constants (fitted on dense rows only) stay."""
    moe = [p for p in rows if p.model.is_moe]
    rest = [p for p in moe if p.model_group != group and not p.validation_only]
    fitted = calibrate.fit_moe(rest)[0] if rest else {}
    return {p.id: predict_row(p, dataclasses.replace(calibrate.uncalibrated_moe(p.hardware.efficiency), **fitted))
            for p in moe if p.model_group == group}


def _folds(rows: list[PreparedRow]) -> list[tuple[Callable, str, str]]:
    """(refit function, model group, GPU family) of every leave-one-model-out fold: dense models
    per family that ran them, MoE models once (their constants are shared by every GPU)."""
    dense = sorted({(p.model_group, p.family) for p in rows if not p.model.is_moe})
    moe = sorted({p.model_group for p in rows if p.model.is_moe})
    return [(_refit_and_predict, g, f) for g, f in dense] + [(_refit_moe_and_predict, g, "") for g in moe]


def cross_validate(rows: list[PreparedRow], progress: Callable[[], None] | None = None,
                   workers: int | None = None) -> dict[str, dict]:
    """Leave-one-model-out: ``{row id: prediction}`` with constants refitted without that model.

    Every GPU family (a preset and the presets that inherit its constants) that ran the model is
    refitted on its other rows. Each refit starts from the uncalibrated constants, so that what
    the held-out rows taught the shipped ones cannot leak into their prediction. The folds run
    in ``workers`` processes (default: one per CPU).
    """
    folds = _folds(rows)
    workers = min(workers or os.cpu_count() or 1, len(folds))
    held_out: dict[str, dict] = {}
    if workers <= 1:
        for refit, group, family in folds:
            held_out.update(refit(rows, group, family))
            if progress:
                progress()
        return held_out
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for done in concurrent.futures.as_completed(
                [pool.submit(refit, rows, group, family) for refit, group, family in folds]):
            held_out.update(done.result())
            if progress:
                progress()
    return held_out


def cross_validation_folds(rows: list[PreparedRow]) -> int:
    """How many refits ``cross_validate`` makes (for a progress bar)."""
    return len(_folds(rows))


def all_runs(runs: Sequence[Path] | None = None) -> list[PreparedRow]:
    """Every prepared row, dense and MoE (by default the published runs and the validation-only
    MLPerf rows)."""
    runs = runs or validation_runs()
    return load_runs(runs) + load_runs(runs, moe=True)


def validate_training(runs: Sequence[Path] | None = None, cross: bool = True,
                      progress: Callable[[], None] | None = None) -> pd.DataFrame:
    """One row per published run, dense and MoE (``kind``): the in-sample prediction and, with
    ``cross``, the leave-one-model-out one (``heldout_predicted``, ``heldout_error_pct``)."""
    rows = all_runs(runs)
    report = pd.DataFrame([predict_row(p) for p in rows])
    if cross:
        held = cross_validate(rows, progress)
        report["heldout_predicted"] = [held[i]["predicted"] for i in report["id"]]
        report["heldout_error_pct"] = [held[i]["error_pct"] for i in report["id"]]
    return report


def summary(report: pd.DataFrame) -> pd.DataFrame:
    """Mean and max |error| for dense and MoE rows apart, then per source and per GPU (held-out
    beside in-sample)."""
    groups = [("kind", name, g) for name, g in report.groupby("kind")]
    groups += [("source", name, g) for name, g in report.groupby("source")]
    groups += [("gpu", name, g) for name, g in report.groupby("gpu")]
    out = []
    for by, name, g in groups:
        entry = {"by": by, "group": name, "rows": len(g), "mean_abs_error_pct": g["error_pct"].abs().mean(),
                 "max_abs_error_pct": g["error_pct"].abs().max(), "all_fit": bool(g["fits"].all())}
        if "heldout_error_pct" in g:
            entry["heldout_mean_abs_error_pct"] = g["heldout_error_pct"].abs().mean()
            entry["heldout_max_abs_error_pct"] = g["heldout_error_pct"].abs().max()
        out.append(entry)
    return pd.DataFrame(out)


def print_report(report: pd.DataFrame, console: Console) -> None:
    held = "heldout_error_pct" in report
    t = Table(title="predicted vs published", header_style="bold")
    columns = ["id", "metric", "measured", "predicted", "error %"] + (["held-out %"] if held else [])
    for c in columns + ["fits", "mem GiB", "variant"]:
        t.add_column(c, justify="right" if c not in ("id", "metric", "variant") else "left")
    for _, r in report.iterrows():
        cells = [r["id"], r["metric"], f"{r['measured']:.4g}", f"{r['predicted']:.4g}", f"{r['error_pct']:+.1f}"]
        cells += [f"{r['heldout_error_pct']:+.1f}"] if held else []
        t.add_row(*cells, "yes" if r["fits"] else "[red]NO[/red]", f"{r['peak_memory_gib']:.1f}",
                  escape(r["variant"]))
    console.print(t)
    s = Table(title="mean / max |error| %: in-sample" + (" and leave-one-model-out" if held else ""),
              header_style="bold")
    for c in ["by", "group", "rows", "in-sample mean", "in-sample max"] + (
            ["held-out mean", "held-out max"] if held else []) + ["all fit"]:
        s.add_column(c, justify="left" if c in ("by", "group") else "right")
    for _, r in summary(report).iterrows():
        cells = [r["by"], r["group"], str(r["rows"]), f"{r['mean_abs_error_pct']:.1f}", f"{r['max_abs_error_pct']:.1f}"]
        if held:
            cells += [f"{r['heldout_mean_abs_error_pct']:.1f}", f"{r['heldout_max_abs_error_pct']:.1f}"]
        s.add_row(*cells, "yes" if r["all_fit"] else "[red]no[/red]")
    console.print(s)


def tie_bands(report: pd.DataFrame) -> dict:
    """The held-out mean |error| (a fraction) pooled per kind and per GPU family (the preset whose
    fitted constants a GPU uses) and kind, with row counts: the share of predicted throughput
    within which a search cannot tell layouts apart on that hardware."""
    family = {gpu: io.load_hardware(gpu).efficiency_from or gpu for gpu in report["gpu"].unique()}
    errors = report.assign(family=report["gpu"].map(family), error=report["heldout_error_pct"].abs() / 100)
    pooled = errors.groupby("kind")["error"].mean()
    by_family: dict[str, dict] = {}
    for (fam, kind), group in errors.groupby(["family", "kind"]):
        by_family.setdefault(fam, {}).update({kind: round(float(group["error"].mean()), 3), f"{kind}_rows": len(group)})
    return {"step_time_relative_error": round(float(pooled["dense"]), 3),
            "moe_step_time_relative_error": round(float(pooled["moe"]), 3) if "moe" in pooled else None,
            "by_family": dict(sorted(by_family.items()))}


def tie_bands_yaml(report: pd.DataFrame, date: str) -> str:
    """prediction_error.yaml as ``validate --tie-bands`` writes it."""
    import yaml
    bands = tie_bands(report)
    counts = report["kind"].value_counts()
    header = ("# How far a predicted step time may be from the measured one on a layout the calibration has not\n"
              "# seen. Ranked tables mark layouts whose predicted throughput is within this share of the best as\n"
              "# a tie: the cost model cannot tell them apart; measure them (search --profile job) to decide.\n"
              "# Written by `autoparallel validate --tie-bands FILE`; tests/test_validate.py checks it.\n")
    bands["source"] = (f"`autoparallel validate`, leave-one-model-out mean |error| over {counts.get('dense', 0)} "
                       f"dense and {counts.get('moe', 0)} MoE published rows, {date}")
    return header + yaml.safe_dump(bands, sort_keys=False, width=100)

