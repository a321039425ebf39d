"""Predict published training runs and measure the error, each metric counted as its source counts.

The runs are the rows of ``training_runs.csv``, ``training_runs_more.csv`` and
``training_runs_papers.csv`` (shipped in ``autoparallel/data/``), dense and mixture-of-experts,
reported apart (``kind``), and MLPerf Training's GPT-3 submissions (``mlperf_training_gpt3.csv``,
kind ``mlperf``: every knob pinned as submitted; predicted, never fitted, not even in the refits) and
NVIDIA's runs newer than the fit (``training_runs_newer.csv``: Megatron-Bridge's summaries after
25.11 and Megatron-LM's DeepSeek-V3 GB200 guide, kinds ``dense-newer`` / ``moe-newer``;
``finetune_runs_newer.csv``: those summaries' SFT and LoRA tables, kinds ``sft-newer`` /
``lora-newer``; ``training_runs_hybrid.csv``: their Nemotron 3 hybrid Mamba-Transformer runs, kind
``hybrid-newer``, and ``training_runs_dsv4.csv``: their DeepSeek-V4 runs, kind ``dsv4-newer``; MLPerf
Training's Llama-2-70B LoRA submissions on Blackwell, ``mlperf_training_lora_blackwell.csv``, kind
``lora-blackwell``, and on AMD Instinct GPUs, ``mlperf_training_lora_amd.csv``, kind ``lora-amd``; and its
Llama 3.1 405B / 8B pre-training submissions (``mlperf_training_llama31.csv``, kinds ``mlperf-llama3.1-405b``
/ ``mlperf-llama3.1-8b``, per model and GPU), each summarized apart (``HELD_APART_KINDS``); never fitted
either). Each row pins the layout it states; what the source leaves unstated (recompute, CPU
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

The MLPerf rows (GPT-3 and Llama-2-70B LoRA), submitted by many systems, are also held out by
*system* (``heldout_system_error_pct``): rows group by GPU and node-count family (``system_group``:
one node, 2-8, 9-64, more), and their GPU family's constants are refitted without every published
row of that GPU at that scale. The submitters' own system names cannot group them: 60 names for 66
LoRA rows, the same DGX H100 under a name per vendor, so each group would be one row of a file no fit
reads. A group whose GPU ran no published row at its scale (every H200 group) is predicted by its
family's constants refitted on all their published rows, from the uncalibrated start: no fit ever saw
that system. (Held out by model, the LoRA rows' refit leaves out the 70B NeMo rows instead.)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.measured_runs import (NEWER_SOURCES, PreparedRow, assumptions_key, load_runs, predict_row,
                                       validation_runs)
from autoparallel.processes import call, in_processes


def _refitted(family: str, rows: list[PreparedRow]):
    """``family``'s dense constants refitted from their uncalibrated values on ``rows`` (its GPUs'
    speeds too where the shipped preset holds some: ``calibrate.speed_donor``)."""
    shipped = io.load_hardware(family)
    start = calibrate.uncalibrated(shipped.efficiency)
    fitted = calibrate.fit(rows, start, donor=calibrate.speed_donor(shipped)).values if rows else {}
    return dataclasses.replace(start, **fitted)


def _refit_and_predict(rows: list[PreparedRow], group: str, family: str) -> dict[str, dict]:
    """One fold: refit ``family`` without ``group``'s rows, predict them."""
    members = [p for p in rows if p.family == family and not p.model.is_moe]
    efficiency = _refitted(family, [p for p in members if p.model_group != group and not p.validation_only])
    return {p.id: predict_row(p, efficiency) for p in members if p.model_group == group}


NODE_FAMILIES = ((1, "1 node"), (8, "2-8 nodes"), (64, "9-64 nodes"), (None, ">64 nodes"))


