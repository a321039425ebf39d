"""Issue 29: every MLPerf Server p99 row, what its miss is made of, and how the p99 depends on the rate.

    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py            # ~3 min on one core
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --csv OUT  # the rows as CSV as well
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --fixed-costs  # what-if refits (~8 min)
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --shape  # mean / p50 / p90 / p99 (~10 s)
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --concurrency  # at the measured N (~3 min)
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --level  # level matched, dispatch (~10 min)
    PYTHONPATH=$PWD python benchmarks/bench_issue29_p99_rows.py --compose  # llama2-70b p99 TPOT's parts (~10 min)

For each Server run that ``validate --inference`` compares (in sample; TensorRT-LLM v4.1 closed):
the engine, GPU, benchmark, round, layout and rate per replica; the measured and simulated p99
TTFT / TPOT / end-to-end latency at the submitted QPS; the simulated replica's mean iteration and
requests in flight (Little's law) there; the measured mean iteration implied by the measured p99
end-to-end latency (the p99 request is one of the ~1,000-token answers in both, so the ratio of
the p99 end-to-end latencies is the ratio of the mean iterations; for Mixtral, whose answer-length
tail is not published, an assumption).

How the p99 depends on the rate: the elasticity d ln p99 / d ln rate at the submitted QPS (central
difference at +-2 %), and the error of the modelled capacity that alone would explain the miss
(ln(measured / simulated) / elasticity). A queue's p99 grows like 1 / (1 - load) near capacity,
so where the elasticity is E a capacity error of x % moves the p99 by about E x %: a 25 % p99
target at the submitted QPS needs the capacity right to within 25 / E %.

``--fixed-costs`` (a diagnostic, nothing shipped): TensorRT-LLM's constants refitted on
serving_runs.csv (``serve.fit``, as ``python -m autoparallel.serve.fit`` does) with one fixed cost
held at a value the tables do not pin (a per-iteration cost, a per-layer cost with the TP all-reduce
latency refitted or held at today's 79 us), and what the MLPerf figures (in sample) do: whether a
fixed cost the throughput tables cannot see is what the Server p99s ask for.

``own``: the p99s at the simulated replica's own Server rate (the largest within the bounds,
where its Server tokens/s are taken; ``serve.mlperf``), no measured QPS in them.

``--shape``: the whole distribution where LoadGen's summary publishes it (mean, p50, p90, p99
TTFT and TPOT, mean latency; ``SUMMARIES``), measured against simulated at the submitted QPS, and
the TTFT in units of the mean TPOT (~ the mean decode iteration): whether a p99 miss is the
tail's shape, the queueing (TTFT in iterations) or the service (the iteration itself), and the
requests in flight by Little's law (rate x mean latency).

``--concurrency``: for the runs of ``SUMMARIES``, the simulated replica at **matched concurrency**:
the Poisson rate (bisection) at which its requests in flight (rate x mean latency, Little's law)
equal the measured ones (LoadGen's rate x mean latency), and its TTFT / TPOT distribution there
against LoadGen's; the requests in flight the simulated KV pool holds (its tokens over the
time-averaged tokens an in-flight request holds: prompt + half its answer, in whole blocks,
weighted by the answer's length); and the same system's Offline run (the engine at its max batch)
as tokens/s per replica and per request in flight, measured and simulated: whether the measured
Server iteration at N is the Offline engine's at N (the simulated curve) or slower.

``--level`` (a diagnostic, nothing shipped; session 40): for the runs of ``SUMMARIES``, the
host cost per streamed token (us per request producing a token, added to every iteration: NVIDIA's
harness streams every token in Server and none in Offline, harness_llm/main_llm.cc) at which the
simulated mean TPOT at the submitted QPS equals LoadGen's (bisection), and the TTFT / TPOT p50 /
p99 there, with each replica fed an independent Poisson share (as ``serve.mlperf`` does) and with
the deployment's Poisson stream dealt out in turn (every ``replicas``-th arrival: a round-robin
stand-in for the harness's load balancing, ``traffic_distribution_policy`` 2, which sends each
sample to the replica with the fewest in flight, harness_llm/llm_server.cc ``getLeastBusyIdx``),
and with that policy itself (``least_in_flight``: the replicas simulated apart, each arrival sent to
the one with the fewest in flight by the previous pass's latencies, three passes): whether, once
the level is right, the simulated spread is LoadGen's.

``--compose`` (a diagnostic, nothing shipped; session 45): for every llama2-70b Server run, what the
simulated p99 TPOT at the submitted QPS is made of (in sample): the requests decoding (Little's law),
the mean iteration and the prompt tokens it carries, the decode-only iteration of that batch and the
share of the mean iteration the prompts take, the p99/p50 spread and the median answer of the
requests at or above the p99; then **k**, every iteration k x longer (exactly: the rate k x higher
and every time k x longer), bisected so the simulated p99 TPOT is LoadGen's (the largest k tried
whose p99 TPOT is still under it, over the run's minimum duration), the p99 TPOT and TTFT there
(whether the TTFT miss has the same cause), and **r**,
what is left of k once the same system's Offline shortfall is taken out: (1 + k) x measured /
simulated Offline tokens/s per replica - 1 (a system whose Offline run is x % slower than simulated
has every iteration ~x % longer in both scenarios).

``matched``: the p99s at the submitted load relative to capacity instead of the submitted rate
(the rate scaled by the simulated / measured Offline output tokens/s per replica of the same
system, where it submitted an Offline run of the same layout): what is left of the miss once the
capacity error (the Offline figure, validated apart) is taken out.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.simulate import run_workload
from autoparallel.serve.workload import load_workload

STEP = 0.02

#: LoadGen's Server summaries with the whole distribution (mlcommons/inference_results_v4.1 @ a2f5d66,
#: closed/<submitter>/results/<system>/<benchmark>/Server/performance/run_1/mlperf_log_summary.txt):
#: (submitter, system, benchmark, target QPS, TTFT mean / p50 / p90 / p99 ms, TPOT mean / p50 / p90 /
#: p99 ms, mean latency s).
SUMMARIES = (
    ("NVIDIA", "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b-99.9", 75.0,
     (275.9, 273.0, 372.9, 461.3), (155.0, 156.4, 165.8, 175.4), 44.95),
    ("HPE", "HPE_Cray_XD670_H100_SXM_80GBx8_TRT", "llama2-70b-99", 80.0,
     (229.0, 226.7, 306.3, 381.8), (127.0, 128.4, 135.9, 141.0), 36.92),
    ("NVIDIA", "H200-SXM-141GBx8_TRT", "llama2-70b-99", 101.0,
     (198.3, 180.8, 309.5, 452.7), (123.3, 124.3, 133.5, 146.0), 35.85),
    ("NVIDIA", "DGX-H100_H100-SXM-80GBx8_TRT", "mixtral-8x7b", 348.0,
     (180.0, 154.3, 285.3, 628.9), (102.6, 102.8, 112.5, 123.1), 15.02),
    ("Supermicro", "SYS_821GE_TNHR_H100_SXM_80GBx8_TRT", "mixtral-8x7b", 347.2,
     (256.7, 173.1, 404.6, 1824.8), (108.5, 109.2, 117.7, 126.7), 15.95),
    ("NVIDIA", "H200-SXM-141GBx8_TRT", "mixtral-8x7b", 392.0,
     (227.6, 215.4, 329.0, 539.7), (138.4, 139.2, 153.0, 167.0), 20.22),
)


def _replica(r, eff, max_batch: int | None = None):
    """(cost, scheduler, workload) of run ``r``'s replica; ``max_batch``: in place of the run's own."""
    s = mlperf.settings()
    wl = load_workload(s["workloads"][r["model"]])
    batch = int(r["max_batch"]) if max_batch is None else max_batch
    cost, sched = mlperf.harness_replica(io.load_model(s["models"][r["model"]]), io.load_hardware(r["hardware"]), eff,
                                         wl, int(r["tp"]), int(r["pp"]), batch, int(r["max_num_tokens"]),
                                         r["weight_precision"], r["kv_precision"], float(r["kv_fraction"]))
    return cost, sched, wl


def at_rate(r, eff, rate: float) -> dict:
    """The simulated replica at ``rate`` requests/s over the run's minimum duration (as mlperf._simulate)."""
    cost, sched, wl = _replica(r, eff)
    n = max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3))
    sim = run_workload(cost, sched, wl, rate, n)
    e2e = sim.finish - sim.arrival
    p99 = {"ttft_p99_ms": sim.ttft, "tpot_p99_ms": sim.tpot, "e2e_p99_ms": e2e}
    out = {k: 1e3 * mlperf.loadgen_percentile(v, 99.0) if sim.keeps_up else np.nan for k, v in p99.items()}
    out["iteration_ms"] = 1e3 * sim.duration / sim.iterations
    out["in_flight"] = len(e2e) / sim.duration * float(np.nanmean(e2e))
    out["keeps_up"] = sim.keeps_up
    return out


