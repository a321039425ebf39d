"""Mixture-of-experts figures (issue 14).

1. The Mixtral-8x7B case of the issue: TP2 PP4 on 64 H100, EP 1 -> 8 at ETP 1 and at Megatron's
   default ETP = TP: step time and memory, broken down.
2. Where NVIDIA's published layout ranks in the default search: DeepSeek-V3 on 256 B200 (the NeMo
   25.11 summary: TP1 PP16 EP8 MBS1 GBS2048, MXFP8) and Qwen3-235B-A22B on 256 GB200 (TP1 PP8 VP3
   EP32 MBS1 GBS8192, BF16), the precision pinned to NVIDIA's.
3. The wall time of ``search --model deepseek-v3 --gpus 1024`` in-process (generation + cost
   model, no interpreter start-up, no run folder), then of writing its run folder's
   candidates.csv (every candidate), beside pandas' own ``to_csv`` of the same table.

    python benchmarks/bench_moe.py [--skip-speed]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from autoparallel import io
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.report import run_folder
from autoparallel.search import run
from autoparallel.space import load_space
from autoparallel.specs.plan import Plan

# (model, GPUs, GPU, gbs, precision, NVIDIA's layout, measured tokens/s/GPU or None, source)
PUBLISHED = [
    ("deepseek-v3", 256, "b200", 2048, "mxfp8", dict(tp=1, pp=16, vp=1, cp=1, ep=8, mbs=1), 2139.0,
     "Megatron-Bridge performance summary, 25.11 NeMo container, DGX-B200 (not in training_runs_more.csv)"),
    ("qwen3-235b-a22b", 256, "gb200", 8192, "bf16", dict(tp=1, pp=8, vp=3, cp=1, ep=32, mbs=1), 4916.0,
     "training_runs_more.csv nemo-qwen3-235b-a22b-gb200-256gpu-bf16-tp1pp8cp1vp3ep32-mbs1-gbs8192"),
]


def mixtral_case() -> None:
    model, hw = io.load_model("mixtral-8x7b"), io.load_hardware("h100-sxm")
    print("Mixtral-8x7B, TP2 PP4, 64 x H100, MBS1 GBS256 BF16 (weights+grads+Adam in GB as Megatron counts them)")
    print()
    print("| ETP | EP | step s | compute | EP all-to-all | bubble | DP | states GB | activations GiB | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for etp in (1, 2):
        for ep in (1, 2, 4, 8):
            r = estimate_plan(model, hw, Plan(tp=2, pp=4, dp=8, gbs=256, mbs=1, ep=ep, etp=etp, sp=True))
            t, mem = r["breakdown"]["time_s"], r["breakdown"]["memory_gib"]
            states = (mem["weights_gib"] + mem["grads_gib"] + mem["optimizer_gib"]) * 2**30 / 1e9
            print(f"| {etp} | {ep} | {r['step_time_s']:.3f} | {t['compute_s']:.3f} | {t['ep_comm_s']:.3f} | "
                  f"{t['bubble_s']:.3f} | {t['dp_comm_s']:.3f} | {states:.1f} | {mem['activations_gib']:.1f} | "
                  f"{r['peak_memory_gib']:.1f} |")


def published_ranks() -> None:
    print()
    print("| model | GPUs | NVIDIA's layout | rank of its best variant | feasible | its predicted tok/s/GPU "
          "| measured | best predicted layout | its tok/s/GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, gpus, gpu, gbs, precision, layout, measured, _ in PUBLISHED:
        model, hw = io.load_model(name), io.load_hardware(gpu)
        result = run.search(model, hw, gpus, gbs, load_space().pinned(precision=precision))
        f = result.feasible
        mine = f
        for knob, value in layout.items():
            mine = mine[mine[knob] == value]
        best = f.iloc[0]
        text = " ".join(f"{k.upper()}{v}" for k, v in layout.items())
        best_text = " ".join(f"{k.upper()}{int(best[k])}" for k in layout) + f" {best['recompute']}"
        if mine.empty:
            print(f"| {name} | {gpus} x {gpu} | {text} | not feasible | {len(f):,} | - | {measured:.0f} | "
                  f"{best_text} | {best['tokens_per_s_per_gpu']:.0f} |")
            continue
        top = mine.iloc[0]
        print(f"| {name} | {gpus} x {gpu} | {text} {precision} | {int(top['rank'])} of {len(f):,} "
              f"(top {100 * top['rank'] / len(f):.2f} %) | {len(f):,} | {top['tokens_per_s_per_gpu']:.0f} | "
              f"{measured:.0f} | {best_text} | {best['tokens_per_s_per_gpu']:.0f} |")
    print()
    for name, *_, source in PUBLISHED:
        print(f"- {name}: {source}")


def search_speed() -> None:
    model, hw, space = io.load_model("deepseek-v3"), io.load_hardware("h100-sxm"), load_space()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        result = run.search(model, hw, 1024, model.global_batch_size, space)
        best = min(best, time.perf_counter() - start)
    print()
    print("| search | candidates | feasible | wall s (best of 2) |")
    print("|---|---|---|---|")
    print(f"| deepseek-v3, 1024 x h100-sxm, GBS {model.global_batch_size} | {len(result.ranked):,} | "
          f"{len(result.feasible):,} | {best:.1f} |")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / run_folder.CANDIDATES
        start = time.perf_counter()
        run_folder.write_csv(path, result.ranked)
        written = time.perf_counter() - start
        size = path.stat().st_size
        start = time.perf_counter()
        expected = run_folder._with_integers(result.ranked.round(run_folder.FLOAT_DIGITS)).to_csv(
            index=False, lineterminator="\n")
        pandas_s = time.perf_counter() - start
        same = path.read_text() == expected
    print()
    print("| candidates.csv | MB | write s | pandas to_csv s | same bytes |")
    print("|---|---|---|---|---|")
    print(f"| {len(result.ranked):,} rows | {size / 1e6:.0f} | {written:.1f} | {pandas_s:.1f} | {same} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-speed", action="store_true", help="leave out the 1024-GPU search timing")
    args = parser.parse_args()
    mixtral_case()
    published_ranks()
    if not args.skip_speed:
        search_speed()


if __name__ == "__main__":
    main()
