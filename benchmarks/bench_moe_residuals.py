"""Issue 22: the MoE rows' errors beside the structural features the cost model computes for them.

Every MoE row ``validate`` prices (the fitted ``moe`` rows as the control, the never-fitted ``moe-newer``,
``hybrid-newer`` and ``dsv4-newer`` ones), its error as priced now (in sample: positive = predicted
throughput too high, the step too short), and per GPU, MoE layer and micro-batch what the cost model's own
functions give for the chosen layout:

- ``loc``: local experts per GPU (``moe.local_experts``), ``k``: top-k, ``conc``: experts whose GEMMs the
  model runs at once (``layer_time.concurrent_experts``);
- ``tok/exp``: rows of one local expert's GEMMs (``moe.tokens_per_expert``, before the imbalance),
  ``GF/grp``: one expert's FC1 (or FC2) forward GFLOP (``moe.expert_gemm_flops``), ``eff``: the GEMM curve's
  share at the size priced (``gemm.efficiency`` at ``conc`` groups), ``eff@all``: at the whole layer's
  grouped work (all local experts' one GroupedLinear as one GEMM);
- ``calls``: per-expert forward calls of the layer (``layer_time.expert_call_count``), ``call ms``: what
  they cost as priced (``layer_time.expert_calls``' forward), ``exp ms``: the routed experts' forward GEMMs
  (``layer_time.routed_experts_time``), ``calls/exp``: their ratio;
- ``dom x in``: the NVLink domains the EP group spans x EP ranks per domain (``dispatch._ep_domains``),
  ``pairs``: (token, destination GPU) pairs per token (flex: distinct GPUs of its top-k,
  ``dispatch.distinct_share``; alltoall: k copies), ``KB/tok``: dispatch bytes per token (pairs x routed
  width x bytes), ``disp ms``: one dispatch as priced (``dispatch.dispatcher_time``);
- ``gap ms``: measured step less predicted step per micro-batch slot of one stage and per MoE layer of it
  (as ``bench_moe_layer_gaps.py``).

Then, over the never-fitted rows, those on Blackwell alone and the fitted ones, each feature's correlation
(Pearson r, of log features where a feature spans decades) with the error and with the gap, and the mean
error of the rows split at the feature's median: which structure the residual follows across models.

``--whatif`` reprices the rows under each hypothesis (``WHATIFS``: structure, patched in process) and under
three changes of a constant or preset value that are not structure (``elementwise 34``, ``h100 elem 10``,
``b300 net 50``), and prints each kind's mean |error| and each family's mean signed error; ``--heldout``
runs ``validate``'s leave-one-model-out MoE folds under the named ``WHATIFS`` (none of them is in the model).

    PYTHONPATH=$PWD python benchmarks/bench_moe_residuals.py [--rows]   (about 25 s; --rows prints each row)
    PYTHONPATH=$PWD python benchmarks/bench_moe_residuals.py --whatif   (in sample, ~1.5 min)
    PYTHONPATH=$PWD python benchmarks/bench_moe_residuals.py --heldout [WHATIF ...]   (about a minute each)
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from unittest.mock import patch

import numpy as np

from autoparallel.costmodel import dispatch, gemm, layer_time, moe
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs
from autoparallel.validate import cross_validate

NEVER_FITTED = ("moe-newer", "hybrid-newer", "dsv4-newer")
FITTED = ("moe",)
BLACKWELL = ("b200", "b300", "gb200", "gb300")
# features whose correlation is taken on their logarithm (they span one or more decades)
LOG_FEATURES = ("loc", "tok/exp", "GF/grp", "calls", "call ms", "exp ms", "calls/exp", "KB/tok", "disp ms", "ep")


def knob(p, i: int, name: str) -> str:
    """The value of the text knob ``name`` (e.g. the dispatcher) of row ``p``'s candidate ``i``."""
    return str(p.cols[name][i]) if name in p.cols else "-"


