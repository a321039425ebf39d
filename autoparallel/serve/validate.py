"""Predict FasterTransformer's published A100 latencies and measure the error; fit the constants.

``autoparallel validate --inference`` prints one row per measured point of
``../shared/data/inference_runs.csv`` (model, TP, PP, batch, input and output length, end-to-end
latency in ms) and the mean / max absolute error. Rows whose ``notes`` start with ``OOM`` have no
latency: they are checked the other way, the memory model must say they do not fit (reported,
not part of the latency error). How each row is read (FT's latency = context phase plus
``output_len`` decoder steps, FP16 weights and KV, the model shapes) is stated in
``search_spaces/inference_assumptions.yaml``.

The constants of ``InferenceEfficiency`` are fitted by

    python -m autoparallel.serve.validate --fit

which minimises the absolute log error of every latency row (scipy least squares, soft-L1
loss) and rewrites the fitted block at the end of the assumptions YAML.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from autoparallel import io, resources
from autoparallel.costmodel.inference import InferenceEfficiency, estimate_inference_columns
from autoparallel.errors import SpecError, UserError
from autoparallel.report.run_folder import write_atomic
from autoparallel.serve.assumptions import ASSUMPTIONS, FIT_MARKER, efficiency_for, load_assumptions
from autoparallel.specs.model import ModelSpec

DEFAULT_RUNS = resources.data_file("inference_runs.csv")
# Not fitted: attention (prompts here are <= 512 tokens, < 5 % of the time: the rows cannot pin
# it), fp8_gemm_relative (no FP8 rows), p2p_latency_us (every PP row crosses nodes).
FIT_KEYS = ("hbm", "gemm_max", "gemm_half_gflop", "roofline_sharpness",
            "layer_overhead_us", "pass_overhead_us", "allreduce_latency_us",
            "internode_allreduce_latency_us", "internode_p2p_latency_us", "elementwise_bytes_per_token_hidden",
            "sampling_ns_per_logit")
FIT_BOUNDS = {"hbm": (0.3, 1.0), "gemm_max": (0.3, 1.0), "gemm_half_gflop": (0.01, 100.0),
              "attention": (0.05, 1.0), "roofline_sharpness": (1.0, 20.0),
              "layer_overhead_us": (0.0, 500.0), "pass_overhead_us": (0.0, 20000.0),
              "allreduce_latency_us": (0.0, 500.0), "internode_allreduce_latency_us": (0.0, 2000.0),
              "internode_p2p_latency_us": (0.0, 5000.0), "elementwise_bytes_per_token_hidden": (0.0, 400.0),
              "sampling_ns_per_logit": (0.0, 50.0)}


def default_runs() -> Path:
    return DEFAULT_RUNS


def _model(name: str, shape, source: str) -> ModelSpec:
    if isinstance(shape, str):
        return io.load_model(shape)
    if not isinstance(shape, dict):
        raise SpecError(f"{source}: validation.models[{name!r}] must be a preset name or a shape")
    h = shape.get("hidden_size")
    data = {"name": name, "ffn_hidden_size": 4 * h if isinstance(h, int) else h, "vocab_size": 51200,
            "seq_length": 2048, "activation": "gelu", "normalization": "layernorm", **shape}
    return io.from_dict(ModelSpec, data, f"{source}: validation.models[{name!r}]")


@dataclasses.dataclass
class Rows:
    """The CSV with the fixed inputs the model needs, grouped by model for vectorised calls."""

    frame: pd.DataFrame
    models: dict[str, ModelSpec]
    hardware: object
    memory_fraction: float
    precision: str
    decode_steps_is_output_len: bool
    microbatching: str
    flash_attention: bool


def load_rows(runs: Path | None = None) -> Rows:
    path = Path(runs) if runs else default_runs()
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as exc:
        raise UserError(f"cannot read inference runs CSV {path}: {exc}") from None
    needed = {"model", "tp", "pp", "input_len", "output_len", "batch_or_concurrency", "latency_ms", "notes"}
    missing = sorted(needed - set(frame.columns))
    if missing:
        raise UserError(f"{path}: missing column(s) {missing}")
    a = load_assumptions()["validation"]
    shapes = a["models"]
    unknown = sorted(set(frame["model"]) - set(shapes))
    if unknown:
        raise UserError(f"{path}: no model shape for {unknown} in {ASSUMPTIONS} (validation.models)")
    models = {name: _model(name, shapes[name], str(ASSUMPTIONS)) for name in frame["model"].unique()}
    frame = frame.copy()
    frame["oom"] = frame["notes"].fillna("").str.startswith("OOM")
    if (frame["latency_ms"].isna() & ~frame["oom"]).any():
        raise UserError(f"{path}: rows without latency_ms must be marked OOM in notes")
    if a["decode_steps"] not in ("output_len", "output_len - 1"):
        raise SpecError(f"{ASSUMPTIONS}: validation.decode_steps must be 'output_len' or 'output_len - 1'")
    return Rows(frame, models, io.load_hardware(a["hardware"]), float(a["memory_fraction"]),
                str(a["precision"]), a["decode_steps"] == "output_len", str(a["microbatching"]),
                bool(a["flash_attention"]))


def predict(rows: Rows, eff: InferenceEfficiency) -> pd.DataFrame:
    """Every row with its predicted latency (ms), memory (GiB) and fit."""
    parts = []
    for name, group in rows.frame.groupby("model", sort=False):
        n = len(group)
        cols = {"tp": group["tp"].to_numpy(), "pp": group["pp"].to_numpy(),
                "batch": group["batch_or_concurrency"].to_numpy(),
                "input_len": group["input_len"].to_numpy(), "output_len": group["output_len"].to_numpy(),
                "weight_precision": np.full(n, rows.precision), "kv_precision": np.full(n, rows.precision)}
        out_len = group["output_len"].to_numpy(dtype=float)
        steps = out_len if rows.decode_steps_is_output_len else out_len - 1
        est = estimate_inference_columns(rows.models[name], rows.hardware, eff, cols,
                                         rows.memory_fraction, decode_steps=steps,
                                         microbatching=rows.microbatching,
                                         flash_attention=rows.flash_attention)
        parts.append(group.assign(predicted_ms=est["latency_s"] * 1e3, ttft_ms=est["ttft_s"] * 1e3,
                                  tpot_ms=est["tpot_s"] * 1e3, memory_gib=est["memory_per_gpu_gib"],
                                  fits=est["fits"]))
    out = pd.concat(parts).loc[rows.frame.index]
    out["error_pct"] = 100.0 * (out["predicted_ms"] - out["latency_ms"]) / out["latency_ms"]
    return out


def validate_inference(runs: Path | None = None) -> pd.DataFrame:
    rows = load_rows(runs)
    return predict(rows, efficiency_for(rows.hardware.name))


def summary(report: pd.DataFrame) -> dict:
    measured = report[~report["oom"]]
    oom = report[report["oom"]]
    err = measured["error_pct"].abs()
    by_model = {m: {"rows": len(g), "mean_abs_error_pct": float(g["error_pct"].abs().mean()),
                    "max_abs_error_pct": float(g["error_pct"].abs().max())}
                for m, g in measured.groupby("model", sort=False)}
    # Secondary check: the rows whose notes give FT's memory use (GB, single GPU).
    noted = report["notes"].fillna("").str.extract(r"memory usage ([0-9.]+) GB")[0].astype(float)
    mem = report[noted.notna()]
    mem_err = 100.0 * (mem["memory_gib"] - noted[noted.notna()] * 1e9 / 2**30) / (noted[noted.notna()] * 1e9 / 2**30)
    return {"rows": int(len(measured)), "mean_abs_error_pct": float(err.mean()),
            "median_abs_error_pct": float(err.median()), "max_abs_error_pct": float(err.max()),
            "measured_rows_predicted_to_fit": int(measured["fits"].sum()),
            "oom_rows": int(len(oom)), "oom_rows_predicted_not_to_fit": int((~oom["fits"]).sum()),
            "memory_rows": int(len(mem)),
            "memory_mean_abs_error_pct": float(mem_err.abs().mean()) if len(mem) else float("nan"),
            "memory_mean_error_pct": float(mem_err.mean()) if len(mem) else float("nan"),
            "by_model": by_model}


def short_model(name: str) -> str:
    return name.split(" (")[0]


def print_report(report: pd.DataFrame, console: Console) -> None:
    t = Table(title="FasterTransformer A100 end-to-end latency: published vs predicted", header_style="bold")
    for c in ("model", "TP", "PP", "in", "out", "batch", "measured ms", "predicted ms", "error %", "fits", "mem GiB"):
        t.add_column(c, justify="left" if c == "model" else "right")
    for _, r in report.iterrows():
        measured = "OOM" if r["oom"] else f"{r['latency_ms']:.1f}"
        err = "-" if r["oom"] else f"{r['error_pct']:+.1f}"
        fits = "yes" if r["fits"] else "[red]no[/red]"
        t.add_row(short_model(r["model"]), str(r["tp"]), str(r["pp"]), str(r["input_len"]),
                  str(r["output_len"]), str(r["batch_or_concurrency"]), measured,
                  f"{r['predicted_ms']:.1f}", err, fits, f"{r['memory_gib']:.1f}")
    console.print(t)
    s = summary(report)
    by = Table(title="absolute error of end-to-end latency by model", header_style="bold")
    for c in ("model", "rows", "mean |err| %", "max |err| %"):
        by.add_column(c, justify="left" if c == "model" else "right")
    for m, v in s["by_model"].items():
        by.add_row(short_model(m), str(v["rows"]), f"{v['mean_abs_error_pct']:.1f}", f"{v['max_abs_error_pct']:.1f}")
    by.add_row("all", str(s["rows"]), f"{s['mean_abs_error_pct']:.1f}", f"{s['max_abs_error_pct']:.1f}")
    console.print(by)
    console.print(f"memory: {s['measured_rows_predicted_to_fit']} of {s['rows']} measured rows predicted to fit; "
                  f"{s['oom_rows_predicted_not_to_fit']} of {s['oom_rows']} rows FT reports as OOM "
                  f"predicted not to fit; "
                  f"memory per GPU vs FT's noted use ({s['memory_rows']} rows): mean |error| "
                  f"{s['memory_mean_abs_error_pct']:.1f} % (mean {s['memory_mean_error_pct']:+.1f} %)")


# --- fitting ----------------------------------------------------------------------------------

def fit(rows: Rows, start: InferenceEfficiency | None = None) -> tuple[InferenceEfficiency, pd.DataFrame]:
    from scipy.optimize import least_squares
    start = start or InferenceEfficiency()
    lo = np.array([FIT_BOUNDS[k][0] for k in FIT_KEYS])
    hi = np.array([FIT_BOUNDS[k][1] for k in FIT_KEYS])
    x0 = np.clip([getattr(start, k) for k in FIT_KEYS], lo + 1e-9, hi - 1e-9)
    scale = np.maximum(np.abs(x0), 1e-3)
    measured = ~rows.frame["oom"].to_numpy()

    def make(x):
        return dataclasses.replace(start, **{k: float(v) for k, v in zip(FIT_KEYS, x)})

    def residuals(x):
        pred = predict(rows, make(x))
        return np.log(pred["predicted_ms"].to_numpy()[measured] / pred["latency_ms"].to_numpy()[measured])

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, loss="soft_l1", f_scale=0.05)
    eff = make(result.x)
    return eff, predict(rows, eff)


def write_fit(eff: InferenceEfficiency, hardware: str, report: pd.DataFrame, runs: Path) -> None:
    """Replace the fitted block (after FIT_MARKER) at the end of the assumptions YAML."""
    text = ASSUMPTIONS.read_text()
    head = text.split(FIT_MARKER)[0].rstrip("\n")
    s = summary(report)
    values = "\n".join(f"    {k}: {round(getattr(eff, k), 4)}" for k in FIT_KEYS)
    block = (f"{FIT_MARKER}\n"
             f"# {dt.date.today().isoformat()}: {s['rows']} latency rows of {runs.name} "
             f"(FasterTransformer, A100, FP16);\n"
             f"# mean |error| {s['mean_abs_error_pct']:.1f} %, max {s['max_abs_error_pct']:.1f} %. Reproduce:\n"
             f"#   python -m autoparallel.serve.validate --fit\n"
             f"# Not fitted (the rows cannot pin them): attention (prompts <= 512 tokens), fp8_gemm_relative\n"
             f"# (no FP8 rows; the training default), p2p_latency_us (every PP row here crosses nodes).\n"
             f"efficiency:\n  default:\n{values}\n    attention: {eff.attention}\n"
             f"    fp8_gemm_relative: {eff.fp8_gemm_relative}\n    p2p_latency_us: {eff.p2p_latency_us}\n")
    write_atomic(ASSUMPTIONS, head + "\n\n" + block)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoparallel.serve.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", help="inference runs CSV (default: the copy shipped in autoparallel/data/)")
    p.add_argument("--fit", action="store_true", help="fit the constants and rewrite the assumptions YAML")
    p.add_argument("--dry-run", action="store_true", help="with --fit: print, do not write")
    args = p.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        rows = load_rows(Path(args.runs) if args.runs else None)
        if args.fit:
            eff, report = fit(rows)  # always from the class defaults: the same command, the same fit
            console.print({k: round(getattr(eff, k), 4) for k in FIT_KEYS})
            if not args.dry_run:
                write_fit(eff, rows.hardware.name, report, Path(args.runs) if args.runs else default_runs())
        else:
            report = predict(rows, efficiency_for(rows.hardware.name))
        print_report(report, console)
    except UserError as exc:
        print(f"autoparallel: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["validate_inference", "summary", "print_report", "fit", "load_rows", "predict"]
