"""Issue 29 (GPU): is a MoE layer's grouped GEMM priced at its whole size or at one expert's?

Times, on one GPU with PyTorch (no TensorRT-LLM there), Mixtral-8x7B's expert GEMMs (8 experts;
FC1 4,096 -> 2 x 14,336, FC2 14,336 -> 4,096) as one grouped GEMM of 8 experts x m rows
(``torch._grouped_mm`` BF16, ``torch._scaled_grouped_mm`` FP8 with row/column scales: CUTLASS
grouped kernels on sm90), against one dense GEMM of the same 8m rows on one expert's weights
(``@``, ``torch._scaled_mm``) and one expert's GEMM of m rows. Prints one dict per (GEMM, m) and
writes them to $OUT/g.json (or /tmp/g.json). Seconds per call, mean of 20 after 3 warm-ups.

    python3 benchmarks/bench_issue29_grouped_gemm_gpu.py     # ~15 s on an H100
"""

import json
import os

import torch

E, H, F = 8, 4096, 14336
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
ROWS = (8, 16, 32, 64, 128, 160, 192, 256, 512, 1024, 2048, 4096)


def seconds(fn, n: int = 20) -> float:
    """Mean seconds per call by CUDA events (3 warm-up calls first)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e-3


def calls(a, a8, w, w8, sa, sb, offs, m: int) -> dict:
    """The six GEMMs at ``m`` rows per expert (g grouped, d dense of 8m rows, o one expert)."""
    wt, w8t = w.transpose(1, 2), w8.transpose(1, 2)
    return {"g16": lambda: torch._grouped_mm(a, wt, offs=offs), "d16": lambda: a @ w[0].t(),
            "o16": lambda: a[:m] @ w[0].t(),
            "g8": lambda: torch._scaled_grouped_mm(a8, w8t, sa, sb, offs=offs, out_dtype=BF16),
            "d8": lambda: torch._scaled_mm(a8, w8t[0], sa[:, None], sb[0][None, :], out_dtype=BF16),
            "o8": lambda: torch._scaled_mm(a8[:m], w8t[0], sa[:m, None], sb[0][None, :],
                                           out_dtype=BF16)}


def main() -> None:
    out = []
    for n, k in ((2 * F, H), (H, F)):
        w = torch.randn(E, n, k, device="cuda", dtype=BF16)
        w8, sb = w.to(FP8), torch.ones(E, n, device="cuda")
        for m in ROWS:
            a = torch.randn(E * m, k, device="cuda", dtype=BF16)
            sa = torch.ones(E * m, device="cuda")
            offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * m
            row = {"N": n, "K": k, "m": m, "flop": 2 * E * m * n * k}
            for name, fn in calls(a, a.to(FP8), w, w8, sa, sb, offs, m).items():
                try:
                    row[name] = seconds(fn)
                except Exception as exc:  # an op this PyTorch lacks: say so, time the others
                    row[name] = str(exc)[:120]
            out.append(row)
            print(row, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "g.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
