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
  not priced on its own);
- ``bias fwd`` / ``bias bwd``: ``TEGroupedMLP._apply_bias``'s per-expert ``t + b * p`` over 16 local experts
  (FP32 and BF16 probabilities; priced: ``expert_bias_time``, ``expert_bias_bytes`` 28 / 36 and 12 / 12 B);
- ``rope fwd`` / ``rope bwd``: ``_apply_rotary_pos_emb_bshd`` with YaRN's scale on the query (64 heads) and
  key (8 heads) of 4 x 4,096 tokens x 64 (priced beyond TE's fused kernel: ``UNFUSED_ROPE_BYTES`` 20 / 16 B;
  the fused kernel's 4 B per element are taken off the measured time).

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


def rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(t, freqs, mscale=1.35):
    cos_ = (torch.cos(freqs) * mscale).to(t.dtype)
    sin_ = (torch.sin(freqs) * mscale).to(t.dtype)
    t, t_pass = t[..., :64], t[..., 64:]
    return torch.cat((t * cos_ + rotate_half(t) * sin_, t_pass), dim=-1)


def apply_bias(out, biases, probs, splits):
    return torch.cat([t + b * p for t, b, p in zip(torch.split(out, splits), biases, torch.split(probs, splits))]
                     ).to(out.dtype)


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
    hbm = args.hbm_tbps * 1e12
    for dtype, (fb, bb) in ((torch.float32, (28.0, 36.0)), (torch.bfloat16, (12.0, 12.0))):
        out = torch.randn(n, f, device=dev, dtype=torch.bfloat16, requires_grad=True)
        p = torch.rand(n, 1, device=dev, dtype=dtype, requires_grad=True)
        biases = [torch.randn(f, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(16)]
        splits = [n // 16] * 16
        y = apply_bias(out, biases, p, splits)
        g = torch.randn_like(y)
        fwd = timed(lambda: apply_bias(out, biases, p, splits))
        bwd = timed(lambda: torch.autograd.grad(y, [out, p] + biases, g, retain_graph=True))
        for name, ms, b in ((f"bias fwd {dtype}", fwd, fb), (f"bias bwd {dtype}", bwd, bb)):
            priced = b * n * f / hbm * 1e3
            print(f"| {name} | {ms:.3f} | {b * n * f / 1e9:.3f} | {b * n * f / (ms * 1e-3) / 1e9:.0f} | {priced:.3f} | "
                  f"{ms / priced:.2f} |")
    freqs = torch.randn(4096, 1, 1, 64, device=dev)
    fwd = bwd = elements = 0.0
    for heads in (64, 8):
        q = torch.randn(4096, 4, heads, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
        o = rope(q, freqs)
        g = torch.randn_like(o)
        fwd += timed(lambda: rope(q, freqs))
        bwd += timed(lambda: torch.autograd.grad(o, q, g, retain_graph=True))
        elements += q.numel()
    fused = 4.0 * elements / hbm * 1e3
    for name, ms, b in (("rope fwd (beyond fused)", fwd - fused, 20.0), ("rope bwd (beyond fused)", bwd - fused, 16.0)):
        priced = b * elements / hbm * 1e3
        print(f"| {name} | {ms:.3f} | {b * elements / 1e9:.3f} | {b * elements / (ms * 1e-3) / 1e9:.0f} | "
              f"{priced:.3f} | {ms / priced:.2f} |")
    a, b = torch.empty(n, 2 * f, device=dev, dtype=torch.bfloat16), x
    ms = timed(lambda: a.copy_(b))
    print(f"| copy (read + write) | {ms:.3f} | {2 * x.numel() * 2 / 1e9:.3f} | {2 * x.numel() * 2 / (ms * 1e-3) / 1e9:.0f}"
          f" | {2 * x.numel() * 2 / (args.hbm_tbps * 1e12) * 1e3:.3f} | - |")


if __name__ == "__main__":
    main()
