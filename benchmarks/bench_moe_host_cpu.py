"""Issue 22: does the MoE forward's host cost per call (``moe_expert_call_s``) differ by host CPU?

Session 54 saw the x86-hosted MoE rows predicted too slow (H100 / B300 EP 8) and the Grace-hosted
ones (GB200 / GB300 NVL72) too fast, and asked whether one fitted per-call cost (``moe_expert_call_s``,
~70 us) should be one per CPU family. EP 64 over an NVL72 rack against EP 8 in a DGX node confounds
Grace with the EP width, so this prints, per MoE row ``validate`` prices (kinds moe, moe-newer,
hybrid-newer, dsv4-newer), what separates them:

- ``gpu``, ``cpu`` (the host CPU family of the GPU's system, ``HOST_CPU``), ``EP``, ``loc`` (local
  experts), ``disp`` (dispatcher / flex backend), ``graph`` (the ``cuda_graph`` knob priced), ``a2a``
  (the 1F1B all-to-all overlap), ``fmlp`` (TE's fused grouped MLP), ``MBS``;
- the predicted step (s) and its terms from the cost model's own breakdown (``compute_s`` with the
  host's per-call stall inside it, ``ep_comm_s``), and ``host``: the share of the step the per-call
  constant prices (the step less the step at ``moe_expert_call_s`` = 0);
- ``err %`` (validate's: tokens/s, + = predicted too fast) and ``need us``: the per-call cost that
  would make the row exact (bisection on ``moe_expert_call_s`` alone, every other constant as
  shipped; ``<0`` where the row is too slow even with free calls, ``>1000`` where 1 ms per call is
  still too fast).

Then the rows grouped by (cpu, gpu, EP bucket): how many, mean signed error, median ``need us``; that
table is the test of the hypothesis (a per-CPU constant needs the rows of one CPU to want one value).

    PYTHONPATH=$PWD python benchmarks/bench_moe_host_cpu.py [--rows] [MODEL_PREFIX ...]   (~2-4 min)
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

import numpy as np

from autoparallel.measured_runs import load_runs, log_error, predict_row, priced, validation_runs

KINDS = ("moe", "moe-newer", "hybrid-newer", "dsv4-newer")
# The host CPU of each GPU's system as the published runs ran it (sources in benchmarks/RESULTS.md,
# session 55 s55h1): GB200 / GB300 NVL72 trays pair the GPUs with Grace (Arm Neoverse V2); DGX H100 /
# B200 / B300 and HGX boards are x86 (Intel Xeon). H800: DeepSeek's cluster, not stated (assumed x86).
HOST_CPU = {"gb200": "grace", "gb300": "grace", "gh200": "grace", "b200": "x86", "b300": "x86",
            "h100-sxm": "x86", "h200": "x86", "h800": "x86?", "a100-sxm-80g": "x86"}
NEED_BOUNDS = (0.0, 1e-3)


def knob(p, i: int, name: str) -> str:
    """Row ``p``'s candidate ``i``'s value of the knob ``name`` (``-`` where the row has none)."""
    return str(p.cols[name][i]) if name in p.cols else "-"


def with_call(p, seconds: float):
    """Row ``p``'s shipped constants with ``moe_expert_call_s`` at ``seconds``."""
    return dataclasses.replace(p.hardware.efficiency, moe_expert_call_s=seconds)


def needed_call_s(p) -> float:
    """The ``moe_expert_call_s`` at which row ``p`` is predicted exactly (log error 0), by bisection:
    the step grows with the per-call cost, so the log error falls. -inf / +inf outside NEED_BOUNDS."""
    lo, hi = NEED_BOUNDS
    if log_error(p, with_call(p, lo)) < 0:
        return -np.inf
    if log_error(p, with_call(p, hi)) > 0:
        return np.inf
    for _ in range(22):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if log_error(p, with_call(p, mid)) > 0 else (lo, mid)
    return 0.5 * (lo + hi)


def row_figures(p) -> dict:
    """One MoE row's layout, predicted terms, error and the per-call cost it needs."""
    out, i = priced(p)
    result = predict_row(p)
    free, j = priced(p, dataclasses.replace(p.hardware, efficiency=with_call(p, 0.0)))
    step = float(out["step_time_s"][i])
    disp = knob(p, i, "moe_token_dispatcher_type")
    if disp == "flex":
        disp += "/" + knob(p, i, "moe_flex_dispatcher_backend").replace("-", "deepep")
    ep = int(p.cols["ep"][i])
    return {
        "id": p.id, "kind": p.kind, "model": str(p.row["model"]), "gpu": str(p.row["gpu"]),
        "cpu": HOST_CPU.get(str(p.row["gpu"]), "?"), "ep": ep, "loc": p.model.num_experts // ep,
        "tp": int(p.cols["tp"][i]), "disp": disp, "graph": knob(p, i, "cuda_graph"),
        "a2a": knob(p, i, "overlap_moe_expert_parallel_comm") == "True",
        "fmlp": knob(p, i, "cutedsl_fused_grouped_mlp") == "True", "mbs": int(p.cols["mbs"][i]),
        "step": step, "compute": float(out["compute_s"][i]), "ep_comm": float(out["ep_comm_s"][i]),
        "host": step - float(free["step_time_s"][j]), "err": float(result["error_pct"]),
        "need": needed_call_s(p),
    }


