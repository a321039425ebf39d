"""Achieved memory bandwidth of each FP8 kernel against the GPU's HBM bandwidth.

The casts are memory-bound, so the figure of merit is bytes moved / time vs the datasheet peak
(a good elementwise kernel reaches 80-90 %). The PyTorch reference of each kernel is timed too,
on the same GPU, to show what fusing saves.

    python benchmarks/bench_kernels.py [--rows 8192 --cols 8192 --dtype bf16 --iters 50]

Without a CUDA GPU it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from autoparallel.model import kernels, reference as R  # noqa: E402

# Dense datasheet HBM bandwidth (DESIGN.md §4), used when the device does not report its memory.
DATASHEET_TBS = {"H100": 3.35, "H200": 4.8, "A100": 2.04, "B200": 8.0, "L40S": 0.864,
                 "L4": 0.3}


def hbm_bandwidth(props) -> tuple[float, str]:
    """Peak bytes/s: 2 (DDR) x memory clock x bus width, else the datasheet by name."""
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8, "memory clock x bus width"
    for name, tbs in DATASHEET_TBS.items():
        if name in props.name:
            return tbs * 1e12, f"datasheet {name}"
    return float("nan"), "unknown"


def time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--tensors", type=int, default=512, help="delayed-update batch size")
    parser.add_argument("--history", type=int, default=1024)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA GPU visible to torch "
              f"(torch {torch.__version__}); nothing to measure.")
        return 0
    module, status = kernels.load()
    if module is None:
        print(f"bench_kernels: kernels unavailable: {status.reason}")
        return 0
    ops = kernels.CudaOps(module)
    props = torch.cuda.get_device_properties(0)
    peak, source = hbm_bandwidth(props)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    x = torch.randn(args.rows, args.cols, device="cuda").to(dtype)
    n, e = x.numel(), x.element_size()
    e4m3 = torch.float8_e4m3fn
    scale = torch.tensor(1.5, device="cuda")
    hist = torch.rand(args.tensors, args.history, device="cuda")
    sc = torch.ones(args.tensors, device="cuda")
    maxes = torch.full((args.tensors,), 448.0, device="cuda")
    tiles = n // 128 * 4
    # (name, what it fuses, kernel call, reference call, DRAM bytes a perfect kernel moves)
    cases = [
        ("amax", "abs + max reduction", lambda: ops.amax(x), lambda: R.amax(x), n * e),
        ("cast_amax (delayed)", "scale mul + saturating cast + amax, one read",
         lambda: ops.cast_amax(x, e4m3, scale), lambda: R.cast_amax(x, e4m3, scale), n * e + n),
        ("current_scale_cast", "amax pass, then scale + cast on device (2 reads)",
         lambda: ops.current_scale_cast(x, e4m3), lambda: R.current_scale_cast(x, e4m3),
         2 * n * e + n),
        ("cast_transpose", "cast + amax + both layouts, one read",
         lambda: ops.cast_transpose(x, e4m3, scale), lambda: R.cast_transpose(x, e4m3, scale),
         n * e + 2 * n),
        ("blockwise 1x128", "per-tile amax + scale + cast, one read",
         lambda: ops.blockwise_cast_1d(x, e4m3), lambda: R.blockwise_cast_1d(x, e4m3),
         n * e + n + tiles),
        ("blockwise 128x128", "per-block amax + scale + cast (2nd read from L2)",
         lambda: ops.blockwise_cast_2d(x, e4m3), lambda: R.blockwise_cast_2d(x, e4m3),
         n * e + n),
        (f"delayed update x{args.tensors}", "amax window + scale + roll, all tensors one launch",
         lambda: ops.delayed_scaling_update(hist, sc, maxes, 0, "max"),
         lambda: R.delayed_scaling_update(hist, sc, maxes, 0, "max"),
         2 * hist.numel() * 4 + 3 * args.tensors * 4),
    ]
    print(f"device: {props.name}, HBM peak {peak / 1e12:.2f} TB/s ({source}); "
          f"input {args.rows}x{args.cols} {args.dtype}; torch {torch.__version__}")
    print("| kernel | fuses | kernel ms | GB/s | % of HBM peak | reference ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for name, fuses, kern, ref, nbytes in cases:
        k_ms, r_ms = time_ms(kern, args.iters), time_ms(ref, max(3, args.iters // 5))
        gbs = nbytes / (k_ms * 1e-3) / 1e9
        print(f"| {name} | {fuses} | {k_ms:.4f} | {gbs:.0f} | {100 * gbs * 1e9 / peak:.0f} % | "
              f"{r_ms:.4f} | {r_ms / k_ms:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
