"""The Nemotron 3 hybrid rows' predicted step, term by term, as `autoparallel validate` prices them.

For the rows whose id starts with an argument (default: Nano and Super MXFP8 on GB300, release 26.08):
each layer kind's time per micro-batch and per step, the Mamba-2 mixer's parts (in/out projection
GEMMs, SSD scan, conv1d, grouped RMSNorm, MambaMixer's layout copies, casts), the E layer's parts
(routed and shared GEMMs, router, permutations, per-expert calls, casts, EP dispatch) and the output
layer. With ``--all`` (and no row named): every hybrid-newer row's measured and predicted step, the gap, and the factor
the Mamba kernels, the M layers or the E layers alone would need to close it. With ``--tp-pairs``: each TP-2 row
beside the TP-1 row of the same model, release and precision (GB200 beside GB300; B200 NVFP4 beside B200 MXFP8),
each row's gap per micro-batch, the TP-2 row's excess (its measured step less its predicted one scaled by the TP-1
row's measured / predicted), the TP collectives priced on it and the factor they would need to absorb the excess.
With ``--layer-terms`` (and row prefixes): each layer kind's ``layer_time.LAYER_TIME_TERMS`` that are not zero, its
forward and its total, ms per micro-batch (where a recipe's selective recompute or EP dispatch sits).

Usage: ``PYTHONPATH=$PWD python benchmarks/bench_hybrid_terms.py [--all | --tp-pairs | --layer-terms] [ID_PREFIX ...]`` (about a
minute on two cores: the rows are prepared as validate prepares them).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from autoparallel import measured_runs as mr
from autoparallel.costmodel import gemm_precision, mamba, stages
from autoparallel.costmodel import layer_time as lt
from autoparallel.validate import all_runs

DEFAULT_ROWS = ("bridge-26.08-nemotron-3-nano-gb300", "bridge-26.08-nemotron-3-super-gb300-64gpu-mxfp8")


def scalar(value) -> float:
    return float(np.asarray(value).ravel()[0])


def priced(p):
    """The row's chosen candidate, its step (s, the release's speed applied), micro-batches, layers."""
    out, i = mr.priced(p)
    x = mr.chosen(p, i)
    step = scalar(out["step_time_s"][i:i + 1]) / p.hardware.efficiency.release_speed.get(p.software, 1.0)
    return x, step, scalar(x.m), lt.layers(x)


def measured_step(p) -> float:
    tokens = int(p.row["gbs"]) * p.model.seq_length / int(p.row["num_gpus"])
    return tokens / float(p.row[mr.MEASURED[p.metric]])


def of_kind(x, kind):
    """``x`` at a quantization recipe's share for ``kind`` (as ``recipe_hybrid_layers`` prices it)."""
    return lt.kind_candidates(x, gemm_precision.kind_fraction(x, kind, 0, 0)) if gemm_precision.applies(x) else x


def mamba_kernels(x) -> dict:
    """(forward, backward) seconds of the mixer's memory-bound kernels on one micro-batch."""
    return {"SSD scan": mamba.ssd_time(x), "conv1d": mamba.conv_time(x), "grouped RMSNorm": mamba.norm_time(x),
            "layout copies": mamba.layout_copy_time(x)}


def terms(p) -> None:
    x, step, m, layers = priced(p)
    counts = Counter(p.model.hybrid_layer_pattern)
    print(f"\n{p.id}: measured {measured_step(p):.3f} s, predicted {step:.3f} s per step; {m:.0f} micro-batches")
    print(f"  {'term':34s} {'ms / micro-batch':>17s} {'s / step':>9s}")

    def line(name, ms, per_step):
        print(f"  {name:34s} {ms:17.3f} {per_step:9.3f}")

    for kind, cost in layers.kinds.items():
        n = counts.get(kind, 0)
        line(f"[{kind}] x {n} (time)", 1e3 * scalar(cost["time"]), n * m * scalar(cost["time"]))
    xm, n_m = of_kind(x, "M"), counts["M"] * m
    params = mamba.linear_params(p.model)
    gemms = 3.0 * scalar(lt.linear_time(xm, params, gemms=2))
    line("  M in_proj + out_proj GEMMs", 1e3 * gemms, n_m * gemms)
    for name, (fwd, bwd) in mamba_kernels(xm).items():
        line(f"  M {name}", 1e3 * (scalar(fwd) + scalar(bwd)), n_m * (scalar(fwd) + scalar(bwd)))
    xe, n_e, model = of_kind(x, "E"), counts["E"] * m, p.model
    routed = lt.routed_experts_time(xe)
    shared_gemms = max(2.0 * (model.shared_expert_ffn_hidden_size > 0) + 2.0 * (model.moe_latent_size is not None), 1.0)
    parts = {"routed expert GEMMs": 3.0 * scalar(routed),
             "shared + latent GEMMs": 3.0 * scalar(lt.linear_time(
                 xe, model.shared_expert_params + model.latent_projection_params, gemms=shared_gemms)),
             "router": sum(map(scalar, lt.router_time(xe))),
             "permutations": sum(map(scalar, lt.permutation_time(xe))),
             "per-expert calls": sum(map(scalar, lt.expert_calls(xe, routed))),
             "host calls after the sync": sum(map(scalar, lt.post_sync_host_calls(xe)))}
    e_layer = lt.moe_block_layer(xe)
    parts.update({"fp8 casts": scalar(e_layer["fp8_cast"]), "EP dispatch + combine": scalar(e_layer["ep_comm"])})
    for name, seconds in parts.items():
        line(f"  E {name}", 1e3 * seconds, n_e * seconds)
    logits = stages.logits_time(x)
    line("output layer and loss", 1e3 * scalar(logits), m * scalar(logits))
    if model.mtp_num_layers:
        mtp = stages.mtp_time(x, layers, logits)
        line(f"MTP ({model.mtp_num_layers} depths)", 1e3 * scalar(mtp), m * scalar(mtp))


