"""Issue 23 item 5: the fixed cost of a training step, fitted where it shows, and what grows as
the work per GPU shrinks.

1. ``step_overhead_s`` (``Efficiency``; priced in ``costmodel.step_time.optimizer_time``) fitted
   on MLPerf Training's GPT-3 rows (``autoparallel/data/mlperf_training_gpt3.csv``): NeMo runs
   whose steps range from 0.9 s to 36 s at the same layout, so the part of the step that does not
   scale with the micro-batches stands out. One constant, chosen by mean |error| on a grid;
   held out: each MLPerf round's rows predicted with the constant fitted on the other rounds.
   The other constants are the shipped ones (fitted on NeMo's rows, which keep the shipped
   floor), so the fit varies only this one.
2. The predicted step-time terms of Llama 3.1 8B on 8, 64 and 512 GPUs of each preset asked
   (GBS 64 and 512): the fixed terms' share grows as tokens per GPU fall.

    PYTHONPATH=$PWD python benchmarks/bench_fixed_costs.py [--gpu h100-sxm gb200]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pandas as pd

from autoparallel import io, measured_runs
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, estimate_columns
from autoparallel.space import SearchSpace, generate
from autoparallel.specs.plan import Plan

GRID = np.round(np.arange(0.0, 0.3001, 0.005), 3)


def mlperf_rows() -> list[measured_runs.PreparedRow]:
    return [r for r in measured_runs.load_runs(measured_runs.validation_runs()) if r.source == "mlperf"]


def errors(rows, floor: float) -> np.ndarray:
    """Signed % error of each row with ``step_overhead_s`` set to ``floor``."""
    return np.array([measured_runs.predict_row(
        r, dataclasses.replace(r.hardware.efficiency, step_overhead_s=floor))["error_pct"] for r in rows])


def fit(rows) -> tuple[float, np.ndarray]:
    """The grid value with the least mean |error| over ``rows`` (errors for every grid value)."""
    table = np.stack([errors(rows, f) for f in GRID])
    return float(GRID[np.argmin(np.abs(table).mean(axis=1))]), table


def fit_table() -> pd.DataFrame:
    rows = mlperf_rows()
    best, table = fit(rows)
    shipped = errors(rows, 0.0)
    rounds = np.array([str(r.row["id"]).split("-")[1] for r in rows])
    held = np.empty(len(rows))
    for name in sorted(set(rounds)):
        out = rounds == name
        others = np.abs(table[:, ~out]).mean(axis=1)
        held[out] = table[int(np.argmin(others)), out]
        print(f"  fitted without {name}: {GRID[int(np.argmin(others))]:.3f} s")
    print(f"fitted on all {len(rows)} rows: step_overhead_s = {best:.3f} s")
    return pd.DataFrame({
        "row": [r.id.removeprefix("mlperf-") for r in rows],
        "without": shipped.round(1),
        "in-sample": table[int(np.argmin(np.abs(table).mean(axis=1)))].round(1),
        "held-out round": held.round(1),
    })


def terms_table(gpus_list=(8, 64, 512), batches=(64, 512), presets=("h100-sxm",)) -> pd.DataFrame:
    """The fastest fitting layout's step-time terms, Llama 3.1 8B, per GPU count and batch."""
    model = io.load_model("llama3.1-8b")
    out = []
    for preset in presets:
        hw = io.load_hardware(preset)
        for gbs in batches:
            for gpus in gpus_list:
                frame = generate(model, hw, gpus, gbs, SearchSpace())
                frame = frame[frame["reason"] == ""].reset_index(drop=True)
                if frame.empty:
                    continue
                cols = {n: frame[n].to_numpy() for n in Plan.field_names()}
                est = estimate_columns(model, hw, cols)
                fits = est["fits"]
                if not fits.any():
                    continue
                i = int(np.argmax(np.where(fits, est["tokens_per_s_per_gpu"], -np.inf)))
                step = float(est["step_time_s"][i])
                row = {"gpu": preset, "gbs": gbs, "gpus": gpus, "tok/GPU": gbs * model.seq_length // gpus,
                       "layout": f"tp{frame['tp'][i]} pp{frame['pp'][i]} dp{gpus // (frame['tp'][i] * frame['pp'][i] * frame['cp'][i])} "
                                 f"mbs{frame['mbs'][i]}",
                       "step ms": round(1e3 * step, 1)}
                for key in BREAKDOWN_KEYS:
                    share = float(est[key][i]) / step
                    if share >= 0.005:
                        row[key.removesuffix("_s")] = f"{100 * share:.0f}%"
                out.append(row)
    return pd.DataFrame(out).fillna("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", nargs="+", default=["h100-sxm", "gb200"])
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    table = fit_table()
    print(table.to_string(index=False))
    for col in ("without", "in-sample", "held-out round"):
        print(f"{col:>15}: mean |error| {table[col].abs().mean():.1f} %, max {table[col].abs().max():.1f} %")
    print()
    print(terms_table(presets=tuple(args.gpu)).to_string(index=False))


if __name__ == "__main__":
    main()