def features(p) -> dict:
    """The row's error and the cost model's structural figures for its chosen layout (see the module)."""
    out, i = priced(p)
    result = predict_row(p)
    x = chosen(p, i)
    model, hw = x.model, x.hw
    ep, etp = float(np.ravel(x.e)[0]), float(np.ravel(x.et)[0])
    tokens = float(np.ravel(x.tokens / x.t)[0])
    imbalance = float(np.ravel(x.imbalance)[0])
    loc = float(moe.local_experts(model, ep))
    conc = float(layer_time.concurrent_experts(model, ep))
    per_expert = float(moe.tokens_per_expert(model, tokens, ep, etp))
    group = float(moe.expert_gemm_flops(model, tokens, ep, etp))
    t_experts = layer_time.routed_experts_time(x)
    calls_fwd = float(np.ravel(layer_time.expert_call_count(x)[0])[0])
    call_s = float(np.ravel(layer_time.expert_calls(x, t_experts)[0])[0])
    t_experts = float(np.ravel(t_experts)[0])
    inside, nodes = (float(np.ravel(v)[0]) for v in dispatch._ep_domains(hw, ep, etp))
    name = knob(p, i, "moe_token_dispatcher_type")
    k = model.moe_router_topk
    pairs = float(dispatch.distinct_share(k, ep)) if name == "flex" else float(k)
    value_bytes = float(np.ravel(x.dispatch_bytes)[0]) if np.size(x.dispatch_bytes) else dispatch.DISPATCH_BYTES
    disp = float(np.ravel(dispatch.dispatcher_time(hw, model, tokens, ep, etp, imbalance, name, value_bytes))[0])
    m, pp = float(out["num_microbatches"][i]), float(np.ravel(x.p)[0])
    measured, predicted = float(result["measured"]), float(result["predicted"])
    step = float(out["step_time_s"][i])
    measured_step = step * predicted / measured
    moe_layers = max(model.num_moe_layers, 1) / pp
    backend = knob(p, i, "moe_flex_dispatcher_backend") if name == "flex" else ""
    return {
        "id": p.id, "kind": p.kind, "model": p.row["model"], "gpu": p.row["gpu"],
        "err": float(result["error_pct"]), "ep": ep, "loc": loc, "k": float(k), "conc": conc,
        "tok/exp": per_expert, "GF/grp": group / 1e9,
        "eff": float(gemm.efficiency(hw, group * conc)), "eff@all": float(gemm.efficiency(hw, group * loc)),
        "calls": calls_fwd, "call ms": 1e3 * call_s, "exp ms": 1e3 * t_experts, "calls/exp": call_s / t_experts,
        "nodes": nodes, "inside": inside, "pairs": pairs,
        "KB/tok": pairs * moe.routed_width(model) * value_bytes / 1e3, "disp ms": 1e3 * disp,
        "disp": name + ("/" + backend if backend and backend != "-" else ""),
        "graph": knob(p, i, "cuda_graph"), "prec": knob(p, i, "precision"),
        "gap ms": 1e3 * (measured_step - step) / (m + pp - 1) / moe_layers,
    }


def correlations(rows: list[dict], title: str) -> None:
    err = np.array([r["err"] for r in rows])
    gap = np.array([r["gap ms"] for r in rows])
    print(f"\n{title}: {len(rows)} rows, mean error {err.mean():+.1f} %, mean |error| {np.abs(err).mean():.1f} %")
    print(f"{'feature':10s} {'r(err)':>7s} {'r(gap)':>7s} {'median':>9s} {'err below':>10s} {'err above':>10s}")
    for name in ("ep", "loc", "k", "conc", "tok/exp", "GF/grp", "calls", "call ms", "exp ms", "calls/exp",
                 "nodes", "pairs", "KB/tok", "disp ms"):
        v = np.array([r[name] for r in rows], dtype=float)
        f = np.log(np.maximum(v, 1e-12)) if name in LOG_FEATURES else v
        if np.ptp(f) == 0:
            continue
        median = float(np.median(v))
        below, above = err[v <= median], err[v > median]
        mean = (lambda v: f"{v.mean():+10.1f}" if v.size else f"{'-':>10s}")
        print(f"{name:10s} {np.corrcoef(f, err)[0, 1]:+7.2f} {np.corrcoef(f, gap)[0, 1]:+7.2f} {median:9.3g}"
              f" {mean(below)} {mean(above)}")


