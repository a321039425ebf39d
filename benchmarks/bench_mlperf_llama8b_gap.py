"""What the MLPerf Training Llama 3.1 8B rows miss per step: residuals against the cost model's terms.

The multi-node 8B rows of ``autoparallel/data/mlperf_training_llama31.csv`` run slower than predicted by a
near-constant time (session 50). This prints, per 8B row, measured minus predicted step time (ms) beside
what the model prices (its breakdown, the data-parallel reduce-scatter / all-gather before and after
overlap, at the CTAs the row's config gives the DP communicators: ``dataparallel.cta_capped``), the layout (GPUs, nodes, DP x CP group, micro-batches), the gradient bucket the config ran, and
the share of the model's unhidden reduce-scatter + all-gather that the residual plus the model's exposed
part would make (``share``: what the miss would be if it were all data-parallel traffic), and a
forward-only probe: the log's ``validation_step_time`` (the same DeltaTimingCallback as
``train_step_time``, NVIDIA's custom_callbacks.py; a forward through the same full-iteration graph
wrapper, no backward, no gradient reduction, no optimizer step) against the model's forward estimate.
Then the 8B and 405B groups' in-sample mean |error| under what-ifs that are not shipped (the
reduce-scatter or the all-gather left unhidden, both, a flat 0.04 s).

    python benchmarks/bench_mlperf_llama8b_gap.py            # needs the MLCommons mirrors for the logs
    python benchmarks/bench_mlperf_llama8b_gap.py --no-logs  # the model's side only

The forward estimate is the layer's ``forward`` plus a third of its other terms (FP8 casts, TP / CP
exchanges: the model prices a backward of twice the forward) and a third of the output layer and loss,
times the layers: an approximation, good to the few ms the table needs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import resources
from autoparallel.costmodel import comm, dataparallel, step_time
from autoparallel.costmodel.estimate import structure_params
from autoparallel.costmodel.layer_time import layers as layer_costs
from autoparallel.costmodel.stages import stage_times
from autoparallel.measured_runs import chosen, load_runs, priced

ROOT = Path(__file__).resolve().parents[1]
FILE = "mlperf_training_llama31.csv"
# NVIDIA's llama31_8b conf/custom.yaml: bucket_size: ${oc.decode:${oc.env:BUCKET_SIZE,134217728}}
DEFAULT_BUCKET = 134217728
GPUS_PER_NODE = {"gb200": 4, "gb300": 4}


def row_terms(p) -> dict:
    """The row's measured and predicted step, breakdown, DP traffic and forward estimate (s)."""
    out, i = priced(p)
    x = chosen(p, i)
    layers = layer_costs(x)
    stages = stage_times(x, layers)
    bottleneck = step_time.schedule(x, stages)
    window = float(np.ravel(layers.on("time", bottleneck.layers, bottleneck.moe, bottleneck.kinds))[0])
    dense = {k: float(np.ravel(v)[0]) for k, v in layers.dense.items() if k in ("forward", "compute", "time")}
    n_layers = float(np.ravel(bottleneck.layers)[0])
    params = float(np.ravel(x.by_structure(structure_params)[1][0])[0])  # the heaviest stage's, as dp_comm_time
    capped = dataparallel.cta_capped(x, x.dp_ranks)
    rs = float(np.ravel(capped.reduce_scatter_time(params * x.grad_bytes))[0])
    ag = float(np.ravel(capped.reduce_scatter_time(params * x.gather_bytes))[0])
    overlap = x.hw.efficiency.dp_overlap
    logits = float(np.ravel(stages.logits)[0])
    return dict(
        id=p.id, gpu=p.row["gpu"], gpus=int(p.row["num_gpus"]), measured=float(p.row["measured_iteration_time_s"]),
        predicted=float(out["step_time_s"][i]), m=int(np.ravel(x.m)[0]), tp=int(np.ravel(x.t)[0]),
        cp=int(np.ravel(x.c)[0]), group=int(np.ravel(x.dp_ranks.size)[0]),
        **{k: float(out[k][i]) for k in step_time.BREAKDOWN_KEYS},
        rs=rs, ag=ag, rs_exposed=float(comm.exposed_behind(rs, 2 / 3 * window, overlap)),
        ag_exposed=float(comm.exposed_behind(ag, window / 3, overlap)),
        forward=n_layers * (dense["forward"] + (dense["time"] - dense["compute"]) / 3) + logits / 3)


