"""Pipeline parallel: split the layers into pp*vp chunks and run 1F1B or interleaved 1F1B.

Virtual stage v = chunk * pp + pp_rank holds layers [v*L/(pp*vp), (v+1)*L/(pp*vp)); the first one
also the embedding, the last one the final norm, output layer and loss. ``schedule`` lists one
rank's forward and backward steps in Megatron-LM's order (warm-up forwards, steady one-forward-
one-backward, cool-down backwards; for vp > 1 the interleaved order of
``forward_backward_pipelining_with_interleaving``). Activations and their gradients travel by
non-blocking sends and tagged receives, so only a receive waits, and the tag (micro-batch,
virtual stage, direction) pairs every message with its receive whatever the order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.model.transformer import to_activation_dtype


@dataclass(frozen=True)
class Op:
    kind: str  # "F" or "B"
    chunk: int
    microbatch: int


def schedule(pp: int, vp: int, rank: int, m: int) -> list[Op]:
    """The ordered forward / backward steps of pipeline rank ``rank`` for ``m`` micro-batches."""
    if vp == 1:
        warmup = min(pp - rank - 1, m)
        ops = [Op("F", 0, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            ops += [Op("F", 0, f), Op("B", 0, b)]
            f, b = f + 1, b + 1
        return ops + [Op("B", 0, i) for i in range(b, m)]
    if m % pp:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) divisible by pp ({pp})")
    total = m * vp

    def fwd(k: int) -> Op:
        return Op("F", (k // pp) % vp, (k // (pp * vp)) * pp + k % pp)

    def bwd(k: int) -> Op:
        return Op("B", vp - 1 - (k // pp) % vp, (k // (pp * vp)) * pp + k % pp)

    warmup = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)
    ops = [fwd(k) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        ops += [fwd(f), bwd(b)]
        f, b = f + 1, b + 1
    return ops + [bwd(k) for k in range(b, total)]


def chunk_layers(num_layers: int, pp: int, vp: int, pp_rank: int) -> list[list[int]]:
    """Layer indices of each of this rank's vp chunks."""
    stages = pp * vp
    if num_layers % stages:
        raise ValueError(f"num_layers={num_layers} is not divisible by pp*vp={stages}")
    per = num_layers // stages
    return [list(range((c * pp + pp_rank) * per, (c * pp + pp_rank + 1) * per))
            for c in range(vp)]


class Chunk(nn.Module):
    """One virtual stage: some layers, plus the embedding and/or the head where they belong."""

    def __init__(self, model: nn.Module, layers: list[int], first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleList(model.layers[i] for i in layers)
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = to_activation_dtype(self.tok_embeddings(x)) if self.first else x
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h)) if self.last else h


class P2P:
    """Tagged point-to-point messages between virtual stages (local hand-over within a rank)."""

    def __init__(self, world_rank_of, pp: int, vp: int, m: int) -> None:
        self.world_rank_of, self.pp, self.vp, self.m = world_rank_of, pp, vp, m
        self.pending: list = []
        self.local: dict[int, torch.Tensor] = {}

    def _tag(self, vstage: int, microbatch: int, backward: bool) -> int:
        return (microbatch * self.pp * self.vp + vstage) * 2 + int(backward)

    def send(self, tensor: torch.Tensor, to_vstage: int, microbatch: int, backward: bool) -> None:
        tag = self._tag(to_vstage, microbatch, backward)
        dst = self.world_rank_of(to_vstage % self.pp)
        if dst == (dist.get_rank() if dist.is_initialized() else 0):
            self.local[tag] = tensor
            return
        tensor = tensor.contiguous()
        self.pending.append((dist.isend(tensor, dst, tag=tag), tensor))

    def recv(self, shape, dtype, device, from_vstage: int, to_vstage: int, microbatch: int,
             backward: bool) -> torch.Tensor:
        tag = self._tag(to_vstage, microbatch, backward)
        if tag in self.local:
            return self.local.pop(tag)
        buf = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(buf, self.world_rank_of(from_vstage % self.pp), tag=tag)
        return buf

    def wait_all(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
