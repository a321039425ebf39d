"""Predict published training runs and measure the error, each metric counted as its source counts.

Each row of ``training_runs.csv`` pins the layout it states; what the source leaves unstated
(micro-batch size for Narayanan, recompute for NeMo) is searched with the assumptions in
``search_spaces/validation.yaml`` and the fastest layout that fits is taken, since the authors
tuned their runs. A published layout predicted not to fit is reported as such: the cost model
must say every published layout fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from autoparallel import io, resources
from autoparallel.costmodel import flops
from autoparallel.errors import UserError
from autoparallel.search.grid import evaluate
from autoparallel.space import SearchSpace, generate
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

DEFAULT_RUNS = resources.data_file("training_runs.csv")
ASSUMPTIONS = io.SEARCH_SPACES / "validation.yaml"
MEASURED = {"hw_tflops": "measured_hw_tflops_per_gpu", "iteration_time": "measured_iteration_time_s",
            "tokens_per_s_per_gpu": "measured_tokens_per_s_per_gpu"}


def default_runs() -> Path:
    return DEFAULT_RUNS


def source_of(run_id: str) -> str:
    return run_id.split("-")[0]


def model_from_row(row: pd.Series) -> ModelSpec:
    def opt_int(key):
        v = row.get(key)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
    return ModelSpec(
        name=str(row["model"]), num_layers=int(row["num_layers"]), hidden_size=int(row["hidden_size"]),
        ffn_hidden_size=int(row["ffn_hidden_size"]), num_attention_heads=int(row["num_attention_heads"]),
        num_query_groups=opt_int("num_query_groups"), vocab_size=int(row["vocab_size"]),
        seq_length=int(row["seq_length"]), activation=str(row["activation"]),
        normalization="rmsnorm" if row["activation"] == "swiglu" else "layernorm")


def _pins(row: pd.Series) -> dict:
    def given(key):
        v = row.get(key)
        return not (v is None or (isinstance(v, float) and math.isnan(v)) or v == "")
    pins = {k: int(row[k]) for k in ("tp", "pp", "cp", "vp", "ep", "mbs") if given(k)}
    if given("sp"):
        pins["sp"] = bool(int(row["sp"]))
    elif pins.get("tp", 1) > 1:
        pins["sp"] = True
    else:
        pins["sp"] = False
    if given("recompute"):
        pins["recompute"] = str(row["recompute"])
    pins["precision"] = str(row["precision"])
    pins["fp8_bf16_edge_layers"] = 0
    return pins


@dataclass(frozen=True)
class PreparedRow:
    """One published run with its candidate layouts generated once (calibration reprices them)."""

    row: pd.Series
    model: ModelSpec
    hardware: HardwareSpec
    metric: str
    memory_fraction: float
    candidates: pd.DataFrame


def prepare_row(row: pd.Series, assumptions: dict) -> PreparedRow:
    source = assumptions[source_of(row["id"])]
    model = model_from_row(row)
    hw = io.load_hardware(str(row["gpu"]))
    settings = {"tp_within_nvlink_domain": False, "full_recompute_fractions": [1.0], **source["space"]}
    space = io.from_dict(SearchSpace, settings, str(ASSUMPTIONS)).pinned(**_pins(row))
    candidates = generate(model, hw, int(row["num_gpus"]), int(row["gbs"]), space)
    candidates = candidates[candidates["reason"] == ""]
    if candidates.empty:
        broken = generate(model, hw, int(row["num_gpus"]), int(row["gbs"]), space)["reason"].iloc[0]
        raise UserError(f"{row['id']}: the published layout breaks a rule: {broken}")
    return PreparedRow(row, model, hw, source["metric"], space.memory_fraction, candidates)


def predict_row(prepared: PreparedRow, hw: HardwareSpec | None = None) -> dict:
    """The best predicted layout consistent with the row, and the metric its source reports."""
    row, model = prepared.row, prepared.model
    ranked = evaluate(model, hw or prepared.hardware, prepared.candidates, prepared.memory_fraction)
    fitting = ranked[ranked["fits"]]
    if fitting.empty:  # report the layout that needs least memory, marked as not fitting
        ranked = ranked.sort_values("peak_memory_gib")
    best = (fitting if not fitting.empty else ranked).iloc[0]
    gpus, gbs = int(row["num_gpus"]), int(row["gbs"])
    if prepared.metric == "hw_tflops":
        full = best["recompute"] == "full"
        predicted = flops.narayanan_flops_per_step(model, gbs, full) / (best["step_time_s"] * gpus) / 1e12
    elif prepared.metric == "iteration_time":
        predicted = best["step_time_s"]
    else:
        predicted = best["tokens_per_s_per_gpu"]
    measured = float(row[MEASURED[prepared.metric]])
    return {
        "id": row["id"], "source": source_of(row["id"]), "gpu": row["gpu"], "metric": prepared.metric,
        "measured": measured, "predicted": float(predicted),
        "error_pct": 100.0 * (predicted - measured) / measured,
        "fits": bool(best["fits"]), "peak_memory_gib": float(best["peak_memory_gib"]),
        "mbs": int(best["mbs"]), "recompute": best["recompute"],
        "recompute_num_layers": int(best["recompute_num_layers"]),
        "tp_comm_overlap": bool(best["tp_comm_overlap"]),
    }


RUN_COLUMNS = ("id", "model", "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
               "vocab_size", "activation", "seq_length", "gpu", "num_gpus", "gbs", "precision")


def read_runs_table(path: Path, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV of measured runs with a header, the given columns and at least one row; anything
    else is a UserError naming the file."""
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"runs CSV {path} does not exist") from None
    except pd.errors.EmptyDataError:
        raise UserError(f"runs CSV {path} is empty (expected a header and one row per run)") from None
    except (OSError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"cannot read runs CSV {path}: {' '.join(str(exc).split())[:200]}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UserError(f"runs CSV {path} lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise UserError(f"runs CSV {path} has a header but no rows")
    return frame


def load_runs(runs: Path | None = None) -> list[PreparedRow]:
    path = runs or default_runs()
    frame = read_runs_table(path, RUN_COLUMNS)
    assumptions = io.read_yaml(ASSUMPTIONS)
    unknown = sorted({source_of(str(i)) for i in frame["id"]} - set(assumptions))
    if unknown:
        raise UserError(f"{path}: no assumptions for source(s) {unknown} in {ASSUMPTIONS}")
    prepared = []
    for _, row in frame.iterrows():
        try:
            prepared.append(prepare_row(row, assumptions))
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{path}: row {row['id']}: {' '.join(str(exc).split())[:200]}") from None
    return prepared


def validate_training(runs: Path | None = None) -> pd.DataFrame:
    return pd.DataFrame([predict_row(p) for p in load_runs(runs)])


def summary(report: pd.DataFrame) -> pd.DataFrame:
    abs_err = report.assign(abs_error_pct=report["error_pct"].abs())
    groups = {"all": abs_err, **{s: g for s, g in abs_err.groupby("source")}}
    return pd.DataFrame([{"source": name, "rows": len(g), "mean_abs_error_pct": g["abs_error_pct"].mean(),
                          "max_abs_error_pct": g["abs_error_pct"].max(), "all_fit": bool(g["fits"].all())}
                         for name, g in groups.items()])


def print_report(report: pd.DataFrame, console: Console) -> None:
    t = Table(title="predicted vs published", header_style="bold")
    for c in ("id", "metric", "measured", "predicted", "error %", "fits", "mem GiB", "mbs", "recompute"):
        t.add_column(c, justify="right" if c not in ("id", "metric") else "left")
    for _, r in report.iterrows():
        rec = r["recompute"] + (f"({r['recompute_num_layers']})" if r["recompute_num_layers"] else "")
        t.add_row(r["id"], r["metric"], f"{r['measured']:.4g}", f"{r['predicted']:.4g}",
                  f"{r['error_pct']:+.1f}", "yes" if r["fits"] else "[red]NO[/red]",
                  f"{r['peak_memory_gib']:.1f}", str(r["mbs"]), rec)
    console.print(t)
    s = Table(title="absolute error by source", header_style="bold")
    for c in ("source", "rows", "mean |err| %", "max |err| %", "all fit"):
        s.add_column(c, justify="right")
    for _, r in summary(report).iterrows():
        s.add_row(r["source"], str(r["rows"]), f"{r['mean_abs_error_pct']:.1f}",
                  f"{r['max_abs_error_pct']:.1f}", "yes" if r["all_fit"] else "[red]no[/red]")
    console.print(s)


