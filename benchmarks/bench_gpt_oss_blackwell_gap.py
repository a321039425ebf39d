"""GPT-OSS-120B on Blackwell, and DeepSeek-V4 Flash: what each row measures against what the cost model
prices, term by term, and the candidates issue 22 names for the missing time (session 55, s55h2).

Per row, in ms per MoE layer and micro-batch on the priced stage (the measured step over the stage's
layer-micro-batches, the step's non-layer share taken as priced, as ``bench_gpt_oss_bf16_terms.py``):
measured, priced, gap, and the priced terms: the GEMMs (attention block + routed experts, forward), the
attention core (forward), the fitted elementwise kernels (forward), the eager passes GPT-OSS runs (expert
bias, GLU clamp, unfused RoPE; forward + backward), the per-expert host calls, the exposed expert
all-to-all, and ``moe_act``'s rerun of the routed activation (``layer_time.moe_act_recompute_time``,
priced since this session). Then, per candidate the brief names, what the source says it costs here:

- sinks: every row ran cuDNN's fused attention with the sink (s37h4; TE's `learnable` filter), head dim
  64 among the dims cuDNN's sink kernels serve (TransformerEngine PR 3470 guards only other head dims) -> 0;
- the unfused bias-dropout-add (GPTOSSBridge ``bias_dropout_fusion = False``): the attention block's
  output bias added by a kernel of its own (read 2 B, write 2 B more per hidden element than the fused
  kernel, forward) and its gradient summed over the tokens (read 2 B, backward) -> ``bda``;
- hidden 2,880 = 11.25 x 256: the N-tile waste of the GEMMs whose output width is 2,880 (projection, FC2,
  and the dgrads into 2,880) if cuBLAS ran 256-wide tiles (an assumption: no source states the tile cuBLAS
  picked) -> ``tiles`` (an upper bound on the forward and dgrad GEMMs);
- head dim 64: the model prices the attention core at max(GEMMs, exponentials) per score, so d 64 costs
  ``d64/d128`` of d 128's time per score on the GPU; cuDNN's published d 64 / d 128 ratio (H200, the only
  GPU with both: 0.57 forward, 0.61 backward, s37h4) is lower: d 64 is not under-priced;
- what is left: the gap less ``bda`` and ``tiles``.

    PYTHONPATH=$PWD python benchmarks/bench_gpt_oss_blackwell_gap.py [ID_SUBSTRING ...]
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/bench_gpt_oss_blackwell_gap.py --whatif

``--whatif``: every GPT-OSS row's error with GPT-OSS's three eager PyTorch paths (expert bias, GLU clamp,
unfused RoPE) at the time they took on an H200 (``EAGER_MEASURED``, this session, one micro-batch's shapes)
over the time the model prices for the same shapes there, applied to every GPU (an assumption: the same
PyTorch kernels, at the same share of each GPU's HBM rate), alone and with s54h7's ``nophantom`` (the fused
MXFP8 MLP runs no eager bias or clamp).

Every figure is the cost model's or the row's; nothing here changes a prediction.
"""

from __future__ import annotations

import sys

import numpy as np

from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs

DEFAULT_ROWS = ("gpt-oss-120b-b200", "gpt-oss-120b-b300", "gpt-oss-120b-gb200", "gpt-oss-120b-gb300",
                "bridge-26.04.01-gpt-oss-120b-h100", "deepseek-v4-flash")
TILE = 256  # the assumed N tile of a Blackwell BF16 GEMM (2-SM 256-wide)


def v(a) -> float:
    return float(np.asarray(a).ravel()[0])