def need_text(seconds: float) -> str:
    if seconds == -np.inf:
        return "<0"
    if seconds == np.inf:
        return ">1000"
    return f"{seconds * 1e6:.0f}"


def ep_bucket(r: dict) -> str:
    """EP within one 8-GPU node, or wider (across nodes on x86, across trays of an NVL72 on Grace)."""
    return "EP<=8" if r["ep"] <= 8 else "EP>8"


def main() -> None:
    args = sys.argv[1:]
    show_rows = "--rows" in args
    prefixes = tuple(a for a in args if not a.startswith("--"))
    rows = [p for p in load_runs(validation_runs(), moe=True) if p.kind in KINDS
            and (not prefixes or str(p.row["model"]).startswith(prefixes))]
    figures = [row_figures(p) for p in rows]
    if show_rows:
        print(f"{'row':58s} {'gpu':8s} {'cpu':5s} {'EP':>3s} {'loc':>3s} {'TP':>2s} {'disp':15s} {'graph':14s}"
              f" {'a2a':>3s} {'fmlp':>4s} {'MBS':>3s} {'step s':>7s} {'comp s':>7s} {'ep s':>6s} {'host s':>6s}"
              f" {'host %':>6s} {'err %':>6s} {'need us':>7s}")
        for r in sorted(figures, key=lambda r: (r["model"], r["cpu"], r["gpu"], r["ep"], r["id"])):
            print(f"{r['id'].removeprefix('bridge-')[:58]:58s} {r['gpu']:8s} {r['cpu']:5s} {r['ep']:3d} {r['loc']:3d}"
                  f" {r['tp']:2d} {r['disp'][:15]:15s} {r['graph'][:14]:14s} {'y' if r['a2a'] else '-':>3s}"
                  f" {'y' if r['fmlp'] else '-':>4s} {r['mbs']:3d} {r['step']:7.3f} {r['compute']:7.3f}"
                  f" {r['ep_comm']:6.3f} {r['host']:6.3f} {100 * r['host'] / r['step']:6.1f} {r['err']:+6.1f}"
                  f" {need_text(r['need']):>7s}")
    group_table(figures, lambda r: (r["cpu"], r["gpu"], ep_bucket(r)), ("cpu", "gpu", "EP"))
    # The same without the full-iteration graph rows (no host sync: the per-call cost barely prices them),
    # by CPU and local experts: whether the wanted per-call cost follows the host or the loop's length.
    synced = [r for r in figures if r["graph"] != "full_iteration"]
    group_table(synced, lambda r: (r["cpu"], "any", f"loc {loc_bucket(r)}"), ("cpu", "gpu", "experts"))
    group_table(synced, lambda r: ("any", r["gpu"], f"loc {loc_bucket(r)}"), ("cpu", "gpu", "experts"))


def loc_bucket(r: dict) -> str:
    """Local experts per GPU: up to 4, 6-8, 16, 32 or more."""
    return "<=4" if r["loc"] <= 4 else "6-8" if r["loc"] <= 8 else "16" if r["loc"] <= 16 else ">=32"


def group_table(figures: list[dict], key_of, names: tuple[str, str, str]) -> None:
    """Rows grouped by ``key_of`` (three labels): count, mean signed and absolute error, the host's share
    of the predicted step and the median per-call cost the rows need."""
    groups: dict = {}
    for r in figures:
        groups.setdefault(key_of(r), []).append(r)
    print(f"\n{names[0]:5s} {names[1]:9s} {names[2]:9s} {'n':>3s} {'mean err %':>10s} {'mean |err| %':>12s}"
          f" {'host % of step':>14s} {'median need us':>14s} {'<0':>3s} {'>1000':>5s}")
    for key in sorted(groups):
        g = groups[key]
        need = [r["need"] for r in g]
        print(f"{key[0]:5s} {key[1]:9s} {key[2]:9s} {len(g):3d} {statistics.mean(r['err'] for r in g):+10.1f}"
              f" {statistics.mean(abs(r['err']) for r in g):12.1f}"
              f" {statistics.mean(100 * r['host'] / r['step'] for r in g):14.1f}"
              f" {need_text(statistics.median(need)):>14s} {sum(n == -np.inf for n in need):3d}"
              f" {sum(n == np.inf for n in need):5d}")


if __name__ == "__main__":
    main()
