"""How well the serving cost model predicts published measurements, in sample and held out.

``autoparallel validate --inference`` prints, per engine, GPU and model, the mean absolute error
of the fitted constants on their own rows (in sample) and of refits that never saw the model
(leave-one-model-out: the constants refitted without that model's rows, then its rows
predicted; ``--no-cross-validation`` skips these refits), for FasterTransformer's A100 latencies (``inference_runs.csv``, static batching) and
TensorRT-LLM's in-flight batching throughput tables (``serving_runs.csv``), then the MLPerf
Inference Offline / Server runs through the traffic simulation (``serve/mlperf.py``: tokens/s and
the Server p99 TTFT / TPOT in sample and LOMO, the p99 end-to-end latency, per round, GPU, benchmark
and scenario; then the held-out MLPerf groups no constant saw, NVIDIA's and AMD's v5.1 runs
(``mlperf.held_out_sets``: in sample only, Interactive apart); ``--json`` adds every run;
``--no-mlperf`` skips them). The FT rows whose
``notes`` start with ``OOM`` have no latency: the memory model must say they do not fit
(reported apart). Rows of ``serving_runs.csv`` that are not predicted are counted by reason.

The constants come from ``python -m autoparallel.serve.fit`` (stored in the assumptions YAML).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from autoparallel.errors import UserError
from autoparallel.progress import transient_progress
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.fit import in_sample_and_lomo, shared_refits
from autoparallel.serve.measured import (load_fastertransformer, load_serving_runs,
                                         not_predicted_serving_rows, predict)

GROUP = ["engine", "hardware", "model"]
# validate has no --wide: a column a narrow terminal drops is in the JSON
NOT_SHOWN = "not shown here (see --json):"


def fastertransformer_report(runs: Path | None = None) -> pd.DataFrame:
    """Every FT row (OOM rows included) with its predicted latency, memory and fit."""
    measured = load_fastertransformer(runs)
    out = predict(measured, efficiency_for(measured.engine.name), measured.frame)
    return out.rename(columns={"predicted": "predicted_ms"})


def ft_summary(report: pd.DataFrame) -> dict:
    """FT latency error, the OOM check and the memory check against FT's noted use."""
    measured = report[~report["oom"]]
    oom = report[report["oom"]]
    err = measured["error_pct"].abs()
    by_model = {m: {"rows": len(g), "mean_abs_error_pct": float(g["error_pct"].abs().mean()),
                    "max_abs_error_pct": float(g["error_pct"].abs().max())}
                for m, g in measured.groupby("model", sort=False)}
    # Secondary check: the rows whose notes give FT's memory use (GB, single GPU).
    noted = report["notes"].fillna("").str.extract(r"memory usage ([0-9.]+) GB")[0].astype(float)
    mem = report[noted.notna()]
    noted_gib = noted[noted.notna()] * 1e9 / 2**30
    mem_err = 100.0 * (mem["memory_gib"] - noted_gib) / noted_gib
    return {"rows": int(len(measured)), "mean_abs_error_pct": float(err.mean()),
            "median_abs_error_pct": float(err.median()), "max_abs_error_pct": float(err.max()),
            "measured_rows_predicted_to_fit": int(measured["fits"].sum()),
            "oom_rows": int(len(oom)), "oom_rows_predicted_not_to_fit": int((~oom["fits"]).sum()),
            "memory_rows": int(len(mem)),
            "memory_mean_abs_error_pct": float(mem_err.abs().mean()) if len(mem) else float("nan"),
            "memory_mean_error_pct": float(mem_err.mean()) if len(mem) else float("nan"),
            "by_model": by_model}


