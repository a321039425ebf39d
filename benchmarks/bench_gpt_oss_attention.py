"""Issue 22: which attention kernel GPT-OSS-120B ran in each release, what it costs, what the model prices.

GPT-OSS's attention: 64 query heads of 64, 8 KV heads, learned sinks (``--softmax-type learnable``: one
softmax offset per head), every other layer a 128-token sliding window (``--window-size 127,0
--window-attn-skip-freq 2``). TransformerEngine's backend filter for a softmax offset
(``transformer_engine/pytorch/attention/dot_product_attention/utils.py`` get_attention_backend, "Filter:
Softmax type", v2.8-v2.17) turns FlashAttention off; cuDNN's fused attention takes the sink from cuDNN
9.13.1 (``transformer_engine/common/fused_attn/fused_attn.cpp`` nvte_get_fused_attn_backend, "softmax type",
v2.8 on) in BF16, and in FP8 only from TE v2.15 on sm100 with cuDNN >= 9.21; the unfused attention takes
no FP8 and no CP; under CP the fused one needs ``cp_comm_type='a2a'``; with
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 the fused one is off for sinks. ``backend`` below is that filter.

Part 1 prints, per release, the container's TE and cuDNN (Megatron-Bridge ``docs/releases/software-versions.md``
at v0.3.0-v0.6.0) and the backend TE picks for the GPT-OSS rows (BF16 or MXFP8 GEMMs, no FP8 attention:
no gpt_oss recipe sets ``fp8_dot_product_attention``; ``attention_backend`` None or "auto"; no CP;
``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` only for DeepSeek, ``perf_plugins.py``).

Part 2 sets the model's attention core (3 x its forward, per step, on the priced stage) beside cuDNN's own
published kernel times for the same shapes: NVIDIA/cudnn-frontend (3929da2)
``benchmark/sdpa_benchmark_training/results/gpt_oss/{gb200,gb300}/gpt_oss_20260424_*.csv`` (cuDNN 9.22,
BF16, causal with a 128 window, batch 2 x 128 heads of 64 = the 256 head-sequences of one GPT-OSS
micro-batch of 4 x 64 heads) for the windowed layers, and for the full layers a range: at least the
Llama-3.1 d=128 kernel's time for the same FLOPs (``results/llama3.1/...``, batch 2 x 64 heads of 128) and
the softmax's exponentials at the SFU rate (``exp_tera_per_s``), at most that time over the d=64 / d=128
ratio cuDNN measures on H200 (``results/h200_919_only_cudnn``: 336 / 591 TFLOP/s forward, 289 / 474
backward at 4,096). B200 / B300 take the GB200 / GB300 figures. The kernels time the shape without the
sink (the benchmark has none): cuDNN computes it inside the same kernel (``set_sink_token`` /
``set_dsink_token``).

Part 3: the 26.06.01 MXFP8 rows, whose summary flags a GPT-OSS regression (cudnn-frontend issue 256),
priced with the fused grouped MLP's FC2-dgrad + dGLU + dbias kernel at the slowdown cudnn-frontend PR 322
measured (1,362.768 us regressed vs 155.632 us fixed, the same shape): a what-if, not in the cost model.

    PYTHONPATH=$PWD python benchmarks/bench_gpt_oss_attention.py
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs

# Megatron-Bridge docs/releases/software-versions.md (v0.3.0-v0.6.0): NeMo container -> (TE, cuDNN).
RELEASES = {"25.11": ("2.9", (9, 13, 1)), "26.02": ("2.12", (9, 18, 0)), "26.04": ("2.14", (9, 20, 0)),
            "26.06": ("2.16", (9, 21, 1))}


def backend(te: str, cudnn: tuple, sm: int, softmax_type="learnable", fp8_dpa=False, cp=1, cp_comm_type="p2p",
            deterministic=False) -> str:
    """TE's attention backend for one configuration (the filters named in the module docstring)."""
    te_v = tuple(int(p) for p in te.split("."))
    flash = softmax_type == "vanilla"
    fused = softmax_type == "vanilla" or cudnn >= (9, 13, 1)
    unfused = cp == 1
    if softmax_type != "vanilla":
        if fp8_dpa:
            fused = fused and te_v >= (2, 15) and sm >= 100 and cudnn >= (9, 21, 0)
            unfused = False
        if cp > 1 and cp_comm_type != "a2a":
            fused = False
        if deterministic:
            fused = False
    for name, ok in (("FlashAttention", flash), ("cuDNN fused (F16_arbitrary_seqlen)", fused),
                     ("unfused (TE UnfusedDotProductAttention)", unfused)):
        if ok:
            return name
    return "none (TE raises: no dot product attention backend)"


# cuDNN 9.22 kernel times, ms, 256 head-sequences of d=64, causal + 128 window (gpt_oss csv), BF16,
# non-deterministic backward; and Llama-3.1 d=128 causal, 2 x 64 heads (the same FLOPs as a GPT-OSS
# full layer of 4 x 64 heads of 64).
SWA = {"gb200": {4096: (0.210, 0.465), 8192: (0.414, 0.911)}, "gb300": {4096: (0.202, 0.442), 8192: (0.397, 0.862)}}
D128 = {"gb200": {4096: (0.391, 1.198), 8192: (1.397, 4.127)}, "gb300": {4096: (0.323, 1.101), 8192: (1.185, 3.832)}}
D64_PER_D128 = (336.0 / 591.0, 289.0 / 474.0)  # H200, cuDNN 9.19: forward, backward TFLOP/s ratio
# cudnn-frontend PR 322 (issue 256 shape, SM100, CUTLASS DSL 4.5): dGLU with dbias, regressed / fixed.
DGLU_DBIAS_REGRESSION = 1362.768 / 155.632


