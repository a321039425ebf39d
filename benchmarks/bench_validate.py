"""Cost-model error on the published training runs: in-sample and leave-one-model-out.

In-sample: the constants shipped in the hardware presets (fitted on these rows). Held-out: each
model's rows predicted by constants refitted without them (every GPU family that ran it), from
the uncalibrated defaults. Issue 11 targets, dense rows of both files: in-sample mean <= 6 %, max
<= 15 %; held-out mean <= 10 %, max <= 25 %.

    python benchmarks/bench_validate.py
"""

from __future__ import annotations

import time

from autoparallel import measured_runs, validate


def main() -> None:
    start = time.perf_counter()
    report = validate.validate_training()
    seconds = time.perf_counter() - start
    print("| run | metric | measured | predicted | in-sample err % | held-out err % |")
    print("|---|---|---|---|---|---|")
    for _, r in report.iterrows():
        print(f"| {r.id} | {r.metric} | {r.measured:.4g} | {r.predicted:.4g} | {r.error_pct:+.1f} | "
              f"{r.heldout_error_pct:+.1f} |")
    print()
    print("| by | group | rows | in-sample mean / max abs % | held-out mean / max abs % | all fit |")
    print("|---|---|---|---|---|---|")
    for _, s in validate.summary(report).iterrows():
        print(f"| {s.by} | {s.group} | {s.rows} | {s.mean_abs_error_pct:.1f} / {s.max_abs_error_pct:.1f} | "
              f"{s.heldout_mean_abs_error_pct:.1f} / {s.heldout_max_abs_error_pct:.1f} | "
              f"{'yes' if s.all_fit else 'no'} |")
    print(f"\n{len(report)} rows, {validate.cross_validation_folds(measured_runs.load_runs())} refits, {seconds:.0f} s")


if __name__ == "__main__":
    main()
