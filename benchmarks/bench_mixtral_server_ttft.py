"""Issue 29: the v4.1 H100 Mixtral Server p99 TTFT, run by run — measured against simulated, and where it goes.

    PYTHONPATH=$PWD python benchmarks/bench_mixtral_server_ttft.py           # ~1-2 min on one core
    PYTHONPATH=$PWD python benchmarks/bench_mixtral_server_ttft.py --csv OUT # the table as CSV too
    PYTHONPATH=$PWD python benchmarks/bench_mixtral_server_ttft.py --shared-queue [--requests N]
        # what-if: the deployment simulated whole, one shared queue (~20 s a run at 30,000 requests)
    PYTHONPATH=$PWD python benchmarks/bench_mixtral_server_ttft.py --level
        # diagnostic: every iteration k x longer, k bisected to LoadGen's mean TPOT (~1 min a run)

For each of the ten H100 Mixtral-8x7B Server runs that ``validate --inference`` compares (in sample,
NVIDIA's v4.1 harness, TP1 x4 or x8, FP8), at the submitted QPS per replica over the run's minimum
duration (as ``serve.mlperf._p99s`` simulates it):

- LoadGen's published TTFT distribution (``MEASURED``: mean, p50, p90, p99, p99.9, and the mean TPOT
  and mean latency) beside the simulated one, and each in units of the run's own mean TPOT (LoadGen's
  mean TPOT is the mean iteration a request sees: the loop's period);
- the load: requests in flight per replica by Little's law (rate x mean latency), measured and
  simulated, and how many requests the simulated KV pool holds at once
  (``mlperf.tokens_held_per_request``);
- where the simulated TTFT goes: each request's TTFT split into the wait before the iteration that
  prefills it and that iteration itself (its end is the first token; its start is the previous
  iteration's end, taken as the latest first token or finish before it: with ~8 such events per
  iteration at these rates an iteration without one is rare, and then the split overstates the
  iteration by one), over all requests (median) and over the requests at or above the simulated p99;
- the simulated share of requests that wait longer than the mean iteration before their prefill
  (behind a long iteration, the KV pool or the token budget: more than the residual of a mean one).

Then how the measured p99 follows the load: its rank correlation (Spearman) over the ten runs with the
measured requests in flight per replica, the measured mean TPOT and the submitted QPS per replica.

``--shared-queue`` (a what-if, nothing in the package): the deployment's replicas simulated together,
fed as NVIDIA's v4.1 harness feeds a TP1 deployment — one process (no mpirun for TP = PP = 1,
code/common/harness.py ``_construct_terminal_command``), one ``LLMServerLeader`` whose LLMCores (one
per GPU) share ONE request queue (llm_server.cc: ``RequestQueueVec(1)``; more issue threads are "not
implemented" for a single process), each GptManager loop taking, at its own iteration boundary, every
queued request up to its free slots (``GptManager::fetchNewRequests`` asks ``getMaxNumSequences() -
mActiveRequests.size()``; ``LLMCore::getInferenceRequest`` moves ``min(maxNbRequests, queue size)``)
— against the same code with each arrival sent to a replica drawn at random (independent Poisson
shares, what ``serve.mlperf`` simulates). Plain Python after ``simulate.simulate_reference`` (pp 1,
MAX_UTILIZATION's allocate-as-you-go blocks and newest-first pausing, no multi-step), so over fewer
requests than the run's duration: the shares' figures here are not ``validate``'s, only the two
columns against each other are.

``--level`` (a diagnostic, nothing in the package): per run, every simulated iteration ``k`` x longer
(``scaled_cost``: the iteration tables, the attention roofline and the host pass overhead times k),
``k`` bisected so the simulated mean TPOT at the submitted QPS is LoadGen's (the Server-only slowdown
sessions 38-45 measured and could not source, taken as given), and the p50 / p99 TTFT, the requests in
flight and the KV pool there: whether, with the iteration at the measured level, the simulated TTFT
tail follows the measured one run by run.

Why this table: the line's 70.9 % mean |error| is the largest of the v4.1 p99s; sessions 40 and 43
(RESULTS.md s40h4, s43h3) found the measured p99 following each system's own margin to its capacity
and no engine setting separating the ten runs. This prints the figures that question needs in one
place, with the load and the decomposition, so the next measurement can be chosen (RESULTS.md, session
55 s55h7).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections import deque

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.simulate import SimResult, arrivals, end_iteration, run_workload
from autoparallel.serve.workload import load_workload

#: LoadGen's Server summaries of the ten runs (mlcommons/inference_results_v4.1 @ 198fc467,
#: closed/<submitter>/results/<system>/mixtral-8x7b/Server/performance/run_1/mlperf_log_summary.txt):
#: system -> (TTFT mean, p50, p90, p99, p99.9 ms; TPOT mean ms; mean latency s).
MEASURED = {
    "XE8640_H100_SXM_80GBx4_TRT": ((155.3, 144.8, 243.1, 355.2, 480.7), 96.0, 14.03),
    "GX2560M7_H100_SXM_80GBx4_TRT": ((146.2, 136.8, 227.9, 328.4, 420.3), 90.5, 13.22),
    "DGX-H100_H100-SXM-80GBx8_TRT:Google": ((201.8, 161.8, 312.7, 1143.5, 2192.5), 105.9, 15.51),
    "HPE_Cray_XD670_H100_SXM_80GBx8_TRT": ((169.1, 152.3, 276.2, 425.6, 907.4), 100.7, 14.73),
    "DGX-H100_H100-SXM-80GBx8_TRT:NVIDIA": ((180.0, 154.3, 285.3, 628.9, 1940.9), 102.6, 15.02),
    "AS_4125GS_TNHR2_LCC_H100_SXM_80GBx8_TRT": ((254.7, 174.1, 396.8, 1708.6, 2918.8), 109.3, 16.05),
    "AS_8125GS_TNHR_H100_SXM_80GBx8_TRT": ((241.1, 170.5, 354.8, 1731.0, 3307.1), 109.1, 16.01),
    "SYS_421GE_TNHR2_LCC_H100_SXM_80GBx8_TRT": ((259.0, 172.7, 407.4, 1908.0, 3157.7), 107.7, 15.84),
    "SYS_821GE_TNHR_H100_SXM_80GBx8_TRT": ((256.7, 173.1, 404.6, 1824.8, 3223.5), 108.5, 15.95),
    "SMC_H100_SXM_80GBX8_TRT": ((167.2, 150.0, 274.2, 421.2, 969.2), 99.8, 14.60),
}
QUANTILES = (50, 90, 99, 99.9)


def measured(r) -> tuple:
    return MEASURED.get(f"{r['system']}:{r['submitter']}") or MEASURED[r["system"]]


def split_ttft(sim) -> tuple[np.ndarray, np.ndarray]:
    """(wait before the prefilling iteration, that iteration) of every request, seconds (see the module
    docstring: the iteration's start is the latest first token or finish before its end)."""
    events = np.unique(np.concatenate([sim.first_token, sim.finish]))
    events = events[np.isfinite(events)]
    pos = np.searchsorted(events, sim.first_token, side="left") - 1
    start = np.where(pos >= 0, events[np.maximum(pos, 0)], sim.arrival)
    start = np.maximum(start, sim.arrival)
    return start - sim.arrival, sim.first_token - start


def run_line(r, eff) -> dict:
    cost, sched, wl = _replica(r, eff)
    rate = float(r["target_qps"]) / float(r["replicas"])
    sim = run_workload(cost, sched, wl, rate, max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3)))
    ttft, e2e = sim.ttft, sim.finish - sim.arrival
    (m_mean, *m_q), m_tpot, m_lat = measured(r)
    s_tpot = 1e3 * float(np.mean(sim.tpot))
    s_q = [1e3 * mlperf.loadgen_percentile(ttft, q) for q in QUANTILES]
    wait, own = split_ttft(sim)
    p99 = ttft >= mlperf.loadgen_percentile(ttft, 99.0)
    iteration = sim.duration / sim.iterations
    pool = sched.kv_blocks * sched.block / mlperf.tokens_held_per_request(wl, sched.block)
    line = {"submitter": r["submitter"], "system": r["system"].replace("_TRT", ""), "rep": int(r["replicas"]),
            "batch": int(r["max_batch"]), "QPS/rep": rate, "keeps up": sim.keeps_up,
            "p99 meas": m_q[2], "p99 sim": s_q[2], "p99 %": 100 * (s_q[2] / m_q[2] - 1),
            "mean meas": m_mean, "mean sim": 1e3 * float(np.mean(ttft)),
            "p50 meas": m_q[0], "p50 sim": s_q[0], "p90 meas": m_q[1], "p90 sim": s_q[1],
            "p99.9 meas": m_q[3], "p99.9 sim": s_q[3],
            "TPOT mean meas": m_tpot, "TPOT mean sim": s_tpot, "iter sim": 1e3 * iteration,
            "p50/T meas": m_q[0] / m_tpot, "p50/T sim": s_q[0] / s_tpot,
            "p99/T meas": m_q[2] / m_tpot, "p99/T sim": s_q[2] / s_tpot,
            "N meas": rate * m_lat, "N sim": rate * float(np.mean(e2e)), "pool holds": pool,
            "wait p50 sim": 1e3 * float(np.median(wait)), "prefill iter p50 sim": 1e3 * float(np.median(own)),
            "wait @p99 sim": 1e3 * float(np.mean(wait[p99])), "prefill iter @p99 sim": 1e3 * float(np.mean(own[p99])),
            "wait > mean iter % sim": 100 * float(np.mean(wait > iteration))}
    return line