def family_table(rows: list[dict]) -> None:
    """One line per (model, GPU, EP, dispatcher, graph, precision): the releases' rows together."""
    groups: dict = {}
    for r in rows:
        key = (r["kind"], r["model"], r["gpu"], int(r["ep"]), r["disp"], r["graph"], r["prec"])
        groups.setdefault(key, []).append(r)
    print(f"{'kind':12s} {'model':22s} {'gpu':8s} {'EP':>3s} {'disp':14s} {'graph':14s} {'prec':12s} {'n':>2s}"
          f" {'err %':>12s} {'loc':>5s} {'k':>3s} {'tok/exp':>8s} {'GF/grp':>7s} {'eff':>5s} {'eff@all':>7s}"
          f" {'calls':>5s} {'call ms':>7s} {'exp ms':>7s} {'dom x in':>8s} {'pairs':>5s} {'KB/tok':>7s}"
          f" {'disp ms':>7s} {'gap ms':>12s}")
    for key in sorted(groups, key=lambda k: (k[0] != "moe", k[1], k[2], k[3])):
        g = groups[key]
        r = g[0]
        errs = [x["err"] for x in g]
        gaps = [x["gap ms"] for x in g]
        span = (lambda v: f"{min(v):+.1f}..{max(v):+.1f}" if len(v) > 1 else f"{v[0]:+.1f}")
        print(f"{key[0]:12s} {key[1][:22]:22s} {key[2]:8s} {key[3]:3d} {key[4][:14]:14s} {key[5][:14]:14s}"
              f" {key[6][:12]:12s} {len(g):2d} {span(errs):>12s} {r['loc']:5.0f} {r['k']:3.0f} {r['tok/exp']:8.0f}"
              f" {r['GF/grp']:7.2f} {r['eff']:5.2f} {r['eff@all']:7.2f} {r['calls']:5.0f} {r['call ms']:7.2f}"
              f" {r['exp ms']:7.2f} {r['nodes']:3.0f} x {r['inside']:2.0f} {r['pairs']:5.1f} {r['KB/tok']:7.1f}"
              f" {r['disp ms']:7.2f} {span(gaps):>12s}")


def one_grouped_kernel():
    """H1: every local expert's FC1 (FC2) in one grouped kernel, the GEMM curve read at the whole
    GroupedLinear's work instead of ``concurrent_experts`` groups' (what a single grouped GEMM would
    run; TransformerEngine 2.12-2.16 run it only on Hopper under NVTE_USE_CUTLASS_GROUPED_GEMM)."""
    return patch.object(layer_time, "concurrent_experts", lambda model, ep: np.maximum(moe.local_experts(model, ep), 1.0))


def no_dedup():
    """H3: a flex dispatch sends every token copy on its own (k (token, expert) pairs, k * (nodes - 1) /
    nodes remote) instead of once per distinct GPU / node: DeepEP / HybridEP's de-duplication undone."""
    return patch.object(dispatch, "distinct_share", lambda picks, places: np.full_like(
        np.asarray(places, dtype=float), float(picks)))


def calls_behind_gemms():
    """H4: the host issues the forward's per-expert calls while the GPU runs the GEMMs already issued
    (CUDA launches are asynchronous): the experts take the longer of the two, not their sum."""
    expert_calls = layer_time.expert_calls

    def overlapped(x, t_experts):
        forward, backward = expert_calls(x, t_experts)
        return np.maximum(forward - t_experts, 0.0), backward
    return patch.object(layer_time, "expert_calls", overlapped)


def elementwise_at(value):
    """H5 (a constant, not structure): a row's constants with ``elementwise_bytes_per_token_hidden`` at
    ``value`` (34 = each saved activation byte read and written once at HBM speed; fitted: H100 118,
    the b200 family 10, on its lower bound)."""
    return lambda p: dataclasses.replace(p.hardware.efficiency, elementwise_bytes_per_token_hidden=value)


