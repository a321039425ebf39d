"""What one Llama 2 7B layer's weight-gradient GEMMs cost against its forward GEMMs, as
TransformerEngine runs them (issue 27: what a frozen base saves).

Why: the cost model prices a frozen base's saving as one forward's Linear time (the wgrad GEMMs at
the forward GEMMs' fitted FP8 rate) plus the column-wise FP8 copies it does not write; it does not
price the accumulation into ``main_grad`` in the wgrad GEMM's epilogue (Megatron's
``gradient_accumulation_fusion``: TE passes ``out=main_grad, accumulate=True``, cuBLAS beta = 1),
and TE runs its forward GEMMs with fast accumulation but dgrad and wgrad with the split (promoted)
accumulator (``module/base.py``: ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = True``,
``_2X_ACC_WGRAD = True``, TransformerEngine v1.10 and d0067d0). This times, on the four Linears of
one 7B layer (TP1, 4,096 tokens: QKV 4096->12288, projection 4096->4096, FC1 4096->22016, FC2
11008->4096), per-tensor FP8 E4M3 x E4M3 through ``torch._scaled_mm`` in the operand layouts each
GEMM has (Hopper's FP8 GEMMs are TN only: the wgrad reads the transposed copies of dY and X):

- fprop (fast accumulation, as TE), fprop and dgrad and wgrad with the split accumulator;
- the BF16 wgrad into a BF16 ``main_grad`` with beta = 1 (``torch.addmm(c, a, b, out=c)``) and
  with beta = 0 (``torch.mm``), the epilogue's C read exposed or not (``torch._scaled_mm`` takes no C);

each the median of 50 back-to-back launches (CUDA events), in ms and TFLOP/s, and the layer's sums.
The cost model's figure for comparison: ``PYTHONPATH=$PWD python benchmarks/nemoft_layer_terms.py``
(wgrad GEMMs 1.32 ms per 7B layer and micro-batch, at ~1,256 TFLOP/s).

    PYTHONPATH=. python3 benchmarks/bench_issue27_wgrad_gpu.py

Needs a CUDA GPU with FP8 GEMMs (compute capability 8.9+); without one it says so and exits 0.
"""

from __future__ import annotations

import sys

import torch

TOKENS = 4096
LINEARS = {"qkv": (4096, 12288), "proj": (4096, 4096), "fc1": (4096, 22016), "fc2": (11008, 4096)}
E4M3 = torch.float8_e4m3fn


def timed(fn, reps: int = 50) -> float:
    """Median ms of ``fn`` over ``reps`` launches, each between two CUDA events."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def fp8(rows: int, cols: int, device: str = "cuda") -> torch.Tensor:
    return (torch.randn(rows, cols, device=device) * 0.5).to(E4M3)


def linear_cases(fan_in: int, fan_out: int, tokens: int = TOKENS, device: str = "cuda") -> dict:
    """The GEMMs of one Linear's forward and backward, each a callable, in the layouts TE runs."""
    one = torch.ones((), device=device)
    x, w, dy = fp8(tokens, fan_in, device), fp8(fan_out, fan_in, device), fp8(tokens, fan_out, device)
    x_t, dy_t = x.t().contiguous(), dy.t().contiguous()  # the column-wise copies wgrad reads
    w_t = w.t().contiguous()  # the weight's transpose dgrad reads
    a16, b16 = dy_t.to(torch.bfloat16), x.to(torch.bfloat16)
    grad = torch.zeros(fan_out, fan_in, device=device, dtype=torch.bfloat16)

    def scaled(a, b, fast=False):
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

    return {"fprop fast": scaled(x, w.t(), True), "fprop split": scaled(x, w.t()),
            "dgrad split": scaled(dy, w_t.t()), "wgrad split": scaled(dy_t, x_t.t()),
            "wgrad fast": scaled(dy_t, x_t.t(), True),
            "bf16 wgrad beta=0": lambda: torch.mm(a16, b16),
            "bf16 wgrad beta=1": lambda: torch.addmm(grad, a16, b16, out=grad)}


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("bench_issue27_wgrad_gpu: no CUDA GPU with FP8 GEMMs; nothing to measure.")
        return 0
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| GEMM (ms) | " + " | ".join(LINEARS) + " | layer ms | layer TFLOP/s |")
    print("|---" * (len(LINEARS) + 3) + "|")
    rows: dict[str, list[float]] = {}
    for fan_in, fan_out in LINEARS.values():
        for case, fn in linear_cases(fan_in, fan_out).items():
            rows.setdefault(case, []).append(timed(fn))
        torch.cuda.empty_cache()
    flops = sum(2.0 * TOKENS * i * o for i, o in LINEARS.values())
    sums = {case: sum(times) for case, times in rows.items()}
    for case, times in rows.items():
        print(f"| {case} | " + " | ".join(f"{t:.3f}" for t in times)
              + f" | {sums[case]:.3f} | {flops / sums[case] / 1e9:.0f} |")
    print(f"wgrad split / fprop fast: {sums['wgrad split'] / sums['fprop fast']:.3f}; "
          f"dgrad split / fprop fast: {sums['dgrad split'] / sums['fprop fast']:.3f}; "
          f"BF16 wgrad beta=1 - beta=0: {sums['bf16 wgrad beta=1'] - sums['bf16 wgrad beta=0']:.3f} ms "
          f"(the epilogue's C read, 2 B a weight: "
          f"{2.0 * sum(i * o for i, o in LINEARS.values()) / 3.35e12 * 1e3:.3f} ms at the datasheet 3.35 TB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
