"""The MLPerf Training Llama 3.1 8B rows' predicted step, term by term, against the measured step.

For the rows whose id contains an argument (default: UF's one-node B200 FP8 row, its 8-node CP-2 row and
NVIDIA's 512-GPU GB200 row): the step's breakdown (``step_time.BREAKDOWN_KEYS``, which add up to the
predicted step), one layer's terms (``layer_time.LAYER_TIME_TERMS``: forward + backward of one
micro-batch), the output layer, and the data-parallel traffic before overlap (the gradient
reduce-scatter and the parameter all-gather over the DP x CP group, as ``dataparallel`` prices them),
uncapped and with the CTAs the row's config gives the DP communicators (``dataparallel.cta_capped``),
with the layout the cost model read (TP, CP, DP, micro-batches, tokens per GPU). The measured step is
the row's (``mlperf_training_llama31.csv``: the log's mean ``train_step_time``).

    PYTHONPATH=$PWD python benchmarks/bench_mlperf_llama8b_terms.py [ID_SUBSTRING ...]
"""

from __future__ import annotations

import argparse

import numpy as np

from autoparallel import resources
from autoparallel.costmodel import dataparallel, step_time
from autoparallel.costmodel.candidates import DP_MAX_CTAS_COLUMN
from autoparallel.costmodel.estimate import structure_params
from autoparallel.costmodel.layer_time import LAYER_TIME_TERMS
from autoparallel.costmodel.layer_time import layers as layer_costs
from autoparallel.costmodel.stages import stage_times
from autoparallel.measured_runs import chosen, load_runs, priced

FILE = "mlperf_training_llama31.csv"
DEFAULT_ROWS = ("University-of-Florida-hpg.dgxb200x8.n1", "University-of-Florida-hpg.dgxb200x8.n8",
                "tyche_ngpu512")


def scalar(value) -> float:
    return float(np.asarray(value).ravel()[0])


def terms(p) -> None:
    out, i = priced(p)
    x = chosen(p, i)
    layers = layer_costs(x)
    stages = stage_times(x, layers)
    bottleneck = step_time.schedule(x, stages)
    n_layers, m = scalar(bottleneck.layers), scalar(x.m)
    measured, predicted = float(p.row["measured_iteration_time_s"]), float(out["step_time_s"][i])
    tp, cp, gpus = scalar(x.t), scalar(x.c), int(p.row["num_gpus"])
    tokens = int(p.row["gbs"]) * p.model.seq_length / gpus
    print(f"\n{p.id}: {gpus} x {p.row['gpu']}, TP {tp:.0f} CP {cp:.0f} DP {gpus / tp / cp:.0f}, GBS {p.row['gbs']},"
          f" {m:.0f} micro-batch(es) per step, {tokens:.0f} tokens per GPU per step")
    print(f"  measured {1e3 * measured:7.1f} ms, predicted {1e3 * predicted:7.1f} ms,"
          f" measured - predicted {1e3 * (measured - predicted):+7.1f} ms")
    print("  step breakdown (ms):")
    for key in step_time.BREAKDOWN_KEYS:
        print(f"    {key:14s} {1e3 * float(out[key][i]):8.2f}")
    print(f"  one layer, one micro-batch (ms; x {n_layers:.0f} layers x {m:.0f}):")
    for key in LAYER_TIME_TERMS + ("forward", "time"):
        value = scalar(layers.dense[key])
        if value:
            print(f"    {key:20s} {1e3 * value:8.3f}  per step {1e3 * value * n_layers * m:8.2f}")
    print(f"    {'output layer + loss':20s} {1e3 * scalar(stages.logits):8.3f}  per step"
          f" {1e3 * scalar(stages.logits) * m:8.2f}")
    params = scalar(x.by_structure(structure_params)[1][0])
    ctas = x.knobs[DP_MAX_CTAS_COLUMN][0] if DP_MAX_CTAS_COLUMN in x.knobs else "NCCL's default"
    print(f"  DP x CP group {scalar(x.dp_ranks.size):.0f} ranks"
          f" ({scalar(x.dp_ranks.per_node):.0f} in one NVLink domain),"
          f" {params / 1e9:.2f} B params per GPU, DP communicators' CTAs: {ctas};"
          f" dp_overlap {x.hw.efficiency.dp_overlap}, step_overhead_s {x.hw.efficiency.step_overhead_s}")
    for name, group in (("uncapped", x.dp_ranks), ("as run", dataparallel.cta_capped(x, x.dp_ranks))):
        rs = scalar(group.reduce_scatter_time(params * x.grad_bytes))
        ag = scalar(group.reduce_scatter_time(params * x.gather_bytes))
        print(f"    {name:8s}: reduce-scatter {1e3 * rs:6.1f} ms, all-gather {1e3 * ag:6.1f} ms before overlap")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", default=DEFAULT_ROWS, help="substrings of the rows' ids")
    args = parser.parse_args()
    for p in load_runs([resources.data_file(FILE)]):
        if p.id.startswith("mlperfllama-8b") and any(s in p.id for s in args.rows):
            terms(p)


if __name__ == "__main__":
    main()
