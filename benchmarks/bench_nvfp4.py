"""NVFP4 against MXFP8 / FP8 in the cost model: Llama 3.1 8B and 405B searched on 512 GB200
(issue 23 figure). Read-only use of the cost model: the default training space, every precision.

For each model: the best feasible NVFP4 layout, the best MXFP8 one and the best of every FP8
recipe (fp8-delayed / current / blockwise / mxfp8), their layouts, the predicted speed-up of
NVFP4 over each, and the step-time terms of the cost model's breakdown side by side with their
difference, so the table shows which terms the speed-up comes from (GEMM compute at the FP4 peak,
the quantization passes, communication of a different layout, the bubble).

    PYTHONPATH=. python benchmarks/bench_nvfp4.py [--gpus 512] [--gpu gb200]
"""

from __future__ import annotations

import argparse
import time

from autoparallel import io
from autoparallel.costmodel.step_time import BREAKDOWN_KEYS
from autoparallel.search import run
from autoparallel.space import load_space
from autoparallel.specs.plan import FP8_PRECISIONS

MODELS = ("llama3.1-8b", "llama3.1-405b")
LAYOUT = ("tp", "pp", "cp", "dp", "vp", "mbs", "fsdp", "sp", "recompute", "fp8_bf16_edge_layers",
          "cuda_graph", "tp_comm_overlap")


def best_by_precision(model_name: str, gpu: str, gpus: int, gbs: int | None) -> dict:
    """{'nvfp4': row, 'mxfp8': row, 'best FP8': row} of the feasible candidates, and the time."""
    model, hw = io.load_model(model_name), io.load_hardware(gpu)
    gbs = gbs or model.global_batch_size
    start = time.perf_counter()
    result = run.search(model, hw, gpus, gbs, load_space())
    seconds = time.perf_counter() - start
    f = result.feasible.sort_values("step_time_s", kind="stable")
    picks = {"nvfp4": f[f.precision == "nvfp4"], "mxfp8": f[f.precision == "mxfp8"],
             "best FP8": f[f.precision.isin(FP8_PRECISIONS)]}
    missing = [k for k, rows in picks.items() if rows.empty]
    if missing:
        raise SystemExit(f"{model_name} on {gpus} x {gpu}: no feasible {', '.join(missing)} layout")
    return {"gbs": gbs, "seconds": seconds, "candidates": len(result.ranked),
            **{k: rows.iloc[0] for k, rows in picks.items()}}


def layout(row) -> str:
    return ", ".join(f"{k}={row[k]}" for k in LAYOUT)


def report(model_name: str, gpu: str, gpus: int, found: dict) -> str:
    nv = found["nvfp4"]
    lines = [f"### {model_name}, {gpus} x {gpu}, GBS {found['gbs']} "
             f"({found['candidates']:,} candidates, search {found['seconds']:.1f} s)", ""]
    lines += ["| precision | layout | step s | tok/s/GPU | peak GiB | NVFP4 speed-up |",
              "|---|---|---|---|---|---|"]
    for label in ("nvfp4", "mxfp8", "best FP8"):
        r = found[label]
        name = r.precision if label != "best FP8" else f"best FP8 ({r.precision})"
        lines.append(f"| {name} | {layout(r)} | {r.step_time_s:.4f} | {r.tokens_per_s_per_gpu:,.0f} "
                     f"| {r.peak_memory_gib:.1f} | {r.step_time_s / nv.step_time_s:.3f}x |")
    lines += ["", "| term (s per step) | NVFP4 | MXFP8 | NVFP4 - MXFP8 | best FP8 | NVFP4 - best FP8 |",
              "|---|---|---|---|---|---|"]
    for key in BREAKDOWN_KEYS:
        a, b, c = nv[key], found["mxfp8"][key], found["best FP8"][key]
        if max(abs(a), abs(b), abs(c)) < 5e-5:
            continue
        lines.append(f"| {key} | {a:.4f} | {b:.4f} | {a - b:+.4f} | {c:.4f} | {a - c:+.4f} |")
    total = nv.step_time_s - found["mxfp8"].step_time_s, nv.step_time_s - found["best FP8"].step_time_s
    lines.append(f"| step_time_s | {nv.step_time_s:.4f} | {found['mxfp8'].step_time_s:.4f} | "
                 f"{total[0]:+.4f} | {found['best FP8'].step_time_s:.4f} | {total[1]:+.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--gpu", default="gb200")
    parser.add_argument("--gbs", type=int, help="global batch (default: each model preset's)")
    args = parser.parse_args()
    for name in MODELS:
        print(report(name, args.gpu, args.gpus, best_by_precision(name, args.gpu, args.gpus,
                                                                     args.gbs)))
        print()


if __name__ == "__main__":
    main()