def tile_waste(n: int) -> float:
    """Columns computed over columns wanted at ``TILE``-wide tiles."""
    return -(-n // TILE) * TILE / n


def gemm_tile_share(model) -> float:
    """Extra share of a GPT-OSS layer's forward + dgrad GEMM time from N-tile waste: each GEMM's FLOPs
    per token weighted by its output width's waste (QKV, projection, FC1, FC2 forward; their dgrads
    write the input widths)."""
    h, f, k = model.hidden_size, model.expert_ffn_hidden_size, model.moe_router_topk
    qkv = (model.num_attention_heads + 2 * model.query_groups) * model.kv_channels
    proj_in = model.num_attention_heads * model.kv_channels
    gemms = [(h * qkv, qkv, h), (proj_in * h, h, proj_in), (k * h * 2 * f, 2 * f, h), (k * f * h, h, f)]
    flops = sum(2 * w for w, _, _ in gemms)
    wasted = sum(w * (tile_waste(n_fwd) - 1) + w * (tile_waste(n_dgrad) - 1) for w, n_fwd, n_dgrad in gemms)
    return wasted / flops


def per_token_exp_ratio(x) -> float:
    """The model's d 64 / d 128 attention time per score on ``x``'s GPU (``attention_time``'s max of
    the two GEMMs and the exponentials)."""
    hw = x.hw
    from autoparallel.costmodel import gemm
    bf16 = v(gemm.bf16_peak(hw))
    exp = 1.0 / (hw.exp_tera_per_s * 1e12)

    def per_score(d):
        return max(2.0 * 2.0 * d / bf16, exp)
    return per_score(64) / per_score(128)


def row(p) -> dict:
    r = predict_row(p)
    out, i = priced(p)
    x = chosen(p, i)
    model = x.model
    n = v(x.m) * model.num_layers / v(x.p)
    step = v(out["step_time_s"][i])
    measured = step * r["predicted"] / r["measured"]
    layer = lt.moe_layer(x)
    eff = x.hw.efficiency
    attn = lt.shared_terms(x)[0]
    nonexpert = model.moe_layer_params - model.num_experts * model.expert_params - model.router_params
    t_exp = lt.routed_experts_time(x)
    gemms = v(lt.linear_time(x, nonexpert, model.mla_down_params)) + v(t_exp)
    eager = sum(v(f) + v(b) for f, b in (lt.expert_bias_time(x), lt.glu_clamp_time(x, True), lt.unfused_rope_time(x)))
    tokens = v(x.tokens / x.t)
    bda = 6.0 * tokens * model.hidden_size / v(x.hbm) if lt.clamps_glu(model) else 0.0
    tiles = 3.0 * gemms * gemm_tile_share(model) if lt.clamps_glu(model) else 0.0  # forward + dgrad ~ 2/3 of x3
    gap = (measured - step) / n
    return {
        "row": p.id.replace("-tp1pp1cp1vp1", " ").replace("-gbs1280", "").replace("-64gpu", "").replace("-128gpu", ""),
        "err %": r["error_pct"], "measured": 1e3 * measured / n, "priced": 1e3 * step / n, "gap": 1e3 * gap,
        "GEMMs": 1e3 * gemms, "attn": 1e3 * v(attn),
        "elementwise": 1e3 * eff.elementwise_bytes_per_token_hidden / 34.0 * v(lt.activation_bytes(x, True, False))
        / v(x.hbm),
        "eager f+b": 1e3 * eager, "calls": 1e3 * v(lt.expert_calls(x, t_exp)[0]), "ep_comm": 1e3 * v(layer["ep_comm"]),
        "moe_act": 1e3 * v(lt.moe_act_recompute_time(x)[1]), "bda": 1e3 * bda, "tiles": 1e3 * tiles,
        "left": 1e3 * (gap - bda - tiles), "d64/d128": per_token_exp_ratio(x),
    }


# Measured on one H200 (torch 2.11, CUDA events, median of 20; benchmarks/RESULTS.md session 55 s55h2, the
# scripts in that section) at GPT-OSS-120B's mbs-4 shapes, against the cost model's bytes at H200's achievable
# 3.36 TB/s for the same shapes: (forward, backward) measured ms and priced ms. Clamp: 65,536 x 5,760 GLU
# inputs; expert bias: 65,536 x 2,880 over 16 local experts (FP32 / BF16 probabilities); unfused RoPE: the
# query (64 heads) and key (8) of 4 x 4,096 tokens x 64, less 4 B per element for TE's fused kernel.
EAGER_MEASURED = {
    "clamp": ((1.417, 3.074), (0.899, 1.123)),
    "bias_fp32": ((2.226, 3.447), (1.573, 2.022)),
    "bias_bf16": ((0.974, 2.045), (0.674, 0.674)),
    "rope": ((0.976 + 0.244 - 0.090, 1.107 + 0.397 - 0.090), (0.449, 0.360)),
}
EAGER_RATIO = {k: tuple(m / p for m, p in zip(*v)) for k, v in EAGER_MEASURED.items()}


def measured_eager():
    """The three eager paths at ``EAGER_RATIO`` times their priced (forward, backward); the clamp's
    moe_act rerun (a forward) at the forward's ratio."""
    bias, clamp, rope = lt.expert_bias_time, lt.glu_clamp_time, lt.unfused_rope_time

    def new_bias(x):
        f, b = bias(x)
        wide = lt.fp32_expert_probs(x)
        (f32, b32), (f16, b16) = EAGER_RATIO["bias_fp32"], EAGER_RATIO["bias_bf16"]
        return f * np.where(wide, f32, f16), b * np.where(wide, b32, b16)

    def new_clamp(x, kind):
        f, b = clamp(x, kind)
        rerun = np.where(x.modules["moe_act"], f, 0.0) if lt.as_kind(kind).is_moe else 0.0
        rf, rb = EAGER_RATIO["clamp"]
        return f * rf, (b - rerun) * rb + rerun * rf

    def new_rope(x):
        f, b = rope(x)
        rf, rb = EAGER_RATIO["rope"]
        return f * rf, b * rb

    lt.expert_bias_time, lt.glu_clamp_time, lt.unfused_rope_time = new_bias, new_clamp, new_rope
    try:
        yield
    finally:
        lt.expert_bias_time, lt.glu_clamp_time, lt.unfused_rope_time = bias, clamp, rope


def whatif() -> None:
    from contextlib import ExitStack, contextmanager

    from bench_gpt_oss_whatif import fused_without_eager_passes

    rows = [p for p in load_runs(validation_runs(), moe=True) if "gpt-oss" in p.id]
    variants = {}
    for name, ctxs in (("priced", ()), ("eager measured", (contextmanager(measured_eager),)),
                       ("nophantom", (fused_without_eager_passes,)),
                       ("eager measured + nophantom", (contextmanager(measured_eager), fused_without_eager_passes))):
        with ExitStack() as stack:
            for c in ctxs:
                stack.enter_context(c())
            variants[name] = [predict_row(p)["error_pct"] for p in rows]
    print("ratios measured / priced (forward, backward): "
          + ", ".join(f"{k} {f:.2f} / {b:.2f}" for k, (f, b) in EAGER_RATIO.items()))
    names = list(variants)
    print("| row | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, p in enumerate(rows):
        print(f"| {p.id} | " + " | ".join(f"{variants[n][i]:+.1f}" for n in names) + " |")
    groups = {
        "BF16 Blackwell (bridge)": lambda p: p.id.startswith("bridge") and "-bf16-" in p.id and "h100" not in p.id,
        "MXFP8 (not 26.06.01)": lambda p: "-mxfp8-" in p.id and "26.06.01" not in p.id,
        "H100": lambda p: "h100" in p.id,
        "NeMo 25.11 (moe kind)": lambda p: p.id.startswith("nemo"),
        "all GPT-OSS": lambda p: True,
    }
    print("\n| group | rows | " + " | ".join(f"{n} mean / mean abs" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for g, keep in groups.items():
        idx = [i for i, p in enumerate(rows) if keep(p)]
        cells = [f"{np.mean([variants[n][i] for i in idx]):+.1f} / {np.mean([abs(variants[n][i]) for i in idx]):.1f}"
                 for n in names]
        print(f"| {g} | {len(idx)} | " + " | ".join(cells) + " |")


def main(patterns) -> None:
    rows = [row(p) for p in load_runs(validation_runs(), moe=True) if any(s in p.id for s in patterns)]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    for r in rows:
        cells = [r["row"], f"{r['err %']:+.1f}"] + [f"{r[c]:.2f}" for c in cols[2:]]
        print("| " + " | ".join(cells) + " |")
    print("\nms per MoE layer and micro-batch; GEMMs, attn, elementwise forward; eager f+b = expert bias + GLU clamp +"
          " unfused RoPE, forward and backward; moe_act = the routed activation's rerun (priced); bda, tiles ="
          " candidates (not priced; tiles an assumption); left = gap - bda - tiles.")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--whatif"]:
        whatif()
    else:
        main(sys.argv[1:] or DEFAULT_ROWS)