def shared_queue_run(cost, sched, arrival, inp, out, replicas: int, shared: bool, seed: int = 7):
    """The deployment's ``replicas`` engines simulated together (see the module docstring): ``shared``,
    one FIFO every engine drains at its iteration boundary (the earliest boundary first, up to its free
    slots); else each arrival goes to a replica drawn at random and waits in that replica's queue.
    Returns a ``simulate.SimResult`` over all requests."""
    n = len(arrival)
    first, finish, gen = np.full(n, np.nan), np.full(n, np.nan), [0] * n
    reps = [{"t": 0.0, "local": deque(), "running": [], "free": sched.kv_blocks} for _ in range(replicas)]
    owner = np.random.default_rng(seed).integers(0, replicas, n)
    queue, nxt, iterations, finished = deque(), 0, 0, 0
    while finished < n:
        k = min(range(replicas), key=lambda j: reps[j]["t"])
        rep = reps[k]
        t, local, running = rep["t"], rep["local"], rep["running"]
        while nxt < n and arrival[nxt] <= t:
            item = {"id": nxt, "target": int(inp[nxt]), "done": 0}
            queue.append(item) if shared else reps[owner[nxt]]["local"].append(item)
            nxt += 1
        room = sched.max_running - len(running) - len(local)
        while shared and queue and room > 0:
            local.append(queue.popleft())
            room -= 1
        while local and len(running) < sched.max_running and sched.blocks(local[0]["target"]) <= rep["free"]:
            r = local.popleft()
            r.update(blocks=sched.blocks(r["target"]), pos=0)
            rep["free"] -= r["blocks"]
            running.append(r)
        if not running:  # idle until the next arrival it could take
            later = next((j for j in range(nxt, n) if shared or owner[j] == k), None)
            rep["t"] = math.inf if later is None else max(t + 1e-9, float(arrival[later]))
            continue
        while True:  # the decode tokens' blocks, pausing the newest admitted while short
            grow = [r for r in running if r["done"] == r["target"] and r["pos"] % sched.block == 0]
            if len(grow) <= rep["free"]:
                rep["free"] -= len(grow)
                for r in grow:
                    r["blocks"] += 1
                break
            victim = running.pop()
            rep["free"] += victim["blocks"]
            victim.update(target=int(inp[victim["id"]]) + gen[victim["id"]], done=0)
            local.appendleft(victim)
        prefilling = [r for r in running if r["done"] < r["target"]]
        decoders = [r for r in running if r["done"] == r["target"]]
        ctx = sum(r["pos"] for r in decoders)
        tokens, flops, nbytes, chunks = len(decoders), ctx * cost.ctx_flops, ctx * cost.ctx_bytes, []
        for r, (c, _) in zip(prefilling, sched.chunks(tokens, [r["target"] - r["done"] for r in prefilling])):
            flops += cost.chunk_flops * c * (r["done"] + c / 2.0)
            nbytes += cost.ctx_bytes * r["done"]
            tokens += c
            chunks.append((r, c))
        completing = sum(1 for r, c in chunks if r["done"] + c == r["target"])
        t += cost.time(tokens, len(decoders) + completing, flops, nbytes, len(decoders) + len(chunks), ())
        iterations += 1
        gone = end_iteration(t, decoders, chunks, running, gen, out, first, finish)
        rep["free"] += sum(r["blocks"] for r in gone)
        finished += len(gone)
        rep["t"] = t
    return SimResult(np.asarray(arrival, float), first, finish, np.asarray(inp), np.asarray(out), iterations, 0)


