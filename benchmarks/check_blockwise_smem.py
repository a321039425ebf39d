"""The blockwise 1x128-both-ways kernel's shared-memory plan, checked on the CPU (no GPU needed).

Replays the index expressions of ``cast_transpose_1x128_kernel`` in
autoparallel/kernels/fp8_blockwise.cu (row pass: ``staged[r * kUnits + swizzle(r, k * kV + i)]``
stores; column pass: the 8-byte ``tile8`` loads) for one 128x128 tile and every thread, and
reports per input width: that each column-pass read returns the element it should (the swizzle
is undone), that the X^T tile is written exactly once, and the worst bank conflict of any warp
phase (16-byte stores are served 8 lanes at a time, 8-byte loads 16 at a time). ``--no-swizzle``
shows what the unswizzled layout would cost.

    python benchmarks/check_blockwise_smem.py [--no-swizzle]

Keep it in step with the kernel when either changes.
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict

THREADS, BLOCK, LANES = 256, 128, 8  # kThreads, kBlock, kLanesPerTile


def swizzle(r: int, u: int, on: bool = True) -> int:
    """fp8_blockwise.cu's swizzle(r, u)."""
    return u ^ (((r >> 4) ^ (u >> 3)) & 7) if on else u


def bank_ways(addrs: list[int], width: int) -> int:
    """Most distinct 4-byte words one bank serves in a phase (1 = conflict-free)."""
    banks = defaultdict(set)
    for a in addrs:
        for w in range(width // 4):
            banks[(a // 4 + w) % 32].add(a // 4 + w)
    return max(len(s) for s in banks.values())


def check(size: int, on: bool = True) -> dict[str, int]:
    """Replay one tile for sizeof(T) = size; return the worst bank ways per access."""
    k_v, units, k_cols = size, BLOCK * size // 16, 8 // size
    smem, worst = {}, {"row-pass 16-byte stores": 0, "column-pass 8-byte loads": 0}
    for p, i, warp in itertools.product(range(BLOCK * LANES // THREADS), range(k_v), range(8)):
        phases = defaultdict(list)
        for lane in range(32):
            tid = warp * 32 + lane
            r, k = (tid + THREADS * p) // LANES, tid % LANES
            unit = r * units + swizzle(r, k * k_v + i, on)
            for e in range(16 // size):  # elements of raw vector i of chunk k
                smem[unit * 16 + e * size] = (r, 16 * k + i * (16 // size) + e)
            phases[lane // 8].append(unit * 16)
        for addrs in phases.values():
            worst["row-pass 16-byte stores"] = max(worst["row-pass 16-byte stores"],
                                                   bank_ways(addrs, 16))
    written = defaultdict(int)
    col_jobs = BLOCK // k_cols * LANES // THREADS
    for p, i, warp in itertools.product(range(col_jobs), range(16), range(8)):
        phases = defaultdict(list)
        for lane in range(32):
            tid = warp * 32 + lane
            g, j = (tid + THREADS * p) // LANES, tid % LANES
            r = 16 * j + i
            idx = (r * units + swizzle(r, g >> 1, on)) * 2 + (g & 1)
            for e in range(k_cols):
                assert smem[idx * 8 + e * size] == (r, g * k_cols + e), (size, tid, i, e)
                written[(g * k_cols + e, r)] += 1
            phases[lane // 16].append(idx * 8)
        for addrs in phases.values():
            worst["column-pass 8-byte loads"] = max(worst["column-pass 8-byte loads"],
                                                    bank_ways(addrs, 8))
    assert set(written) == set(itertools.product(range(BLOCK), range(BLOCK)))
    assert set(written.values()) == {1}
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-swizzle", action="store_true")
    args = parser.parse_args()
    for size, name in ((2, "bf16"), (4, "fp32")):
        worst = check(size, not args.no_swizzle)
        print(f"{name}: reads undo the swizzle, X^T tile written once; worst bank ways "
              + ", ".join(f"{k} {v}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
