"""Expert parallel for the built-in transformer's MoE layers, applied from outside.

Megatron-LM's MoE parallel folding with expert tensor parallel 1: the tp*cp*dp ranks of a
pipeline stage, in Megatron's order (TP fastest, then CP, then DP), are regrouped for the expert
layers into EP groups of ``ep`` consecutive ranks, each holding num_experts/ep experts whole, and
expert-data-parallel (EDP) groups of the ranks at the same place in every EP group, which hold
the same experts. A MoE layer routes on its own tokens (under sequence parallel, its shard of the
sequence), sends every (token, expert) copy to the EP rank holding that expert with an
all-to-all (counts first, then rows), runs the local experts and sends the results back the same
way; both all-to-alls are autograd functions whose backward is the reverse all-to-all, as
Megatron's alltoall token dispatcher does.

Gradients: an expert's gradient on its rank already sums the contributions of every token of its
EP group; summed over the EDP group it covers every data-parallel replica once, so it is divided
by dp*cp like every other gradient. The router and the shared experts are whole on every TP rank
and see only the rank's sequence shard: their gradients are partial sums over TP, like the norms'.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.model.moe import MoeMlp, run_experts


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` to the group's ranks (``send`` rows each); the reverse in backward."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


class AllToAllDispatch:
    """Send each row to the EP rank that holds its expert, run the local experts there, bring the
    results back into the rows' order."""

    def __init__(self, group, ep: int, experts_per_rank: int) -> None:
        self.group, self.ep, self.per_rank = group, ep, experts_per_rank

    def __call__(self, moe: MoeMlp, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        destination = torch.div(expert_ids, self.per_rank, rounding_mode="floor")
        order = torch.argsort(destination, stable=True)
        send_counts = torch.bincount(destination, minlength=self.ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        rows = _AllToAll.apply(x.index_select(0, order), send, recv, self.group)
        ids = expert_ids.new_empty(sum(recv))
        dist.all_to_all_single(ids, expert_ids.index_select(0, order).contiguous(), recv, send, group=self.group)
        back = _AllToAll.apply(run_experts(moe.experts, rows, ids), recv, send, self.group)
        return back.new_zeros(back.shape).index_copy(0, order, back)


def stage_index(coords: dict, dims) -> int:
    """A rank's place among the tp*cp*dp ranks of its pipeline stage, in Megatron's order."""
    return (coords["dp"] * dims.cp + coords["cp"]) * dims.tp + coords["tp"]


def build_groups(dims, ep: int) -> dict:
    """The EP and EDP groups of every stage (``new_group`` is collective over the world): this
    rank's ``ep`` / ``edp`` group, ``ep_rank`` and ``edp_rank``."""
    stage_size = dims.tp * dims.cp * dims.dp
    if stage_size % ep:
        raise ValueError(f"ep={ep} does not divide the {stage_size} ranks of a pipeline stage (tp*cp*dp)")
    me = dist.get_rank()
    by_stage: dict[int, list[int]] = {}
    for r in range(dims.world_size):
        c = dims.coords(r)
        by_stage.setdefault(c["pp"], [0] * stage_size)[stage_index(c, dims)] = r
    out: dict = {}
    for ranks in by_stage.values():
        for start in range(0, stage_size, ep):
            members = ranks[start:start + ep]
            group = dist.new_group(members)
            if me in members:
                out.update(ep=group, ep_rank=members.index(me))
        for offset in range(ep):
            members = ranks[offset::ep]
            group = dist.new_group(members)
            if me in members:
                out.update(edp=group, edp_rank=members.index(me), edp_size=len(members))
    return out


def moe_layers(model: nn.Module) -> list[MoeMlp]:
    return [m for m in model.modules() if isinstance(m, MoeMlp)]


def apply_expert_parallel(model: nn.Module, ep_rank: int, ep: int, group) -> None:
    """Keep EP rank ``ep_rank``'s experts of every MoE layer and dispatch to the others'."""
    for moe in moe_layers(model):
        if moe.num_experts % ep:
            raise ValueError(f"num_experts={moe.num_experts} is not divisible by ep={ep}")
        per_rank = moe.num_experts // ep
        local = range(ep_rank * per_rank, (ep_rank + 1) * per_rank)
        moe.experts = nn.ModuleDict({str(i): moe.experts[str(i)] for i in local})
        moe.dispatcher = AllToAllDispatch(group, ep, per_rank)


def is_expert_param(name: str) -> bool:
    """A routed expert's weight (reduced over the EDP group)."""
    return ".mlp.experts." in name


def tp_replicated_params(model: nn.Module) -> list[nn.Parameter]:
    """The router's and the shared experts' weights: whole on every TP rank."""
    return [p for m in moe_layers(model) for child in (m.router, m.shared_experts) if child is not None
            for p in child.parameters()]