def system_group(p: PreparedRow) -> str:
    """The GPU and node-count family a row ran on ("h200 2-8 nodes"): what a held-out system is."""
    nodes = -(-int(p.row["num_gpus"]) // p.hardware.gpus_per_node)
    name = next(label for most, label in NODE_FAMILIES if most is None or nodes <= most)
    return f"{p.row['gpu']} {name}"


def _system_folds(rows: list[PreparedRow]) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(GPU family, ids of the published rows left out of its refit, ids of the validation-only
    rows predicted with it): one per system group, groups that leave out the same rows sharing one
    refit. The runs newer than the fit get no system fold: no fit sees any of them."""
    folds: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for p in rows:
        if not p.validation_only or p.model.is_moe or assumptions_key(p.id) in NEWER_SOURCES:
            continue
        group = system_group(p)
        left_out = tuple(sorted(q.id for q in rows if q.family == p.family and not q.validation_only
                                and not q.model.is_moe and system_group(q) == group))
        folds.setdefault((p.family, left_out), []).append(p.id)
    return [(family, left_out, tuple(ids)) for (family, left_out), ids in sorted(folds.items())]


def _refit_system_and_predict(rows: list[PreparedRow], family: str, left_out: tuple[str, ...],
                              predicted: tuple[str, ...]) -> dict[str, dict]:
    """One system fold: ``family`` refitted from its uncalibrated constants without ``left_out``."""
    efficiency = _refitted(family, [p for p in rows if p.family == family and not p.model.is_moe
                                    and not p.validation_only and p.id not in left_out])
    return {p.id: predict_row(p, efficiency) for p in rows if p.id in predicted}


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
    return _run(rows, [(refit, (group, family)) for refit, group, family in _folds(rows)], progress, workers)


def cross_validate_by_system(rows: list[PreparedRow], progress: Callable[[], None] | None = None,
                             workers: int | None = None) -> dict[str, dict]:
    """Leave-one-system-out for the validation-only (MLPerf) rows: ``{row id: prediction}`` with
    their GPU family refitted without the published rows of their system group."""
    return _run(rows, [(_refit_system_and_predict, fold) for fold in _system_folds(rows)], progress, workers)


def _run(rows: list[PreparedRow], folds: list[tuple[Callable, tuple]], progress: Callable[[], None] | None,
         workers: int | None) -> dict[str, dict]:
    """Every fold ``refit(rows, *args)``, in ``workers`` processes (default: one per CPU)."""
    held_out: dict[str, dict] = {}
    for predictions in in_processes(call, [(refit, rows, *args) for refit, args in folds], workers, progress):
        held_out.update(predictions)
    return held_out


def cross_validation_folds(rows: list[PreparedRow]) -> int:
    """How many refits ``cross_validate`` and ``cross_validate_by_system`` make (for a progress bar)."""
    return len(_folds(rows)) + len(_system_folds(rows))


def all_runs(runs: Sequence[Path] | None = None) -> list[PreparedRow]:
    """Every prepared row, dense and MoE (by default the published runs and the validation-only
    MLPerf rows)."""
    runs = runs or validation_runs()
    return load_runs(runs) + load_runs(runs, moe=True)


def validate_training(runs: Sequence[Path] | None = None, cross: bool = True,
                      progress: Callable[[], None] | None = None,
                      rows: list[PreparedRow] | None = None) -> pd.DataFrame:
    """One row per published run, dense and MoE (``kind``): the in-sample prediction and, with
    ``cross``, the leave-one-model-out one (``heldout_predicted``, ``heldout_error_pct``) and, for
    the MLPerf rows, the leave-one-system-out one (``system``, ``heldout_system_error_pct``; empty
    for the other rows). ``rows``: ``all_runs(runs)`` read already."""
    rows = all_runs(runs) if rows is None else rows
    report = pd.DataFrame([predict_row(p) for p in rows])
    if cross:
        held = cross_validate(rows, progress)
        report["heldout_predicted"] = [held[i]["predicted"] for i in report["id"]]
        report["heldout_error_pct"] = [held[i]["error_pct"] for i in report["id"]]
        by_system = cross_validate_by_system(rows, progress)
        report["system"] = [system_group(p) if p.id in by_system else None for p in rows]
        report["heldout_system_predicted"] = [by_system[i]["predicted"] if i in by_system else math.nan
                                              for i in report["id"]]
        report["heldout_system_error_pct"] = [by_system[i]["error_pct"] if i in by_system else math.nan
                                              for i in report["id"]]
    return report


# Kinds reported as a group of their own and left out of the per-source, per-GPU and per-system
# groups and of the tie bands: the Nemotron 3 hybrid Mamba-Transformer runs (training_runs_hybrid.csv),
# the first rows with Mamba-2 and LatentMoE layers, held out from every fit. Mixed into "bridge 26.08" or
# "gb300" their errors would move figures that describe the transformer rows.
HYBRID_KINDS = ("hybrid", "hybrid-newer")
# DeepSeek-V4's runs (training_runs_dsv4.csv): the first rows with its hybrid sparse attention, mHC and hash
# routing, held out the same way, in groups of their own ("dsv4 gpu").
DSV4_KINDS = ("dsv4", "dsv4-newer")
# MLPerf's LoRA submissions on Blackwell (mlperf_training_lora_blackwell.csv), held out the same way
# ("lora-blackwell gpu"): the Hopper LoRA rows' figures and the fitted rows' per-GPU groups stay theirs.
BLACKWELL_LORA_KINDS = ("lora-blackwell",)
# MLPerf Training's Llama 3.1 pre-training submissions (mlperf_training_llama31.csv, v5.0-v5.1): record runs on
# B200 to GB300 in FP8 and NVFP4, never fitted; reported per model and GPU ("mlperf-llama gpu") and kept out of
# the per-source, per-GPU and per-system groups and of the tie bands, whose figures describe the other rows.
MLPERF_LLAMA_KINDS = ("mlperf-llama3.1-405b", "mlperf-llama3.1-8b")
# MLPerf's LoRA rows on AMD Instinct GPUs (mlperf_training_lora_amd.csv): no constant is fitted on an AMD GPU,
# each prices with an NVIDIA family's (efficiency_from); held out the same way, in groups of their own ("amd gpu").
AMD_KINDS = ("lora-amd",)
HELD_APART_KINDS = HYBRID_KINDS + DSV4_KINDS + BLACKWELL_LORA_KINDS + MLPERF_LLAMA_KINDS + AMD_KINDS


def held_apart(report: pd.DataFrame) -> pd.Series:
    """True for the rows of ``HELD_APART_KINDS``."""
    return report["kind"].isin(HELD_APART_KINDS)


def summary(report: pd.DataFrame) -> pd.DataFrame:
    """Mean and max |error| for dense and MoE rows apart, then per source and per GPU (held-out
    beside in-sample); the ``HELD_APART_KINDS`` rows per kind and per GPU of their own ("hybrid gpu",
    "dsv4 gpu", "amd gpu")."""
    apart = held_apart(report)
    rest, hybrid = report[~apart], report[apart]
    groups = [("kind", name, g) for name, g in report.groupby("kind")]
    groups += [("source", name, g) for name, g in rest.groupby("source")]
    groups += [("gpu", name, g) for name, g in rest.groupby("gpu")]
    if "system" in report:
        groups += [("system", name, g) for name, g in rest.groupby("system")]
    dsv4, lora = hybrid["kind"].isin(DSV4_KINDS), hybrid["kind"].isin(BLACKWELL_LORA_KINDS)
    llama, amd = hybrid["kind"].isin(MLPERF_LLAMA_KINDS), hybrid["kind"].isin(AMD_KINDS)
    groups += [("hybrid gpu", name, g) for name, g in hybrid[~dsv4 & ~lora & ~llama & ~amd].groupby("gpu")]
    groups += [("dsv4 gpu", name, g) for name, g in hybrid[dsv4].groupby("gpu")]
    groups += [("lora-blackwell gpu", name, g) for name, g in hybrid[lora].groupby("gpu")]
    groups += [("mlperf-llama gpu", f"{kind.removeprefix('mlperf-llama3.1-')} {gpu}", g)
               for (kind, gpu), g in hybrid[llama].groupby(["kind", "gpu"])]
    groups += [("amd gpu", name, g) for name, g in hybrid[amd].groupby("gpu")]
    out = []
    for by, name, g in groups:
        entry = {"by": by, "group": name, "rows": len(g), "mean_abs_error_pct": g["error_pct"].abs().mean(),
                 "max_abs_error_pct": g["error_pct"].abs().max(), "all_fit": bool(g["fits"].all())}
        if "heldout_error_pct" in g:
            entry["heldout_mean_abs_error_pct"] = g["heldout_error_pct"].abs().mean()
            entry["heldout_max_abs_error_pct"] = g["heldout_error_pct"].abs().max()
        if "heldout_system_error_pct" in g:  # NaN where the group has no MLPerf row
            entry["heldout_system_mean_abs_error_pct"] = g["heldout_system_error_pct"].abs().mean()
            entry["heldout_system_max_abs_error_pct"] = g["heldout_system_error_pct"].abs().max()
        out.append(entry)
    return pd.DataFrame(out)


def _pct(value: float, sign: str = "") -> str:
    """A percentage cell; blank where a row has no such figure (NaN)."""
    return "" if pd.isna(value) else f"{value:{sign}.1f}"


# The per-row table takes this many columns (its ids run to 89 characters, its variants to 230); a narrower
# terminal gets each run as two lines, its id and then its figures (``_print_rows_narrow``).
WIDE_REPORT = 200
SHORT_METRIC = {"tokens_per_s_per_gpu": "tok/s/GPU", "iteration_time": "step s", "hw_tflops": "hw TFLOP/s",
                "model_tflops": "TFLOP/s"}


NARROW_HEADS = {"rows": "rows", "in-sample mean": "in\nmean", "in-sample max": "in\nmax", "held-out mean": "held\nmean",
                "held-out max": "held\nmax", "by-system mean": "sys\nmean", "by-system max": "sys\nmax",
                "all fit": "all\nfit"}


def fold_at_hyphens(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken after a '-' (a run id's fields stay whole:
    folding at the width cut 'gbs8192' into 'gbs819' / '2'); a field wider than a line is folded."""
    lines = [""]
    for field in re.split(r"(?<=-)", text):
        if lines[-1] and len(lines[-1]) + len(field) > width:
            lines.append("")
        lines[-1] += field
    return lines


def _print_rows_narrow(report: pd.DataFrame, console: Console, held: bool, by_system: bool) -> None:
    """The per-row table for a terminal narrower than ``WIDE_REPORT``: each run's id on a line of its
    own (folded, never cut), then its figures under fixed-width headers; the variant is left to
    ``--json`` (a terminal table cannot hold it)."""
    heads = [("metric", 10), ("measured", 9), ("predicted", 9), ("error %", 7)]
    heads += [("held-out %", 10)] if held else []
    heads += [("by system %", 11)] if by_system else []
    heads += [("fits", 4), ("mem GiB", 7)]
    console.print("predicted vs published: each run's id, then its figures (the knobs each was priced with: "
                  "--json)", markup=False, highlight=False)
    console.print("  " + " ".join(f"{h:<{w}}" if h == "metric" else f"{h:>{w}}" for h, w in heads),
                  style="bold", markup=False, highlight=False)
    for _, r in report.iterrows():
        for line in fold_at_hyphens(str(r["id"]), console.width):
            console.print(line, overflow="fold", markup=False, highlight=False)
        cells = [SHORT_METRIC.get(r["metric"], r["metric"]), f"{r['measured']:.4g}", f"{r['predicted']:.4g}",
                 f"{r['error_pct']:+.1f}"]
        cells += [f"{r['heldout_error_pct']:+.1f}"] if held else []
        cells += [_pct(r["heldout_system_error_pct"], "+")] if by_system else []
        cells += ["yes" if r["fits"] else "NO", f"{r['peak_memory_gib']:.1f}"]
        console.print("  " + " ".join(f"{c:<{w}}" if h == "metric" else f"{c:>{w}}"
                                      for c, (h, w) in zip(cells, heads)), markup=False, highlight=False)


def print_report(report: pd.DataFrame, console: Console) -> None:
    held = "heldout_error_pct" in report
    by_system = "heldout_system_error_pct" in report
    if console.width < WIDE_REPORT:
        _print_rows_narrow(report, console, held, by_system)
        _print_summary(report, console, held, by_system)
        return
    t = Table(title="predicted vs published", header_style="bold")
    columns = ["id", "metric", "measured", "predicted", "error %"] + (["held-out %"] if held else [])
    columns += ["by system %"] if by_system else []
    for c in columns + ["fits", "mem GiB", "variant"]:
        t.add_column(c, justify="right" if c not in ("id", "metric", "variant") else "left")
    for _, r in report.iterrows():
        cells = [r["id"], r["metric"], f"{r['measured']:.4g}", f"{r['predicted']:.4g}", f"{r['error_pct']:+.1f}"]
        cells += [f"{r['heldout_error_pct']:+.1f}"] if held else []
        cells += [_pct(r["heldout_system_error_pct"], "+")] if by_system else []
        t.add_row(*cells, "yes" if r["fits"] else "[red]NO[/red]", f"{r['peak_memory_gib']:.1f}",
                  escape(r["variant"]))
    console.print(t)
    _print_summary(report, console, held, by_system)


def _print_summary(report: pd.DataFrame, console: Console, held: bool, by_system: bool) -> None:
    """Mean and max |error| per group; under ``WIDE_REPORT`` columns the headers go on two lines
    ('in-sample' over 'mean'), the table has no side borders and each "by" (kind, source, GPU...)
    heads its block of groups instead of taking a column: at 80 columns that column (18 wide) left
    the figures 3 characters, '27.0' printed '27…'."""
    from rich import box
    narrow = console.width < WIDE_REPORT
    heads = ["by", "group", "rows", "in-sample mean", "in-sample max"] + (
        ["held-out mean", "held-out max"] if held else []) + (
        ["by-system mean", "by-system max"] if by_system else []) + ["all fit"]
    heads = heads[1:] if narrow else heads
    title = ("mean / max |error| %: in-sample" + (" and leave-one-model-out" if held else "")
             + (" (MLPerf rows: and leave-one-system-out)" if by_system else ""))
    title = "mean / max |error| % per group" if narrow else title  # the caption under it says what each is
    s = (Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
               collapse_padding=True) if narrow else Table(title=title, header_style="bold"))
    if narrow:
        s.caption = "in: in-sample" + (", held: leave-one-model-out" if held else "") + (
            ",\nsys: leave-one-system-out (MLPerf rows)" if by_system else "")
    for c in heads:  # the figures never wrap; a group's name folds first where the terminal is narrower still
        s.add_column(NARROW_HEADS.get(c, c) if narrow else c, no_wrap=narrow and c != "group",
                     overflow="fold", justify="left" if c in ("by", "group") else "right")
    previous = None
    for _, r in summary(report).iterrows():
        cells = [r["group"], str(r["rows"]), f"{r['mean_abs_error_pct']:.1f}", f"{r['max_abs_error_pct']:.1f}"]
        if held:
            cells += [f"{r['heldout_mean_abs_error_pct']:.1f}", f"{r['heldout_max_abs_error_pct']:.1f}"]
        if by_system:
            cells += [_pct(r["heldout_system_mean_abs_error_pct"]), _pct(r["heldout_system_max_abs_error_pct"])]
        cells.append("yes" if r["all_fit"] else "[red]no[/red]")
        if not narrow:
            s.add_row(r["by"], *cells)
            continue
        if r["by"] != previous:
            s.add_row(f"[bold]by {escape(r['by'])}[/bold]")
            previous = r["by"]
        s.add_row(" " + escape(cells[0]), *cells[1:])
    console.print(s)


