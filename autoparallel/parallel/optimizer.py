"""Data-parallel gradient reduction and the (optionally sharded) AdamW step.

Every parameter of a rank lives in one flat fp32 view for the optimizer. Gradients are reduced
over the dp x cp group, as Megatron-LM does: context-parallel ranks hold the same weights and each
has the gradient of its own tokens' mean loss, so their mean, like the DP ranks', is the
single-process gradient. With the distributed optimizer (Megatron-LM
``--use-distributed-optimizer``, ZeRO-1) the flat gradient is reduce-scattered over that group
(each rank gets the mean of its 1/(dp*cp) slice), AdamW updates only that slice of fp32 master
weights and moments, and the new weights are all-gathered. Without it the gradient is
all-reduced and every rank steps the whole buffer. AdamW is elementwise, so both give the
single-process update exactly, up to float summation order.

Gradient-norm clipping uses the global norm: squares summed over the rank's slice, counting
TP-replicated parameters (the norms) on TP rank 0 only, then summed over the whole world.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.parallel import comm


class DistributedOptimizer:
    def __init__(self, params: list[nn.Parameter], replicated: set[int], dims, coords,
                 sharded: bool, lr: float, weight_decay: float, clip: float | None,
                 betas=(0.9, 0.95), group=None) -> None:
        """``group``: (process group, size, this rank's index) to reduce over instead of dp x cp
        (the expert-data-parallel group of expert weights); gradients are still divided by
        dp*cp, the number of data-parallel replicas."""
        self.params = params
        # the gradient-reduction group: dp x cp ranks, group rank dp_rank * cp + cp_rank
        self.group, self.size = dims.group("dp_cp"), dims.dp * dims.cp
        index = coords["dp"] * dims.cp + coords["cp"]
        self.replicas = self.size
        if group is not None:
            self.group, self.size, index = group
        self.sharded, self.clip = sharded and self.size > 1, clip
        self.numels = [p.numel() for p in params]
        total = sum(self.numels)
        self.padded = -(-total // self.size) * self.size if self.sharded else total
        device = params[0].device if params else torch.device("cpu")
        flat = torch.zeros(self.padded, dtype=torch.float32, device=device)
        if params:
            flat[:total] = torch.cat([p.detach().float().reshape(-1) for p in params])
        shard = self.padded // self.size if self.sharded else self.padded
        self.start = index * shard if self.sharded else 0
        self.master = nn.Parameter(flat[self.start:self.start + shard].clone())
        # 1 where a slice element counts towards the gradient norm on this rank.
        weight = torch.cat([torch.full((n,), 0.0 if (id(p) in replicated and coords["tp"] > 0)
                                       else 1.0, device=device)
                            for p, n in zip(params, self.numels)] + [torch.zeros(
                                self.padded - total, device=device)])
        self.norm_weight = weight[self.start:self.start + shard]
        self.adam = torch.optim.AdamW([self.master], lr=lr, betas=betas,
                                      weight_decay=weight_decay)
        self.last_grad_norm = 0.0

    def _flat_grads(self) -> torch.Tensor:
        total = sum(self.numels)
        flat = torch.zeros(self.padded, dtype=torch.float32, device=self.master.device)
        if self.params:
            flat[:total] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                      .float().reshape(-1) for p in self.params])
        return flat

    def reduce(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's reduced gradient (its slice when sharded) and its share of the squared
        global norm (to be summed over the world)."""
        flat = self._flat_grads()
        if self.sharded:
            grad = torch.empty_like(self.master)
            comm.reduce_scatter_flat(grad, flat, self.group)
        else:
            if self.size > 1:
                dist.all_reduce(flat, group=self.group)
            grad = flat
        grad /= self.replicas
        sq = (grad.square() * self.norm_weight).sum()
        if not self.sharded and self.size > 1:
            sq /= self.size  # every rank of the group holds the whole (identical) gradient
        return grad, sq

    def step(self, lr: float | None = None) -> float:
        grad, sq = self.reduce()
        norm = global_norm([sq])
        self.last_grad_norm = norm
        self.update(grad, clip_scale(norm, self.clip), lr)
        return norm

    def update(self, grad: torch.Tensor, scale: float, lr: float | None = None) -> None:
        """AdamW on ``grad`` times ``scale`` (the clipping), then the new weights everywhere."""
        if scale != 1.0:
            grad *= scale
        self.master.grad = grad
        if lr is not None:
            self.adam.param_groups[0]["lr"] = lr
        self.adam.step()
        if self.sharded:
            flat = torch.empty(self.padded, dtype=torch.float32, device=self.master.device)
            comm.all_gather_flat(flat, self.master.detach(), self.group)
        else:
            flat = self.master.detach()
        offset = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.numels):
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """fp32 master slice and the two Adam moments this rank holds."""
        return 3 * self.master.numel() * 4


def global_norm(squares: list[torch.Tensor]) -> float:
    """The gradient norm of the whole model from each optimizer's share on each rank."""
    sq = torch.stack(squares).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)
    return float(sq.sqrt())


def clip_scale(norm: float, clip: float | None) -> float:
    return clip / (norm + 1e-6) if clip is not None and norm > clip else 1.0


class Optimizers:
    """Several optimizers (dense weights over dp x cp, expert weights over their EDP group)
    stepping as one: one global norm, one clipping factor."""

    def __init__(self, parts: list[DistributedOptimizer]) -> None:
        self.parts = parts
        self.last_grad_norm = 0.0

    def step(self, lr: float | None = None) -> float:
        reduced = [part.reduce() for part in self.parts]
        norm = global_norm([sq for _, sq in reduced])
        self.last_grad_norm = norm
        for part, (grad, _) in zip(self.parts, reduced):
            part.update(grad, clip_scale(norm, part.clip), lr)
        return norm

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def state_bytes(self) -> int:
        return sum(part.state_bytes() for part in self.parts)
