"""The gap (measured step less predicted step) per micro-batch and MoE layer, for the MoE and hybrid rows of
the newer summaries on Blackwell GPUs, beside the recipe facts that set a per-layer host sync apart.

Read from a ``validate --json`` file (its ``error_pct``, on tokens/s: positive = predicted too fast), so the
figure is the cost model's own. Per row: the measured step (GBS x sequence / GPUs / measured tokens/s), the
predicted one (measured / (1 + error)), and the gap divided by the micro-batch slots of one pipeline stage
(m + pp - 1) and that stage's MoE layers (the model's MoE layers / pp): the time a term fixed per MoE layer and
micro-batch would have to add to close the row. Columns: EP, local experts, the CUDA-graph knob the row is
priced with (``full_iteration`` = sync-free: Megatron-Bridge pads experts to a 1.5 rank capacity there) and
the tokens a GPU holds per micro-batch.

Usage: ``PYTHONPATH=$PWD python benchmarks/bench_moe_layer_gaps.py VALIDATE.json [MODEL_PREFIX ...]`` (about a
minute: the rows are prepared as validate prepares them, to read each model's MoE layer count).
"""

from __future__ import annotations

import json
import math
import sys

from autoparallel.validate import all_runs

KINDS = ("moe-newer", "hybrid-newer")
GPUS = ("gb200", "gb300", "b200", "b300")


def graph_knob(variant: str) -> str:
    """The ``cuda_graph=`` entry of a row's variant string (validate prints the knob it priced)."""
    for part in variant.split():
        if part.startswith("cuda_graph="):
            return part.split("=", 1)[1].split("[", 1)[0]
    return "?"


def gap_row(p, result) -> dict:
    row = p.row
    gpus, gbs, mbs = int(row["num_gpus"]), int(row["gbs"]), int(row["mbs"])
    tp, pp, cp = (int(row[k] or 1) for k in ("tp", "pp", "cp"))
    ep = int(row["ep"] or 1)
    seq = p.model.seq_length
    measured = gbs * seq / gpus / float(row["measured_tokens_per_s_per_gpu"])
    predicted = measured / (1.0 + result["error_pct"] / 100.0)
    m = gbs // (mbs * gpus // (tp * pp * cp))
    moe_layers = p.model.num_moe_layers / pp
    return {"id": p.id.removeprefix("bridge-"), "error": result["error_pct"], "ep": ep,
            "local": p.model.num_experts // ep, "graph": graph_knob(result["variant"]),
            "tokens": mbs * seq // (tp * cp), "m": m, "pp": pp, "gap": measured - predicted,
            "per_layer_ms": 1e3 * (measured - predicted) / (m + pp - 1) / moe_layers}


def main() -> None:
    results = {r["id"]: r for r in json.load(open(sys.argv[1]))["rows"]}
    prefixes = tuple(sys.argv[2:])
    rows = []
    for p in all_runs():
        r = results.get(p.id)
        if (r is None or r["kind"] not in KINDS or p.row["gpu"] not in GPUS
                or not math.isfinite(float(p.row.get("measured_tokens_per_s_per_gpu") or "nan"))):
            continue
        if prefixes and not p.row["model"].startswith(prefixes):
            continue
        rows.append(gap_row(p, r))
    print(f"{'row':70s} {'err %':>6s} {'EP':>3s} {'loc':>4s} {'graph':>14s} {'tok/mb':>6s} {'m':>4s} {'pp':>2s}"
          f" {'gap s':>6s} {'ms / mb / MoE layer':>19s}")
    for g in sorted(rows, key=lambda g: (g["id"].split("-", 1)[1], g["id"])):
        print(f"{g['id'][:70]:70s} {g['error']:+6.1f} {g['ep']:3d} {g['local']:4d} {g['graph']:>14s} {g['tokens']:6d}"
              f" {g['m']:4d} {g['pp']:2d} {g['gap']:+6.2f} {g['per_layer_ms']:+19.2f}")


if __name__ == "__main__":
    main()