def tie_bands(report: pd.DataFrame) -> dict:
    """The held-out mean |error| (a fraction) pooled per kind and per GPU family (the preset whose
    fitted constants a GPU uses) and kind, with row counts: the share of predicted throughput
    within which a search cannot tell layouts apart on that hardware. The ``HELD_APART_KINDS`` rows
    (never fitted) give the hybrid models' band and DeepSeek-V4's, pooled and per family, apart from the others;
    the MLPerf Llama 3.1 rows (``MLPERF_LLAMA_KINDS``: record submissions, not recipes a search ranks) give none."""
    report = report[~report["kind"].isin(MLPERF_LLAMA_KINDS)]
    presets = {gpu: io.load_hardware(gpu) for gpu in report["gpu"].unique()}
    errors = report.assign(family=report["gpu"].map({g: hw.efficiency_from or g for g, hw in presets.items()}),
                           vendor=report["gpu"].map({g: hw.vendor for g, hw in presets.items()}),
                           error=report["heldout_error_pct"].abs() / 100)
    held = held_apart(errors)
    pooled = errors[~held].groupby("kind")["error"].mean()
    nvidia = errors["vendor"] == "nvidia"
    by_family: dict[str, dict] = {}
    # Not another vendor's rows: their constants are an NVIDIA family's, borrowed; their errors are not that family's.
    for (fam, kind), group in errors[nvidia].groupby(["family", "kind"]):
        by_family.setdefault(fam, {}).update({kind: round(float(group["error"].mean()), 3), f"{kind}_rows": len(group)})
    bands = {"step_time_relative_error": round(float(pooled["dense"]), 3),
             "moe_step_time_relative_error": round(float(pooled["moe"]), 3) if "moe" in pooled else None}
    hybrid, dsv4 = errors["kind"].isin(HYBRID_KINDS), errors["kind"].isin(DSV4_KINDS)
    if hybrid.any():
        bands["hybrid_step_time_relative_error"] = round(float(errors.loc[hybrid, "error"].mean()), 3)
    if dsv4.any():
        bands["dsv4_step_time_relative_error"] = round(float(errors.loc[dsv4, "error"].mean()), 3)
    # A GPU not made by NVIDIA prices with a borrowed family's constants: its band is its vendor's rows' error.
    by_vendor = {vendor: {"error": round(float(group["error"].mean()), 3), "rows": len(group)}
                 for vendor, group in errors[~nvidia].groupby("vendor")}
    return {**bands, "by_family": dict(sorted(by_family.items())), **({"by_vendor": by_vendor} if by_vendor else {})}