def raw_rows() -> dict:
    """The CSV's rows by validate's id (``mlperfllama-<8b|405b>-<round>-<submitter>-<system>``)."""
    raw = pd.read_csv(resources.data_file(FILE))
    size = raw["model"].str.removeprefix("llama3.1-")
    ids = "mlperfllama-" + size + "-" + raw["round"] + "-" + raw["submitter"] + "-" + raw["system"]
    return {i: row for i, (_, row) in zip(ids, raw.iterrows())}


def log_means(row, mirrors) -> tuple[float, float]:
    """(mean train_step_time, mean validation_step_time) of the row's log; each evaluation's first
    validation step left out (DeltaTimingCallback times it from the last training step's end: the
    evaluation's start-up)."""
    log = re.search(r"log:(\S+)", row["source"]).group(1)
    train, val, previous = [], [], None
    for rec in mllog(mirrors[row["round"]].show(log) or ""):
        value = rec.get("value")
        if rec.get("key") != "tracked_stats" or not isinstance(value, dict):
            continue
        if "validation_step_time" in value:
            if previous == "val":
                val.append(value["validation_step_time"])
            previous = "val"
        elif "train_step_time" in value and "reduced_train_loss" in value:
            train.append(value["train_step_time"])
            previous = "train"
    warm = max(2, len(train) // 10)
    return statistics.mean(train[warm:]), (statistics.mean(val) if val else float("nan"))


def bucket(row, mirrors) -> tuple[int, str]:
    """The gradient bucket (elements) and ALIGN_PARAM_GATHER the row's config leaves."""
    config = re.search(r"config:(\S+)", row["source"]).group(1)
    env, _ = run_config(mirrors[row["round"]], config)
    return int(env.get("BUCKET_SIZE", DEFAULT_BUCKET)), env.get("ALIGN_PARAM_GATHER", "False")


def same_system(rows) -> None:
    """A diagnostic, not a constant for the model: on one submitter's GPU and precision, the training
    step against the forward-only validation step of the same software, train = a * val + c by least
    squares; c is what a training step spends beyond a multiple of its forward (the backward, the
    data-parallel traffic, the optimizer step and the host loop outside the graph)."""
    groups: dict = {}
    for r in rows:
        if np.isfinite(r.get("val", np.nan)):
            groups.setdefault(r["system"], []).append(r)
    print("\nsame system: train = a * val + c (least squares over the system's rows; ms)")
    for key, members in sorted(groups.items()):
        if len({m["gpus"] for m in members}) < 2:
            continue
        a, c = np.polyfit([m["val"] for m in members], [m["measured"] for m in members], 1)
        off = "two rows: the line passes through both" if len(members) == 2 else ", ".join(
            f"{m['gpus']} GPUs {1e3 * (m['measured'] - a * m['val'] - c):+.1f}" for m in sorted(members, key=lambda m: m["gpus"]))
        print(f"  {' '.join(key):40s} a {a:4.2f}  c {1e3 * c:+6.1f}   rows off the line: {off}")


WHATIFS = {
    "shipped": lambda r: r["predicted"],
    "grad reduce-scatter unhidden": lambda r: r["predicted"] + r["rs"] - r["rs_exposed"],
    "param all-gather unhidden": lambda r: r["predicted"] + r["ag"] - r["ag_exposed"],
    "both unhidden": lambda r: r["predicted"] + r["rs"] + r["ag"] - r["rs_exposed"] - r["ag_exposed"],
    "flat 0.04 s": lambda r: r["predicted"] + 0.04,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-logs", action="store_true", help="skip the mirrors (validation steps, buckets)")
    args = parser.parse_args()
    prepared = load_runs([resources.data_file(FILE)])
    rows = [row_terms(p) for p in prepared]
    mirrors = None if args.no_logs else {k: Mirror(v) for k, v in MIRRORS.items() if Path(v).exists()}
    raw = raw_rows()
    print(f"{'row':50s} {'gpu':8s} {'GPUs':>4s} {'nodes':>5s} {'tp':>2s} {'cp':>2s} {'dpxcp':>5s} {'m':>2s} {'gbs':>4s} {'prec':5s} {'graph':5s} "
          f"{'meas':>6s} {'pred':>6s} {'resid':>6s} | {'RS':>5s} {'AG':>5s} {'DPexp':>5s} {'opt':>4s} | "
          f"{'bucket':>6s} {'val':>6s} {'fwd':>6s} {'vresid':>6s} | {'share':>5s}")
    for r in sorted(rows, key=lambda r: (r["gpu"], r["gpus"], r["id"])):
        if "-8b-" not in r["id"]:
            continue
        row = raw[r["id"]]
        nodes = r["gpus"] // GPUS_PER_NODE.get(r["gpu"], 8)
        val = b = float("nan")
        if mirrors and row["round"] in mirrors:
            _, val = log_means(row, mirrors)
            b = bucket(row, mirrors)[0] / 1e6
        r.update(val=val, system=(row["submitter"], r["gpu"], row["precision"]))
        knobs = dict(kv.split("=", 1) for kv in str(row["other_knobs"]).split("; ") if "=" in kv)
        graph = ("full" if knobs.get("FULL_CUDA_GRAPH") == "1" else
                 "layer" if "1" in (knobs.get("MCORE_CUDA_GRAPH"), knobs.get("LAYER_CUDA_GRAPH")) else "none")
        prec = {"fp8-current": "fp8cs", "fp8-delayed": "fp8ds"}.get(row["precision"], row["precision"])
        print(f"{r['id'][12:62]:50s} {r['gpu']:8s} {r['gpus']:4d} {nodes:5d} {r['tp']:2d} {r['cp']:2d} {r['group']:5d} "
              f"{r['m']:2d} {int(row['global_batch_size']):4d} {prec:5s} {graph:5s} {1e3 * r['measured']:6.1f} {1e3 * r['predicted']:6.1f} "
              f"{1e3 * (r['measured'] - r['predicted']):+6.1f} | {1e3 * r['rs']:5.1f} {1e3 * r['ag']:5.1f} "
              f"{1e3 * r['dp_comm_s']:5.1f} {1e3 * r['optimizer_s']:4.1f} | {b:5.0f}M {1e3 * val:6.1f} "
              f"{1e3 * r['forward']:6.1f} {1e3 * (val - r['forward']):+6.1f} | "
              f"{(r['measured'] - r['predicted'] + r['dp_comm_s']) / (r['rs'] + r['ag']):5.2f}")
    if mirrors:
        same_system(r for r in rows if "-8b-" in r["id"])
    print("\nin-sample mean |error| % (max), not shipped:")
    for name, predict in WHATIFS.items():
        line = []
        for label, part in (("8B", "-8b-"), ("405B", "-405b-")):
            errors = [100 * abs(predict(r) - r["measured"]) / r["measured"] for r in rows if part in r["id"]]
            line.append(f"{label} {np.mean(errors):5.1f} ({max(errors):5.1f})")
        residual = [1e3 * (r["measured"] - predict(r)) for r in rows if "-8b-" in r["id"]]
        print(f"  {name:30s} {'   '.join(line)}   8B residual {np.mean(residual):+6.1f} ms, sd {np.std(residual):5.1f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))
    from mlperf_pretrain_rows import run_config  # noqa: E402
    from mlperf_results import MIRRORS, Mirror, mllog  # noqa: E402
    main()