def shared_queue_table(requests: int) -> pd.DataFrame:
    rows, _ = mlperf.load_rows()
    eff, out = efficiency_for("tensorrt-llm"), []
    for _, r in _runs(rows).iterrows():
        cost, sched, wl = _replica(r, eff)
        inp, outl = wl.sample(requests, 0)
        arrival = arrivals(requests, float(r["target_qps"]), 0)
        line = {"submitter": r["submitter"], "system": r["system"].replace("_TRT", ""), "rep": int(r["replicas"]),
                "TTFT p99 meas": r["ttft_p99_ms"], "TPOT p99 meas": r["tpot_p99_ms"]}
        for shared in (False, True):
            sim = shared_queue_run(cost, sched, arrival, inp, outl, int(r["replicas"]), shared)
            name = "shared" if shared else "shares"
            for q in (50, 99):
                line[f"TTFT p{q} {name}"] = 1e3 * mlperf.loadgen_percentile(sim.ttft, q)
            line[f"TPOT p99 {name}"] = 1e3 * mlperf.loadgen_percentile(sim.tpot, 99)
            line[f"TPOT mean {name}"] = 1e3 * float(np.mean(sim.tpot))
        out.append(line)
    return pd.DataFrame(out)


def scaled_cost(cost, k: float):
    """A copy of ``cost`` (a ``simulate.IterationCost``) whose every iteration takes ``k`` x as long."""
    out = copy.copy(cost)
    out.per_tokens = [k * v for v in cost.per_tokens]
    out.per_sampled = [k * v for v in cost.per_sampled]
    out.hop = [k * v for v in cost.hop]
    out.per_flop, out.per_byte, out.pass_s = k * cost.per_flop, k * cost.per_byte, k * cost.pass_s
    return out