def offline_scale(rows: pd.DataFrame, report: pd.DataFrame) -> pd.Series:
    """Simulated / measured Offline tokens/s per replica of the same submitter, system, model and TP x PP."""
    key = ["submitter", "system", "model", "tp", "pp"]
    off = report[report["scenario"] == "Offline"].assign(
        scale=lambda f: f["in_sample_tokens_per_s"] / f["tokens_per_s"]).drop_duplicates(subset=key)
    return rows.merge(off[key + ["scale"]], on=key, how="left")["scale"]


def table() -> pd.DataFrame:
    rows, _ = mlperf.load_rows()
    report = mlperf.predict_rows(rows, cross=False)
    server = report[report["scenario"] == "Server"].reset_index(drop=True)
    eff = efficiency_for("tensorrt-llm")
    scale = offline_scale(server, report)
    out = []
    for i, r in server.iterrows():
        rate = float(r["target_qps"]) / float(r["replicas"])
        at = at_rate(r, eff, rate)
        lo, hi = at_rate(r, eff, rate * (1 - STEP)), at_rate(r, eff, rate * (1 + STEP))
        line = {"round": r["round"], "submitter": r["submitter"], "engine": "TensorRT-LLM", "GPU": r["hardware"],
                "benchmark": r["model"], "TPxPP": f"{int(r['tp'])}x{int(r['pp'])}", "replicas": int(r["replicas"]),
                "batch": int(r["max_batch"]), "rate/rep": rate, "tok/s %": r["in_sample_pct"],
                "TTFT meas": r["ttft_p99_ms"], "TTFT sim": at["ttft_p99_ms"],
                "TPOT meas": r["tpot_p99_ms"], "TPOT sim": at["tpot_p99_ms"],
                "TTFT own": r["in_sample_ttft_own_ms"], "TPOT own": r["in_sample_tpot_own_ms"],
                "e2e meas s": r["latency_p99_ms"] / 1e3, "e2e sim s": at["e2e_p99_ms"] / 1e3,
                "iter sim ms": at["iteration_ms"], "N sim": at["in_flight"]}
        line["iter meas ms"] = line["iter sim ms"] * line["e2e meas s"] / line["e2e sim s"]
        line["N meas"] = line["N sim"] * line["e2e meas s"] / line["e2e sim s"]
        for name in ("ttft", "tpot"):
            col = f"{name}_p99_ms"
            e = (math.log(hi[col]) - math.log(lo[col])) / (math.log(1 + STEP) - math.log(1 - STEP)) \
                if lo["keeps_up"] and hi["keeps_up"] else np.nan
            line[f"E {name.upper()}"] = e
            line[f"cap err {name.upper()} %"] = 100 * math.log(r[col] / at[col]) / e if e and e > 0 else np.nan
        s = scale.iloc[i]
        if np.isfinite(s):
            m = at_rate(r, eff, rate * s)
            line["TTFT matched"], line["TPOT matched"] = m["ttft_p99_ms"], m["tpot_p99_ms"]
        out.append(line)
    return pd.DataFrame(out)