# DeepEP hybrid-ep branch (deepseek-ai/DeepEP@94a9f8f docs/README_Hybrid-EP.md), "Torch API" algorithm
# bandwidth (each rank's received (token, rank) pairs x hidden bytes over the time), 4,096 tokens, hidden 7,168,
# top-8, random uniform router, BF16: the mean of dispatch and combine. GB200, HybridEP at 32 SMs, per EP size
# (8 to 36 ranks; EP 64 takes 36's, an extrapolation); B200, DeepEP at 32 SMs (8 ranks).
HYBRIDEP_GB200_GBPS = {8: (545.71 + 568.94) / 2, 16: (523.48 + 521.55) / 2, 24: (507.32 + 483.76) / 2,
                       32: (484.22 + 464.54) / 2, 36: (479.02 + 447.89) / 2}
DEEPEP_B200_GBPS = (619.0 + 524.0) / 2


def published_ep_bandwidth():
    """H3: a flex dispatch inside one NVLink domain of a Blackwell GPU moves its (token, destination
    GPU) pairs (the own GPU's included) at the published algorithm bandwidth of the kernels
    (``HYBRIDEP_GB200_GBPS`` on GB200 / GB300, ``DEEPEP_B200_GBPS`` on B200 / B300) instead of
    ``nvlink`` x the link; across domains (RDMA) as priced."""
    flex_time = dispatch.flex_time

    def flex(hw, model, tokens, ep, etp, imbalance, value_bytes=dispatch.DISPATCH_BYTES):
        priced = flex_time(hw, model, tokens, ep, etp, imbalance, value_bytes)
        _, nodes = dispatch._ep_domains(hw, ep, etp)
        if hw.name in ("gb200", "gb300"):
            ranks = min(HYBRIDEP_GB200_GBPS, key=lambda r: abs(r - float(np.max(ep))))
            gbps = HYBRIDEP_GB200_GBPS[ranks]
        elif hw.name in ("b200", "b300"):
            gbps = DEEPEP_B200_GBPS
        else:
            return priced
        pairs = dispatch.distinct_share(model.moe_router_topk, ep)
        per_pair = moe.routed_width(model) * value_bytes * imbalance
        published = tokens * pairs * per_pair / (gbps * 1e9) + hw.nvlink_latency_us * 1e-6
        return np.where((nodes <= 1) & (np.asarray(ep) > 1), published, priced)
    return patch.object(dispatch, "flex_time", flex)


WHATIFS = {"grouped": one_grouped_kernel, "no-dedup": no_dedup, "published-ep": published_ep_bandwidth,
           "calls||gemms": calls_behind_gemms}


def family(p) -> tuple:
    """A row's family: its kind, model, GPU and EP (the releases' rows of one layout together)."""
    return (p.kind, str(p.row["model"]), str(p.row["gpu"]), int(p.row["ep"] or 1))


def b300_network_as_b200(p):
    """A B300 row priced with B200's network (400 Gb/s per GPU, ``internode_gbps`` 50) instead of the b300
    preset's ConnectX-8 at 800 Gb/s: the fabric of NVIDIA's DGX-B300 runs is not published. Not structure."""
    if p.row["gpu"] != "b300":
        return p
    return dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, internode_gbps=B200_INTERNODE_GBPS))


B200_INTERNODE_GBPS = 50.0  # search_spaces/hardware/b200.yaml


def h100_elementwise_at(value):
    """H100 rows' constants with ``elementwise_bytes_per_token_hidden`` at ``value`` (the b200 family's 10)."""
    return lambda p: (dataclasses.replace(p.hardware.efficiency, elementwise_bytes_per_token_hidden=value)
                      if p.row["gpu"] == "h100-sxm" else None)


def group_errors(rows, efficiency=lambda p: None, row=lambda p: p) -> tuple[dict, dict]:
    """Mean |error| % in sample per kind and over the never-fitted kinds together, and the mean signed
    error % per ``family``; ``efficiency``: a row's constants (None: its own); ``row``: the row priced."""
    errs: dict = {}
    families: dict = {}
    for p in rows:
        e = predict_row(row(p), efficiency(p))["error_pct"]
        errs.setdefault(p.kind, []).append(e)
        families.setdefault(family(p), []).append(e)
    out = {k: float(np.mean(np.abs(v))) for k, v in errs.items()}
    never = [e for k in NEVER_FITTED for e in errs.get(k, [])]
    out["never-fitted"] = float(np.mean(np.abs(never)))
    return out, {k: float(np.mean(v)) for k, v in families.items()}


