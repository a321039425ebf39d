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
    main(sys.argv[1:] or DEFAULT_ROWS)
