"""Collectives as autograd functions: what tensor and sequence parallel insert at the edges of
the attention and MLP blocks (Megatron-LM's mappings).

- ``copy_to``: identity forward, all-reduce backward (entering a TP block without SP).
- ``reduce_from``: all-reduce forward, identity backward (leaving a TP block without SP).
- ``gather_seq``: all-gather along the sequence forward, reduce-scatter backward (entering with SP).
- ``scatter_seq``: reduce-scatter along the sequence forward, all-gather backward (leaving with SP).
With a group of one rank each is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

SEQ_DIM = 1  # activations are [batch, seq, hidden]


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


# torch 2.13 deprecates the *_tensor names in favour of *_single; use whichever exists.
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """Sum of ``inp`` over the group, rank i keeping the i-th equal slice (dim 0) in ``out``."""
    _reduce_scatter_flat(out, inp, group=group)


def all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    _all_gather_flat(out, inp, group=group)


def all_gather_dim(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    x = x.contiguous()
    out = torch.empty((n, *x.shape), dtype=x.dtype, device=x.device)
    all_gather_flat(out.view(-1), x.view(-1), group)
    return torch.cat(out.unbind(0), dim=dim)


def reduce_scatter_dim(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    stacked = torch.stack(x.chunk(n, dim=dim)).contiguous()
    out = torch.empty(stacked.shape[1:], dtype=x.dtype, device=x.device)
    reduce_scatter_flat(out.view(-1), stacked.view(-1), group)
    return out


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_dim(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_dim(g, SEQ_DIM, ctx.group), None


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_dim(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, g):
        return all_gather_dim(g, SEQ_DIM, ctx.group), None


def copy_to(x, group):
    return x if _size(group) == 1 else _CopyTo.apply(x, group)


def reduce_from(x, group):
    return x if _size(group) == 1 else _ReduceFrom.apply(x, group)


def gather_seq(x, group):
    return x if _size(group) == 1 else _GatherSeq.apply(x, group)


def scatter_seq(x, group):
    return x if _size(group) == 1 else _ScatterSeq.apply(x, group)


def enter_block(x, group, sp: bool):
    return gather_seq(x, group) if sp else copy_to(x, group)


def exit_block(x, group, sp: bool):
    return scatter_seq(x, group) if sp else reduce_from(x, group)