def held_out_report(runs: Path | None = None, console: Console | None = None, cross: bool = True,
                    workers: int | None = None) -> pd.DataFrame:
    """Every predicted row of every engine with its in-sample and (``cross``) leave-one-model-out error,
    the refits in ``workers`` processes (default: one per CPU; ``processes.in_processes``)."""
    sets = [load_fastertransformer(runs), *load_serving_runs()]
    total = sum(m.predicted_rows["model"].nunique() for m in sets) if cross else None
    parts = []
    with transient_progress(console or Console(stderr=True)) as progress:
        task = progress.add_task("leave-one-model-out refits" if cross else "pricing the serving runs", total=total)
        for measured in sets:
            report = in_sample_and_lomo(measured, efficiency_for(measured.engine.name),
                                        lambda: progress.advance(task), cross, workers)
            parts.append(report[["engine", "hardware", "model", "weight_precision", "tp", "input_len",
                                 "output_len", "measured", "predicted", "error_pct", "lomo_pct", "fitted_on"]])
    return pd.concat(parts, ignore_index=True)


def _mean_abs(frame: pd.DataFrame) -> pd.Series:
    return pd.Series({"rows": len(frame), "in_sample_pct": frame["error_pct"].abs().mean(),
                      "lomo_pct": frame["lomo_pct"].abs().mean(), "max_in_sample_pct": frame["error_pct"].abs().max()})


def by_engine_gpu_model(report: pd.DataFrame) -> pd.DataFrame:
    """Mean |error| in sample and held out, per engine, GPU and model."""
    rows = report.groupby(GROUP, sort=False)[["error_pct", "lomo_pct"]].apply(_mean_abs).reset_index()
    rows["rows"] = rows["rows"].astype(int)
    return rows


def by_engine(report: pd.DataFrame) -> pd.DataFrame:
    """Per engine: the rows its fit used (FT: all; TensorRT-LLM: H100 and H200) and the rest."""
    out = []
    for (engine, fitted), frame in report.groupby(["engine", "fitted_on"], sort=False):
        out.append({"engine": engine, "rows_used_by_fit": bool(fitted), **_mean_abs(frame).to_dict()})
    return pd.DataFrame(out)


