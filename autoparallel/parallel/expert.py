"""Expert parallel for the built-in transformer's MoE layers, applied from outside.

Megatron-LM's MoE parallel folding with expert tensor parallel 1 (groups: ``ParallelDims.
build_expert_groups``): each rank of an EP group keeps num_experts/ep consecutive experts of
every MoE layer, whole. A MoE layer routes its own tokens (under sequence parallel, the rank's
shard of the sequence) and sends every (token, expert) copy to the EP rank holding that expert
with an all-to-all, runs its local experts and sends the results back the same way, as
Megatron's alltoall token dispatcher does. Both all-to-alls are autograd functions whose
backward is the reverse all-to-all. The rows per (source, expert) travel first, in one small
all-to-all, so the receiver knows each row's expert without an exchange of ids.

Gradients (``autoparallel.parallel.parallelize``): an expert's gradient on its rank sums the
contributions of every token of its EP group; summed over the expert-data-parallel group it
covers every data-parallel replica once, so it is divided by dp*cp like every other gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.model.moe import MoeMlp, run_experts, unsort


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` to the group's ranks (``send[r]`` rows to rank r, ``recv[r]`` from it);
    the reverse exchange in backward."""

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
    """Send each row to the EP rank holding its expert, run the local experts there, and bring
    the results back in the rows' order."""

    def __init__(self, group, ep: int, ep_rank: int, experts_per_rank: int) -> None:
        self.group, self.ep, self.per_rank = group, ep, experts_per_rank
        self.first = ep_rank * experts_per_rank

    def __call__(self, moe: MoeMlp, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(expert_ids, stable=True)  # by expert, so by destination rank
        # rows for each (destination rank, its local expert) -> from each (source, my expert)
        send_counts = torch.bincount(expert_ids, minlength=self.ep * self.per_rank)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        # the one host sync of the layer: [send, recv][rank][local expert]
        out, into = torch.stack((send_counts, recv_counts)).view(2, self.ep, self.per_rank).tolist()
        send, recv = [sum(r) for r in out], [sum(r) for r in into]
        rows = _AllToAll.apply(x.index_select(0, order), send, recv, self.group)
        local = torch.arange(self.per_rank, device=x.device).repeat(self.ep)
        ids = local.repeat_interleave(recv_counts, output_size=sum(recv)) + self.first
        per_expert = [sum(c) for c in zip(*into)]
        back = _AllToAll.apply(run_experts(moe.experts, rows, ids, per_expert), recv, send,
                               self.group)
        return unsort(back, order)


def apply_expert_parallel(model: nn.Module, ep_rank: int, ep: int, group) -> None:
    """Keep EP rank ``ep_rank``'s experts of every MoE layer (num_experts divisible by ``ep``:
    ``check_plan``) and dispatch to the others'."""
    for moe in [m for m in model.modules() if isinstance(m, MoeMlp)]:
        per_rank = moe.num_experts // ep
        local = range(ep_rank * per_rank, (ep_rank + 1) * per_rank)
        moe.experts = nn.ModuleDict({str(e): moe.experts[str(e)] for e in local})
        moe.dispatcher = AllToAllDispatch(group, ep, ep_rank, per_rank)
