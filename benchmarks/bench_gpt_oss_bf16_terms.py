"""GPT-OSS-120B's Blackwell rows term by term, BF16 beside MXFP8 (issue 22, session 54, s54h3).

For each row named (default: one BF16 and one MXFP8 row per GPU family, the same EP where one exists),
per MoE layer and micro-batch on the priced stage, in ms: the measured layer time (measured step over
the stage's layer-micro-batches, the step's non-layer share taken as priced), the priced one, the gap,
each ``LAYER_TIME_TERMS`` entry, and inside ``compute`` the parts the MoE layer is built from (forward
times: attention-block GEMMs, routed experts' GEMMs, attention core, elementwise, router, permutations,
per-expert calls, expert bias, GLU clamp, unfused RoPE; backward where it is priced on its own).

    PYTHONPATH=$PWD python benchmarks/bench_gpt_oss_bf16_terms.py [ID_SUBSTRING ...]
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/bench_gpt_oss_bf16_terms.py --whatif [--no-yarn]

``--whatif``: every GPT-OSS row's error as priced and with two source-backed corrections the cost
model does not make (each alone, then both), grouped BF16-on-Blackwell / MXFP8 / H100 / NeMo 25.11:

- ``nophantom``: the fused CuTe-DSL grouped MLP rows without the eager expert-bias and GLU-clamp passes
  Megatron-Core does not run there (``bench_gpt_oss_whatif.fused_without_eager_passes``; s38h1 (c));
- ``window``: the 128-token sliding-window half of the layers at cuDNN's published time for exactly that
  attention (NVIDIA/cudnn-frontend 3929da2 ``benchmark/sdpa_benchmark_training/results/gpt_oss/{gb200,gb300}/``,
  cuDNN 9.22, BF16, causal + window 128, batch 2 x 128 heads of 64 at 4,096 tokens = the 256
  head-sequences of one mbs-4 micro-batch: GB200 0.210 ms forward + 0.465 backward, GB300 0.202 + 0.442;
  B200 / B300 take GB200's / GB300's, an assumption), scaled by head-sequences x tokens; the full layers
  as priced.

``yarn`` (Megatron-Core's unfused RoPE under YaRN) is priced by the cost model since this session
(``layer_time.unfused_rope_time``); ``--whatif --no-yarn`` prices the rows without it, to show its share.
The last column swaps a fitted constant and is no correction: the h100-sxm fit's
``elementwise_bytes_per_token_hidden`` on the Blackwell rows, over both corrections.

Every figure is the cost model's; nothing here changes a prediction.
"""

from __future__ import annotations

import dataclasses
import sys
from contextlib import ExitStack, contextmanager

import numpy as np

from autoparallel.costmodel import layer_time as lt
from autoparallel.io import load_hardware
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs

DEFAULT_ROWS = (
    "bridge-26.04.01-gpt-oss-120b-b200", "bridge-26.04.01-gpt-oss-120b-b300", "bridge-26.06-gpt-oss-120b-b300",
    "bridge-26.02-gpt-oss-120b-gb200", "bridge-26.04-gpt-oss-120b-gb200", "bridge-26.08-gpt-oss-120b-gb200",
    "bridge-26.04.01-gpt-oss-120b-gb300", "bridge-26.08-gpt-oss-120b-gb300",
    "bridge-26.04.01-gpt-oss-120b-h100",
)


def v(a) -> float:
    return float(np.asarray(a).ravel()[0])


def parts(x) -> dict:
    """Forward (and, where priced apart, backward) ms of what one MoE layer's compute holds."""
    model = x.model
    nonexpert = model.moe_layer_params - model.num_experts * model.expert_params - model.router_params
    eff = x.hw.efficiency
    attn, softmax, _, _ = lt.shared_terms(x)
    t_exp = lt.routed_experts_time(x)
    out = {
        "attn-block GEMMs": v(lt.linear_time(x, nonexpert, model.mla_down_params)),
        "expert GEMMs": v(t_exp),
        "attention core": v(attn),
        "elementwise": v(eff.elementwise_bytes_per_token_hidden / 34.0 * lt.activation_bytes(x, True, False) / x.hbm),
        "launches": v(np.where(x.knob_is("cuda_graph", "none"), eff.layer_overhead_s, 0.0)),
    }
    for name, pair in (("router", lt.router_time(x)), ("permutation", lt.permutation_time(x)),
                       ("expert calls", lt.expert_calls(x, t_exp)), ("expert bias", lt.expert_bias_time(x)),
                       ("GLU clamp", lt.glu_clamp_time(x, True)), ("unfused RoPE", lt.unfused_rope_time(x))):
        out[name] = v(pair[0])
        out[name + " bwd"] = v(pair[1])
    return {k: 1e3 * val for k, val in out.items()}


