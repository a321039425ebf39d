"""How much of a held-out (LOMO) serving figure is the refit's starting point (session 41, s41h1).

``fit.refit_without`` refits an engine's constants from the uncalibrated defaults without one
model's rows. Its least squares can stop in different minima on two trees that differ a little
(session 41: s40h5's KV pool on s40h1's base). This dumps each tree's cold LOMO constants, then
refits each model from the other tree's constants as well and keeps the refit with the lower loss
on the rows it was fitted on (no held-out row is seen: both starts were fitted without the model).

    PYTHONPATH=$PWD python benchmarks/bench_issue29_lomo_starts.py --dump /tmp/a.json   # on tree A
    PYTHONPATH=$PWD python benchmarks/bench_issue29_lomo_starts.py --starts /tmp/b.json  # on tree A, B's dump
"""

import argparse
import dataclasses
import json

import numpy as np
import pandas as pd

from autoparallel.costmodel.inference import InferenceEfficiency
from autoparallel.serve import fit as F
from autoparallel.serve.measured import groups, load_serving_runs, predict, predicted_values


def loss(m, rows, eff) -> float:
    """``fit.fit``'s objective: soft-L1 (f_scale 0.05) of the log error."""
    r = np.log(predicted_values(m, eff, groups(m, rows), len(rows)) / rows["measured"].to_numpy(float))
    return float(np.sum(0.05 ** 2 * 2 * (np.sqrt(1 + (r / 0.05) ** 2) - 1)))


def inflight():
    return [m for m in load_serving_runs() if m.engine.batching == "inflight"]


def dump(path: str) -> None:
    out = {}
    for m in inflight():
        train = F.fit_rows(m)
        for name in m.predicted_rows["model"].unique():
            if (train["model"] != name).any():
                out[f"{m.engine.name}|{name}"] = dataclasses.asdict(F.refit_without(m, name))
    with open(path, "w") as f:
        json.dump(out, f)


def compare(path: str) -> None:
    with open(path) as f:
        starts = json.load(f)
    for m in inflight():
        rows, train = m.predicted_rows, F.fit_rows(m)
        cold, best = pd.Series(np.nan, index=rows.index), pd.Series(np.nan, index=rows.index)
        for name in rows["model"].unique():
            key = f"{m.engine.name}|{name}"
            if key not in starts:
                continue
            tr = train[train["model"] != name]
            a = F.refit_without(m, name)
            c = F.fit(m, tr, InferenceEfficiency(**starts[key]))
            la, lc = loss(m, tr, a), loss(m, tr, c)
            held = rows[rows["model"] == name]
            cold[held.index] = predict(m, a, held)["error_pct"]
            best[held.index] = predict(m, c if lc < la else a, held)["error_pct"]
            print(f"{key}: loss cold {la:.4f}, from the other start {lc:.4f}; held-out mean |error| "
                  f"{cold[held.index].abs().mean():.1f} -> {best[held.index].abs().mean():.1f} %", flush=True)
        fit_gpu = rows["hardware"].isin(F.target_gpus())
        print(f"{m.engine.name}: LOMO fit rows {cold[fit_gpu].abs().mean():.1f} -> {best[fit_gpu].abs().mean():.1f} %, "
              f"other GPUs {cold[~fit_gpu].abs().mean():.1f} -> {best[~fit_gpu].abs().mean():.1f} % (cold -> best of two)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--dump", help="write this tree's cold LOMO constants to this JSON")
    g.add_argument("--starts", help="refit from these constants too (another tree's --dump)")
    a = p.parse_args()
    dump(a.dump) if a.dump else compare(a.starts)
