"""Cost-model error on the published runs, with the fitted constants and with the uncalibrated
defaults side by side (issue 2: mean |error| <= 10 %, no row worse than 25 %).

    python benchmarks/bench_validate.py
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from autoparallel import validate
from autoparallel.specs.hardware import Efficiency


def main() -> None:
    rows = validate.load_runs()
    fitted = pd.DataFrame([validate.predict_row(p) for p in rows])
    default = pd.DataFrame([validate.predict_row(p, dataclasses.replace(p.hardware, efficiency=Efficiency()))
                            for p in rows])
    print("| run | metric | measured | uncalibrated | err % | calibrated | err % |")
    print("|---|---|---|---|---|---|---|")
    for (_, f), (_, d) in zip(fitted.iterrows(), default.iterrows()):
        print(f"| {f.id} | {f.metric} | {f.measured:.4g} | {d.predicted:.4g} | {d.error_pct:+.1f} | "
              f"{f.predicted:.4g} | {f.error_pct:+.1f} |")
    print()
    print("| source | rows | uncalibrated mean / max abs % | calibrated mean / max abs % |")
    print("|---|---|---|---|")
    for (_, f), (_, d) in zip(validate.summary(fitted).iterrows(), validate.summary(default).iterrows()):
        print(f"| {f.source} | {f.rows} | {d.mean_abs_error_pct:.1f} / {d.max_abs_error_pct:.1f} | "
              f"{f.mean_abs_error_pct:.1f} / {f.max_abs_error_pct:.1f} |")


if __name__ == "__main__":
    main()