def level_table(steps: int = 6, top: float = 2.0) -> pd.DataFrame:
    rows, _ = mlperf.load_rows()
    eff, out = efficiency_for("tensorrt-llm"), []
    for _, r in _runs(rows).iterrows():
        cost, sched, wl = _replica(r, eff)
        rate = float(r["target_qps"]) / float(r["replicas"])
        n = max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3))
        (m_mean, *m_q), m_tpot, m_lat = measured(r)
        lo, hi, best = 1.0, top, None
        for _ in range(steps):
            k = 0.5 * (lo + hi)
            sim = run_workload(scaled_cost(cost, k), sched, wl, rate, n)
            if sim.keeps_up and 1e3 * float(np.mean(sim.tpot)) <= m_tpot:
                lo, best = k, sim
            else:
                hi = k
        line = {"submitter": r["submitter"], "system": r["system"].replace("_TRT", ""), "N meas": rate * m_lat,
                "TTFT p50 meas": m_q[0], "TTFT p99 meas": m_q[2], "TPOT mean meas": m_tpot, "k": lo}
        if best is not None:
            line.update({"TPOT mean sim": 1e3 * float(np.mean(best.tpot)),
                         "TTFT p50 sim": 1e3 * mlperf.loadgen_percentile(best.ttft, 50),
                         "TTFT p99 sim": 1e3 * mlperf.loadgen_percentile(best.ttft, 99),
                         "N sim": rate * float(np.mean(best.finish - best.arrival)),
                         "pool holds": sched.kv_blocks * sched.block / mlperf.tokens_held_per_request(wl, sched.block)})
        out.append(line)
    return pd.DataFrame(out)


