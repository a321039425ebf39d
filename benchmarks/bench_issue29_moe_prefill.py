"""Issue 29: is the Mixtral prompt token priced too cheaply for the MLPerf rows? (what-if, not shipped)

The MLPerf rows are predicted with the TensorRT-LLM constants fitted on the newer trtllm-bench
tables (``efficiency_for("tensorrt-llm")``), which hold no MoE row. TensorRT-LLM 0.10's table in
serving_runs.csv has Mixtral-8x7B FP8 TP2 rows next to dense FP8 rows of the same release and
sequence lengths. Predicted with the MLPerf constants, the error of a Mixtral cell minus that of
the dense 70B TP2 cells at the same (input, output, GPU) is what the constants misprice of a
Mixtral token against a dense one, the release's own speed cancelling.

This prints (1) those errors; (2) the share ``r`` of their GEMM efficiency the routed experts'
GEMMs would need for the prefill-heavy cells (2,048 in, 128 out) to match the dense ones
(bisection; a what-if: ``price_routed_experts``' GEMM time divided by ``r`` for this script only);
(3) at that ``r``, the mlperf-mixtral-8x7b mean input the H100 Offline runs then fit
(benchmarks/bench_issue29_mlperf_input.py's procedure) and (4) how many requests the simulated
pool of NVIDIA's H100 Server engine holds at that input against LoadGen's 653 in flight.

    PYTHONPATH=$PWD python benchmarks/bench_issue29_moe_prefill.py     # ~1 min
"""

import dataclasses

from autoparallel.costmodel import inference
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.fit import predict
from autoparallel.serve.measured import load_serving_runs

DENSE = ("Llama-2-70B", "Llama-3-70B")
_ROUTED = inference.price_routed_experts


def routed_share(r: float) -> None:
    """What-if: the routed experts' GEMMs at ``r`` x the GEMM efficiency (1.0: the shipped model)."""
    def scaled(eff, work, gemm_peak, hbm):
        gemm, read = _ROUTED(eff, work, gemm_peak, hbm)
        return gemm / r, read
    inference.price_routed_experts = _ROUTED if r == 1.0 else scaled


def table_errors() -> "tuple":
    """(Mixtral FP8 rows, dense 70B FP8 TP2 rows) of TensorRT-LLM 0.10's table, MLPerf constants."""
    m10 = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm-0.10")
    r = predict(m10, efficiency_for("tensorrt-llm"))
    r = r[(r["weight_precision"] == "fp8") & r["hardware"].isin(["h100-sxm", "h200"])]
    return r[r["model"] == "Mixtral-8x7B"], r[r["model"].isin(DENSE) & (r["tp"] == 2)]


def gap(cell=(2048, 128)) -> float:
    mix, dense = table_errors()
    pick = lambda f: f[(f["input_len"] == cell[0]) & (f["output_len"] == cell[1])]["error_pct"].mean()  # noqa: E731
    return float(pick(mix) - pick(dense))


def pool_holds(mean_input: float) -> tuple[float, float]:
    """(requests the simulated pool of NVIDIA's H100 Mixtral Server engine holds, LoadGen's in flight)."""
    from autoparallel import io
    rows, _ = mlperf.load_rows()
    run = rows[(rows["submitter"] == "NVIDIA") & (rows["system"] == "DGX-H100_H100-SXM-80GBx8_TRT")
               & (rows["model"] == "mixtral-8x7b") & (rows["scenario"] == "Server")].iloc[0]
    wl = mlperf.load_workload(mlperf.settings()["workloads"]["mixtral-8x7b"])
    wl = dataclasses.replace(wl, input=dataclasses.replace(wl.input, mean=float(mean_input)))
    _, sched = mlperf.harness_replica(io.load_model("mixtral-8x7b"), io.load_hardware(run["hardware"]),
                                      efficiency_for("tensorrt-llm"), wl, 1, 1, int(run["max_batch"]),
                                      int(run["max_num_tokens"]), run["weight_precision"], run["kv_precision"],
                                      run["kv_fraction"])
    return sched.kv_blocks * sched.block / mlperf.tokens_held_per_request(wl, sched.block), run["target_qps"] / run["replicas"] * 15.02


def main() -> None:
    from bench_issue29_mlperf_input import median_error
    mix, dense = table_errors()
    print("TensorRT-LLM 0.10 FP8 rows predicted with the MLPerf constants (error %, + = predicted fast):")
    for (i, o), g in mix.groupby(["input_len", "output_len"]):
        d = dense[(dense["input_len"] == i) & (dense["output_len"] == o)]["error_pct"]
        print(f"  in {i:5d} out {o:5d}: Mixtral TP2 {', '.join(f'{e:+.1f}' for e in g['error_pct'])}"
              f"  dense 70B TP2 mean {d.mean():+.1f}")
    lo, hi = 0.2, 1.0
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        routed_share(mid)
        lo, hi = (mid, hi) if gap() < 0 else (lo, mid)
    r = 0.5 * (lo + hi)
    routed_share(r)
    print(f"routed-expert GEMM share matching the prefill-heavy cells: r = {r:.3f}")
    for (i, o), g in table_errors()[0].groupby(["input_len", "output_len"]):
        print(f"  at r: in {i:5d} out {o:5d}: Mixtral TP2 {', '.join(f'{e:+.1f}' for e in g['error_pct'])}")
    rows, _ = mlperf.load_rows()
    offline = rows[(rows["scenario"] == "Offline") & (rows["hardware"] == "h100-sxm")]
    lo, hi = 100.0, 1000.0
    for _ in range(9):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if median_error(offline, "mixtral-8x7b", mid) > 0 else (lo, mid)
    fitted = 0.5 * (lo + hi)
    holds, in_flight = pool_holds(fitted)
    print(f"at r: H100 Offline runs fit a mean input of {fitted:.0f} tokens; the simulated H100 Server pool "
          f"holds {holds:.0f} requests there (LoadGen: {in_flight:.0f} in flight)")
    routed_share(1.0)
    holds, _ = pool_holds(mlperf.load_workload(mlperf.settings()["workloads"]["mixtral-8x7b"]).input.mean)
    print(f"shipped (r = 1, the workload's input): the pool holds {holds:.0f}")


if __name__ == "__main__":
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
