"""The MoE dispatch of a DeepSeek-V3 layout whose EP group spans 8-GPU nodes, per dispatcher and
overlap setting: predicted ``ep_comm_s`` and the bytes one GPU sends per token and MoE layer over
the network and over NVLink (one dispatch, BF16, as Megatron sends them), beside DeepEP's
published normal-kernel figures (docs/legacy.md of deepseek-ai/DeepEP: H800, CX7 400 Gb/s, 4096
tokens, hidden 7168, top-8 of 256 with 4 of 8 groups, FP8 dispatch / BF16 combine: internode
"bottleneck bandwidth" 43 GB/s at EP16, 58 at EP32, 51 at EP64 RDMA; intranode 153-158 GB/s
NVLink at EP8).

    python benchmarks/bench_moe_dispatch.py
"""

from __future__ import annotations

import numpy as np

from autoparallel import io
from autoparallel.costmodel import dispatch
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.specs.plan import Plan

DEEPEP_RDMA_GBPS = {16: 43, 32: 58, 64: 51}  # dispatch bottleneck bandwidth, GB/s (RDMA)


def per_token_bytes(model, hw, ep: int) -> tuple[float, float, float]:
    """(network bytes flex, NVLink bytes flex, network bytes alltoall) per token of one dispatch."""
    inside = min(hw.nvlink_domain, ep)
    nodes = ep / inside
    h2 = model.hidden_size * dispatch.DISPATCH_BYTES
    remote = float(dispatch.nodes_per_token(model, nodes)) * (nodes - 1) / nodes
    gpus = float(dispatch.distinct_share(model.moe_router_topk, ep))
    nvlink_pairs = gpus * ((inside - 1) / ep + (ep - inside) / ep * (inside - 1) / inside)
    alltoall = model.moe_router_topk * (ep - inside) / ep
    return remote * h2, nvlink_pairs * h2, alltoall * h2


def main() -> None:
    model, hw = io.load_model("deepseek-v3"), io.load_hardware("h800")
    print(f"DeepSeek-V3 ({model.moe_router_num_groups} groups, top {model.moe_router_group_topk}; "
          f"MTP {model.mtp_num_layers}) on {hw.name}: TP1, 4096 tokens per micro-batch")
    print()
    print("| EP | nodes | dispatcher | 1F1B overlap | network KB/token | NVLink KB/token | one dispatch ms "
          "| DeepEP at its published RDMA GB/s, ms | ep_comm_s | step s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tokens = 4096
    for ep in (16, 32, 64):
        pp = 2048 // 128 if ep == 64 else 16
        flex_net, flex_nvl, a2a_net = per_token_bytes(model, hw, ep)
        published = tokens * flex_net / (DEEPEP_RDMA_GBPS[ep] * 1e9) * 1e3
        for dispatcher in ("alltoall", "flex"):
            one = float(dispatch.dispatch_time(hw, model, tokens, np.array([float(ep)]), 1, 1.0,
                                               np.array([dispatcher]))[0])
            for overlap in (False, True):
                plan = Plan(tp=1, pp=pp, vp=2, dp=128, ep=ep, mbs=1, gbs=15360, precision="fp8-blockwise",
                            recompute="selective", recompute_modules="mla_up_proj moe_act",
                            overlap_moe_expert_parallel_comm=overlap, moe_token_dispatcher_type=dispatcher,
                            pipeline_model_parallel_layout="Et|(t*2|)*30mL")
                r = estimate_plan(model, hw, plan)
                net = a2a_net if dispatcher == "alltoall" else flex_net
                nvl = "" if dispatcher == "alltoall" else f"{flex_nvl / 1e3:.1f}"
                ref = f"{published:.2f}" if dispatcher == "flex" else ""
                print(f"| {ep} | {ep // 8} | {dispatcher} | {'on' if overlap else 'off'} | {net / 1e3:.1f} | {nvl} | "
                      f"{one * 1e3:.2f} | {ref} | {r['breakdown']['time_s']['ep_comm_s']:.2f} | {r['step_time_s']:.2f} |")


if __name__ == "__main__":
    main()