def shape() -> pd.DataFrame:
    """Measured (LoadGen's summaries) against simulated distributions at the submitted QPS: one
    line per run and quantity (TTFT, TPOT, TTFT / mean TPOT), the mean / p50 / p90 / p99, and the
    requests in flight per replica (Little's law)."""
    rows, _ = mlperf.load_rows()
    eff = efficiency_for("tensorrt-llm")
    out = []
    for submitter, system, benchmark, qps, ttft, tpot, latency_s in SUMMARIES:
        r = rows[(rows["submitter"] == submitter) & (rows["system"] == system) & (rows["scenario"] == "Server")
                 & (rows["benchmark"].str.startswith(benchmark.split("-99")[0]))
                 & ((rows["target_qps"] - qps).abs() < 0.5)].iloc[0]
        rate = qps / float(r["replicas"])
        cost, sched, wl = _replica(r, eff)
        sim = run_workload(cost, sched, wl, rate, max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3)))
        stats = lambda x: (1e3 * float(np.mean(x)), *(1e3 * mlperf.loadgen_percentile(x, p) for p in (50, 90, 99)))  # noqa: E731
        s_ttft, s_tpot = stats(sim.ttft), stats(sim.tpot)
        n_meas, n_sim = rate * latency_s, rate * float(np.mean(sim.finish - sim.arrival))
        at_n = at_concurrency(r, eff, n_meas)
        for what, meas, simulated in (("TTFT ms", ttft, s_ttft), ("TPOT ms", tpot, s_tpot),
                                      ("TTFT / mean TPOT", tuple(v / tpot[0] for v in ttft),
                                       tuple(v / s_tpot[0] for v in s_ttft))):
            line = {"submitter": submitter, "GPU": r["hardware"], "benchmark": r["model"],
                    "req/s/rep": rate, "N meas / sim": f"{n_meas:,.0f} / {n_sim:,.0f}",
                    "tok/s at N meas: sim / meas": f"{at_n:,.0f} / {rate * wl.mean_output:,.0f}", "quantity": what}
            for name, m, v in zip(("mean", "p50", "p90", "p99"), meas, simulated):
                line[name] = f"{m:,.3g} / {v:,.3g}" if what.startswith("TTFT /") else f"{m:,.0f} / {v:,.0f}"
            line["p99 / p50 meas / sim"] = f"{meas[3] / meas[1]:.2f} / {simulated[3] / simulated[1]:.2f}"
            out.append(line)
    return pd.DataFrame(out)


