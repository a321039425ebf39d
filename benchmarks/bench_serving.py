"""The serving cost model and search of issue 16: accuracy, the 70B decision, speed; prints markdown.

    python benchmarks/bench_serving.py              # everything (about a minute on 2 shared cores)
    python benchmarks/bench_serving.py --rows       # + every validation row

Accuracy: each engine's constants as fitted (search_spaces/inference_assumptions.yaml) against
its own rows (in sample) and refits without one model predicting that model (leave-one-model-
out). Search time is measured in-process (candidate generation, pricing, ranking; imports
excluded) as the median of --repeat runs, and once end to end through the CLI (a fresh process).
Supersedes benchmarks/bench_inference.py (issue 6), whose validation API this issue replaced.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import pandas as pd

from autoparallel import io
from autoparallel.serve import search as serve
from autoparallel.serve.report import markdown_table
from autoparallel.serve.space import load_space
from autoparallel.serve.validate import by_engine_gpu_model, fastertransformer_report, ft_summary, held_out_report

TARGET = ("h100-sxm", "h200")
MEASURED = {  # TensorRT-LLM 0.12 perf-overview, one H100, FP8, output tokens/s (serving_runs.csv)
    ("llama3-8b", 128, 128): 27399.75, ("llama3-8b", 2048, 2048): 8894.11,
    ("llama2-7b", 128, 128): 19068.99, ("llama2-7b", 2048, 2048): 2802.41,
}
SEARCHES = [  # (model, gpus, gpu, input, output, bounds, pins)
    ("llama3.1-70b", 8, "h100-sxm", 2048, 256, {"max_tpot_ms": 50.0, "max_ttft_ms": 2000.0}, {"weight_precision": "fp8"}),
    ("llama3-8b", 1, "h100-sxm", 128, 128, {}, {}),
    ("llama3.1-405b", 16, "h100-sxm", 4096, 512, {"max_tpot_ms": 100.0}, {}),
    ("llama3.1-8b", 8, "h200", 20000, 1000, {"max_ttft_ms": 3000.0, "max_tpot_ms": 40.0}, {}),
    ("mixtral-8x7b", 8, "h100-sxm", 2048, 256, {"max_tpot_ms": 50.0}, {}),  # MoE: expert parallel searched too
    ("deepseek-v3", 8, "h200", 2048, 256, {"max_tpot_ms": 60.0}, {"weight_precision": "fp8"}),  # MoE + MLA
]


def mean_abs(frame: pd.DataFrame, column: str) -> float:
    return float(frame[column].abs().mean())


def accuracy(report: pd.DataFrame, ft: pd.DataFrame) -> None:
    print("### Accuracy: mean |error| of output tokens/s (TensorRT-LLM) and end-to-end latency (FT)\n")
    print("| rows | n | in sample % | leave-one-model-out % | issue target |")
    print("|---|---|---|---|---|")
    trt = report[report["engine"].str.startswith("tensorrt-llm") & report["hardware"].isin(TARGET)]
    cases = [("TensorRT-LLM 0.12 (trtllm-bench) in-flight, H100+H200, FP8+FP16", trt[trt["engine"] == "tensorrt-llm"]),
             ("  of which FP8", trt[(trt["engine"] == "tensorrt-llm") & (trt["weight_precision"] == "fp8")]),
             ("  of which FP16", trt[(trt["engine"] == "tensorrt-llm") & (trt["weight_precision"] == "fp16")]),
             ("TensorRT-LLM 0.10 (gptManagerBenchmark) in-flight, H100+H200", trt[trt["engine"] == "tensorrt-llm-0.10"]),
             ("  of which Mixtral-8x7B (MoE)", trt[(trt["engine"] == "tensorrt-llm-0.10")
                                                   & (trt["model"] == "Mixtral-8x7B")]),
             ("both releases together", trt)]
    for label, rows in cases:
        print(f"| {label} | {len(rows)} | {mean_abs(rows, 'error_pct'):.2f} | {mean_abs(rows, 'lomo_pct'):.2f} | "
              "<= 15 / <= 25 |")
    other = report[report["engine"].str.startswith("tensorrt-llm") & ~report["hardware"].isin(TARGET)]
    for engine, rows in other.groupby("engine", sort=False):
        print(f"| {engine} on A100, L40S, GH200 (not fitted on) | {len(rows)} | {mean_abs(rows, 'error_pct'):.1f} | "
              f"{mean_abs(rows, 'lomo_pct'):.1f} | - |")
    s = ft_summary(ft)
    held = report[report["engine"] == "fastertransformer"]
    print(f"| FasterTransformer (inference_runs.csv), A100, FP16, static batching | {s['rows']} | "
          f"{s['mean_abs_error_pct']:.1f} | {mean_abs(held, 'lomo_pct'):.1f} | <= 10 in sample |")
    print("\n### Per engine, GPU and model (`autoparallel validate --inference`)\n")
    print("| engine | GPU | model | rows | in sample % | LOMO % | max in sample % |\n|---|---|---|---|---|---|---|")
    for _, r in by_engine_gpu_model(report).iterrows():
        print(f"| {r['engine']} | {r['hardware']} | {r['model'].split(' (')[0]} | {r['rows']} | "
              f"{r['in_sample_pct']:.1f} | {r['lomo_pct']:.1f} | {r['max_in_sample_pct']:.1f} |")


def headline() -> None:
    print("\n### The issue's first complaint: one H100, FP8 weights and KV cache, no bound\n")
    print("| model | in/out | predicted out tok/s (best layout) | TensorRT-LLM 0.12 measured | error % |")
    print("|---|---|---|---|---|")
    for (name, s_in, s_out), measured in MEASURED.items():
        space = load_space().pinned(tp=1, pp=1, weight_precision="fp8", kv_precision="fp8")
        best = serve.search(io.load_model(name), io.load_hardware("h100-sxm"), 1, serve.Request(s_in, s_out),
                            space).entry(1)
        predicted = best["output_tokens_per_s_per_gpu"]
        print(f"| {name} | {s_in}/{s_out} | {predicted:,.0f} (max batch {int(best['max_batch'])}, max tokens "
              f"{int(best['max_num_tokens'])}, {best['concurrency']:.0f} in flight) | {measured:,.0f} | "
              f"{100 * (predicted - measured) / measured:+.1f} |")


def runner_up(result: serve.InferenceResult) -> pd.Series:
    """The best feasible layout whose structure (TP, PP, precisions) differs from the winner's."""
    best = result.entry(1)
    key = ["tp", "pp", "weight_precision", "kv_precision"]
    f = result.feasible
    return f[(f[key] != best[key]).any(axis=1)].iloc[0]


