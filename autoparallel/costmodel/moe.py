"""The mixture-of-experts layer as Megatron-LM runs it (``--moe-token-dispatcher-type alltoall``,
``--moe-grouped-gemm``), priced per GPU and micro-batch.

**Parallel folding** (``megatron/core/parallel_state.py``): attention runs on tp x cp x dp GPUs
per stage; the expert layers regroup the same GPUs as etp x ep x edp (expert tensor, expert and
expert-data parallel, edp = tp*cp*dp / (ep*etp), ranks in that order, etp fastest). Each GPU holds
num_experts / ep experts, each split over etp GPUs; expert gradients are reduced, and the
distributed optimizer shards their Adam states, over the edp group, not over dp*cp.

**One MoE layer forward** (``token_dispatcher.MoEAlltoAllTokenDispatcher``) on the T tokens a GPU
holds (the micro-batch's b*s/cp, split over tp by sequence parallel): the router (a T x h x E
GEMM), permutation, an all-to-all over the EP group sending each token to its top-k experts
(T*k*h BF16 values, the share (ep-1)/ep leaving the GPU), an all-gather over the ETP group, the
local experts' grouped GEMMs, a reduce-scatter over ETP, the combine all-to-all, unpermutation.
The backward pass runs both all-to-alls again. An all-to-all's peers inside the NVLink domain
are reached over NVLink, the others over the network, both at once; it reaches a fitted share
(``alltoall``) of the link bandwidth. Without ``--overlap-moe-expert-parallel-comm`` the
all-to-alls wait for the compute around them and it for them; with it, the all-to-alls of one
micro-batch hide behind another's computation (``ep_overlap``, the share that can hide).

**Grouped GEMMs**: each local expert sees T*k*etp*ep / E tokens on average; its two GEMMs are
priced at the GEMM efficiency of their own size, so fine-grained experts (small FFN, few tokens
per expert) run at a small share of peak.

**Load imbalance**: with dropless routing (no capacity factor) every expert takes what the router
sends, so the step waits for the busiest EP rank. Each rank's load is modelled as the even share
with a relative spread ``moe_load_imbalance`` (fitted on published forced-balance vs dropless
pairs), the busiest of ep ranks at 1 + spread*sqrt(2 ln ep) (the expected maximum of ep
normal draws); a capacity factor caps it; forced balancing (Megatron's benchmarking switch
``--moe-router-force-load-balancing``) and ep = 1 remove it.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import comm
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

DISPATCH_BYTES = 2.0  # BF16 tokens through the all-to-alls


def local_experts(model: ModelSpec, ep):
    return (model.num_experts or 1) / np.asarray(ep, dtype=float)


def load_imbalance(hw: HardwareSpec, model: ModelSpec, ep):
    """The busiest EP rank's routed tokens over the even share (1 when balanced)."""
    ep = np.asarray(ep, dtype=float)
    if model.moe_router_force_load_balancing:
        return np.ones_like(ep)
    spread = 1.0 + hw.efficiency.moe_load_imbalance * np.sqrt(2.0 * np.log(np.maximum(ep, 1.0)))
    if model.moe_expert_capacity_factor is not None:
        spread = np.minimum(spread, model.moe_expert_capacity_factor)
    return spread


def tokens_per_expert(model: ModelSpec, tokens, ep, etp):
    """Rows of one local expert's GEMMs: the T*k token copies of the ep*etp GPUs that feed it."""
    return tokens * model.moe_router_topk * np.asarray(ep, dtype=float) * etp / (model.num_experts or 1)


def expert_flops(model: ModelSpec, tokens):
    """Forward FLOPs of the routed experts on one GPU (T*k token copies through one expert's
    weights; ETP splits the FFN but gathers etp times the tokens, so etp cancels)."""
    return 2.0 * tokens * model.moe_router_topk * model.expert_params


def expert_gemm_flops(model: ModelSpec, tokens, ep, etp):
    """Average size of one grouped-GEMM group: one expert's FC1 or FC2 on its tokens."""
    return 2.0 * tokens_per_expert(model, tokens, ep, etp) * model.expert_params / etp / 2.0


def alltoall_time(hw: HardwareSpec, nbytes, ep, etp):
    """One all-to-all in which every GPU of an EP group sends ``nbytes`` split evenly over the
    group. EP ranks are etp GPUs apart, so ``ranks_per_domain`` of them share an NVLink domain."""
    ep = np.asarray(ep, dtype=float)
    eff = hw.efficiency
    inside = comm.ranks_per_domain(hw, ep, etp)
    nvlink = hw.nvlink_unidirectional_gbps * 1e9 * eff.alltoall
    network = hw.internode_gbps * 1e9 * eff.alltoall
    intra = nbytes * (inside - 1) / ep / nvlink
    inter = nbytes * (ep - inside) / ep / network
    latency = np.where(ep > inside, hw.internode_latency_us, hw.nvlink_latency_us) * 1e-6
    return np.where(ep > 1, np.maximum(intra, inter) + latency, 0.0)


def dispatch_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance):
    """One dispatch (or combine): the EP all-to-all of T*k tokens, then the ETP all-gather (or
    the reduce-scatter before it). The busiest rank receives ``imbalance`` times its share."""
    nbytes = tokens * model.moe_router_topk * model.hidden_size * DISPATCH_BYTES * imbalance
    per_domain = comm.ranks_per_domain(hw, etp, 1)
    return alltoall_time(hw, nbytes, ep, etp) + comm.reduce_scatter_time(hw, nbytes * etp, etp, per_domain)


def exposed_dispatch(hw: HardwareSpec, total, overlap, window):
    """What the step waits for of ``total`` seconds of all-to-alls: all of it, or with the 1F1B
    overlap what ``window`` (another micro-batch's computation) cannot hide."""
    hidden = np.maximum((1.0 - hw.efficiency.ep_overlap) * total, total - window)
    return np.where(overlap, hidden, total)


def expert_params_gpu(model: ModelSpec, ep, etp):
    """Routed-expert weights of one MoE layer on one GPU."""
    return local_experts(model, ep) * model.expert_params / np.asarray(etp, dtype=float)


def nonexpert_moe_params_gpu(model: ModelSpec, tp):
    """Everything else of a MoE layer on one GPU: attention and shared experts split by TP, MLA's
    down projections and the router whole on every TP rank."""
    tp = np.asarray(tp, dtype=float)
    split = model.attention_params - model.mla_down_params + model.shared_expert_params
    return split / tp + model.mla_down_params + model.router_params