def at_concurrency(r, eff, n: float, requests: int = 20_000) -> float:
    """Output tokens/s of the simulated replica holding ``n`` requests in flight: an all-at-once
    run with the batch capped at ``n``, its steady rate (the engine's throughput curve at that
    point; the measured Server run's is its rate x the mean output at its Little's-law ``n``)."""
    cost, sched, wl = _replica(r, eff, max(1, round(n)))
    return run_workload(cost, sched, wl, None, requests).steady_requests_per_s * wl.mean_output


def pool_requests(sched, wl, samples: int = 200_000) -> float:
    """Requests in flight the simulated KV pool holds on average: its tokens over the tokens an
    in-flight request holds, time-averaged (prompt + half its answer in whole blocks, each request
    weighted by its answer's length: the time it stays)."""
    return sched.kv_blocks * sched.block / mlperf.tokens_held_per_request(wl, sched.block, samples)


def concurrency() -> pd.DataFrame:
    """``SUMMARIES`` at matched concurrency (see the module docstring)."""
    rows, _ = mlperf.load_rows()
    eff = efficiency_for("tensorrt-llm")
    ms = lambda x, p: 1e3 * mlperf.loadgen_percentile(x, p)  # noqa: E731
    out = []
    for submitter, system, benchmark, qps, ttft, tpot, latency_s in SUMMARIES:
        same = (rows["submitter"] == submitter) & (rows["system"] == system) & (
            rows["benchmark"].str.startswith(benchmark.split("-99")[0]))
        r = rows[same & (rows["scenario"] == "Server") & ((rows["target_qps"] - qps).abs() < 0.5)].iloc[0]
        rate = qps / float(r["replicas"])
        n_meas = rate * latency_s
        cost, sched, wl = _replica(r, eff)
        matched, sim = mlperf.rate_at_concurrency(cost, sched, wl, rate, n_meas)
        n_sim = matched * float(np.mean(sim.finish - sim.arrival))
        line = {"submitter": submitter, "GPU": r["hardware"], "benchmark": r["model"], "req/s/rep": rate,
                "matched req/s": matched, "N meas / sim": f"{n_meas:,.0f} / {n_sim:,.0f}",
                "pool holds N": pool_requests(sched, wl),
                "TTFT mean/p50/p99 meas": "/".join(f"{v:,.0f}" for v in (ttft[0], ttft[1], ttft[3])),
                "TTFT sim": "/".join(f"{v:,.0f}" for v in (1e3 * np.mean(sim.ttft), ms(sim.ttft, 50), ms(sim.ttft, 99))),
                "TPOT mean/p50/p99 meas": "/".join(f"{v:,.0f}" for v in (tpot[0], tpot[1], tpot[3])),
                "TPOT sim": "/".join(f"{v:,.0f}" for v in (1e3 * np.mean(sim.tpot), ms(sim.tpot, 50), ms(sim.tpot, 99)))}
        off = rows[same & (rows["scenario"] == "Offline")]
        if not off.empty:
            o = off.iloc[0]
            o_cost, o_sched, o_wl = _replica(o, eff)
            o_sim = run_workload(o_cost, o_sched, o_wl, None, 20_000)
            n_off = min(float(o["max_batch"]), pool_requests(o_sched, o_wl))
            meas_off = float(o["tokens_per_s"]) / float(o["replicas"])
            line["Offline tok/s/rep meas / sim"] = f"{meas_off:,.0f} / {o_sim.steady_requests_per_s * o_wl.mean_output:,.0f}"
            # the measured Server engine's tokens/s at its N over the Offline engine's at its N,
            # against the same ratio of the simulated curve (an all-at-once run capped at each N)
            srv_meas = rate * float(r["out_tokens_per_sample_perf"])
            srv_curve = at_concurrency(r, eff, n_meas) / at_concurrency(o, eff, n_off)
            line["Server/Offline tok/s meas / sim curve"] = f"{srv_meas / meas_off:.3f} / {srv_curve:.3f}"
        out.append(line)
    return pd.DataFrame(out)


