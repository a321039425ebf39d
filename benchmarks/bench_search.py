"""Search speed and the rank of the published NeMo layout (issue 2 figures).

Prints, for the default 175B / 1024 x H100 search and the 175B / 512 x H100 search: how many
candidates, how many valid and feasible, the wall time of generation + cost model (excluding
interpreter start-up and file writing), candidates per second, the time to write the run
folder, and where the published NeMo layout (TP4 PP8 VP6 MBS2 GBS2048 FP8) ranks.

    python benchmarks/bench_search.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from autoparallel import io
from autoparallel.search import run
from autoparallel.space import load_space


def main() -> None:
    model, hw, space = io.load_model("175b"), io.load_hardware("h100-sxm"), load_space()
    print("| GPUs | candidates | valid | feasible | search s | candidates/s | write s | NeMo layout rank |")
    print("|---|---|---|---|---|---|---|---|")
    for gpus in (1024, 512):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = run.search(model, hw, gpus, 2048, space)
            best = min(best, time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            run.save(result, Path(tmp), ["bench"])
            write = time.perf_counter() - start
        ranked, f = result.ranked, result.feasible
        valid = ranked["reason"].eq("") | ranked["reason"].str.startswith("out of memory")
        nemo = f[(f.tp == 4) & (f.pp == 8) & (f.vp == 6) & (f.cp == 1) & (f.mbs == 2)
                 & (f.precision == "fp8-delayed")]
        rank = f"{int(nemo['rank'].min())} of {len(f)} (top {100 * nemo['rank'].min() / len(f):.2f} %)" \
            if not nemo.empty else "not feasible"
        print(f"| {gpus} | {len(ranked):,} | {int(valid.sum()):,} | {len(f):,} | {best:.2f} | "
              f"{len(ranked) / best:,.0f} | {write:.2f} | {rank} |")


if __name__ == "__main__":
    main()
