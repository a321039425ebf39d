"""GPT-OSS-120B's Blackwell rows: what each recipe sets, and three what-ifs that are *not* in the cost model.

Issue 22, session 38 (s38h1). For every GPT-OSS row of `validate` (and, for the network what-if, every
B300 MoE row, since a preset change moves them all): the recipe facts the row is priced with (dispatcher,
1F1B all-to-all overlap, CUDA graph, recompute modules, TE's fused CuTe-DSL grouped MLP), measured and
predicted tokens/s/GPU, the error, the step's missed seconds per layer and micro-batch, and the error if

- ``net400``: the b300 preset's network were 400 Gb/s per GPU (50 GB/s, the b200 preset's) instead of
  the 800 Gb/s ConnectX-8 line rate it states (100 GB/s);
- ``fused``: the fused CuTe-DSL grouped MLP rows (``cutedsl_fused_grouped_mlp``) paid no eager expert
  bias / GLU clamp passes (Megatron-Core's fused path: FC2's bias scaled by the probabilities inside
  TE's GroupedLinear op, ``scale_bias``, and the clamp inside ``ScaledClampedQGeGLU``;
  Megatron-LM d98e8a64dd ``megatron/core/transformer/moe/experts.py`` ``_make_fused_ops``);
- ``cudnn256``: the 26.06.01 rows' fused FC2-dgrad + dGeGLU + dbias kernel ran at the 8.76x its
  fix measured (NVIDIA/cudnn-frontend issue 256, PR 322: 1,362.8 us with dbias before, 155.6 us
  after, at the issue's shape): the FC2 dgrad the model prices (a third of the routed experts'
  forward GEMM time) taken 8.76x, on the 26.06.01 rows only;
- ``fused+cudnn256``: both at once, the pair that follows the source (the fused path runs no eager
  passes, and the 26.06.01 container ran the regressed kernel).

Then, for every pair of rows that differ only in the GPU (B200 / B300) and run EP across 8-GPU
nodes: per layer and micro-batch on the priced stage, the measured time, the priced compute and
all-to-all, the all-to-all the measurement leaves if the rest is priced right, and the network
rate per GPU that implies for the bytes the all-to-alls send across nodes (issue 22, session 40).

Every figure is the cost model's; nothing here changes a prediction.

    PYTHONPATH=$PWD python benchmarks/bench_gpt_oss_whatif.py
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np

from autoparallel.costmodel import dispatch
from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs

B200_NETWORK_GBPS = 50.0       # b200.yaml internode_gbps: 400 Gb/s per GPU
CUDNN_256_SLOWDOWN = 1362.768 / 155.632  # cudnn-frontend PR 322's dbias kernel, before / after


@contextmanager
def fused_without_eager_passes():
    """The fused grouped MLP's rows priced without the eager bias and clamp passes."""
    bias, clamp = lt.expert_bias_time, lt.glu_clamp_time

    def drop(f):
        def wrapped(x, *args):
            out = f(x, *args)
            fused = x.flag("cutedsl_fused_grouped_mlp")
            return tuple(np.where(fused, 0.0, o) for o in out)
        return wrapped

    lt.expert_bias_time, lt.glu_clamp_time = drop(bias), drop(clamp)
    try:
        yield
    finally:
        lt.expert_bias_time, lt.glu_clamp_time = bias, clamp


def error(r: dict) -> float:
    return float(r["error_pct"])


def recipe(x) -> str:
    modules = ",".join(k for k, v in x.modules.items() if bool(np.asarray(v).ravel()[0])) or "-"
    return (f"{str(x.knobs['moe_token_dispatcher_type'][0])}"
            f"{'+a2a-overlap' if bool(x.flag('overlap_moe_expert_parallel_comm')[0]) else ''} "
            f"graph={str(x.cuda_graph[0])} recompute={modules}"
            f"{' fusedMLP' if bool(x.flag('cutedsl_fused_grouped_mlp')[0]) else ''}")


def cudnn256_error(p, r: dict, step: float) -> float:
    """The error % of a 26.06.01 GPT-OSS row with its regressed dGLU-dbias kernel priced, from the
    prediction ``r`` whose priced step is ``step`` seconds."""
    out, i = priced(p)
    x = chosen(p, i)
    n = float(x.m[0]) * p.model.num_layers / float(x.p[0])  # layer-micro-batches on the priced stage
    extra = (CUDNN_256_SLOWDOWN - 1.0) * float(lt.routed_experts_time(x)[0]) / 3.0 * n
    return 100.0 * (r["predicted"] * step / (step + extra) - r["measured"]) / r["measured"]