def with_host_cost(cost, us: float):
    """A copy of the iteration cost ``cost`` whose every iteration also pays ``us`` microseconds per
    sequence that produces a token in it (pipeline-free layouts: every ``SUMMARIES`` run is PP1)."""
    import copy
    out, time, decode = copy.copy(cost), cost.time, cost.decode_times
    out.time = lambda tokens, sampled, flops, nbytes, seqs, chunks=(): (
        time(tokens, sampled, flops, nbytes, seqs, chunks) + us * 1e-6 * sampled)
    out.decode_times = lambda n, ctx_sums: decode(n, ctx_sums) + us * 1e-6 * n
    return out


def dealt_arrivals(n: int, rate: float, replicas: int, seed: int = 0) -> np.ndarray:
    """Arrival times at one replica when a Poisson stream of ``replicas`` x ``rate`` requests/s is
    dealt out in turn: every ``replicas``-th arrival, i.e. gaps of ``replicas`` exponential gaps of
    the whole stream (a gamma renewal process, mean gap 1 / ``rate``, squared CV 1 / ``replicas``)."""
    gaps = np.random.default_rng([seed, 1]).gamma(replicas, 1.0 / (rate * replicas), n)
    return np.cumsum(gaps) - gaps[0]


def least_in_flight(cost, sched, wl, rate: float, replicas: int, n: int, passes: int = 3, seed: int = 0):
    """One replica's requests when the deployment's Poisson stream (``replicas`` x ``rate``, ``n``
    per replica) goes to the replica with the fewest requests in flight at each arrival (the first
    such replica on ties: NVIDIA's harness, ``getLeastBusyIdx``), the replicas simulated apart: the
    requests' latencies of the previous pass decide who is in flight (first pass: dealt out in
    turn), ``passes`` times. Returns the replicas' runs (``SimResult`` each)."""
    import heapq

    from autoparallel.serve.simulate import arrivals, simulate
    total = n * replicas
    arr = arrivals(total, rate * replicas, seed)
    inp, outp = wl.sample(total, seed)
    who = np.arange(total) % replicas
    runs = []
    for step in range(passes + 1):
        runs, latency = [], np.empty(total)
        for j in range(replicas):
            idx = np.flatnonzero(who == j)
            sim = simulate(cost, sched, arr[idx] - arr[idx][0], inp[idx], outp[idx])
            runs.append(sim)
            latency[idx] = sim.finish - sim.arrival
        if step == passes:
            break
        heaps = [[] for _ in range(replicas)]
        for i in range(total):  # the fewest in flight at each arrival, by the last pass's latencies
            for h in heaps:
                while h and h[0] <= arr[i]:
                    heapq.heappop(h)
            j = min(range(replicas), key=lambda k: len(heaps[k]))
            heapq.heappush(heaps[j], arr[i] + latency[i])
            who[i] = j
    return runs


