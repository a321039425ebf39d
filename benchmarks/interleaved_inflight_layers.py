"""Layer-micro-batches a pipeline rank holds at its peak under Megatron-Core's interleaved 1F1B,
replayed chunk by chunk, against what the cost model priced before issue 22's helper h4
(``pipeline.inflight_chunks`` / vp micro-batches of the rank's average chunk) and prices now
(``pipeline.held_at_peak``: the states Megatron's schedule holds, chunk by chunk). The first two
differ where a rank's chunks are uneven (the embedding or the loss counted in the split, a layout
string): the held chunks are mostly the early chunks of each group.

Megatron-LM d98e8a64dd megatron/core/pipeline_parallel/schedules.py: forwards run in the order of
``get_schedule_table`` (groups of ``microbatch_group_size_per_vp_stage`` micro-batches, each through
chunk 0, 1, ... in turn), backwards in the same order with the chunk reversed; warm-up
(pp - rank - 1) * 2 + (vp - 1) * group forwards (lines 957-970), then one forward and one backward.

    python benchmarks/interleaved_inflight_layers.py    # Llama 3.1 405B, 256 GB200, TP4 PP16 VP4, gbs 1536
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from autoparallel.costmodel import pipeline  # noqa: E402


def schedule_table(m: int, vp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order (``get_schedule_table``)."""
    table: list[tuple[int, int]] = []
    for low in range(0, m, group):
        high = m if low + group >= m else low + group
        table += [(mb, c) for c in range(vp) for mb in range(low, high)]
    return table


def peak_layers(pp: int, vp: int, m: int, group: int, rank: int, sizes: list[int]) -> int:
    """Most layer-micro-batches alive on ``rank`` whose chunks hold ``sizes`` layers."""
    table = schedule_table(m, vp, group)
    warmup = min((pp - rank - 1) * 2 + (vp - 1) * group, len(table))
    alive: dict[tuple[int, int], int] = {}
    best = forwards = backwards = 0
    for step in range(2 * len(table)):
        if forwards < len(table) and (forwards < warmup or forwards == backwards + warmup):
            alive[table[forwards]] = sizes[table[forwards][1]]
            forwards += 1
            best = max(best, sum(alive.values()))
        else:
            mb, chunk = table[backwards]
            del alive[(mb, vp - 1 - chunk)]
            backwards += 1
    return best


def main() -> None:
    pp, vp, m = 16, 4, 1536 // 4  # 126 layers + embedding + loss in 64 virtual stages of 2 slots
    sizes = pipeline.virtual_stage_sizes(126, pp, vp, 0, 0, True, True)
    group = pipeline.microbatch_group_size(m, pp)
    split = [np.array([v]) for v in (0, 0, True, True, "")]
    held = pipeline.held_at_peak((0,) * 126, np.array([pp]), np.array([vp]), np.array([m]), *split)
    now = {0: held[0], 1: held[1], pp - 1: held[2]}
    print("| rank | chunk layers | Megatron's peak | priced before (inflight_chunks / vp x layers) | priced now |")
    print("|---|---|---|---|---|")
    for rank in (0, 1, pp - 1):
        chunks = [sizes[c * pp + rank] for c in range(vp)]
        before = float(pipeline.inflight_chunks(pp, vp, m, rank)) / vp * sum(chunks)
        dense, moe, _ = now[rank]
        print(f"| {rank} | {chunks} | {peak_layers(pp, vp, m, group, rank, chunks)} | {before:.2f} | "
              f"{float((dense + moe).max()):.0f} |")


if __name__ == "__main__":
    main()
