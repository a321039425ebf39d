"""Achieved memory bandwidth of each FP8 kernel (and the fused SwiGLU) against the GPU's HBM
bandwidth.

The casts and the activation are memory-bound, so the figure of merit is bytes moved / time vs
the datasheet peak (a good elementwise kernel reaches 80-90 %). The PyTorch reference of each
kernel is timed too, on the same GPU, to show what fusing saves.

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
from autoparallel.profiling.layer import back_to_back_s  # noqa: E402

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
    return back_to_back_s(fn, iters) * 1e3


def kernel_cases(ops, x: torch.Tensor, tensors: int = 512, history: int = 1024) -> list[tuple]:
    """(name, what it fuses, kernel call, reference call, DRAM bytes a perfect kernel moves)
    for every kernel, on input ``x`` (2-D, on the GPU)."""
    n, e = x.numel(), x.element_size()
    e4m3 = torch.float8_e4m3fn
    scale = torch.tensor(1.5, device="cuda")
    hist = torch.rand(history, tensors, device="cuda")
    sc, sc_inv = torch.ones(tensors, device="cuda"), torch.ones(tensors, device="cuda")
    maxes = torch.full((tensors,), 448.0, device="cuda")
    tiles = n // 128 * 4  # fp32 scales of 1x128 tiles
    dy = x[:, : x.shape[1] // 2].contiguous()  # the SwiGLU output's gradient (x is [gate | up])
    return [
        ("amax", "abs + max reduction", lambda: ops.amax(x), lambda: R.amax(x), n * e),
        ("cast_amax (delayed)", "scale mul + saturating cast + amax, one read",
         lambda: ops.cast_amax(x, e4m3, scale), lambda: R.cast_amax(x, e4m3, scale), n * e + n),
        ("current_scale_cast", "amax pass, then scale + cast on device (2 reads)",
         lambda: ops.current_scale_cast(x, e4m3), lambda: R.current_scale_cast(x, e4m3),
         2 * n * e + n),
        ("cast_transpose", "cast + amax + both layouts, one read",
         lambda: ops.cast_transpose(x, e4m3, scale), lambda: R.cast_transpose(x, e4m3, scale),
         n * e + 2 * n),
        ("current cast_transpose", "amax pass, then cast + both layouts",
         lambda: ops.current_scale_cast_transpose(x, e4m3),
         lambda: R.current_scale_cast_transpose(x, e4m3), 2 * n * e + 2 * n),
        ("blockwise 1x128", "per-tile amax + scale + cast, one read",
         lambda: ops.blockwise_cast_1d(x, e4m3), lambda: R.blockwise_cast_1d(x, e4m3),
         n * e + n + tiles),
        ("blockwise 1x128 both ways", "row and column tiles of one staged 128x128 tile",
         lambda: ops.blockwise_cast_transpose_1d(x, e4m3),
         lambda: R.blockwise_cast_transpose_1d(x, e4m3), n * e + 2 * n + 2 * tiles),
        ("blockwise 128x128", "per-block amax + scale + cast from registers, one read",
         lambda: ops.blockwise_cast_2d(x, e4m3), lambda: R.blockwise_cast_2d(x, e4m3),
         n * e + n),
        (f"delayed update x{tensors}", "amax window + scale + roll, all tensors one launch",
         lambda: ops.delayed_scaling_update(hist, sc, sc_inv, maxes, 0, "max"),
         lambda: R.delayed_scaling_update(hist, sc, sc_inv, maxes, 0, "max"),
         2 * hist.numel() * 4 + 4 * tensors * 4),
        ("swiglu", "silu(gate) * up of [gate | up], one read",
         lambda: ops.swiglu(x), lambda: R.swiglu(x), n * e * 3 // 2),
        ("swiglu backward", "FP32 d(gate), d(up) into one [dgate | dup], one read",
         lambda: ops.swiglu_backward(x, dy), lambda: R.swiglu_backward(x, dy), n * e * 5 // 2),
    ]


def measure(rows: int = 8192, cols: int = 8192, dtype: str = "bf16", iters: int = 50,
            tensors: int = 512, history: int = 1024) -> tuple[list[dict], float, str]:
    """Per kernel: ms, GB/s, % of HBM peak, reference ms; plus the peak and its source."""
    module, status = kernels.load()
    if module is None:
        raise RuntimeError(f"kernels unavailable: {status.reason}")
    ops = kernels.CudaOps(module)
    peak, source = hbm_bandwidth(torch.cuda.get_device_properties(0))
    x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16 if dtype == "bf16"
                                                  else torch.float32)
    out = []
    for name, fuses, kern, ref, nbytes in kernel_cases(ops, x, tensors, history):
        k_ms, r_ms = time_ms(kern, iters), time_ms(ref, max(3, iters // 5))
        gbs = nbytes / (k_ms * 1e-3) / 1e9
        out.append({"kernel": name, "fuses": fuses, "ms": k_ms, "gbs": gbs,
                    "pct_peak": 100 * gbs * 1e9 / peak, "reference_ms": r_ms})
    return out, peak, source


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
    try:
        rows, peak, source = measure(args.rows, args.cols, args.dtype, args.iters, args.tensors,
                                     args.history)
    except RuntimeError as exc:
        print(f"bench_kernels: {exc}")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, HBM peak {peak / 1e12:.2f} TB/s "
          f"({source}); input {args.rows}x{args.cols} {args.dtype}; torch {torch.__version__}")
    print("| kernel | fuses | kernel ms | GB/s | % of HBM peak | reference ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['fuses']} | {r['ms']:.4f} | {r['gbs']:.0f} | "
              f"{r['pct_peak']:.0f} % | {r['reference_ms']:.4f} | "
              f"{r['reference_ms'] / r['ms']:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
