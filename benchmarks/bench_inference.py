"""Speed and accuracy of the inference search (issue 6); prints markdown tables.

    python benchmarks/bench_inference.py                  # search times, validation summary, worked examples
    python benchmarks/bench_inference.py --cross-validate # + leave-one-model-out refits (~1 min)

Search time is measured in-process (candidate generation, pricing, ranking; imports excluded)
as the median of --repeat runs, and once end to end through the CLI (a fresh process, imports
and YAML parsing included, no run folder).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from autoparallel import io
from autoparallel.serve import search as serve
from autoparallel.serve.report import markdown_table
from autoparallel.serve.space import load_space
from autoparallel.serve.validate import FIT_KEYS, fit, load_rows, predict, short_model, summary

CASES = [  # (model, gpus, gpu, input, output, bound ms, metric, pins)
    ("llama3-70b", 8, "h100-sxm", 2048, 256, 50.0, "tpot", {}),
    ("gpt3-175b", 16, "a100-sxm-80g", 512, 32, 2000.0, "e2e", {}),
    ("llama2-70b", 8, "h100-sxm", 2048, 256, 50.0, "tpot", {"weight_precision": "fp8"}),
    ("llama3.1-405b", 16, "h100-sxm", 4096, 512, 100.0, "tpot", {}),
]


def run_case(case, repeat: int):
    name, gpus, gpu, s_in, s_out, bound, metric, pins = case
    model, hw = io.load_model(name), io.load_hardware(gpu)
    space = load_space().pinned(**pins)
    request = serve.Request(s_in, s_out, bound, metric)
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = serve.search(model, hw, gpus, request, space)
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def cli_seconds(case) -> float:
    name, gpus, gpu, s_in, s_out, bound, metric, pins = case
    argv = [sys.executable, "-m", "autoparallel.cli", "infer", "--model", name, "--gpus", str(gpus),
            "--gpu", gpu, "--input-len", str(s_in), "--output-len", str(s_out), "--max-latency-ms", str(bound),
            "--latency-metric", metric, "--no-save"]
    for k, v in pins.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def cross_validate() -> None:
    rows = load_rows()
    print("\n### Leave-one-model-out (refit without the model, predict it)\n")
    print("| held-out model | rows | mean abs err % | max abs err % |\n|---|---|---|---|")
    frame = rows.frame
    for name in frame["model"].unique():
        train = type(rows)(**{**rows.__dict__, "frame": frame[frame["model"] != name]})
        test = type(rows)(**{**rows.__dict__, "frame": frame[frame["model"] == name]})
        eff, _ = fit(train)
        s = summary(predict(test, eff))
        print(f"| {short_model(name)} | {s['rows']} | {s['mean_abs_error_pct']:.1f} | {s['max_abs_error_pct']:.1f} |")
    print(f"\n(refits the {len(FIT_KEYS)} fitted constants each time)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cross-validate", action="store_true")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--rows", action="store_true", help="also print the per-row validation table")
    args = p.parse_args()

    print("### Search time (default space)\n")
    print("| case | candidates | feasible | search s (median, in-process) | CLI s (fresh process) |")
    print("|---|---|---|---|---|")
    results = []
    for case in CASES:
        result, seconds = run_case(case, args.repeat)
        results.append(result)
        label = f"{case[0]} on {case[1]} x {case[2]}, {case[3]}/{case[4]}, {case[6]} <= {case[5]:g} ms"
        print(f"| {label} | {len(result.ranked)} | {len(result.feasible)} | {seconds:.3f} | {cli_seconds(case):.2f} |")

    rows = load_rows()
    from autoparallel.serve.assumptions import efficiency_for
    report = predict(rows, efficiency_for(rows.hardware.name))
    s = summary(report)
    print("\n### Validation (FasterTransformer, A100, end-to-end latency)\n")
    print(f"{s['rows']} rows: mean |error| {s['mean_abs_error_pct']:.1f} %, median {s['median_abs_error_pct']:.1f} %, "
          f"max {s['max_abs_error_pct']:.1f} %; memory: {s['measured_rows_predicted_to_fit']}/{s['rows']} measured "
          f"rows predicted to fit, {s['oom_rows_predicted_not_to_fit']}/{s['oom_rows']} OOM rows predicted "
          "not to fit\n")
    print("| model | rows | mean abs err % | max abs err % |\n|---|---|---|---|")
    for m, v in s["by_model"].items():
        print(f"| {short_model(m)} | {v['rows']} | {v['mean_abs_error_pct']:.1f} | {v['max_abs_error_pct']:.1f} |")
    print(f"\nmemory per GPU vs FT's noted use ({s['memory_rows']} single-GPU rows): mean |error| "
          f"{s['memory_mean_abs_error_pct']:.1f} % (signed mean {s['memory_mean_error_pct']:+.1f} %)")
    if args.rows:
        print("\n| model | TP | PP | in | out | batch | measured ms | predicted ms | error % | fits (GiB) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for _, r in report.iterrows():
            measured = "OOM" if r["oom"] else f"{r['latency_ms']:.1f}"
            err = "-" if r["oom"] else f"{r['error_pct']:+.1f}"
            print(f"| {short_model(r['model'])} | {r['tp']} | {r['pp']} | {r['input_len']} | {r['output_len']} | "
                  f"{r['batch_or_concurrency']} | {measured} | {r['predicted_ms']:.1f} | {err} | "
                  f"{'yes' if r['fits'] else 'no'} ({r['memory_gib']:.1f}) |")

    for result in results:
        print(f"\n### {serve.title_of(result)}\n")
        print(markdown_table(result.ranked, args.top))
    if args.cross_validate:
        cross_validate()


if __name__ == "__main__":
    main()
