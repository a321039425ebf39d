"""Leave-one-out check of the calibration: fit a GPU's constants on all its published rows but
one, predict the one left out, repeat for every row. The held-out error is what a new layout
should expect; the in-sample error of `autoparallel validate` understates it.

    python benchmarks/bench_calibration_cv.py [--gpu h100-sxm]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from autoparallel import io, validate
from autoparallel.costmodel import calibrate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", default="h100-sxm")
    args = parser.parse_args()
    hw = io.load_hardware(args.gpu)
    rows = [p for p in validate.load_runs() if p.hardware.name == hw.name]
    print(f"| held-out run ({hw.name}) | measured | in-sample err % | held-out err % |")
    print("|---|---|---|---|")
    held, inside = [], []
    for i, row in enumerate(rows):
        fitted = calibrate.fit(rows[:i] + rows[i + 1:], hw.efficiency).values
        trial = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **fitted))
        out = validate.predict_row(row, trial)
        ins = validate.predict_row(row)
        held.append(abs(out["error_pct"]))
        inside.append(abs(ins["error_pct"]))
        print(f"| {out['id']} | {out['measured']:.4g} | {ins['error_pct']:+.1f} | {out['error_pct']:+.1f} |", flush=True)
    print(f"\nmean |err|: in-sample {np.mean(inside):.1f} %, held-out {np.mean(held):.1f} % "
          f"(max {np.max(held):.1f} %)")


if __name__ == "__main__":
    main()