def level(steps: int = 7, top_us: float = 40.0) -> pd.DataFrame:
    """``SUMMARIES`` with the per-streamed-token host cost that matches LoadGen's mean TPOT at the
    submitted QPS, under the Poisson split and the dealt-out stream (see the module docstring)."""
    from autoparallel.serve.simulate import simulate
    rows, _ = mlperf.load_rows()
    eff = efficiency_for("tensorrt-llm")
    ms = lambda x, p: 1e3 * mlperf.loadgen_percentile(x, p)  # noqa: E731
    out = []
    for submitter, system, benchmark, qps, ttft, tpot, latency_s in SUMMARIES:
        r = rows[(rows["submitter"] == submitter) & (rows["system"] == system) & (rows["scenario"] == "Server")
                 & (rows["benchmark"].str.startswith(benchmark.split("-99")[0]))
                 & ((rows["target_qps"] - qps).abs() < 0.5)].iloc[0]
        replicas = int(r["replicas"])
        rate = qps / replicas
        cost, sched, wl = _replica(r, eff)
        n = max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3))
        lo, hi = 0.0, top_us
        for _ in range(steps):  # the mean TPOT grows with the host cost: bisect on it
            mid = 0.5 * (lo + hi)
            sim = run_workload(with_host_cost(cost, mid), sched, wl, rate, n)
            lo, hi = (mid, hi) if sim.keeps_up and 1e3 * float(np.mean(sim.tpot)) < tpot[0] else (lo, mid)
        priced = with_host_cost(cost, lo)
        split = run_workload(priced, sched, wl, rate, n)
        inp, outp = wl.sample(n, 0)
        dealt = simulate(priced, sched, dealt_arrivals(n, rate, replicas), inp, outp)
        line = {"submitter": submitter, "GPU": r["hardware"], "benchmark": r["model"], "replicas": replicas,
                "us per streamed token": lo,
                "TPOT mean/p50/p99 meas": "/".join(f"{v:,.0f}" for v in (tpot[0], tpot[1], tpot[3])),
                "TTFT p50/p99 meas": f"{ttft[1]:,.0f}/{ttft[3]:,.0f}"}
        joint = least_in_flight(priced, sched, wl, rate, replicas, n)
        fewest = type("Runs", (), {"tpot": np.concatenate([x.tpot for x in joint]),
                                   "ttft": np.concatenate([x.ttft for x in joint])})
        for name, sim in (("split", split), ("dealt", dealt), ("fewest in flight", fewest)):
            line[f"TPOT {name}"] = "/".join(f"{v:,.0f}" for v in (1e3 * np.mean(sim.tpot), ms(sim.tpot, 50),
                                                                   ms(sim.tpot, 99)))
            line[f"TTFT {name}"] = f"{ms(sim.ttft, 50):,.0f}/{ms(sim.ttft, 99):,.0f}"
        line["N meas / split"] = f"{rate * latency_s:,.0f} / {rate * float(np.mean(split.finish - split.arrival)):,.0f}"
        out.append(line)
    return pd.DataFrame(out)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    err = lambda a, b: (100 * (frame[a] - frame[b]) / frame[b]).abs()  # noqa: E731
    return pd.DataFrame([{
        "runs": len(frame),
        "TTFT % (submitted QPS)": err("TTFT sim", "TTFT meas").mean(),
        "TPOT % (submitted QPS)": err("TPOT sim", "TPOT meas").mean(),
        "TTFT % (matched load)": err("TTFT matched", "TTFT meas").mean(),
        "TPOT % (matched load)": err("TPOT matched", "TPOT meas").mean(),
        "TTFT % (own rate)": err("TTFT own", "TTFT meas").mean(),
        "TPOT % (own rate)": err("TPOT own", "TPOT meas").mean(),
        "median E TTFT": frame["E TTFT"].median(), "median E TPOT": frame["E TPOT"].median(),
        "mean iter ratio meas/sim": (frame["iter meas ms"] / frame["iter sim ms"]).mean()}])