def tie_bands_yaml(report: pd.DataFrame, date: str) -> str:
    """prediction_error.yaml as ``validate --tie-bands`` writes it."""
    import yaml
    bands = tie_bands(report)
    counts = report["kind"].value_counts()
    header = ("# How far a predicted step time may be from the measured one on a layout the calibration has not\n"
              "# seen. Ranked tables mark layouts whose predicted throughput is within this share of the best as\n"
              "# a tie: the cost model cannot tell them apart; measure them (search --profile job) to decide.\n"
              "# Written by `autoparallel validate --tie-bands FILE`; tests/test_validate.py checks it.\n")
    hybrid = int(report["kind"].isin(HYBRID_KINDS).sum())
    dsv4 = int(report["kind"].isin(DSV4_KINDS).sum())
    bands["source"] = (f"`autoparallel validate`, leave-one-model-out mean |error| over {counts.get('dense', 0)} "
                       f"dense and {counts.get('moe', 0)} MoE published rows"
                       + (f"; {hybrid} held-out hybrid rows for hybrid models" if hybrid else "")
                       + (f"; {dsv4} held-out DeepSeek-V4 rows for DeepSeek-V4" if dsv4 else "") + f", {date}")
    return header + yaml.safe_dump(bands, sort_keys=False, width=100)

