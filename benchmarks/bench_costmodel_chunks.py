"""CPU seconds of the cost model alone on DeepSeek-V3 / 1024 H100's valid candidates, priced chunk by
chunk on one thread as the evaluator cuts them (no generation, no ranking, no second thread): the
figure a change to ``autoparallel/costmodel`` moves. One warm-up pass, then ``--repeats`` timed ones.

    PYTHONPATH=$PWD python benchmarks/bench_costmodel_chunks.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from autoparallel import io
from autoparallel.costmodel.estimate import estimate_columns
from autoparallel.search.evaluators import CHUNK_ROWS
from autoparallel.space import generate, load_space
from autoparallel.specs.plan import Plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, hw, space = io.load_model("deepseek-v3"), io.load_hardware("h100-sxm"), load_space()
    frame = generate(model, hw, 1024, model.global_batch_size, space)
    valid = frame["reason"].to_numpy(dtype=object) == ""
    cols = {name: frame[name].to_numpy()[valid] for name in Plan.field_names()}
    rows = int(valid.sum())

    def price() -> None:
        for start in range(0, rows, CHUNK_ROWS):
            estimate_columns(model, hw, {k: v[start:start + CHUNK_ROWS] for k, v in cols.items()},
                             space.memory_fraction)

    price()
    times = []
    for _ in range(args.repeats):
        start = time.process_time()
        price()
        times.append(time.process_time() - start)
    print(f"{rows:,} rows: cost model CPU s, best {min(times):.2f}, runs " + " ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    main()