def main(patterns) -> None:
    rows = [p for p in load_runs(validation_runs(), moe=True) if any(s in p.id for s in patterns)]
    for p in rows:
        r = predict_row(p)
        out, i = priced(p)
        x = chosen(p, i)
        n = v(x.m) * p.model.num_layers / v(x.p)
        step = v(out["step_time_s"][i])
        measured = step * r["predicted"] / r["measured"]
        layer = lt.moe_layer(x)
        print(f"\n{p.id}: error {r['error_pct']:+.1f} %, measured {1e3 * measured / n:.2f} ms per layer-mb, "
              f"priced {1e3 * step / n:.2f}, gap {1e3 * (measured - step) / n:+.2f}; priced layer {1e3 * v(layer['time']):.2f}")
        print("  terms: " + ", ".join(f"{k} {1e3 * v(layer[k]):.2f}" for k in lt.LAYER_TIME_TERMS if abs(v(layer[k])) > 1e-7))
        print("  compute parts (forward unless bwd): " + ", ".join(f"{k} {val:.2f}" for k, val in parts(x).items() if val))


# cuDNN's published BF16 sliding-window (128) attention, forward + backward ms, for 256 head-sequences of
# 4,096 tokens (head dim 64); the GPUs without a figure take their sibling's (an assumption).
WINDOW_MS = {"gb200": 0.210 + 0.465, "gb300": 0.202 + 0.442}
WINDOW_SIBLING = {"b200": "gb200", "b300": "gb300"}
WINDOW_HEAD_TOKENS = 256 * 4096
@contextmanager
def patched(module, name, make):
    old = getattr(module, name)
    setattr(module, name, make(old))
    try:
        yield
    finally:
        setattr(module, name, old)


def window_attention(old):
    """The windowed half of GPT-OSS's layers at cuDNN's published cost (forward = a third of it)."""
    def attention_time(x):
        full = old(x)
        gpu = WINDOW_SIBLING.get(x.hw.name, x.hw.name)
        if not lt.clamps_glu(x.model) or gpu not in WINDOW_MS:  # GPT-OSS (rows carry no window)
            return full
        head_tokens = x.b * x.model.num_attention_heads / x.t * x.model.seq_length / x.c
        windowed = WINDOW_MS[gpu] * 1e-3 / 3.0 * head_tokens / WINDOW_HEAD_TOKENS
        return 0.5 * full + 0.5 * windowed
    return attention_time


def no_rope(old):
    """The cost model's unfused-RoPE term switched off (to show its share)."""
    def unfused_rope_time(x):
        f, b = old(x)
        return 0.0 * f, 0.0 * b
    return unfused_rope_time


def h100_elementwise(p):
    """``p`` with its GPU's ``elementwise_bytes_per_token_hidden`` at the h100-sxm fit's value (a what-if
    that swaps a fitted constant: the b200 family's is fitted on FP8 dense rows whose elementwise share is
    small; never a correction)."""
    if p.hardware.name == "h100-sxm":
        return p
    h100 = load_hardware("h100-sxm").efficiency.elementwise_bytes_per_token_hidden
    eff = dataclasses.replace(p.hardware.efficiency, elementwise_bytes_per_token_hidden=h100)
    return dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, efficiency=eff))


def whatif(yarn: bool = True) -> None:
    from bench_gpt_oss_whatif import fused_without_eager_passes

    rows = [p for p in load_runs(validation_runs(), moe=True) if "gpt-oss" in p.id]
    variants = {"priced": []}

    def run(name, *ctxs):
        with ExitStack() as stack:
            for c in ctxs:
                stack.enter_context(c())
            variants[name] = [predict_row(p)["error_pct"] for p in rows]

    base = () if yarn else (lambda: patched(lt, "unfused_rope_time", no_rope),)
    run("priced", *base)
    run("nophantom", *base, fused_without_eager_passes)
    run("window", *base, lambda: patched(lt, "attention_time", window_attention))
    both = base + (fused_without_eager_passes, lambda: patched(lt, "attention_time", window_attention))
    run("both", *both)
    with ExitStack() as stack:  # not a correction: the H100 fit's elementwise rate on Blackwell, over both
        for c in both:
            stack.enter_context(c())
        variants["both + H100 elementwise"] = [predict_row(h100_elementwise(p))["error_pct"] for p in rows]
    names = list(variants)
    print("| row | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, p in enumerate(rows):
        print(f"| {p.id} | " + " | ".join(f"{variants[n][i]:+.1f}" for n in names) + " |")
    groups = {
        "BF16 Blackwell (26.02-26.04.01, no B300 EP64)": lambda p: p.id.startswith("bridge") and "-bf16-" in p.id
        and "h100" not in p.id and not ("b300" in p.id and "ep64" in p.id),
        "MXFP8 26.06 / 26.08": lambda p: "-mxfp8-" in p.id and "26.06.01" not in p.id,
        "H100": lambda p: "h100" in p.id,
        "NeMo 25.11 (moe kind)": lambda p: p.id.startswith("nemo"),
    }
    print("\n| group | rows | " + " | ".join(f"{n} mean / mean abs" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for g, keep in groups.items():
        idx = [i for i, p in enumerate(rows) if keep(p)]
        cells = [f"{np.mean([variants[n][i] for i in idx]):+.1f} / {np.mean([abs(variants[n][i]) for i in idx]):.1f}"
                 for n in names]
        print(f"| {g} | {len(idx)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--whatif"]:
        whatif(yarn="--no-yarn" not in sys.argv)
    else:
        main(sys.argv[1:] or DEFAULT_ROWS)