def compose(model: str = "llama2-70b", steps: int = 7, top: float = 1.35) -> pd.DataFrame:
    """``--compose``: see the module docstring."""
    rows, _ = mlperf.load_rows()
    report = mlperf.predict_rows(rows[rows["model"] == model], cross=False)
    server = report[report["scenario"] == "Server"].reset_index(drop=True)
    scale = offline_scale(server, report)
    eff = efficiency_for("tensorrt-llm")
    out = []
    for i, r in server.iterrows():
        cost, sched, wl = _replica(r, eff)
        rate = float(r["target_qps"]) / float(r["replicas"])
        sim = run_workload(cost, sched, wl, rate,
                           max(mlperf.REQUESTS, math.ceil(rate * float(r["min_duration_ms"]) / 1e3)))
        line = {"submitter": r["submitter"], "GPU": r["hardware"], "TPxPP": f"{int(r['tp'])}x{int(r['pp'])}",
                "replicas": int(r["replicas"]), "rate/rep": rate, "TPOT meas": r["tpot_p99_ms"]}
        if not sim.keeps_up:
            out.append({**line, "TPOT sim": np.nan})
            continue
        tpot = sim.tpot
        p99 = 1e3 * mlperf.loadgen_percentile(tpot, 99.0)
        iteration = sim.duration / sim.iterations
        decoding = rate * float(np.nanmean(sim.finish - sim.first_token))
        context = float(np.mean(sim.input_len + sim.output_len / 2.0))  # prompt + half the answer
        decode_only = float(cost.decode_times(max(1, round(decoding)), np.array([decoding * context]))[0])
        many = sim.output_len > 1
        tail = np.sort(tpot)[int(0.99 * len(tpot))]
        lo, hi, at_lo = 1.0, top, sim
        for _ in range(steps):
            k = 0.5 * (lo + hi)
            run = run_workload(cost, sched, wl, rate * k,
                               max(mlperf.REQUESTS, math.ceil(rate * k * float(r["min_duration_ms"]) / 1e3)))
            v = k * 1e3 * mlperf.loadgen_percentile(run.tpot, 99.0) if run.keeps_up else math.inf
            lo, hi, at_lo = (k, hi, run) if v < r["tpot_p99_ms"] else (lo, k, at_lo)
        k = lo  # the largest scale tried whose p99 TPOT is still under LoadGen's
        s = float(scale.iloc[i])
        line.update({"TPOT sim": p99, "TPOT %": 100 * (p99 / r["tpot_p99_ms"] - 1),
                     "TPOT mean sim": 1e3 * float(tpot.mean()), "p99/p50 sim": p99 / (1e3 * float(np.median(tpot))),
                     "N decoding": decoding, "iter ms": 1e3 * iteration,
                     "prompt tok/iter": float(sim.input_len.sum()) / sim.iterations,
                     "decode-only ms": 1e3 * decode_only, "prompt share": 1 - decode_only / iteration,
                     "p99 answers (median)": float(np.median(sim.output_len[many][tpot >= tail])),
                     "k %": 100 * (k - 1),
                     "TPOT at k": k * 1e3 * mlperf.loadgen_percentile(at_lo.tpot, 99.0),
                     "TTFT meas": r["ttft_p99_ms"], "TTFT sim": 1e3 * mlperf.loadgen_percentile(sim.ttft, 99.0),
                     "TTFT at k": k * 1e3 * mlperf.loadgen_percentile(at_lo.ttft, 99.0), "Offline sim/meas": s,
                     "r %": 100 * (k / s - 1) if np.isfinite(s) else np.nan})
        out.append(line)
    return pd.DataFrame(out)