def _by_model_table(report: pd.DataFrame, console: Console) -> None:
    """Mean |error| per engine, GPU and model: a boxed table where it fits whole; in a narrower
    terminal the columns that fit (``report.fit``), so that rich never cuts an engine, GPU or model
    to "tensorrt-…", "Llama-2-7…" (which read the same for 7B and 70B)."""
    from autoparallel.report.fit import Column, cell, print_table, table_width
    title = "serving cost model vs published measurements: mean |error| % in sample and leave-one-model-out (LOMO)"
    columns = (Column("engine", "engine", knob=True), Column("hardware", "GPU", knob=True),
               Column("model", "model", knob=True), Column("rows", "rows"),
               Column("in_sample_pct", "in-sample %", "{:.1f}"), Column("lomo_pct", "LOMO %", "{:.1f}"),
               Column("max_in_sample_pct", "max in-sample %", "{:.1f}", drop=1))
    frame = by_engine_gpu_model(report).assign(model=lambda f: f["model"].str.split(" (", regex=False).str[0])
    rows = [[cell(r[c.key], c.fmt) for c in columns] for _, r in frame.iterrows()]
    widths = [max(len(c.header), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    if table_width(widths) + len(widths) + 3 > console.width:  # the box's borders and padding: rich would cut
        print_table(console, title, columns, rows, adds=NOT_SHOWN)
        return
    t = Table(title=title, header_style="bold")
    for c in columns:
        t.add_column(c.header, justify="left" if c.knob else "right")
    for r in rows:
        t.add_row(*r)
    console.print(t)


def print_report(report: pd.DataFrame, ft: pd.DataFrame, not_predicted: pd.DataFrame, console: Console) -> None:
    _by_model_table(report, console)
    from autoparallel.report.fit import cell
    s = Table(title="per engine (the rows each fit used, then the other GPUs' rows)", header_style="bold")
    for c in ("engine", "rows used by the fit", "rows", "in-sample %", "LOMO %"):
        s.add_column(c, justify="left" if c == "engine" else "right")
    for _, r in by_engine(report).iterrows():
        s.add_row(r["engine"], "yes" if r["rows_used_by_fit"] else "no (other GPUs)", str(int(r["rows"])),
                  *(cell(r[k], "{:.1f}") for k in ("in_sample_pct", "lomo_pct")))
    console.print(s)
    f = ft_summary(ft)
    _prose(console, f"FasterTransformer memory: {f['measured_rows_predicted_to_fit']} of {f['rows']} measured rows "
                  f"predicted to fit; {f['oom_rows_predicted_not_to_fit']} of {f['oom_rows']} rows FT reports as "
                  f"OOM predicted not to fit; memory per GPU vs FT's noted use ({f['memory_rows']} rows): mean "
                  f"|error| {f['memory_mean_abs_error_pct']:.1f} % (mean {f['memory_mean_error_pct']:+.1f} %)")
    counts = not_predicted["reason"].value_counts()
    _prose(console, "serving_runs.csv rows not predicted: "
                  + "; ".join(f"{n} {reason}" for reason, n in counts.items()))


def json_report(report: pd.DataFrame, ft: pd.DataFrame, not_predicted: pd.DataFrame) -> dict:
    import json
    records = lambda frame: json.loads(frame.to_json(orient="records"))  # noqa: E731
    return {"by_engine_gpu_model": records(by_engine_gpu_model(report)),
            "by_engine": records(by_engine(report)),
            "fastertransformer": ft_summary(ft),
            "rows": records(report),
            "not_predicted": {str(k): int(v) for k, v in not_predicted["reason"].value_counts().items()}}


def mlperf_report(cross: bool = True) -> tuple[pd.DataFrame, pd.Series]:
    """MLPerf Inference runs predicted by the traffic simulation (serve/mlperf.py) and the reasons
    of the rows left out."""
    from autoparallel.serve import mlperf
    rows, left_out = mlperf.load_rows()
    return mlperf.predict_rows(rows, cross=cross), left_out


def held_out_mlperf_reports() -> list[tuple[dict, pd.DataFrame, pd.Series]]:
    """Each further MLPerf Inference CSV (``mlperf.held_out_sets``: NVIDIA's and AMD's v5.1 rows)
    predicted with its engine, in sample only (no constant saw them, so a LOMO refit would hold
    nothing more out): (its settings, the predicted runs, the rows left out by reason)."""
    from autoparallel.serve import mlperf
    out = []
    for entry in mlperf.held_out_sets():
        rows, left_out = mlperf.load_rows(entry["csv"], entry["engine"], entry["engine_column"])
        out.append((entry, mlperf.predict_rows(rows, cross=False, engine=entry["engine"]), left_out))
    return out


def _mlperf_columns():
    from autoparallel.report.fit import Column
    pct = "{:.1f}"
    return (Column("round", "round"), Column("hardware", "GPU"), Column("model", "benchmark"),
            Column("scenario", "scenario"), Column("runs", "runs", "{:.0f}"),
            Column("tokens_pct", "tok/s %", pct), Column("lomo_pct", "LOMO %", pct),
            Column("ttft_p99_pct", "TTFT %", pct), Column("ttft_p99_lomo_pct", "TTFT LOMO", pct, drop=2),
            Column("tpot_p99_pct", "TPOT %", pct), Column("tpot_p99_lomo_pct", "TPOT LOMO", pct, drop=2),
            Column("latency_p99_pct", "e2e %", pct, drop=1))


def print_held_out_mlperf(entry: dict, report: pd.DataFrame, left_out: pd.Series, console: Console) -> None:
    """One held-out MLPerf group: the table per round, GPU, benchmark and scenario (Interactive's p99s
    beside Server's, and at the simulated replica's own rate) and the means per scenario."""
    from autoparallel.report.fit import Column, cell, print_table
    from autoparallel.serve import mlperf
    pct = "{:.1f}"
    columns = (Column("round", "round"), Column("hardware", "GPU"), Column("model", "benchmark"),
               Column("scenario", "scenario"), Column("runs", "runs", "{:.0f}"),
               Column("tokens_pct", "tok/s %", pct), Column("ttft_p99_pct", "TTFT %", pct),
               Column("tpot_p99_pct", "TPOT %", pct), Column("ttft_p99_own_pct", "own TTFT", pct, drop=2),
               Column("tpot_p99_own_pct", "own TPOT", pct, drop=2), Column("latency_p99_pct", "e2e %", pct, drop=1))
    table = mlperf.summary(report)
    print_table(console, f"MLPerf Inference held out (never fitted): {entry['group']}, {entry['csv']}, the "
                         f"{entry['engine']} engine; mean |error| % of output tokens/s and of the Server / "
                         "Interactive p99 TTFT / TPOT at the target QPS",
                columns, [[cell(r[c.key], c.fmt) for c in columns] for _, r in table.iterrows()],
                ("own: the p99s at the simulated replica's own largest rate within the bounds; "
                 "Interactive: Server with the round's tighter bounds",), adds=NOT_SHOWN)
    parts = []
    for m in mlperf.held_out_means(report):
        text = f"{m['scenario']} {m['tokens_pct']:.1f} % ({m['runs']} runs, mean {m['tokens_signed_pct']:+.1f} %)"
        if "ttft_p99_pct" in m and np.isfinite(m["ttft_p99_pct"]):
            text += f", p99 TTFT {m['ttft_p99_pct']:.1f} %, TPOT {m['tpot_p99_pct']:.1f} %"
        if m.get("overloaded_runs"):
            text += f" ({m['overloaded_runs']} overloaded at the submitted QPS: p99s not compared)"
        parts.append(text)
    _prose(console, f"MLPerf {entry['group']} held out, mean |error| of tokens/s per GPU: " + "; ".join(parts)
           + "; rows not predicted: " + "; ".join(f"{n} {why}" for why, n in left_out.value_counts().items()))


def print_mlperf(report: pd.DataFrame, left_out: pd.Series, console: Console) -> None:
    from autoparallel.report.fit import cell, print_table
    from autoparallel.serve import mlperf
    columns = _mlperf_columns()
    table = mlperf.summary(report)
    print_table(console, "MLPerf Inference, simulated: mean |error| % of output tokens/s (in sample, LOMO), "
                         "and of Server p99 TTFT / TPOT / end-to-end latency at the target QPS",
                columns, [[cell(r[c.key], c.fmt) for c in columns] for _, r in table.iterrows()],
                ("LOMO: constants refitted without the benchmark's model; e2e: p99 end-to-end latency "
                 "(in sample), whose p99 request is a ~1,000-token answer: it checks the mean iteration time",),
                adds=NOT_SHOWN)
    m = mlperf.scenario_means(report)
    parts = [f"{name} {m[f'{key}_tokens_pct']:.1f} %" + (f" (LOMO {m[f'{key}_tokens_lomo_pct']:.1f} %)"
                                                        if f"{key}_tokens_lomo_pct" in m else "")
             for name, key in (("Offline", "offline"), ("Server", "server")) if f"{key}_tokens_pct" in m]
    lomo = lambda key: f" (LOMO {m[key]:.1f} %)" if key in m else ""  # noqa: E731
    _prose(console, f"MLPerf mean |error| of tokens/s per GPU: {', '.join(parts)}; Server p99 TTFT "
                  f"{m['ttft_p99_pct']:.1f} %{lomo('ttft_p99_lomo_pct')}, p99 TPOT {m['tpot_p99_pct']:.1f} %"
                  f"{lomo('tpot_p99_lomo_pct')}, p99 end-to-end {m['latency_p99_pct']:.1f} %"
                  f"{_overloaded(m, int((report['scenario'] == 'Server').sum()))}; at the simulated "
                  f"Server rate (the one its tokens/s are taken at) p99 TTFT {m['ttft_p99_own_pct']:.1f} %"
                  f"{lomo('ttft_p99_own_lomo_pct')}, TPOT {m['tpot_p99_own_pct']:.1f} %"
                  f"{lomo('tpot_p99_own_lomo_pct')}; rows not predicted: "
                  + "; ".join(f"{n} {why}" for why, n in left_out.value_counts().items()))


def _prose(console: Console, text: str) -> None:
    """A paragraph broken between its phrases (``report.fit.phrase_lines``): the terminal's word wrap
    left "Server 6.5" / "% (LOMO 7.7 %)", a figure on one line and its unit on the next."""
    from rich.text import Text

    from autoparallel.report.fit import phrase_lines
    for line in phrase_lines(text, console.width):
        console.print(Text(line))


def _overloaded(means: dict, server_runs: int) -> str:
    """The Server runs the simulation cannot keep up with at the submitted QPS (no p99 to compare)."""
    n, lomo = means.get("server_overloaded_in_sample_runs", 0), means.get("server_overloaded_lomo_runs")
    if not n and not lomo:
        return ""
    return (f" over the runs simulated as keeping up; {n} of {server_runs} Server runs overloaded at the "
            f"submitted QPS in sample" + (f", {lomo} LOMO" if lomo is not None else "") + " (p99s not compared)")


def mlperf_json(report: pd.DataFrame, left_out: pd.Series) -> dict:
    """The MLPerf part of ``--json``: the headline means, the table per round, GPU, benchmark and
    scenario, every predicted run, and the rows left out by reason."""
    import json
    from autoparallel.serve import mlperf
    return {**mlperf.scenario_means(report),
            "by_round_gpu_benchmark_scenario": json.loads(mlperf.summary(report).to_json(orient="records")),
            "rows": mlperf.records(report),
            "not_predicted": {str(k): int(v) for k, v in left_out.value_counts().items()}}


def held_out_mlperf_json(entry: dict, report: pd.DataFrame, left_out: pd.Series) -> dict:
    """One held-out group's part of ``--json``: means per scenario and per GPU and scenario, the table
    per round, GPU, benchmark and scenario, every predicted run, the rows left out by reason."""
    import json
    from autoparallel.serve import mlperf
    return {"csv": entry["csv"], "engine": entry["engine"],
            "by_scenario": mlperf.held_out_means(report),
            "by_gpu_scenario": mlperf.held_out_means(report, ("hardware", "scenario")),
            "by_round_gpu_benchmark_scenario": json.loads(mlperf.summary(report).to_json(orient="records")),
            "rows": mlperf.records(report),
            "not_predicted": {str(k): int(v) for k, v in left_out.value_counts().items()}}


def run(runs: Path | None, as_json: bool, console: Console, cross: bool = True, with_mlperf: bool = True) -> int:
    ft = fastertransformer_report(runs)
    with shared_refits():  # MLPerf's LOMO refit of TensorRT-LLM without Llama-2-70B is one of the table's
        report = held_out_report(runs, cross=cross)
        not_predicted = not_predicted_serving_rows()
        ml, held = None, []
        if with_mlperf:  # about half a minute of simulated traffic, and as much for the held-out groups
            with transient_progress(Console(stderr=True)) as bar:
                bar.add_task("simulating the MLPerf Inference runs", total=None)
                ml = mlperf_report(cross)
                held = held_out_mlperf_reports()
    if as_json:
        import json
        out = json_report(report, ft, not_predicted)
        if ml is not None:
            out["mlperf"] = mlperf_json(*ml)
            out["mlperf"]["held_out"] = {entry["group"]: held_out_mlperf_json(entry, r, left)
                                         for entry, r, left in held}
        print(json.dumps(out, indent=1))
    else:
        print_report(report, ft, not_predicted, console)
        if ml is not None:
            print_mlperf(*ml, console)
        for entry, r, left in held:
            print_held_out_mlperf(entry, r, left, console)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoparallel.serve.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a flag only as spelled whole, as the CLI's
    p.add_argument("--runs", help="FasterTransformer runs CSV (default: the copy shipped in autoparallel/data/)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-cross-validation", action="store_true", help="in-sample errors only (no refits)")
    p.add_argument("--no-mlperf", action="store_true", help="skip the MLPerf Inference runs (simulated: ~30 s)")
    args = p.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)
    try:
        return run(Path(args.runs) if args.runs else None, args.json, console, cross=not args.no_cross_validation,
                   with_mlperf=not args.no_mlperf)
    except UserError as exc:
        print(f"autoparallel: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["fastertransformer_report", "ft_summary", "held_out_report", "by_engine_gpu_model", "by_engine",
           "print_report", "json_report", "run"]
