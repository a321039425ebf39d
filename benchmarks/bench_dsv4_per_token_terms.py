"""Where DeepSeek-V4 Flash's held-out 26.08 rows lose their time, term by term against DeepSeek-V3's
26.08 rows on the same GPUs (same container, same recipe family: MXFP8, flex / HybridEP, EP over one
NVL72 domain, full-iteration CUDA graph, fused grouped MLP), all per token and layer.

Every figure is GPU-nanoseconds per token and layer: a row's 1 / (tokens/s/GPU) spread over the layers
a token passes (decoder + MTP), so a PP4 row and a PP1 row compare directly; a term of the MoE layer is
its seconds per micro-batch over the micro-batch's tokens on one GPU. First table: the priced MoE layer
of each model (forward pieces x3 where the cost model prices the backward as twice the forward, the
kernels with their own backward summed), then measured vs predicted whole-model time per token and
layer and the gap. Second: what one priced piece of DeepSeek-V4's layer would have to be to close the
gap alone. Third: two structures read in the source the cost model now prices (session 53 s53h1) and how
little they move, and one it does not (the sparse backward's dKV atomics, no source for their rate).

    PYTHONPATH=$PWD python benchmarks/bench_dsv4_per_token_terms.py
"""

from __future__ import annotations

import numpy as np

from autoparallel import resources
from autoparallel.costmodel import dsv4, flops
from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced

V3 = ("bridge-26.08-deepseek-v3-gb200-256gpu-mxfp8-tp1pp4cp1vp4ep64-mbs1-gbs4096",
      "bridge-26.08-deepseek-v3-gb300-256gpu-mxfp8-tp1pp2cp1vp8ep32-mbs1-gbs4096")


def first(v) -> float:
    return float(np.ravel(v)[0])


def layer_pieces(x) -> dict:
    """The MoE layer's priced pieces, seconds per micro-batch (forward pieces already x3 where
    ``compute_time`` triples them; kernel pairs forward + backward)."""
    model = x.model
    nonexpert = model.moe_layer_params - model.num_experts * model.expert_params - model.router_params
    t_experts = lt.routed_experts_time(x)
    eff = x.hw.efficiency
    pieces = {
        "GEMMs, attention side + shared expert (x3)": 3 * lt.linear_time(x, nonexpert, model.mla_down_params),
        "GEMMs, routed experts (x3)": 3 * t_experts,
        "attention core (x3)": 3 * lt.attention_time(x),
        "elementwise (x3)": 3 * eff.elementwise_bytes_per_token_hidden / 34.0 * lt.activation_bytes(x, True, False) / x.hbm,
    }
    kernels = {"router": lt.hash_routed_router_time(x), "permutation": lt.permutation_time(x),
               "expert calls / fused-MLP launches + padding": lt.expert_calls(x, t_experts),
               "expert bias": lt.expert_bias_time(x), "GLU clamp": lt.glu_clamp_time(x, True)}
    if model.hc_mult > 1:
        kernels["mHC (fused cuTile)"] = dsv4.hyper_connection_time(x)
    if model.is_dsv4:
        names = ("DSA indexer top-k", "DSA indexer loss", "wo_a in BF16", "compressor pooling",
                 "compressor / indexer GEMMs as run (s53h1)", "FlashMLA padded key slots (s53h1)")
        kernels.update(zip(names, lt.dsv4_attention_kernels(x)))
    pieces.update({name: f + b for name, (f, b) in kernels.items()})
    layer = lt.layers(x).moe
    for key in ("fp8_cast", "selective_recompute", "ep_comm"):
        pieces[key] = layer[key]
    pieces["= MoE layer"] = layer["time"]
    return pieces


def main() -> None:
    rows = load_runs([resources.data_file("training_runs_dsv4.csv")], moe=True)
    rows += [r for r in load_runs([resources.data_file("training_runs_newer.csv")], moe=True) if r.id in V3]
    v3 = {r.hardware.name: r for r in rows[2:]}
    v4 = {r.hardware.name: r for r in rows[:2]}
    cols, gaps = [], {}
    for gpu in ("gb200", "gb300"):
        for r in (v3[gpu], v4[gpu]):
            out, i = priced(r)
            x = chosen(r, i)
            per = 1e9 / first(x.tokens)
            pred = predict_row(r)
            layers = r.model.num_layers + r.model.mtp_num_layers
            measured = 1e9 / pred["measured"] / layers
            predicted = 1e9 / pred["predicted"] / layers
            cols.append((f"{'V4' if r.model.is_dsv4 else 'V3'} {gpu}", {k: first(v) * per for k, v in layer_pieces(x).items()},
                         measured, predicted, x))
            if r.model.is_dsv4:
                gaps[gpu] = (measured - predicted, x)
    names = [k for k in dict.fromkeys(k for _, pieces, *_ in cols for k in pieces) if k != "= MoE layer"]
    names.append("= MoE layer")
    print("| GPU-ns per token and layer | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{c[1].get(name, 0.0):,.0f}" for c in cols) + " |")
    print("| whole model, measured | " + " | ".join(f"{c[2]:,.0f}" for c in cols) + " |")
    print("| whole model, predicted | " + " | ".join(f"{c[3]:,.0f}" for c in cols) + " |")
    print("| gap (measured - predicted) | " + " | ".join(f"{c[2] - c[3]:+,.0f}" for c in cols) + " |")

    print("\nWhat one priced piece of V4's layer would have to be, alone, to close the gap (x its priced time):")
    for gpu, (gap, x) in gaps.items():
        per = 1e9 / first(x.tokens)
        pieces = layer_pieces(x)
        needs = {k: (first(v) * per + gap) / (first(v) * per) for k, v in pieces.items()
                 if not k.startswith("=") and first(v) > 0}
        print(f"  {gpu} (gap {gap:,.0f} ns): " + "; ".join(f"{k} x{v:.1f}" for k, v in needs.items()))

    print("\nStructures read in the source (session 53 s53h1), GPU-ns per token and layer:")
    for gpu, (gap, x) in gaps.items():
        per = 1e9 / first(x.tokens)
        gemms = sum(lt.dsv4_compressor_gemms_time(x))
        slots = sum(lt.dsv4_padded_key_slots_time(x))
        print(f"  {gpu}: BF16 compressor / indexer GEMMs {first(gemms) * per:+.1f}; FlashMLA's padded key "
              f"slots {first(slots) * per:+.1f}; of a gap of {gap:,.0f}")
        # Not priced: cuDNN's DSA backward (NVIDIA/cudnn-frontend dsa_bwd_sm100.py reduce_dKV_from_reg)
        # adds each query's dKV rows (v_head_dim FP32 per valid key) into an FP32 workspace with global
        # atomics, in warps beside the MMA warps; the rate of those L2 reductions has no source.
        model = x.model
        keys = np.mean([flops.dsv4_sparse_context(model, r, model.seq_length) for r in model.dsv4_decoder_ratios])
        atomic = keys * model.v_head_dim * 4.0
        print(f"  {gpu}: cuDNN DSA backward's dKV atomics {atomic / 1e3:,.0f} KB per token and layer "
              f"({keys:.0f} keys x {model.v_head_dim} x 4 B); at the HBM rate {atomic / first(x.hbm) * 1e9:,.0f} ns "
              f"beside a priced attention backward of {2 * first(lt.attention_time(x)) * 1e9 / first(x.tokens):,.0f} ns "
              "(overlapped by the kernel's warp roles: not priced)")


if __name__ == "__main__":
    main()
