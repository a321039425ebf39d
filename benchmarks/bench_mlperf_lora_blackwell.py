"""MLPerf Training Llama-2-70B LoRA on Blackwell (autoparallel/data/mlperf_training_lora_blackwell.csv):
the errors of validate's kind lora-blackwell per GPU and precision, per round, per CP, and the worst rows.

    python benchmarks/bench_mlperf_lora_blackwell.py                   # in sample only (~10 s)
    autoparallel validate --json > v.json
    python benchmarks/bench_mlperf_lora_blackwell.py --json v.json     # with the held-out columns
"""

from __future__ import annotations

import argparse
import json

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="`autoparallel validate --json` output (adds the held-out columns)")
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
    worst = rep.reindex(rep.error_pct.abs().sort_values(ascending=False).index).head(10)
    print("\nworst rows:\n" + worst[["id", "gpu", "precision", "cp", "gpus", "measured", "predicted", *cols]]
          .round(3).to_string(index=False))


if __name__ == "__main__":
    main()