#: The what-if variants of ``--fixed-costs``: the constants held fixed in the serving refit.
VARIANTS = ({}, {"pass_overhead_us": 10000.0}, {"layer_overhead_us": 100.0},
            {"layer_overhead_us": 100.0, "allreduce_latency_us": 79.0},
            {"layer_overhead_us": 150.0, "allreduce_latency_us": 79.0})


def fixed_costs() -> pd.DataFrame:
    import dataclasses

    from autoparallel.serve import fit
    from autoparallel.serve.measured import load_serving_runs, predict
    measured = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm")
    base, fit_rows, keys = efficiency_for("tensorrt-llm"), fit.fit_rows(measured), fit.FIT_KEYS["inflight"]
    rows, _ = mlperf.load_rows()
    original = mlperf.efficiency_for
    out = []
    try:
        for held in VARIANTS:
            fit.FIT_KEYS["inflight"] = tuple(k for k in keys if k not in held)
            eff = fit.fit(measured, fit_rows, dataclasses.replace(base, **held)) if held else base
            tables = predict(measured, eff, fit_rows)["error_pct"].abs()
            mlperf.efficiency_for = lambda name, e=eff: e
            mlperf.clear_simulations()
            m = mlperf.scenario_means(mlperf.predict_rows(rows, cross=False))
            out.append({"held": ", ".join(f"{k} {v:g}" for k, v in held.items()) or "today's fit",
                        "allreduce us": eff.allreduce_latency_us, "tables %": tables.mean(),
                        "Offline %": m["offline_tokens_pct"], "Server %": m["server_tokens_pct"],
                        "p99 TTFT %": m["ttft_p99_pct"], "p99 TPOT %": m["tpot_p99_pct"],
                        "overloaded": m["server_overloaded_in_sample_runs"]})
    finally:
        fit.FIT_KEYS["inflight"] = keys
        mlperf.efficiency_for = original
        mlperf.clear_simulations()
    return pd.DataFrame(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", help="also write the rows here")
    p.add_argument("--fixed-costs", action="store_true", help="only the what-if refits (diagnostic)")
    p.add_argument("--shape", action="store_true", help="only the distributions LoadGen's summaries publish")
    p.add_argument("--concurrency", action="store_true", help="only the summaries' runs at matched concurrency")
    p.add_argument("--level", action="store_true",
                   help="only the summaries' runs with a per-streamed-token host cost matching the mean TPOT")
    p.add_argument("--compose", action="store_true",
                   help="only the llama2-70b runs: the simulated p99 TPOT's parts and the iteration scale it misses by")
    args = p.parse_args()
    if args.compose:
        print(markdown(compose()))
        return
    if args.level:
        print(markdown(level()))
        return
    if args.concurrency:
        print(markdown(concurrency()))
        return
    if args.shape:
        print(markdown(shape()))
        return
    if args.fixed_costs:
        print(markdown(fixed_costs()))
        return
    frame = table()
    if args.csv:
        frame.to_csv(args.csv, index=False)
    print(markdown(frame))
    print()
    print(markdown(summary(frame)))


def markdown(frame: pd.DataFrame) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return "-" if not np.isfinite(v) else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
