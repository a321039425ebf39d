"""Blackwell Ultra (B300 / GB300) against Blackwell (B200 / GB200): signed error and same-layout speed ratios.

Reads one or two `autoparallel validate --json` files (before, after) and prints, per GPU x kind x
precision x model class (dense / MoE; the LoRA and MLPerf kinds apart), the mean signed error in sample
and held out (predicted over measured of the row's own metric: negative is predicted slow for the
tokens/s rows, predicted fast for the iteration-time rows of MLPerf and LoRA); then
`bench_newer_runs.gpu_pairs` (the same row id run on two GPUs: measured and predicted speed ratio,
second over first); with two files, every summary group's mean |error| before and after and every
row whose signed error moves by more than 2 points in sample or held out.

    PYTHONPATH=. python -m autoparallel validate --json > after.json
    PYTHONPATH=. python benchmarks/bench_blackwell_ultra.py before.json after.json
"""

from __future__ import annotations

import json
import sys

import pandas as pd

from bench_newer_runs import GPU_PAIRS, gpu_pairs

BLACKWELL = ("b200", "gb200", "b300", "gb300")
PRECISIONS = ("nvfp4", "mxfp8", "fp8-current", "fp8-delayed", "bf16")
MOE_MODELS = ("deepseek", "qwen3-30b", "qwen3-235b", "gpt-oss", "mixtral", "kimi", "nemotron-3")


def load(path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = json.load(open(path))
    return pd.DataFrame(data["rows"]), pd.DataFrame(data["summary"])


def precision(row_id: str) -> str:
    return next((p for p in PRECISIONS if f"-{p}-" in row_id), "as submitted")


def model_class(row: pd.Series) -> str:
    if row.kind.startswith(("lora", "mlperf", "sft")):
        return "finetune/mlperf"
    return "moe" if any(m in row.id for m in MOE_MODELS) else "dense"


def signed_table(rows: pd.DataFrame) -> pd.DataFrame:
    bw = rows[rows.gpu.isin(BLACKWELL)].copy()
    bw["precision"] = bw.id.map(precision)
    bw["class"] = bw.apply(model_class, axis=1)
    bw["held"] = bw.heldout_error_pct.fillna(bw.error_pct)
    return bw.groupby(["kind", "class", "precision", "gpu"]).agg(
        rows=("id", "size"), in_sample=("error_pct", "mean"), held_out=("held", "mean")).round(1)


def moved(before: pd.DataFrame, after: pd.DataFrame, points: float = 2.0) -> pd.DataFrame:
    both = before.set_index("id")[["kind", "error_pct", "heldout_error_pct"]].join(
        after.set_index("id")[["error_pct", "heldout_error_pct"]], rsuffix="_after")
    shift = pd.concat([(both.error_pct_after - both.error_pct).abs(),
                       (both.heldout_error_pct_after - both.heldout_error_pct).abs()], axis=1).max(axis=1)
    return both[shift > points].round(1)


def main(paths: list[str]) -> None:
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 1000)
    before, summary_before = load(paths[0])
    print("mean signed error %, Blackwell rows (before):\n", signed_table(before).to_string(), "\n")
    for path in paths[1:]:
        after, summary_after = load(path)
        print("mean signed error %, Blackwell rows (after):\n", signed_table(after).to_string(), "\n")
    pairs = gpu_pairs(before)
    print("same layout on two GPUs (before):\n", pairs.to_string(index=False))
    if len(paths) > 1:
        print("same layout on two GPUs (after):\n", gpu_pairs(after).to_string(index=False))
        key = ["by", "group"]
        cols = ["rows", "mean_abs_error_pct", "heldout_mean_abs_error_pct"]
        joined = summary_before.set_index(key)[cols].join(summary_after.set_index(key)[cols[1:]], rsuffix="_after")
        print("\nevery group, mean |error| % (in sample; held out), before and after:\n", joined.round(2).to_string())
        rows = moved(before, after)
        print(f"\n{len(rows)} rows whose signed error moves by more than 2 points:\n", rows.to_string())
    print("\npairs:", ", ".join(f"{b} / {a}" for a, b in GPU_PAIRS))


if __name__ == "__main__":
    main(sys.argv[1:] or ["/dev/stdin"])