def heldout_errors(rows) -> dict:
    """Mean |error| % per kind held out: ``validate``'s leave-one-model-out MoE folds (the MoE constants
    refitted on the other models' rows), run on the MoE rows alone (the dense folds do not price them)."""
    held = cross_validate(rows, workers=1)
    errs: dict = {}
    for p in rows:
        errs.setdefault(p.kind, []).append(held[p.id]["error_pct"])
    out = {k: float(np.mean(np.abs(v))) for k, v in errs.items()}
    out["never-fitted"] = float(np.mean(np.abs([e for k in NEVER_FITTED for e in errs.get(k, [])])))
    return out


def heldout(prepared, names) -> None:
    """The held-out figures as priced and under the what-ifs ``names`` (``WHATIFS``; a few minutes each)."""
    kinds = ("moe",) + NEVER_FITTED + ("never-fitted",)
    print(f"what-if, mean |error| % held out:  {'what-if':14s}" + "".join(f" {k:>13s}" for k in kinds))
    for name in ("as priced",) + tuple(names):
        with WHATIFS[name]() if name in WHATIFS else contextlib.nullcontext():
            result = heldout_errors(prepared)
        print(f"{'':36s}{name:14s}" + "".join(f" {result[k]:13.2f}" for k in kinds), flush=True)


def whatifs(prepared) -> None:
    rows = [p for p in prepared if p.kind in NEVER_FITTED + FITTED]
    results = {"as priced": group_errors(rows)}
    for name, make in WHATIFS.items():
        with make():
            results[name] = group_errors(rows)
    results["elementwise 34"] = group_errors(rows, elementwise_at(34.0))
    results["h100 elem 10"] = group_errors(rows, h100_elementwise_at(10.0))
    results["b300 net 50"] = group_errors(rows, row=b300_network_as_b200)
    kinds = ("moe",) + NEVER_FITTED + ("never-fitted",)
    print(f"what-if, mean |error| % in sample: {'what-if':14s}" + "".join(f" {k:>13s}" for k in kinds))
    for name, (by_kind, _) in results.items():
        print(f"{'':36s}{name:14s}" + "".join(f" {by_kind[k]:13.2f}" for k in kinds))
    print(f"\nmean signed error % per family (kind, model, GPU, EP, rows):{'':9s}"
          + "".join(f" {name:>14s}" for name in results))
    counts: dict = {}
    for p in rows:
        counts[family(p)] = counts.get(family(p), 0) + 1
    for key in sorted(counts, key=lambda k: (k[0] != "moe", k[1], k[2], k[3])):
        print(f"{key[0]:12s} {key[1][:22]:22s} {key[2]:8s} {key[3]:3d} {counts[key]:3d}{'':3s}"
              + "".join(f" {fam[key]:+14.1f}" for _, fam in results.values()))


def main() -> None:
    prepared = load_runs(validation_runs(), moe=True)
    if "--whatif" in sys.argv:
        whatifs(prepared)
        return
    if "--heldout" in sys.argv:
        heldout(prepared, sys.argv[sys.argv.index("--heldout") + 1:])
        return
    rows = [features(p) for p in prepared]
    rows = [r for r in rows if r["kind"] in NEVER_FITTED + FITTED]
    if "--rows" in sys.argv:
        for r in rows:
            print(r["id"], f"{r['err']:+.1f}", f"{r['gap ms']:+.2f}")
    family_table(rows)
    correlations([r for r in rows if r["kind"] in NEVER_FITTED], "never-fitted (moe-newer, hybrid-newer, dsv4-newer)")
    correlations([r for r in rows if r["kind"] in NEVER_FITTED and r["gpu"] in BLACKWELL],
                 "never-fitted on Blackwell (b200, b300, gb200, gb300: one family of constants)")
    correlations([r for r in rows if r["kind"] in FITTED], "fitted (moe)")


if __name__ == "__main__":
    main()
