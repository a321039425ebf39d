"""AMD's MLPerf v5.1 llama2-70b Interactive rows (vLLM on ROCm): measured against simulated time per
decode iteration, the decomposition behind the held-out group's +76 % Interactive tokens/s.

Why: ``validate --inference`` predicts the Interactive tokens/s of AMD's eight runs 1.5-2.4x too high
while Offline and Server are within a few per cent. An Interactive run's tokens/s is set by the TPOT
bound (40 ms p99), so what matters is the time of one decode iteration at the run's small batch. This
prints, per Interactive run (and the same GPU's Server runs for contrast), at the submitted rate:

- measured (LoadGen's mlperf_log_summary.txt in the MLCommons mirror): mean / p99 TPOT, mean / p99
  TTFT, and the requests in flight per GPU by Little's law (samples/s x mean latency / GPUs);
- simulated (the held-out group's own replica, ``serve/mlperf.py``, at the same rate per replica):
  the same figures, the share of the time in iterations that prefill (``P``), the mean decode batch;
- the model's decode-only iteration at the *measured* requests in flight (``decode@n``) and the
  iteration the measurement implies, mean TPOT x (1 - P): each decode iteration gives every running
  request one token and the prefill iterations take P of the time (P as simulated); ``gap`` is their
  difference, the time per decode iteration the model does not price.

    python benchmarks/bench_amd_interactive_step.py               # needs the inference_results_v5.1 mirror
    python benchmarks/bench_amd_interactive_step.py --single-step # vLLM V0 multi-step off (session 52)
    python benchmarks/bench_amd_interactive_step.py --what-if-ms 0 5 10  # the amd group under a host time

``--what-if-ms``: the amd group's mean |error| of tokens/s (and signed mean) by scenario and GPU, in sample,
with the ``vllm`` engine's ``pass_overhead_us`` (the host's time per iteration, added to each; 0 as fitted) set
to each value: a probe of what a per-iteration host cost would do, not a shipped constant (no source sizes it).

RESULTS.md (session 53, s53h5): the Interactive gap is 9.3-9.7 ms per decode iteration on MI300X (V0, eager,
multi-step 8) and 6.7-9.6 ms on MI325X (V1, eager, chunked prefill), at 34-83 requests in flight per GPU, where
the model prices 17-18.5 ms; Server's is 2-9 ms on 64-86 ms. No source found sizes such a per-iteration cost
(eager HIP launches, V0 / V1 host work) on ROCm, so it is not priced.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import subprocess
from pathlib import Path

import numpy as np

from autoparallel import io
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.simulate import IterationCost, run_workload
from autoparallel.serve.workload import load_workload

MIRROR = Path("/work/.mirror/mlcommons+inference_results_v5.1/repo")


class Recorded(IterationCost):
    """An ``IterationCost`` that keeps the time of the iterations with prompts and the decode batches
    (``simulate`` prices a subclass through ``time`` and ``decode_times``, the same sums)."""

    def start(self):
        self.prefill_s, self.decode_iters, self.decode_seqs = 0.0, 0, 0
        return self

    def time(self, tokens, sampled, flops, nbytes, seqs, chunks=()):
        t = super().time(tokens, sampled, flops, nbytes, seqs, chunks)
        if tokens > seqs:  # a prompt chunk in it (``simulate`` passes the chunks' shapes only with PP)
            self.prefill_s += t
        else:
            self.decode_iters += 1
            self.decode_seqs += seqs
        return t

    def decode_times(self, n, ctx_sums):
        self.decode_iters += len(ctx_sums)
        self.decode_seqs += n * len(ctx_sums)
        return super().decode_times(n, ctx_sums)


def measured(row) -> dict | None:
    """LoadGen's summary of the row's run (its ``source``'s first path), None without the mirror."""
    path = row["source"].split(": ", 1)[1].split(";")[0].strip()
    try:
        text = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{path}"], capture_output=True, text=True,
                              check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None

    def get(name):
        return float(re.search(re.escape(name) + r"\s*:\s*([0-9.]+)", text).group(1))

    sps = get("Completed samples per second")
    return {"tpot": get("Mean Time to Output Token (ns)") / 1e6,
            "tpot99": get("99.00 percentile time to output token (ns)") / 1e6,
            "ttft": get("Mean First Token latency (ns)") / 1e6,
            "ttft99": get("99.00 percentile first token latency (ns)") / 1e6,
            "inflight": sps * get("Mean latency (ns)") / 1e9 / float(row["gpus"])}


def what_if(ms_values: list[float]) -> None:
    """The amd group's tokens/s errors with a host time per iteration of each of ``ms_values`` ms."""
    held = next(h for h in mlperf.held_out_sets() if h["engine"] == "vllm")
    rows, _ = mlperf.load_rows(held["csv"], held["engine"], held["engine_column"])
    fitted = efficiency_for(held["engine"])
    for ms in ms_values:
        eff = dataclasses.replace(fitted, pass_overhead_us=fitted.pass_overhead_us + 1e3 * ms)
        mlperf.efficiency_for = lambda engine, eff=eff: eff  # read by predict_rows (forked workers inherit it)
        mlperf.clear_simulations()
        out = mlperf.predict_rows(rows, cross=False, engine=held["engine"])
        parts = []
        for (scenario, gpu), g in out.groupby(["scenario", "gpu_family"]):
            parts.append(f"{gpu} {scenario} {g['in_sample_pct'].abs().mean():.1f} ({g['in_sample_pct'].mean():+.1f})")
        print(f"host +{ms:g} ms / iteration: " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--single-step", action="store_true", help="simulate vLLM V0 without multi-step scheduling")
    ap.add_argument("--what-if-ms", type=float, nargs="+", help="the amd group's errors under these host times")
    args = ap.parse_args()
    if args.what_if_ms:
        what_if(args.what_if_ms)
        return
    s = mlperf.settings()
    held = next(h for h in mlperf.held_out_sets() if h["engine"] == "vllm")
    rows, _ = mlperf.load_rows(held["csv"], held["engine"], held["engine_column"])
    rows = rows[(rows["model"] == "llama2-70b") & (rows["scenario"] != "Offline")].sort_values(
        ["scenario", "gpu_family", "submitter"])
    eff = efficiency_for(held["engine"])
    wl = load_workload(s["workloads"]["llama2-70b"])
    spec = io.load_model(s["models"]["llama2-70b"])
    print(f"{'run':34} {'eng':9} {'n meas':>6} {'n sim':>6} {'TPOT meas':>9} {'sim':>5} {'p99 meas':>8} {'sim':>5} "
          f"{'TTFT meas':>9} {'sim':>5} {'p99 meas':>8} {'sim':>5} {'P':>5} {'decode@n':>8} {'implied':>7} {'gap':>5}")
    for _, r in rows.iterrows():
        run = r["engine_settings"]
        if args.single_step:
            run = run._replace(scheduler_steps=1)
        hw = mlperf.gfx_clock(io.load_hardware(r["hardware"]), run.gfx_clock_mhz)
        cost, sched = mlperf.harness_replica(spec, hw, eff, wl, int(r["tp"]), int(r["pp"]), int(r["max_batch"]),
                                             int(r["max_num_tokens"]), r["weight_precision"], r["kv_precision"],
                                             float(r["kv_fraction"]), run)
        rec = Recorded.__new__(Recorded)
        rec.__dict__.update(cost.__dict__)
        rate = float(r["target_qps"]) / float(r["replicas"])
        sim = run_workload(rec.start(), sched, wl, rate, max(3000, math.ceil(rate * 600.0)))
        lat = sim.finish - sim.arrival
        busy = float(np.nanmax(sim.finish))
        share = rec.prefill_s / busy
        m = measured(r)
        ctx = float(np.mean(sim.input_len) + np.mean(sim.output_len) / 2.0)
        n = int(round(m["inflight"])) if m else int(round(rate * float(np.nanmean(lat))))
        model_step = 1e3 * float(cost.decode_times(n, np.array([n * ctx]))[0])
        label = f"{r['submitter'][:12]} {r['gpu_family']} {r['scenario']}"
        eng = ("V0 x" + str(run.scheduler_steps)) if run.prefill_first else "V1 chunk"
        meas = (m["inflight"], m["tpot"], m["tpot99"], m["ttft"], m["ttft99"]) if m else (math.nan,) * 5
        implied = meas[1] * (1.0 - share)
        print(f"{label:34} {eng:9} {meas[0]:6.1f} {rate * float(np.nanmean(lat)):6.1f} {meas[1]:9.1f} "
              f"{1e3 * float(np.mean(sim.tpot)):5.1f} {meas[2]:8.1f} {1e3 * mlperf.loadgen_percentile(sim.tpot, 99):5.1f} "
              f"{meas[3]:9.0f} {1e3 * float(np.mean(sim.ttft)):5.0f} {meas[4]:8.0f} "
              f"{1e3 * mlperf.loadgen_percentile(sim.ttft, 99):5.0f} {share:5.2f} {model_step:8.1f} {implied:7.1f} "
              f"{implied - model_step:5.1f}")
    print("n: requests in flight per GPU (measured: Little's law); TPOT / TTFT in ms, mean and p99 at the submitted "
          "rate; P: simulated share of time in iterations with prompts; decode@n: the model's decode-only iteration "
          "at the measured n (ms); implied: measured mean TPOT x (1 - P); gap: implied - decode@n")


if __name__ == "__main__":
    main()
