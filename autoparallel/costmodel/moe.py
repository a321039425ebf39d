"""The mixture-of-experts layer as Megatron-LM runs it (``--moe-grouped-gemm``), priced per GPU
and micro-batch; moving the tokens to their experts is ``dispatch``.

**Parallel folding** (``megatron/core/parallel_state.py``): attention runs on tp x cp x dp GPUs
per stage; the expert layers regroup the same GPUs as etp x ep x edp (expert tensor, expert and
expert-data parallel, edp = tp*cp*dp / (ep*etp), ranks in that order, etp fastest). Each GPU holds
num_experts / ep experts, each split over etp GPUs; expert gradients are reduced, and the
distributed optimizer shards their Adam states, over the edp group, not over dp*cp.

**One MoE layer forward** on the T tokens a GPU holds (the micro-batch's b*s/cp, split over tp
by sequence parallel): the router (a T x h x E GEMM), permutation, the dispatch of each token to
its top-k experts over the EP group (``dispatch``: alltoall, allgather or flex), the local
experts' grouped GEMMs, the combine back, unpermutation. The backward pass runs the dispatch and
the combine again.

**Grouped GEMMs**: each local expert sees T*k*etp*ep / E tokens on average; its two GEMMs are
cuBLAS GEMMs of their own (TransformerEngine's GroupedLinear loops over the experts, round-robin
over its 4 compute streams), priced on the dense GEMM curve at the size of the GEMMs in flight
together (``layer_time.concurrent_experts``: up to 4 experts' at once), so fine-grained experts
(small FFN, few tokens per expert) still run at a smaller share of peak; each call per local
expert also pays a fixed cost (``layer_time.moe_expert_calls``).

**Load imbalance**: with dropless routing (no capacity factor) every expert takes what the router
sends, so the step waits for the busiest EP rank. Each rank's load is modelled as the even share
with a relative spread ``moe_load_imbalance`` (fitted on published forced-balance vs dropless
pairs), the busiest of ep ranks at 1 + spread*sqrt(2 ln ep) (the expected maximum of ep
normal draws); a capacity factor caps it; forced balancing (Megatron's benchmarking switch
``--moe-router-force-load-balancing``) and ep = 1 remove it.
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec


def routed_width(model: ModelSpec) -> int:
    """Width of the tokens the routed experts take, dispatch and combine: the hidden size, or the
    latent width under LatentMoE, whose dispatcher "only sees latent-dim tensors" (Megatron-LM
    d98e8a64dd ``megatron/core/transformer/moe/moe_layer.py``: fc1_latent_proj before the
    dispatch, fc2_latent_proj after the combine)."""
    return model.moe_latent_size or model.hidden_size


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


def expert_params_gpu(model: ModelSpec, ep, etp):
    """Routed-expert weights of one MoE layer on one GPU."""
    return local_experts(model, ep) * model.expert_params / np.asarray(etp, dtype=float)


def nonexpert_moe_params_gpu(model: ModelSpec, tp):
    """Everything else of a MoE layer on one GPU: attention, shared experts and LatentMoE's
    projections split by TP, MLA's down projections and the router whole on every TP rank."""
    tp = np.asarray(tp, dtype=float)
    split = model.attention_params - model.mla_down_params + model.shared_expert_params + model.latent_projection_params
    return split / tp + model.mla_down_params + model.router_params
