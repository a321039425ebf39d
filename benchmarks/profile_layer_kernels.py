"""Where a layer's GPU time goes: the CUDA kernels of one fwd+bwd of the built-in layer and of
the plain PyTorch layer of the same shape (bench_issue15_gpu row 1), top kernels by time.

    PYTHONPATH=. python3 benchmarks/profile_layer_kernels.py [--precision bf16] [--top 12]

Needs a CUDA GPU; without one it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_issue15_gpu import PlainLayer, shape_for  # noqa: E402
from autoparallel.profiling.layer import make_layer  # noqa: E402


def kernel_table(step, top: int) -> tuple[float, list[tuple[str, float, int]]]:
    """(total GPU ms of one step, [(kernel, ms, calls)] for the ``top`` longest)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 1e3, e.count) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_layer_kernels: no CUDA GPU; nothing to profile.")
        return 0
    shape = shape_for("llama3-70b", 8, 8192, 1, args.precision)[0]
    run, _, x, dy, cos, sin = make_layer(shape, "cuda")
    plain = PlainLayer(shape).cuda().to(torch.bfloat16)
    px = torch.randn(1, shape["seq"], shape["hidden"], device="cuda", dtype=torch.bfloat16,
                     requires_grad=True)
    steps = {"built-in": lambda: torch.autograd.backward(run(x, cos, sin), dy),
             "plain": lambda: plain(px).backward(dy)}
    for name, step in steps.items():
        total, rows = kernel_table(step, args.top)
        print(f"\n{name} layer ({args.precision}): {total:.2f} ms of kernels")
        for key, ms, calls in rows:
            print(f"  {ms:7.3f} ms {calls:4d}x  {key[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
