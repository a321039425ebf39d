"""Sequence parallel's column-parallel GEMMs, saving the sequence shard as Megatron-LM does.

Under sequence parallel a block's input is all-gathered along the sequence before its column-
parallel linears (Q, K and V; or FC1 and the gate). Plain autograd would save the gathered
input, tp times the shard. Megatron-LM saves the shard and gathers it again in backward for the
weight gradients, which is what Korthikanti et al.'s s·b·h/t·34 counts, so the built-in model
does the same: ``_GatheredColumns`` runs a block's column GEMM(s) on one gathered input and
saves only the shard (one all-gather forward; one all-gather and one reduce-scatter backward).
The block's own code still calls ``self.wqkv(x)`` / ``self.w1(x)``: those modules are swapped for
``_PrecomputedColumn`` stand-ins that hand back the output computed for them. FP8 linears
quantise and save their own input, so a block with one keeps the plain gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.parallel import comm

SEQ = comm.SEQ_DIM


class _GatheredColumns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, full, group, *weights):
        ctx.group = group
        ctx.save_for_backward(shard, *weights)
        return tuple(F.linear(full, w) for w in weights)

    @staticmethod
    def backward(ctx, *grads):
        shard, *weights = ctx.saved_tensors
        full = comm.all_gather_dim(shard, SEQ, ctx.group)
        dfull, dweights = None, []
        for g, w in zip(grads, weights):
            d = g @ w.to(g.dtype)
            dfull = d if dfull is None else dfull + d
            dweights.append((g.flatten(0, -2).t() @ full.flatten(0, -2).to(g.dtype)).to(w.dtype))
        dshard = comm.reduce_scatter_dim(dfull, SEQ, ctx.group)
        return (dshard.to(shard.dtype), None, None, *dweights)


def gathered_columns(shard: torch.Tensor, group, weights: list[torch.Tensor]
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The gathered input (for shapes only, outside autograd) and ``full @ w.T`` for each w."""
    full = comm.all_gather_dim(shard.detach(), SEQ, group)
    return full, _GatheredColumns.apply(shard, full, group, *weights)


class _PrecomputedColumn(nn.Module):
    """Stands in for a column-parallel ``nn.Linear`` (same ``weight`` parameter and name) whose
    output the enclosing ``SequenceParallelBlock`` has already computed."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.output: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, self.output = self.output, None
        if out is None:
            raise RuntimeError("a sequence-parallel column linear ran outside its block")
        return out


def column_names(block: nn.Module) -> list[str]:
    """The block's column-parallel linears that this path can take: all plain ``nn.Linear``."""
    names = [n for n in ("wqkv", "w1") if getattr(block, n, None) is not None]
    return names if all(type(getattr(block, n)) is nn.Linear for n in names) else []


class SequenceParallelBlock(nn.Module):
    """An attention or MLP block under TP + SP: gather in (saving the shard), reduce-scatter out."""

    def __init__(self, block: nn.Module, group, names: list[str]) -> None:
        super().__init__()
        self.block, self.group, self.names = block, group, names
        for name in names:
            setattr(block, name, _PrecomputedColumn(getattr(block, name)))

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        columns = [getattr(self.block, n) for n in self.names]
        full, outputs = gathered_columns(x, self.group, [c.weight for c in columns])
        for column, out in zip(columns, outputs):
            column.output = out
        try:
            y = self.block(full, *args)
        finally:
            for column in columns:
                column.output = None
        return comm.scatter_seq(y, self.group)