def gaps(rows) -> None:
    print(f"\n{'row':64s} {'meas':>6s} {'pred':>6s} {'gap':>6s} {'Mkern':>6s} {'M':>6s} {'E':>6s}"
          f" {'xMkern':>6s} {'xM':>6s} {'xE':>6s}")
    for p in rows:
        x, step, m, layers = priced(p)
        counts = Counter(p.model.hybrid_layer_pattern)
        kern = counts["M"] * m * sum(scalar(f) + scalar(b) for f, b in mamba_kernels(of_kind(x, "M")).values())
        per = {k: counts[k] * m * scalar(layers.kinds[k]["time"]) for k in ("M", "E")}
        gap = measured_step(p) - step
        print(f"{p.id.removeprefix('bridge-')[:64]:64s} {measured_step(p):6.2f} {step:6.2f} {gap:+6.2f} {kern:6.2f}"
              f" {per['M']:6.2f} {per['E']:6.2f} {1 + gap / kern:6.2f} {1 + gap / per['M']:6.2f} {1 + gap / per['E']:6.2f}")


def tp_partner(p, rows):
    """The TP-1 row of ``p``'s model, release and precision on the GPU its TP-2 recipe pairs with:
    GB300 for GB200 (the same recipe at TP 1); for B200, its MXFP8 TP-1 row (a different precision,
    and the recipes differ in CUDA graphs and recompute too)."""
    gpu, precision = p.row["gpu"], p.row["precision"]
    gpu, precision = {"gb200": ("gb300", precision), "b200": ("b200", "mxfp8")}.get(gpu, (None, None))
    for q in rows:
        if (q.row["model"], q.row["release"], q.row["gpu"], q.row["precision"]) == (
                p.row["model"], p.row["release"], gpu, precision) and int(q.row["tp"]) == 1:
            return q
    return None


def tp_pairs(rows) -> None:
    print(f"\n{'TP-2 row':44s} {'TP-1 row':44s} {'mb':>5s} {'gap/mb s':>11s} {'excess s':>8s} {'tp_comm s':>9s} {'x tp':>5s}")
    for p in rows:
        q = tp_partner(p, rows) if int(p.row["tp"]) == 2 else None
        if q is None:
            continue
        x2, step2, m2, layers2 = priced(p)
        _, step1, m1, _ = priced(q)
        meas2, meas1 = measured_step(p), measured_step(q)
        excess = meas2 - step2 * meas1 / step1
        counts = Counter(p.model.hybrid_layer_pattern)
        tp_comm = m2 * sum(counts.get(k, 0) * scalar(c["tp_comm"]) for k, c in layers2.kinds.items())
        print(f"{p.id.removeprefix('bridge-')[:44]:44s} {q.id.removeprefix('bridge-')[:44]:44s} {m1:2.0f}/{m2:2.0f}"
              f" {(meas1 - step1) / m1:5.3f}/{(meas2 - step2) / m2:5.3f} {excess:+8.2f} {tp_comm:9.3f} {1 + excess / tp_comm:5.1f}")


def layer_terms(p) -> None:
    x, step, m, layers = priced(p)
    counts = Counter(p.model.hybrid_layer_pattern)
    print(f"\n{p.id}: measured {measured_step(p):.3f} s, predicted {step:.3f} s per step; {m:.0f} micro-batches")
    for kind, cost in layers.kinds.items():
        terms = [(t, 1e3 * scalar(cost[t])) for t in (*lt.LAYER_TIME_TERMS, "forward", "time")]
        print(f"  [{kind}] x {counts.get(kind, 0)}: " + " ".join(f"{t} {ms:.3f}" for t, ms in terms if ms))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help=f"row id prefixes (default without --all: {', '.join(DEFAULT_ROWS)})")
    parser.add_argument("--all", action="store_true", help="every hybrid-newer row's gap and the factors")
    parser.add_argument("--tp-pairs", action="store_true", help="each TP-2 row beside its TP-1 row: gaps per micro-batch")
    parser.add_argument("--layer-terms", action="store_true", help="each layer kind's non-zero terms (ms per micro-batch)")
    args = parser.parse_args()
    rows = [p for p in all_runs() if p.kind == "hybrid-newer"]
    for prefix in args.rows or ((), DEFAULT_ROWS)[not (args.all or args.tp_pairs)]:
        (layer_terms if args.layer_terms else terms)(next(p for p in rows if p.id.startswith(prefix)))
    if args.all:
        gaps(rows)
    if args.tp_pairs:
        tp_pairs(rows)


if __name__ == "__main__":
    main()