def cross_node_pairs(rows, base) -> None:
    """The B200 / B300 rows of one layout whose EP group spans 8-GPU nodes, per layer-micro-batch."""
    print("\n| row | measured ms | priced ms | compute ms | ep_comm ms | a2a left by the measurement ms | "
          "bytes across nodes per layer-mb MB | implied network GB/s per GPU | priced GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in rows:
        if p.row["gpu"] not in ("b200", "b300"):
            continue
        out, i = priced(p)
        x = chosen(p, i)
        inside, nodes = dispatch._ep_domains(x.hw, x.e, x.et)
        if float(np.ravel(nodes)[0]) <= 1.0:
            continue
        r = base[p.id]
        n = float(x.m[0]) * p.model.num_layers / float(x.p[0])
        step = float(out["step_time_s"][i])
        measured = step * r["predicted"] / r["measured"]
        a2a = float(out["ep_comm_s"][i])
        left = measured - (step - a2a)
        one = x.tokens / x.t * p.model.moe_router_topk * p.model.hidden_size * dispatch.DISPATCH_BYTES * x.imbalance
        across = 4.0 * float(np.ravel(one * (x.e - inside) / x.e)[0])  # dispatch + combine, forward + backward
        rate = x.hw.internode_gbps * x.hw.efficiency.alltoall
        print(f"| {p.id} | {1e3 * measured / n:.1f} | {1e3 * step / n:.1f} | {1e3 * float(out['compute_s'][i]) / n:.1f} | "
              f"{1e3 * a2a / n:.1f} | {1e3 * left / n:.1f} | {across / 1e6:.0f} | {across / (left / n) / 1e9:.1f} | {rate:.1f} |")


def main() -> None:
    rows = [p for p in load_runs(validation_runs(), moe=True) if "gpt-oss" in p.id or p.row["gpu"] == "b300"]
    base = {p.id: predict_row(p) for p in rows}
    net = {}
    for p in rows:
        if p.row["gpu"] == "b300":
            q = dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, internode_gbps=B200_NETWORK_GBPS))
            net[p.id] = predict_row(q)
    with fused_without_eager_passes():
        fused = {p.id: predict_row(p) for p in rows if "gpt-oss" in p.id}
        fused_steps = {p.id: float(priced(p)[0]["step_time_s"][priced(p)[1]]) for p in rows if "26.06.01" in p.id
                       and "gpt-oss" in p.id}
    print("| row | recipe | measured | predicted | error % | missed ms per layer-mb | net400 % | fused % | cudnn256 % "
          "| fused+cudnn256 % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in rows:
        r = base[p.id]
        out, i = priced(p)
        x = chosen(p, i)
        step = float(out["step_time_s"][i])
        n = float(x.m[0]) * p.model.num_layers / float(x.p[0])  # layer-micro-batches on the priced stage
        missed = step * r["predicted"] / r["measured"] - step
        cudnn = both = ""
        if p.id in fused_steps:
            cudnn = f"{cudnn256_error(p, r, step):+.1f}"
            both = f"{cudnn256_error(p, fused[p.id], fused_steps[p.id]):+.1f}"
        print(f"| {p.id} | {recipe(x)} | {r['measured']:.0f} | {r['predicted']:.0f} | {error(r):+.1f} | "
              f"{1e3 * missed / n:+.2f} | {error(net[p.id]) if p.id in net else float('nan'):+.1f} | "
              f"{error(fused[p.id]) if p.id in fused else float('nan'):+.1f} | {cudnn} | {both} |")
    gpt = [p.id for p in rows if "gpt-oss" in p.id and p.row["gpu"] != "h100-sxm"]
    b300 = [p.id for p in rows if p.row["gpu"] == "b300"]
    mean = lambda ids, d: float(np.mean([abs(error(d[k])) for k in ids]))  # noqa: E731
    print(f"\nBlackwell GPT-OSS rows ({len(gpt)}), mean |error| %: as priced {mean(gpt, base):.1f}, "
          f"fused {mean(gpt, {**base, **fused}):.1f}, net400 {mean(gpt, {**base, **net}):.1f}")
    print(f"B300 rows ({len(b300)}), mean |error| %: as priced {mean(b300, base):.1f}, net400 {mean(b300, net):.1f}")
    over = lambda d: sorted(k for k in d if abs(error(d[k])) > 35.0)  # noqa: E731
    print(f"rows over 35 %: as priced {len(over(base))}, net400 {len(over({**base, **net}))}")
    cross_node_pairs([p for p in load_runs(validation_runs(), moe=True) if "gpt-oss" in p.id],
                     {p.id: predict_row(p) for p in load_runs(validation_runs(), moe=True) if "gpt-oss" in p.id})


if __name__ == "__main__":
    main()
