"""Fit a GPU's efficiency constants to published runs and store them in its hardware YAML.

The fit minimises the mean squared log error between predicted and published figures over the
rows of the runs CSV measured on that GPU (each counted as its source counts, see
``autoparallel.validate``). Candidate layouts are generated once per row; each trial only
reprices them with new constants, so a fit takes tens of seconds. The result is written to a copy
of the hardware YAML in the user's preset folder (or ``--output``), below a marker comment that
names the data, the date and the before/after error, so the provenance of every fitted number
stays next to it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np
from rich.console import Console

from autoparallel import io, resources
from autoparallel.errors import UserError
from autoparallel.report.run_folder import write_atomic
from autoparallel.specs.hardware import Efficiency, HardwareSpec

# Fitted constants and their bounds; the rest of Efficiency keeps its default or YAML value.
FITTED = {
    "gemm_max": (0.3, 0.95),
    "gemm_half_gflop": (0.1, 200.0),
    "fp8_gemm_relative": (0.4, 1.0),
    "attention": (0.15, 0.9),
    "elementwise_bytes_per_token_hidden": (10.0, 250.0),
    "tp_overlap": (0.0, 0.95),
}
MARKER = "# --- fitted by `autoparallel calibrate`"


def _with(hw: HardwareSpec, values: dict) -> HardwareSpec:
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **values))


def fit(rows, hw: HardwareSpec, progress=None) -> tuple[dict, float, float]:
    """Return (fitted constants, mean |error| % before, after) for ``rows`` on ``hw``."""
    from scipy.optimize import minimize

    from autoparallel.validate import predict_row
    names = [n for n in FITTED if n != "fp8_gemm_relative" or any("fp8" in str(p.row["precision"]) for p in rows)]
    start = np.array([getattr(hw.efficiency, n) for n in names])
    low = np.array([FITTED[n][0] for n in names])
    high = np.array([FITTED[n][1] for n in names])

    def errors(x) -> np.ndarray:
        trial = _with(hw, dict(zip(names, np.clip(x, low, high))))
        out = [predict_row(p, trial) for p in rows]
        return np.array([np.log(r["predicted"] / r["measured"]) for r in out])

    def loss(x) -> float:
        if progress:
            progress()
        return float(np.mean(errors(x) ** 2))

    # Constants the rows cannot see (e.g. TP overlap when no row overlaps) keep their value.
    base = loss(start)
    moved = [loss(np.where(np.arange(len(names)) == i, np.clip(start * 1.3, low, high), start)) != base
             for i in range(len(names))]
    names = [n for n, m in zip(names, moved) if m]
    start, low, high = (a[np.array(moved)] for a in (start, low, high))

    result = minimize(loss, start, method="Powell", bounds=list(zip(low, high)),
                      options={"maxfev": 400, "xtol": 1e-3, "ftol": 1e-6})
    fitted = dict(zip(names, (float(v) for v in np.clip(result.x, low, high))))
    pct = lambda e: float(np.mean(np.abs(np.expm1(e))) * 100)  # noqa: E731
    return fitted, pct(errors(start)), pct(errors(result.x))


def _yaml_float(value: float) -> str:
    """Four significant digits that YAML 1.1 still reads as a float (it needs a dot: 3.0e-05)."""
    text = f"{value:.4g}"
    return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text


def user_preset(name: str) -> Path:
    """Where a calibration of hardware preset ``name`` is written: the user's preset folder,
    never the installed package (a user preset of the same name takes the shipped one's place)."""
    return resources.user_dir() / "hardware" / f"{name}.yaml"


def write_block(path: Path, fitted: dict, efficiency: Efficiency, note: str, calibrated_on: str,
                source: Path | None = None) -> None:
    """Write hardware YAML ``source`` (default ``path`` itself) to ``path`` with its fitted block
    at the end replaced (or appended)."""
    text = (source or path).read_text()
    if MARKER in text:
        text = text[: text.index(MARKER)]
    values = {**dataclasses.asdict(efficiency), **fitted}
    lines = [MARKER, f"# {note}", f"calibrated_on: {calibrated_on!r}", "efficiency:"]
    lines += [f"  {k}: {_yaml_float(v)}" for k, v in values.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


def main(gpu: str, runs: Path | None, write: bool, console: Console, output: Path | None = None) -> dict:
    """Fit ``gpu`` to its rows of ``runs``; write the preset to ``output`` (default: the user's
    preset folder)."""
    from rich.progress import Progress

    from autoparallel.validate import default_runs, load_runs
    hw = io.load_hardware(gpu)
    runs_path = runs or default_runs()
    rows = [p for p in load_runs(runs_path) if p.hardware.name == hw.name]
    if not rows:
        raise UserError(f"no rows of {runs_path} were measured on {hw.name}; nothing to fit")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"fitting {hw.name} on {len(rows)} runs", total=None)
        fitted, before, after = fit(rows, hw, progress=lambda: bar.advance(task))
    for name, value in fitted.items():
        console.print(f"  {name}: {getattr(hw.efficiency, name):.4g} -> {value:.4g}")
    sources = sorted({p.row["id"].split("-")[0] for p in rows})
    console.print(f"mean |error| on {len(rows)} {hw.name} rows: {before:.1f} % -> {after:.1f} %")
    if write:
        path = output or user_preset(hw.name)
        note = (f"{dt.date.today().isoformat()}: {len(rows)} rows of {runs_path.name} "
                f"({', '.join(sources)}); mean |error| {before:.1f} % before, {after:.1f} % after")
        write_block(path, fitted, hw.efficiency, note,
                    f"{runs_path.name}: {len(rows)} {'/'.join(sources)} rows",
                    source=io.resolve_preset("hardware", gpu))
        console.print(f"wrote {path}")
    return fitted


# --- fitting to profiling jobs (issue 4) ----------------------------------------------------------
# What a profiled machine's own step times can pin down; bounds are wide because a CPU running
# the built-in transformer is far from a GPU (per-layer Python overhead, gloo over TCP).
MEASURED_FITTED = {
    "gemm_max": (0.05, 1.0),
    "gemm_half_gflop": (1e-4, 50.0),
    "attention": (0.01, 1.0),
    "elementwise_bytes_per_token_hidden": (5.0, 5000.0),
    "layer_overhead_s": (1e-7, 0.05),
    "nvlink": (0.01, 1.0),
}


def fit_measured(model, hw: HardwareSpec, rows, measured_step_s, names=None, slowdown=None
                 ) -> tuple[dict, float, float]:
    """Fit efficiency constants so the cost model's step time matches measured ones.

    ``rows``: a frame with the Plan columns of the measured layouts; ``measured_step_s`` their
    measured step times. Minimises the mean squared log error (Powell, in log space of the
    constants). ``slowdown`` (per row, default 1) multiplies the predicted step time: ranks that
    share a device, e.g. more processes than cores on a CPU, each get that much less of it.
    Returns (fitted constants, mean |error| % before, after).
    """
    from scipy.optimize import minimize

    from autoparallel.costmodel.estimate import estimate_columns
    from autoparallel.specs.plan import Plan
    names = list(names or MEASURED_FITTED)
    cols = {n: np.asarray(rows[n].to_numpy() if hasattr(rows[n], "to_numpy") else rows[n])
            for n in Plan.field_names()}
    measured = np.asarray(measured_step_s, dtype=float)
    factor = np.ones_like(measured) if slowdown is None else np.asarray(slowdown, dtype=float)
    low = np.log([MEASURED_FITTED[n][0] for n in names])
    high = np.log([MEASURED_FITTED[n][1] for n in names])
    start = np.clip(np.log([getattr(hw.efficiency, n) for n in names]), low, high)

    def errors(x) -> np.ndarray:
        trial = _with(hw, dict(zip(names, np.exp(np.clip(x, low, high)))))
        predicted = estimate_columns(model, trial, cols, 1.0)["step_time_s"] * factor
        return np.log(predicted / measured)

    def loss(x) -> float:
        return float(np.mean(errors(x) ** 2))

    result = minimize(loss, start, method="Powell", bounds=list(zip(low, high)),
                      options={"maxfev": 3000, "xtol": 1e-4, "ftol": 1e-8})
    fitted = dict(zip(names, (float(v) for v in np.exp(np.clip(result.x, low, high)))))
    pct = lambda e: float(np.mean(np.abs(np.expm1(e))) * 100)  # noqa: E731
    return fitted, pct(errors(start)), pct(errors(result.x))
