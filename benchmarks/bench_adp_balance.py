"""TensorRT-LLM's ADP balance against its own published ablation (session 56, s56h5).

NVIDIA/TensorRT-LLM@011cfc2c docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md ran DeepSeek-V3 on 8
GB200 (attention DP 8, EP 8), 16,000 requests at once (mean input 803, output 3,653, long-tailed: MLPerf's
DeepSeek-R1 shape), with in-flight batching: baseline (no balance) 25,664 tokens/s, context wait only
(``timeout_iters`` 50) 33,499, the full strategy (``timeout_iters`` 50, ``batching_wait_iters`` 10) 34,140.
This runs the same three through the lock-step simulation (serve/attention_dp.py) on the workload
``mlperf-deepseek-r1`` with NVIDIA's v5.1 GB200 Offline limits (max batch 512, max_num_tokens 4,608, NVFP4,
FP8 KV, whole prompts: the blog does not state its own) and prints tokens/s and the ratios to the baseline.
Nothing is fitted to it; the one-rank (mirror-image ranks) simulation is printed beside as the "SOL" bound.

    PYTHONPATH=. python benchmarks/bench_adp_balance.py [requests]
"""

import dataclasses
import sys
import time

from autoparallel import io
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.simulate import run_workload
from autoparallel.serve.workload import load_workload

BLOG = {"baseline": 25_664, "context wait (0, 50)": 33_499, "full (10, 50)": 34_140}


def main(requests: int = 16_000) -> None:
    model, hw = io.load_model("deepseek-v3"), io.load_hardware("gb200")
    eff = efficiency_for("tensorrt-llm")
    workload = load_workload("mlperf-deepseek-r1")
    cost, sched = mlperf.harness_replica(model, hw, eff, workload, 8, 1, 512, 4608, "nvfp4", "fp8", 0.9, None, True,
                                         (), False)
    base = None
    for (name, measured), balance in zip(BLOG.items(), [(), (0, 50), (10, 50)]):
        t0 = time.process_time()
        sim = run_workload(cost, dataclasses.replace(sched, adp_balance=balance), workload, None, requests)
        tps = sim.output_tokens_per_s
        base = base or (tps, measured)
        print(f"{name:22s} simulated {tps:8,.0f} tokens/s ({tps / base[0]:.3f} x baseline), blog {measured:,} "
              f"({measured / base[1]:.3f} x); {sim.iterations:,} iterations, {time.process_time() - t0:.1f} s CPU")
    one = run_workload(cost, dataclasses.replace(sched, dp=1, adp_balance=()), workload, None, -(-requests // 8))
    print(f"{'mirror-image ranks':22s} simulated {8 * one.output_tokens_per_s:8,.0f} tokens/s "
          f"(the one-rank model before session 56); blog's SOL of the full strategy 37,912")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
