"""Fit the unpublished mean input length of an MLPerf LLM benchmark (issue 29).

No source states the mean prompt length of MLPerf's llama2-70b or mixtral-8x7b datasets. This
finds, by bisection, the mean input (tokens) at which the traffic simulation's median error on
the benchmark's H100-SXM Offline runs is zero; search_spaces/workloads.yaml stores the result as a
stated, fitted assumption (the other GPUs' Offline runs and every Server run stay held out).

    PYTHONPATH=$PWD python benchmarks/bench_issue29_mlperf_input.py
"""

import dataclasses

import numpy as np

from autoparallel.serve import mlperf


def median_error(rows, model: str, mean_input: float) -> float:
    original = mlperf.load_workload

    def load(name):
        w = original(name)
        if name != mlperf.settings()["workloads"][model]:
            return w
        return dataclasses.replace(w, input=dataclasses.replace(w.input, mean=mean_input))

    mlperf.load_workload = load
    mlperf.clear_simulations()
    try:
        return float(np.median(mlperf.predict_rows(rows[rows["model"] == model], cross=False)["in_sample_pct"]))
    finally:
        mlperf.load_workload = original
        mlperf.clear_simulations()


def main() -> None:
    rows, _ = mlperf.load_rows()
    offline = rows[(rows["scenario"] == "Offline") & (rows["hardware"] == "h100-sxm")]
    for model in ("llama2-70b", "mixtral-8x7b"):
        lo, hi = 50.0, 1000.0
        for _ in range(9):
            mid = 0.5 * (lo + hi)
            err = median_error(offline, model, mid)
            print(f"{model}: mean input {mid:.1f} -> median Offline error {err:+.2f} %", flush=True)
            lo, hi = (mid, hi) if err > 0 else (lo, mid)
        print(f"{model}: fitted mean input {0.5 * (lo + hi):.0f} tokens")


if __name__ == "__main__":
    main()