def _runs(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[(rows["scenario"] == "Server") & (rows["model"] == "mixtral-8x7b") & (rows["hardware"] == "h100-sxm")
                & (rows["round"] == "v4.1")]


def _replica(r, eff):
    s = mlperf.settings()
    wl = load_workload(s["workloads"][r["model"]])
    cost, sched = mlperf.harness_replica(io.load_model(s["models"][r["model"]]), io.load_hardware(r["hardware"]), eff,
                                         wl, int(r["tp"]), int(r["pp"]), int(r["max_batch"]),
                                         int(r["max_num_tokens"]), r["weight_precision"], r["kv_precision"],
                                         float(r["kv_fraction"]))
    return cost, sched, wl


def table() -> pd.DataFrame:
    rows, _ = mlperf.load_rows()
    eff = efficiency_for("tensorrt-llm")
    return pd.DataFrame([run_line(r, eff) for _, r in _runs(rows).iterrows()]).sort_values("p99 meas").reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="write the table here as CSV too")
    ap.add_argument("--shared-queue", action="store_true", help="the what-if: the deployment whole, one shared queue")
    ap.add_argument("--requests", type=int, default=30_000, help="requests of the --shared-queue runs")
    ap.add_argument("--level", action="store_true", help="the iteration scaled to LoadGen's mean TPOT")
    args = ap.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", None)
    fmt = lambda v: f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"  # noqa: E731
    if args.shared_queue:
        frame = shared_queue_table(args.requests)
        print(frame.to_string(index=False, float_format=fmt))
        for name in ("shares", "shared"):
            for q in ("TTFT p99", "TPOT p99"):
                err = 100 * (frame[f"{q} {name}"] / frame[f"{q} meas"] - 1)
                print(f"{name}: {q} mean |error| {err.abs().mean():.1f} % (signed {err.mean():+.1f} %)")
        if args.csv:
            frame.to_csv(args.csv, index=False)
        return 0
    if args.level:
        frame = level_table()
        print(frame.to_string(index=False, float_format=fmt))
        err = 100 * (frame["TTFT p99 sim"] / frame["TTFT p99 meas"] - 1)
        print(f"p99 TTFT at the measured level: mean |error| {err.abs().mean():.1f} % (signed {err.mean():+.1f} %) over "
              f"{int(err.notna().sum())} runs; Spearman with the measured {frame['TTFT p99 meas'].rank().corr(frame['TTFT p99 sim'].rank()):+.2f}")
        if args.csv:
            frame.to_csv(args.csv, index=False)
        return 0
    frame = table()
    cols = [("submitter", "system", "rep", "QPS/rep", "keeps up", "p99 meas", "p99 sim", "p99 %", "mean meas",
             "mean sim", "p50 meas", "p50 sim", "p90 meas", "p90 sim", "p99.9 meas", "p99.9 sim"),
            ("submitter", "rep", "TPOT mean meas", "TPOT mean sim", "iter sim", "p50/T meas", "p50/T sim",
             "p99/T meas", "p99/T sim", "N meas", "N sim", "pool holds"),
            ("submitter", "rep", "wait p50 sim", "prefill iter p50 sim", "wait @p99 sim", "prefill iter @p99 sim",
             "wait > mean iter % sim")]
    for c in cols:
        print(frame[list(c)].to_string(index=False, float_format=fmt))
        print()
    kept = frame[frame["keeps up"]]
    print(f"mean |error| of the p99 TTFT over the {len(kept)} runs kept: {kept['p99 %'].abs().mean():.1f} % "
          f"(signed {kept['p99 %'].mean():+.1f} %; {int((kept['p99 %'] < 0).sum())} under, "
          f"{int((kept['p99 %'] > 0).sum())} over)")
    for what in ("N meas", "TPOT mean meas", "QPS/rep"):
        rho = frame["p99 meas"].rank().corr(frame[what].rank())
        print(f"Spearman rank correlation of the measured p99 TTFT with {what}: {rho:+.2f}")
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
