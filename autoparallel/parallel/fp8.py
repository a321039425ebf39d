"""Delayed-scaling amax reduction across the ranks that share a pipeline stage.

Each rank records the amax of the tensors it casts: a TP rank sees a slice of each weight and of
each row-parallel input and output gradient, a DP rank sees its own data, a CP rank its own part
of every sequence. As Megatron-LM / TransformerEngine do (``amax_reduction_group`` = the
tp x cp x dp group), the amax is reduced over the ``stage`` group (every rank holding the same
layers) before computing the scale, so every rank uses the scale the single-process model
would: the max over all slices. This step's amaxes of every FP8 layer of a recipe are one
contiguous row (``Fp8StatePack.history[0]``), so the reduction is one in-place all-reduce per
recipe. FP8 is only in the linears, so context parallel's attention is unaffected.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from autoparallel.model.fp8 import state_packs, update_fp8_scales


def reduce_amax(model: nn.Module, group) -> int:
    """Max-reduce this step's amax of every delayed-scaling layer over ``group``; returns how
    many layers."""
    packs = state_packs(model)
    if group is not None and dist.get_world_size(group) > 1:
        for pack in packs:
            dist.all_reduce(pack.history[0], op=dist.ReduceOp.MAX, group=group)
    return sum(len(p.layers) for p in packs)


def update_scales(model: nn.Module, group) -> int:
    reduce_amax(model, group)
    return update_fp8_scales(model)
