"""GPT-OSS's routed activation on a real GPU: Megatron-Core's clamped, probability-weighted quick-GEGLU
timed at one GPT-OSS-120B micro-batch's routed copies on one EP-8 rank (16,384 tokens x top-4 = 65,536
rows of 2 x 2,880), against the HBM bytes the cost model prices for it (session 55, s55h2; needs CUDA).

The functions are NVIDIA/Megatron-LM d98e8a64dd ``megatron/core/fusions/fused_bias_geglu.py`` as TEGroupedMLP
runs them with GPT-OSS's settings (``weighted_bias_quick_geglu_impl`` with bias None, clamp 7, linear offset
1): the eager chunk / clamp / cat, then ``WeightedQuickGeGLUFunction`` whose forward and backward helpers
are under ``jit_fuser`` (``torch.compile`` on torch >= 2.2, ``megatron/core/jit.py``). Timed with CUDA
events, median of 20 after warm-up:

- ``clamp fwd`` / ``clamp bwd``: the eager clamp and its autograd backward (priced: ``glu_clamp_time``,
  ``GLU_CLAMP_BYTES`` 8 / 10 B per GLU input element);
- ``glu fwd``: the compiled weighted GLU forward, which ``--recompute-modules moe_act`` runs again in the
  backward (priced: ``moe_act_recompute_time``, ``MOE_ACT_BYTES`` 6 B per output element);
- ``glu bwd``: the compiled backward helper (input and probability gradients; in the fitted elementwise term,
  not priced on its own).

Each is printed with the bytes the model counts over the measured time (GB/s), and the time at the model's
achievable HBM rate (``--hbm-tbps``, default H200's 4.8 x 0.7).

    python benchmarks/bench_gpt_oss_act_gpu.py [--rows 65536] [--hbm-tbps 3.36]
"""

from __future__ import annotations

import argparse
import statistics

import torch


def quick_gelu(y):
    return y * torch.sigmoid(1.702 * y)


@torch.compile
def weighted_quick_geglu(y, weights, linear_offset):
    y_1, y_2 = torch.chunk(y, 2, dim=-1)
    return (quick_gelu(y_1) * (y_2 + linear_offset) * weights).to(y.dtype)


@torch.compile
def weighted_quick_geglu_back(g, y, weights, linear_offset):
    input_dtype, w_dtype = y.dtype, weights.dtype
    gw = g * weights
    y_1, y_2 = torch.chunk(y, 2, -1)
    sig = torch.sigmoid(1.702 * y_1)
    dy_1 = gw * sig * (1 + 1.702 * y_1 * (1 - sig)) * (y_2 + linear_offset)
    dy_2 = gw * y_1 * sig
    input_grad = torch.cat((dy_1, dy_2), -1)
    weights_grad = torch.sum(quick_gelu(y_1) * (y_2 + linear_offset) * g.to(w_dtype), dim=-1, keepdim=True)
    return input_grad.to(input_dtype), weights_grad.to(w_dtype)


def clamp(x, c):
    x_glu, x_linear = x.chunk(2, -1)
    return torch.cat((x_glu.clamp(min=None, max=c), x_linear.clamp(min=-c, max=c)), -1)


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--ffn", type=int, default=2880)
    ap.add_argument("--hbm-tbps", type=float, default=4.8 * 0.7)
    args = ap.parse_args()
    n, f = args.rows, args.ffn
    dev = "cuda"
    x = (3.0 * torch.randn(n, 2 * f, device=dev)).to(torch.bfloat16)
    probs = torch.rand(n, 1, device=dev, dtype=torch.float32)
    off = torch.tensor(1.0, dtype=torch.bfloat16, device=dev)
    g_out = torch.randn(n, f, device=dev).to(torch.bfloat16)

    xr = x.detach().requires_grad_(True)
    clamped = clamp(xr, 7.0)
    g_in = torch.randn_like(clamped)
    y = clamp(x, 7.0)

    inputs = n * 2 * f
    rows = [
        ("clamp fwd", lambda: clamp(x, 7.0), 8.0 * inputs),
        ("clamp bwd", lambda: torch.autograd.grad(clamped, xr, g_in, retain_graph=True), 10.0 * inputs),
        ("glu fwd (moe_act rerun)", lambda: weighted_quick_geglu(y, probs, off), 6.0 * n * f),
        ("glu bwd", lambda: weighted_quick_geglu_back(g_out, y, probs, off), None),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {n} rows x 2 x {f} BF16")
    print("| kernel | measured ms | priced bytes GB | GB/s at the measured time | priced ms at "
          f"{args.hbm_tbps:.2f} TB/s | measured / priced |")
    print("|---|---|---|---|---|---|")
    for name, fn, nbytes in rows:
        ms = timed(fn)
        if nbytes is None:
            print(f"| {name} | {ms:.3f} | - | - | - | - |")
            continue
        priced = nbytes / (args.hbm_tbps * 1e12) * 1e3
        print(f"| {name} | {ms:.3f} | {nbytes / 1e9:.3f} | {nbytes / (ms * 1e-3) / 1e9:.0f} | {priced:.3f} | "
              f"{ms / priced:.2f} |")
    a, b = torch.empty(n, 2 * f, device=dev, dtype=torch.bfloat16), x
    ms = timed(lambda: a.copy_(b))
    print(f"| copy (read + write) | {ms:.3f} | {2 * x.numel() * 2 / 1e9:.3f} | {2 * x.numel() * 2 / (ms * 1e-3) / 1e9:.0f}"
          f" | {2 * x.numel() * 2 / (args.hbm_tbps * 1e12) * 1e3:.3f} | - |")


if __name__ == "__main__":
    main()
