"""Delayed-scaling amax reduction across the ranks that share a pipeline stage.

Each rank records the amax of the tensors it casts: a TP rank sees a slice of each weight and of
each row-parallel input and output gradient, a DP rank sees its own data, a CP rank its own part
of every sequence. As Megatron-LM / TransformerEngine do (``amax_reduction_group`` = the
tp x cp x dp group), the amax is reduced over the ``stage`` group (every rank holding the same
layers) before computing the scale, so every rank uses the scale the single-process model
would: the max over all slices. This step's amaxes of every FP8 layer of a recipe are one
contiguous row (``Fp8StatePack.history[0]``), so the reduction is one in-place all-reduce per
recipe. FP8 is only in the linears, so context parallel's attention is unaffected.

Under expert parallel the ranks of a stage hold different routed experts, so those layers'
columns are reduced over the expert-data-parallel group instead (the ranks holding the same
experts, which together saw every token routed to them): the single-process scale again.
TransformerEngine reduces the whole row over the stage group, taking the max of different
experts' amaxes at the same place; the scale is then merely more conservative.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.model.fp8 import state_packs, update_fp8_scales
from autoparallel.model.moe import is_routed_expert
from autoparallel.parallel import comm


def reduce_amax(model: nn.Module, group, expert_group=None) -> int:
    """Max-reduce this step's amax of every delayed-scaling layer over ``group`` (routed
    experts' over ``expert_group`` when given); returns how many layers."""
    packs = state_packs(model)
    experts = ({id(m) for name, m in model.named_modules() if is_routed_expert(name)}
               if expert_group is not None else set())
    for pack in packs:
        row = pack.history[0]
        width = row.numel() // len(pack.layers)
        cols = [width * k + j for k, m in enumerate(pack.layers) if id(m) in experts
                for j in range(width)]
        index = torch.tensor(cols, dtype=torch.long, device=row.device)
        own = row.index_select(0, index) if cols else None
        if comm._size(group) > 1:
            dist.all_reduce(row, op=dist.ReduceOp.MAX, group=group)
        if cols:
            if comm._size(expert_group) > 1:
                dist.all_reduce(own, op=dist.ReduceOp.MAX, group=expert_group)
            row.index_copy_(0, index, own)
    return sum(len(p.layers) for p in packs)


def update_scales(model: nn.Module, group, expert_group=None) -> int:
    reduce_amax(model, group, expert_group)
    return update_fp8_scales(model)
