"""Delayed-scaling amax reduction across the ranks that share a pipeline stage.

Each rank records the amax of the tensors it casts: a TP rank sees a slice of each weight and of
each row-parallel input and output gradient, a DP rank sees its own data, a CP rank its own part
of every sequence. As Megatron-LM / TransformerEngine do (``amax_reduction_group`` = the
tp x cp x dp group), the amax is reduced over the ``stage`` group (every rank holding the same
layers) before computing the scale, so every rank uses the scale the single-process model
would: the max over all slices. One batched all-reduce per step covers every FP8 layer of the
rank. FP8 is only in the linears, so context parallel's attention is unaffected.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.model.fp8 import fp8_modules, update_fp8_scales
from autoparallel.model.recipes import DelayedScaling


def reduce_amax(model: nn.Module, group) -> int:
    """Max-reduce the current amax slot of every delayed-scaling layer over ``group``."""
    layers = [m for m in fp8_modules(model) if isinstance(m.recipe, DelayedScaling)]
    if not layers or group is None or dist.get_world_size(group) == 1:
        return len(layers)
    current = torch.cat([m.amax_history[:, 0] for m in layers])
    dist.all_reduce(current, op=dist.ReduceOp.MAX, group=group)
    n = layers[0].amax_history.shape[0]
    for k, m in enumerate(layers):
        m.amax_history[:, 0] = current[k * n:(k + 1) * n]
    return len(layers)


def update_scales(model: nn.Module, group) -> int:
    reduce_amax(model, group)
    return update_fp8_scales(model)