def published_attention_s(gpu: str, hw, b: int, s: int, heads: int, layers: int, microbatches: float):
    """(low, high) seconds per step of GPT-OSS's attention core from the published kernels: half the
    layers windowed, half full causal; times scaled by the micro-batch's head-sequences (b x heads / 256)
    and, for the full layers, from the published sequence length (4,096 or 8,192)."""
    ref = "gb300" if gpu in ("gb300", "b300") else "gb200"
    scale = b * heads / 256.0
    swa = sum(SWA[ref][s]) * scale
    d128_fwd, d128_bwd = (t * scale for t in D128[ref][s])
    exps_fwd = b * heads * s * s / 2.0 / (hw.exp_tera_per_s * 1e12) * 1e3  # ms; the backward recomputes them
    low = max(d128_fwd, exps_fwd) + max(d128_bwd, exps_fwd)
    high = max(d128_fwd / D64_PER_D128[0], exps_fwd) + max(d128_bwd / D64_PER_D128[1], exps_fwd)
    per_pair = np.array([low, high]) + swa  # one full and one windowed layer, ms
    return per_pair * layers / 2.0 * microbatches / 1e3


def part1() -> None:
    print("| release | TE | cuDNN | GPT-OSS backend, H100 (sm90) | Blackwell (sm100) | with FP8 attention, sm90 / sm100 |")
    print("|---|---|---|---|---|---|")
    for rel, (te, cudnn) in RELEASES.items():
        v = ".".join(map(str, cudnn))
        print(f"| {rel} | {te} | {v} | {backend(te, cudnn, 90)} | {backend(te, cudnn, 100)} | "
              f"{backend(te, cudnn, 90, fp8_dpa=True)} / {backend(te, cudnn, 100, fp8_dpa=True)} |")
    print(f"CP 2 with p2p (the exports before this branch): {backend('2.14', (9, 20, 0), 100, cp=2)}; "
          f"with a2a: {backend('2.14', (9, 20, 0), 100, cp=2, cp_comm_type='a2a')}; "
          f"NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: {backend('2.14', (9, 20, 0), 100, deterministic=True)}")


def part2() -> None:
    print()
    print("| row | error % | step s | attention priced s | published low-high s | error % at the published midpoint |")
    print("|---|---|---|---|---|---|")
    for p in load_runs(validation_runs(), moe=True):
        gpu = p.id.split("-")[4] if p.id.startswith("nemo") else p.id.split("-")[5]
        if "gpt-oss" not in p.id or gpu not in ("b200", "b300", "gb200", "gb300"):
            continue
        r = predict_row(p)
        out, i = priced(p)
        x = chosen(p, i)
        n = float(x.m[0]) * p.model.num_layers / float(x.p[0])
        attention_s = 3.0 * float(lt.attention_time(x)[0]) * n
        step = float(out["step_time_s"][i])
        measured = step * r["predicted"] / r["measured"]
        low, high = published_attention_s(gpu, p.hardware, int(x.b[0]), p.model.seq_length,
                                          p.model.num_attention_heads, p.model.num_layers / float(x.p[0]),
                                          float(x.m[0]))
        at_mid = (measured / (step - attention_s + (low + high) / 2.0) - 1.0) * 100.0
        print(f"| {p.id} | {r['error_pct']:+.1f} | {step:.2f} | {attention_s:.2f} | {low:.2f}-{high:.2f} | {at_mid:+.1f} |")


def part3() -> None:
    print()
    print(f"dGLU + dbias kernel regressed / fixed (cudnn-frontend PR 322): {DGLU_DBIAS_REGRESSION:.2f}x")
    print("| row | error % | step s | FC2 dgrad (dGLU) priced s | with the regression s | error % |")
    print("|---|---|---|---|---|---|")
    for p in load_runs(validation_runs(), moe=True):
        if "gpt-oss" not in p.id or "mxfp8" not in p.id or "26.06.01" not in p.id:
            continue
        r = predict_row(p)
        out, i = priced(p)
        x = chosen(p, i)
        if not bool(x.flag("cutedsl_fused_grouped_mlp")[0]):
            continue
        n = float(x.m[0]) * p.model.num_layers / float(x.p[0])
        # FC2's dgrad is one third of the routed experts' forward GEMM FLOPs (FC1 gated: two thirds).
        dglu = float(lt.routed_experts_time(x)[0]) / 3.0 * n
        step = float(out["step_time_s"][i])
        measured = step * r["predicted"] / r["measured"]
        slowed = step + (DGLU_DBIAS_REGRESSION - 1.0) * dglu
        print(f"| {p.id} | {r['error_pct']:+.1f} | {step:.2f} | {dglu:.3f} | {slowed:.2f} | "
              f"{(measured / slowed - 1.0) * 100.0:+.1f} |")


if __name__ == "__main__":
    part1()
    part2()
    part3()
