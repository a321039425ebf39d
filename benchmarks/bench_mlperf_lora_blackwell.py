"""MLPerf Training Llama-2-70B LoRA on Blackwell (autoparallel/data/mlperf_training_lora_blackwell.csv):
the errors of validate's kind lora-blackwell per GPU and precision, per round, per CP, and the worst rows.

    python benchmarks/bench_mlperf_lora_blackwell.py                   # in sample only (~10 s)
    autoparallel validate --json > v.json
    python benchmarks/bench_mlperf_lora_blackwell.py --json v.json     # with the held-out columns
    python benchmarks/bench_mlperf_lora_blackwell.py --v50 DIR         # and the v5.0 logs' peak memory

v5.0's logs also print ``max_memory_usage`` (mlperf_common: torch.cuda.max_memory_allocated() / 2**30,
GiB): with ``--v50`` (the git dir of mlcommons/training_results_v5.0) the median over each system's logs
is set beside the predicted peak memory.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess

import pandas as pd

from autoparallel import resources
from autoparallel.measured_runs import load_runs, predict_row

FILE = "mlperf_training_lora_blackwell.csv"


def report(json_path: str | None) -> pd.DataFrame:
    raw = pd.read_csv(resources.data_file(FILE))
    raw["id"] = "mlperflora-" + raw["round"] + "-" + raw["submitter"] + "-" + raw["system"]
    if json_path:
        with open(json_path) as f:
            rows = pd.DataFrame(json.load(f)["rows"])
        rows = rows[rows.kind == "lora-blackwell"]
    else:
        rows = pd.DataFrame([predict_row(p) for p in load_runs([resources.data_file(FILE)])])
    return rows.merge(raw[["id", "round", "precision", "cp", "gpus", "global_batch_size"]], on="id")


def logged_peak_memory(git_dir: str, submitter: str, system: str) -> float:
    """Median over the system's v5.0 result logs of the largest max_memory_usage each prints (NaN: none)."""
    folder = f"{submitter}/results/{system}/llama2_70b_lora/"
    run = lambda *a: subprocess.run(["git", "-C", git_dir, *a], capture_output=True, text=True).stdout  # noqa: E731
    peaks = [max(map(float, found)) for f in run("ls-tree", "--name-only", "HEAD", folder).split()
             if (found := re.findall(r'"max_memory_usage": ([0-9.]+)', run("show", f"HEAD:{f}")))]
    return statistics.median(peaks) if peaks else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="`autoparallel validate --json` output (adds the held-out columns)")
    parser.add_argument("--v50", help="git dir of mlcommons/training_results_v5.0 (adds the logged peak memory)")
    args = parser.parse_args()
    rep = report(args.json)
    cols = ["error_pct"] + [c for c in ("heldout_error_pct", "heldout_system_error_pct") if c in rep]
    absolute = rep.assign(**{c: rep[c].abs() for c in cols})
    print(f"{len(rep)} rows, all fit: {bool(rep.fits.all())}; mean |error| %:",
          ", ".join(f"{c} {absolute[c].mean():.1f}" for c in cols))
    for by in (["gpu", "precision"], ["round"], ["round", "gpu"], ["cp"]):
        table = absolute.groupby(by)[cols].mean().round(1).add_prefix("|").add_suffix("|")
        table.insert(0, "rows", rep.groupby(by).size())
        table["signed error_pct"] = rep.groupby(by)["error_pct"].mean().round(1)
        print(f"\nby {' / '.join(by)}:\n{table.to_string()}")
    if args.v50:
        v50 = rep[rep["round"] == "v5.0"].copy()
        v50["logged_gib"] = [logged_peak_memory(args.v50, *i[len("mlperflora-v5.0-"):].split("-", 1)) for i in v50.id]
        v50["diff_pct"] = 100 * (v50.peak_memory_gib / v50.logged_gib - 1)
        print("\nv5.0 peak memory, predicted vs logged (GiB):\n" + v50.groupby(["gpu", "cp"]).agg(
            rows=("id", "size"), logged_gib=("logged_gib", "median"), predicted_gib=("peak_memory_gib", "median"),
            diff_pct=("diff_pct", "mean")).round(1).to_string()
            + f"\nmean |diff| {v50.diff_pct.abs().mean():.1f} %")
    worst = rep.reindex(rep.error_pct.abs().sort_values(ascending=False).index).head(10)
    print("\nworst rows:\n" + worst[["id", "gpu", "precision", "cp", "gpus", "measured", "predicted", *cols]]
          .round(3).to_string(index=False))


if __name__ == "__main__":
    main()
