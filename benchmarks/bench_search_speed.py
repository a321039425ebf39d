"""In-process time of the searches issue 22 and issue 11 hold to a target, and of ``validate``.

Each search runs ``repeats`` times in this process after one warm-up (imports, preset reads):
generation (``space.generate_with_sources``), pricing + ranking (``grid.evaluate`` with the string
columns' codes, as ``run.search`` runs it), and ``run.search`` as a
whole, in wall seconds and CPU seconds (the cost model prices chunks on a thread per core, so CPU
can exceed wall; on a machine shared with other jobs the CPU time is what a quiet one would take).
The table gives the best and the median of the runs. Issue 22's target: ``search --model
deepseek-v3 --gpus 1024`` under 6 s in-process on two cores.

``--validate`` also times ``autoparallel validate --no-cross-validation`` (a fresh process each,
half as many runs): the preset look-ups it makes per measured run were most of its time.

To compare two checkouts on the same machine, run the script from each (same load):

    PYTHONPATH=$PWD python benchmarks/bench_search_speed.py [--repeats 5] [--validate]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

from autoparallel import io
from autoparallel.search import grid, run
from autoparallel.space import generate_with_sources, load_space

CASES = [("deepseek-v3", "h100-sxm", 1024), ("gpt3-175b", "h100-sxm", 1024)]


def _timed(fn) -> tuple[float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - start_cpu


def _cell(samples: list[float]) -> str:
    return f"{min(samples):.2f} / {statistics.median(samples):.2f}"


def searches(repeats: int) -> None:
    print("| search | candidates | generate s (wall, best / median) | price + rank s | "
          "run.search s (wall) | run.search s (CPU) |")
    print("|---|---|---|---|---|---|")
    for name, gpu, gpus in CASES:
        model, hw, space = io.load_model(name), io.load_hardware(gpu), load_space()
        gbs = model.global_batch_size
        run.search(model, hw, gpus, gbs, space)  # warm-up
        gen, price, wall, cpu = [], [], [], []
        for _ in range(repeats):
            box = {}
            gen.append(_timed(lambda: box.update(c=generate_with_sources(model, hw, gpus, gbs, space)))[0])
            price.append(_timed(lambda: grid.evaluate(model, hw, box["c"][0], space.memory_fraction,
                                                      sources=box["c"][1]))[0])
            w, c = _timed(lambda: box.update(r=run.search(model, hw, gpus, gbs, space)))
            wall.append(w)
            cpu.append(c)
        print(f"| {name}, {gpus} x {gpu} | {len(box['r'].ranked):,} | {_cell(gen)} | {_cell(price)} | "
              f"{_cell(wall)} | {_cell(cpu)} |")


def validate_time(repeats: int) -> None:
    """``validate`` as a user runs it: a fresh process each time (no preset read before it)."""
    wall, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoparallel", "validate", "--no-cross-validation", "--json"],
                       check=True, stdout=subprocess.DEVNULL)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print()
    print("| command (a fresh process each) | wall s (best / median) | CPU s (best / median) |")
    print("|---|---|---|")
    print(f"| autoparallel validate --no-cross-validation --json | {_cell(wall)} | {_cell(cpu)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--validate", action="store_true", help="also time validate --no-cross-validation")
    args = parser.parse_args()
    searches(args.repeats)
    if args.validate:
        validate_time(max(1, args.repeats // 2))


if __name__ == "__main__":
    main()