def explain(result: serve.InferenceResult) -> None:
    cols = ["tp", "pp", "replicas", "max_batch", "max_num_tokens", "weight_precision", "kv_precision", "concurrency",
            "kv_capacity_requests", "ttft_ms", "tpot_ms", "output_tokens_per_s_per_gpu", "memory_per_gpu_gib",
            "weights_gib", "kv_cache_gib", "decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_pp_s"]
    print("\n| | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    f = result.feasible
    rows = [("winner", result.entry(1)), ("runner-up (other structure)", runner_up(result)),
            ("best without PP", f[f["pp"] == 1].iloc[0]), ("best with TP > 1", f[f["tp"] > 1].iloc[0])]
    for label, row in rows:
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n(decode_*_s: one iteration's GEMM + attention FLOP time, bytes time, TP all-reduce time and pipeline "
          "hand-offs, seconds; compute and memory overlap per kernel)")


def searches(repeat: int, top: int) -> list[serve.InferenceResult]:
    print("\n### Search time\n")
    print("| case | candidates | feasible | search s (median, in-process) | CLI s (fresh process) |")
    print("|---|---|---|---|---|")
    out = []
    for name, gpus, gpu, s_in, s_out, bounds, pins in SEARCHES:
        model, hw = io.load_model(name), io.load_hardware(gpu)
        request, space = serve.Request(s_in, s_out, **bounds), load_space().pinned(**pins)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = serve.search(model, hw, gpus, request, space)
            times.append(time.perf_counter() - start)
        argv = [sys.executable, "-m", "autoparallel", "infer", "--model", name, "--gpus", str(gpus), "--gpu", gpu,
                "--input-len", str(s_in), "--output-len", str(s_out), "--no-save"]
        for k, v in {**bounds, **pins}.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        cli = time.perf_counter() - start
        label = f"{name} on {gpus} x {gpu}, {s_in}/{s_out}, {request.describe() or 'no bound'}" + (
            f", {pins}" if pins else "")
        print(f"| {label} | {len(result.ranked)} | {len(result.feasible)} | {statistics.median(times):.3f} | {cli:.2f} |")
        out.append(result)
    for result in out:
        print(f"\n#### {serve.title_of(result)}\n")
        print(markdown_table(result.feasible, top))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--rows", action="store_true", help="also print every validation row")
    args = p.parse_args()
    report, ft = held_out_report(), fastertransformer_report()
    accuracy(report, ft)
    headline()
    results = searches(args.repeat, args.top)
    decision = results[0]
    print(f"\n### The decision: {serve.title_of(decision)}\n")
    best = decision.entry(1)
    print(f"Chosen: TP{int(best['tp'])} PP{int(best['pp'])} x {int(best['replicas'])} replicas, max batch "
          f"{int(best['max_batch'])} per micro-batch, max tokens {int(best['max_num_tokens'])}, weights "
          f"{best['weight_precision']}, KV {best['kv_precision']}: {best['output_tokens_per_s_per_gpu']:,.0f} output "
          f"tokens/s per GPU ({best['output_tokens_per_s']:,.0f} for the 8 GPUs), TTFT {best['ttft_ms']:.0f} ms, "
          f"TPOT {best['tpot_ms']:.1f} ms.")
    explain(decision)
    print("\nPareto front (fitting layouts, any bound):\n")
    print(markdown_table(decision.pareto, len(decision.pareto), feasible_only=False))
    if args.rows:
        print("\n| engine | GPU | model | precision | TP | in | out | measured | predicted | error % | LOMO % |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for _, r in report.iterrows():
            print(f"| {r['engine']} | {r['hardware']} | {r['model'].split(' (')[0]} | {r['weight_precision']} | "
                  f"{r['tp']} | {r['input_len']} | {r['output_len']} | {r['measured']:,.1f} | {r['predicted']:,.1f} | "
                  f"{r['error_pct']:+.1f} | {r['lomo_pct']:+.1f} |")


if __name__ == "__main__":
    main()
