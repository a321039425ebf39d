"""On one H200 (PyTorch only, no TransformerEngine): the per-GPU pieces of one Llama-2-70B layer that
MLPerf's LoRA layouts TP4 (8,192 tokens gathered, widths / 4), TP2 and TP1 CP2 (4,096 tokens, full
widths) run without communication, timed with CUDA events, so that issue 27's H200 question (does the
model price TP4 against TP1 CP2 as the GPU runs them?) can be read on the pieces a single GPU can run:

- the frozen base's FP8 GEMMs (``torch._scaled_mm``, E4M3 x E4M3, per-tensor scales, BF16 out: cuBLASLt,
  as TransformerEngine 1.x calls it): each Linear's forward and its data-gradient GEMM (a frozen base
  makes no weight gradient), at each layout's shapes;
- the LoRA adapters of linear_qkv and linear_proj (rank 16, BF16, dropout 0.1 on the input, alpha / r
  scaling, added to the base output), forward and backward in eager PyTorch, at each layout's shapes;
- a device copy (bytes read + written per second): the HBM rate the pieces above stream at.

Each piece: median of ``REPEATS`` timed runs after warm-up. Prints one JSON object (and writes it to
$OUT/pieces.json where $OUT is set).

    python3 benchmarks/device_issue27_h200_pieces.py

Figures of 2026-11-29 (two machine starts; RESULTS.md, session 55, s55h4): copy 4.24 / 4.17 TB/s; FP8 GEMMs per
layer TP4 5.61 / 5.68 ms (x 2 for TP1 CP2's work), TP2 11.24 / 10.89, TP1 CP2 11.31 / 10.89; the adapters' spread
between starts (up to 40 %) leaves them unread.
"""

from __future__ import annotations

import json
import os
import statistics

import torch

H, FFN, Q_HEADS, KV_HEADS, HEAD_DIM, RANK = 8192, 28672, 64, 8, 128, 16
QKV = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
# (tokens a GPU's GEMMs see, TP): TP t gathers the whole 8,192-token sequence (SP); CP 2 halves it.
LAYOUTS = {"tp4": (8192, 4), "tp2": (8192, 2), "tp1cp2": (4096, 1)}
REPEATS, WARMUP = 20, 5


def timed(fn) -> float:
    """Median milliseconds of ``fn`` over ``REPEATS`` runs, each bracketed by CUDA events."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def linear_shapes(tokens: int, tp: int) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) of each frozen Linear's forward and data-gradient GEMM on one GPU."""
    fwd = {"qkv": (tokens, H, QKV // tp), "proj": (tokens, H // tp, H),
           "fc1": (tokens, H, 2 * FFN // tp), "fc2": (tokens, FFN // tp, H)}
    out = {}
    for name, (m, k, n) in fwd.items():
        out[f"{name}_fwd"] = (m, k, n)
        out[f"{name}_dgrad"] = (m, n, k)
    return out


def fp8_gemm_ms(m: int, k: int, n: int) -> float:
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt's TN
    one = torch.ones((), device="cuda")
    return timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def adapter_ms(tokens_in: int, fan_in: int, fan_out: int) -> float:
    """One adapter's forward and backward: dropout(x) @ A @ B * (alpha / r) + base, grads to x, A, B."""
    x = torch.randn(tokens_in, fan_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    base = torch.randn(tokens_in, fan_out, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a = torch.randn(fan_in, RANK, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(RANK, fan_out, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens_in, fan_out, device="cuda", dtype=torch.bfloat16)

    def step():
        y = base + (torch.nn.functional.dropout(x, 0.1, training=True) @ a @ b) * 2.0
        y.backward(grad)
    return timed(step)


def copy_tbps(size: int = 2 * 1024 ** 3) -> float:
    """Bytes read and written per second (TB/s) by a device-to-device copy of ``size`` bytes."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * size / (timed(lambda: dst.copy_(src)) / 1e3) / 1e12


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["copy_tbps"] = copy_tbps()
    for layout, (tokens, tp) in LAYOUTS.items():
        gemms = {name: fp8_gemm_ms(*shape) for name, shape in linear_shapes(tokens, tp).items()}
        # linear_qkv (column-parallel, tp_comm_overlap_disable_qkv as every MLPerf LoRA log prints it: no
        # userbuffers gather, so TE returns the norm output gathered): the whole sequence's input, B's
        # output split. linear_proj (row-parallel, a2a_experimental under SP): the sequence-whole input
        # split by hidden, B's output split by hidden until the all-to-all puts it on the sequence shard
        # (the same elements: T x h / t). NeMo 8cfedd7 nlp/modules/common/megatron/adapters/
        # parallel_adapters.py ParallelLinearAdapter.forward, mcore_mixins.py MCoreSelfAttentionMixin.
        adapters = {"qkv": adapter_ms(tokens, H, QKV // tp), "proj": adapter_ms(tokens, H // tp, H // tp)}
        result[layout] = {"tokens": tokens, "tp": tp, "gemm_ms": gemms, "gemm_ms_sum": sum(gemms.values()),
                          "adapter_ms": adapters, "adapter_ms_sum": sum(adapters.values())}
        torch.cuda.empty_cache()
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "pieces.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
