"""Search speed, and where NVIDIA's published layouts rank among the feasible candidates.

Part 1 (issue 2 / 11 figures): for the default 175B / 1024 x H100 and 175B / 512 x H100 searches,
how many candidates, how many valid and feasible, the wall and CPU time of generation + cost
model (best of 3, excluding interpreter start-up and file writing; the search is single-threaded,
so on a shared machine the CPU time is what a quiet one would take), candidates per CPU second,
and the time to write the run folder.

Part 2 (issue 11 figure): for each published NeMo layout named below, the rank of its best
variant (any recompute / overlap / FP8 recipe the source leaves open) among every feasible
candidate of the default space, as a percentile, beside the search's winner.

    python benchmarks/bench_search.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from autoparallel import io
from autoparallel.search import run
from autoparallel.space import load_space

# model, GPUs, GPU, gbs, the knobs NVIDIA published (autoparallel/data/training_runs*.csv)
PUBLISHED = [
    ("gpt3-175b", 512, "h100-sxm", 2048, dict(tp=4, pp=8, cp=1, vp=6, mbs=2, precision="fp8-delayed")),
    ("gpt3-175b", 1024, "h100-sxm", 2048, dict(tp=4, pp=8, cp=1, vp=6, mbs=2, precision="fp8-delayed")),
    ("llama3.1-405b", 1024, "h100-sxm", 512, dict(tp=8, pp=8, cp=2, vp=8, mbs=1, precision="fp8-current")),
    ("llama3-70b", 64, "h100-sxm", 128, dict(tp=4, pp=8, cp=1, vp=5, mbs=1, precision="fp8-current")),
    ("llama3-8b", 8, "h100-sxm", 128, dict(tp=1, pp=1, cp=1, vp=1, mbs=1, precision="fp8-current", fsdp=True)),
]


def speed() -> None:
    model, hw, space = io.load_model("175b"), io.load_hardware("h100-sxm"), load_space()
    print("| GPUs | candidates | valid | feasible | search s (wall) | CPU s | candidates/s (CPU) | write s |")
    print("|---|---|---|---|---|---|---|---|")
    for gpus in (1024, 512):
        best, cpu = float("inf"), float("inf")
        for _ in range(3):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = run.search(model, hw, gpus, 2048, space)
            best = min(best, time.perf_counter() - start)
            cpu = min(cpu, time.process_time() - start_cpu)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            run.save(result, Path(tmp), ["bench"])
            write = time.perf_counter() - start
        ranked, f = result.ranked, result.feasible
        valid = ranked["reason"].eq("") | ranked["reason"].str.startswith("out of memory")
        print(f"| {gpus} | {len(ranked):,} | {int(valid.sum()):,} | {len(f):,} | {best:.2f} | {cpu:.2f} | "
              f"{len(ranked) / cpu:,.0f} | {write:.2f} |")


def layout(row) -> str:
    split = ""
    if row.account_for_embedding_in_pipeline_split or row.account_for_loss_in_pipeline_split:
        split = " (embedding/loss counted)"
    elif row.num_layers_in_first_pipeline_stage or row.num_layers_in_last_pipeline_stage:
        split = f" (first {int(row.num_layers_in_first_pipeline_stage)}, last {int(row.num_layers_in_last_pipeline_stage)})"
    extra = (" FSDP" if row.fsdp else "") + (f" offload {int(row.cpu_offloading_num_layers)}"
                                               if row.cpu_offloading_num_layers else "")
    return (f"TP{int(row.tp)} PP{int(row.pp)} VP{int(row.vp)}{split} CP{int(row.cp)} DP{int(row.dp)} "
            f"MBS{int(row.mbs)} {row.precision} {row.recompute}{extra}")


def published_ranks() -> None:
    print("| model | GPUs | NVIDIA's layout | its rank (percentile) | tok/s/GPU | our winner | tok/s/GPU |")
    print("|---|---|---|---|---|---|---|")
    for name, gpus, gpu, gbs, knobs in PUBLISHED:
        result = run.search(io.load_model(name), io.load_hardware(gpu), gpus, gbs, load_space())
        f = result.feasible
        match = f
        for knob, value in knobs.items():
            match = match[match[knob] == value]
        best = f.iloc[0]
        if match.empty:
            print(f"| {name} | {gpus} x {gpu} | {knobs} | not feasible | - | {layout(best)} | "
                  f"{best.tokens_per_s_per_gpu:,.0f} |")
            continue
        ours = match.iloc[0]
        rank = int(ours["rank"])
        print(f"| {name} | {gpus} x {gpu} | {layout(ours)} | {rank:,} of {len(f):,} (top {100 * rank / len(f):.2f} %) | "
              f"{ours.tokens_per_s_per_gpu:,.0f} | {layout(best)} | {best.tokens_per_s_per_gpu:,.0f} |")


if __name__ == "__main__":
    speed()
    print()
    published_ranks()
