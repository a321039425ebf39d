"""NVFP4 rows against the FP8 / MXFP8 rows on the same GPUs: mean |error| and signed mean error per
(kind, GPU, precision) group of ``autoparallel validate --json``.

The precision comes from the run id for NVIDIA's Megatron-Bridge / NeMo rows (``-nvfp4-``,
``-mxfp8-``, ``-fp8-...``) and from the ``precision`` column of the MLPerf CSVs for the MLPerf rows
(whose ids name only round, submitter and system). Signs: ``error_pct`` as validate prints it;
for ``iteration_time`` rows negative = predicted faster, for throughput rows negative = predicted
slower, so the table adds a ``fast`` column, the signed error turned into "+ = predicted too fast".

    PYTHONPATH=. python -m autoparallel validate --json > /tmp/v.json
    PYTHONPATH=. python benchmarks/bench_nvfp4_heldout.py /tmp/v.json [/tmp/base.json]
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "autoparallel" / "data"
MLPERF_CSVS = {"mlperflora-": "mlperf_training_lora_blackwell.csv", "mlperfllama-": "mlperf_training_llama31.csv"}
BLACKWELL = ("b200", "b300", "gb200", "gb300")
TIME_METRICS = ("iteration_time", "step_time")


def mlperf_precisions() -> dict[str, str]:
    """{row id: precision} for the MLPerf rows, from the CSVs' round, submitter, system."""
    out = {}
    for prefix, name in MLPERF_CSVS.items():
        with open(DATA / name, newline="") as f:
            for row in csv.DictReader(f):
                # The Llama 3.1 ids name the model size too (mlperfllama-405b-v5.1-NVIDIA-...).
                size = row["model"].split("-")[-1] + "-" if prefix == "mlperfllama-" else ""
                out[f"{prefix}{size}{row['round']}-{row['submitter']}-{row['system']}"] = row["precision"]
    return out


def precision_of(row: dict, mlperf: dict[str, str]) -> str | None:
    """'nvfp4', 'fp8' (any FP8 recipe, MXFP8 included) or None (BF16 / not known)."""
    rid = row["id"]
    if rid in mlperf:
        p = mlperf[rid]
    else:
        p = rid.lower()
    if "fp4" in p:
        return "nvfp4"
    if "fp8" in p:
        return "fp8"
    return None


def groups(rows: list[dict], mlperf: dict[str, str]) -> dict[tuple, list[dict]]:
    """Rows on Blackwell GPUs of every kind holding an NVFP4 row, by (kind, gpu, precision)."""
    tagged = [(r, precision_of(r, mlperf)) for r in rows if r["gpu"] in BLACKWELL]
    nvfp4_kinds = {r["kind"] for r, p in tagged if p == "nvfp4"}
    out = defaultdict(list)
    for r, p in tagged:
        if p and r["kind"] in nvfp4_kinds:
            out[(r["kind"], r["gpu"], p)].append(r)
    return out


def fast_pct(row: dict) -> float:
    """Signed error with + = predicted faster than measured, whatever the metric."""
    e = row["error_pct"]
    return -e if row["metric"] in TIME_METRICS else e


def table(path: str, mlperf: dict[str, str]) -> dict[tuple, tuple[int, float, float]]:
    """{(kind, gpu, precision): (rows, mean |error| %, mean 'too fast' %)}."""
    rows = json.load(open(path))["rows"]
    return {k: (len(v), sum(abs(r["error_pct"]) for r in v) / len(v), sum(fast_pct(r) for r in v) / len(v))
            for k, v in sorted(groups(rows, mlperf).items())}


def main(argv: list[str]) -> None:
    mlperf = mlperf_precisions()
    after = table(argv[0], mlperf)
    before = table(argv[1], mlperf) if len(argv) > 1 else {}
    print(f"{'kind':<20} {'gpu':<6} {'prec':<6} {'n':>3} {'|err|':>7} {'fast':>7}"
          + (f" {'|err| was':>9} {'fast was':>8}" if before else ""))
    for k, (n, mae, fast) in after.items():
        line = f"{k[0]:<20} {k[1]:<6} {k[2]:<6} {n:>3} {mae:7.1f} {fast:+7.1f}"
        if k in before:
            line += f" {before[k][1]:9.1f} {before[k][2]:+8.1f}"
        print(line)
    # The NVFP4-specific bias: an NVFP4 group's 'too fast' minus its FP8 siblings' (same kind and GPU).
    print("\nNVFP4 minus FP8 'too fast' (points), same kind and GPU:")
    for (kind, gpu, prec), (_, _, fast) in after.items():
        fp8 = (kind, gpu, "fp8")
        if prec == "nvfp4" and fp8 in after:
            line = f"{kind:<20} {gpu:<6} {fast - after[fp8][2]:+7.1f}"
            if (kind, gpu, prec) in before and fp8 in before:
                line += f"   was {before[(kind, gpu, prec)][2] - before[fp8][2]:+7.1f}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
