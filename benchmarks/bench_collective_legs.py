"""Every validated row's collectives over several NVLink domains: the two legs in series against NCCL's ring.

Before session 55 ``comm.Group.reduce_scatter_time`` added a hierarchical collective's NVLink leg
((g-1)/g of the buffer at the GPU's NVLink) and its network leg ((nodes-1)/nodes of S/g at one NIC)
one after the other (``series_time``, with the model's latency: one hop on each tier). NCCL runs a
reduce-scatter / all-gather over several nodes as one ring whose chunks cross NVLink and the NICs
at the same time: (n-1)/n of the buffer at the slower link, busBw = min(NVLink, per_node x NIC),
plus its tuner's ring latency, which grows with the ranks (NVIDIA/nccl@5067397c
src/graph/tuning.cc ncclTopoTuneModel, src/graph/search.cc: a ring's bwIntra = bwInter); that is
what the model prices since session 55 (s55h5: ``comm.ring_bus_bandwidth``,
``comm.nccl_ring_latency``; benchmarks/RESULTS.md). This prints, for each row of ``autoparallel
validate`` (the candidate it reports) and each of its groups that spans more than one domain (the
DP x CP group at the CTAs the row's config gives its communicators, ``dataparallel.cta_capped``;
the expert-data-parallel group; the TP group), one reduce-scatter of the heaviest stage's gradients
(TP: of one layer's activations) both ways, in one call, the ratio, and which link binds the ring;
then per GPU and group the rows and the mean ratio.

    PYTHONPATH=$PWD python benchmarks/bench_collective_legs.py [ID_SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from autoparallel.costmodel import comm, dataparallel
from autoparallel.costmodel.estimate import structure_params
from autoparallel.measured_runs import chosen, load_runs, priced, validation_runs


def scalar(value) -> float:
    return float(np.asarray(value).ravel()[0])


def series_time(group: comm.Group, nbytes) -> float:
    """The legs in series: (g-1)/g of the buffer at NVLink, then (nodes-1)/nodes of S/g at one NIC,
    plus the model's latency of the group (one hop on each tier)."""
    n, g = scalar(group.size), scalar(group.per_node)
    nodes = n / g
    return ((g - 1) / g * nbytes / scalar(group.nvlink) + (nodes - 1) / nodes * nbytes / g / scalar(group.network)
            + scalar(group.latency_s))


def legs(group: comm.Group, nbytes) -> dict | None:
    """Series (the model's) and ring time of one reduce-scatter of ``nbytes`` over ``group``; None
    inside one domain, where both are (g-1)/g of the buffer on NVLink."""
    if scalar(group.size) <= scalar(group.per_node):
        return None
    nvlink, nics = scalar(group.nvlink), scalar(group.per_node) * scalar(group.network)
    return dict(ranks=scalar(group.size), per_node=scalar(group.per_node), nvlink=nvlink, nics=nics,
                series=series_time(group, nbytes), ring=scalar(group.reduce_scatter_time(nbytes)),
                binds="NVLink" if nvlink < nics else "NICs")


def row_groups(p) -> list[tuple[str, dict]]:
    _, i = priced(p)
    x = chosen(p, i)
    dense, experts = (scalar(v) for v in x.by_structure(structure_params)[1])
    found = [("DPxCP", legs(dataparallel.cta_capped(x, x.dp_ranks), dense * scalar(x.grad_bytes))),
             ("TP", legs(x.tp_ranks, 2.0 * scalar(x.tokens) * x.model.hidden_size))]
    if x.model.is_moe:
        found.append(("EDP", legs(x.edp_ranks, experts * scalar(x.grad_bytes))))
    return [(name, found_legs) for name, found_legs in found if found_legs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="substrings of the rows' ids (default: every row)")
    args = parser.parse_args()
    runs = validation_runs()
    prepared = load_runs(runs) + load_runs(runs, moe=True)
    summary = collections.defaultdict(list)
    print(f"{'row':64s} {'GPU':13s} {'group':5s} {'ranks':>5s} {'/dom':>4s} {'NVLink':>7s} {'NICs':>6s}"
          f" {'series ms':>9s} {'ring ms':>8s} {'ring/ser':>8s} binds")
    for p in prepared:
        if args.rows and not any(s in p.id for s in args.rows):
            continue
        for name, g in row_groups(p):
            ratio = g["ring"] / g["series"]
            summary[(str(p.row["gpu"]), name, g["binds"])].append(ratio)
            print(f"{p.id[:64]:64s} {str(p.row['gpu']):13s} {name:5s} {g['ranks']:5.0f} {g['per_node']:4.0f}"
                  f" {g['nvlink'] / 1e9:7.1f} {g['nics'] / 1e9:6.1f} {1e3 * g['series']:9.2f} {1e3 * g['ring']:8.2f}"
                  f" {ratio:8.3f} {g['binds']}")
    print(f"\n{'GPU':13s} {'group':5s} {'binds':6s} {'rows':>4s} {'mean ring/series':>16s} {'min':>6s} {'max':>6s}")
    for (gpu, name, binds), ratios in sorted(summary.items()):
        print(f"{gpu:13s} {name:5s} {binds:6s} {len(ratios):4d} {np.mean(ratios):16.3f} {min(ratios):6.3f}"
              f" {max(ratios):6.3f}")


if __name__ == "__main__":
    main()
