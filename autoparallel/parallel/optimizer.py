"""Data-parallel gradient reduction and the (optionally sharded) AdamW step.

The rank's weights and FP32 gradients are flat buffers (``buffers.ParamBuffers``). Gradients are
reduced over the dp x cp group, as Megatron-LM does: context-parallel ranks hold the same weights
and each has the gradient of its own tokens' mean loss, so their mean, like the DP ranks', is the
single-process gradient. With the distributed optimizer (Megatron-LM
``--use-distributed-optimizer``, ZeRO-1) the flat gradient is reduce-scattered over that group
(each rank gets the mean of its 1/(dp*cp) slice), AdamW updates only that slice of FP32 master
weights and moments (12 bytes per parameter of the slice), and the updated slice, in the
training dtype, is all-gathered into the weight buffer. Without it the gradient is all-reduced
and every rank steps the whole buffer. AdamW is elementwise, so both give the single-process
update exactly, up to float summation order.

A MoE model's routed experts are in a second buffer with an optimizer of its own that reduces
(and shards) over the expert-data-parallel group, the ranks holding the same experts, and still
divides by dp*cp, the number of data-parallel replicas (``autoparallel.parallel.expert``).

Gradient-norm clipping uses the global norm: squares summed over the rank's slice, counting
TP-replicated parameters (the norms, the routers) on TP rank 0 only, then summed over the whole
world; ``Optimizers`` steps several optimizers with one norm, as Megatron-LM clips dense and
expert gradients together. The clip factor min(1, clip / norm) is applied on the device: no
step waits for the GPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.adamw import adamw

from autoparallel.parallel import comm
from autoparallel.parallel.buffers import ParamBuffers


class AdamW:
    """``torch.optim.AdamW`` on one FP32 tensor, through its functional form
    (``torch.optim.adamw.adamw``) with the state and the choices the class makes in torch 2.13
    (torch/optim/adam.py ``Adam._init_group`` and ``adam``): both moments zeroed at the first
    step, the step count a 0-d tensor (FP32 on the device when fused, else on the CPU in the
    default float dtype), fused on a GPU and torch's default elsewhere. So the same update,
    bit for bit (tests/parallel/test_optimizer_functional.py).

    Why not the class: every ``torch.optim.Optimizer`` imports ``torch._dynamo`` when it is
    built (``add_param_group`` is wrapped in ``torch._disable_dynamo``) and when it steps, an
    import of 1.5-3 s on this CPU inside every profiling job's model build (benchmarks/
    RESULTS.md, session 39), for a job that never compiles.
    """

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple[float, float],
                 weight_decay: float, eps: float = 1e-8) -> None:
        self.param, self.lr, self.betas = param, lr, betas
        self.weight_decay, self.eps = weight_decay, eps
        self.fused = True if param.is_cuda else None
        self.moments: tuple[torch.Tensor, torch.Tensor] | None = None
        wide = torch.get_default_dtype() == torch.float64
        self.steps = (torch.zeros((), dtype=torch.float32, device=param.device) if self.fused
                      else torch.tensor(0.0, dtype=torch.float64 if wide else torch.float32))

    def step(self, grad: torch.Tensor) -> None:
        if self.moments is None:  # as the class: the moments come with the first step
            self.moments = tuple(torch.zeros_like(self.param, memory_format=torch.preserve_format)
                                 for _ in range(2))
        with torch.no_grad():
            adamw([self.param], [grad], [self.moments[0]], [self.moments[1]], [], [self.steps],
                  fused=self.fused, amsgrad=False, beta1=self.betas[0], beta2=self.betas[1],
                  lr=self.lr, weight_decay=self.weight_decay, eps=self.eps, maximize=False)


class DistributedOptimizer:
    def __init__(self, buffers: ParamBuffers, replicated: set[int], dims, coords,
                 sharded: bool, lr: float, weight_decay: float, clip: float | None,
                 betas=(0.9, 0.95), group: tuple | None = None) -> None:
        """``group``: (process group, size, this rank's index in it) to reduce over instead of
        dp x cp (the expert-data-parallel group of routed experts)."""
        self.buffers = buffers
        # the gradient-reduction group: dp x cp ranks, group rank dp_rank * cp + cp_rank
        self.group, self.size = dims.group("dp_cp"), dims.dp * dims.cp
        index = coords["dp"] * dims.cp + coords["cp"]
        self.replicas = self.size  # what the summed gradients are divided by
        if group is not None:
            self.group, self.size, index = group
        self.sharded, self.clip = sharded and self.size > 1, clip
        padded = buffers.padded
        shard = padded // self.size if self.sharded else padded
        self.start = index * shard if self.sharded else 0
        self.master = nn.Parameter(buffers.params[self.start:self.start + shard]
                                   .to(torch.float32, copy=True))
        self.grad = (torch.empty(shard, dtype=torch.float32, device=buffers.grads.device)
                     if self.sharded else buffers.grads)
        # Views of this rank's gradient slice that count towards the norm (replicated
        # parameters only on TP rank 0), for one fused norm over them.
        self.norm_views = []
        for (_, p), offset, n in zip(buffers.named, buffers.offsets, buffers.numels):
            if id(p) in replicated and coords["tp"] > 0:
                continue
            lo, hi = max(offset, self.start), min(offset + n, self.start + shard)
            if lo < hi:
                self.norm_views.append(self.grad[lo - self.start:hi - self.start])
        # fused on a GPU: one kernel, no full-size temporaries (foreach would allocate one)
        self.adam = AdamW(self.master, lr=lr, betas=betas, weight_decay=weight_decay)

    def _squared_norm(self) -> torch.Tensor:
        if not self.norm_views:
            return torch.zeros((), device=self.master.device)
        return torch.stack(torch._foreach_norm(self.norm_views, 2)).square().sum()

    def reduce(self) -> torch.Tensor:
        """Reduce the gradients into this rank's slice; returns the slice's share of the squared
        global norm (to be summed over the world)."""
        flat = self.buffers.grads
        if self.sharded:
            comm.reduce_scatter_flat(self.grad, flat, self.group)
        elif self.size > 1:
            dist.all_reduce(flat, group=self.group)
        self.grad.div_(self.replicas)
        sq = self._squared_norm()
        if not self.sharded and self.size > 1:
            sq = sq / self.size  # every rank of the group holds the whole (identical) gradient
        return sq

    def step(self, lr: float | None = None) -> torch.Tensor:
        """Reduce, clip and apply the gradients; returns the global gradient norm (a tensor)."""
        norm = global_norm([self.reduce()])
        self.apply(norm, lr)
        return norm

    def apply(self, norm: torch.Tensor, lr: float | None = None) -> None:
        """Clip the reduced gradients by the global ``norm``, step AdamW, and write the new
        weights (all-gathered when sharded) into the weight buffer."""
        if self.clip is not None:
            self.grad.mul_(torch.clamp(self.clip / (norm + 1e-6), max=1.0))
        if lr is not None:
            self.adam.lr = lr
        self.adam.step(self.grad)
        with torch.no_grad():
            if self.sharded:
                comm.all_gather_flat(self.buffers.params,
                                     self.master.detach().to(self.buffers.params.dtype),
                                     self.group)
            else:
                self.buffers.params.copy_(self.master.detach())

    def zero_grad(self) -> None:
        self.buffers.zero_grad()

    def state_bytes(self) -> int:
        """FP32 master slice and the two Adam moments this rank holds (and, sharded, the
        reduce-scatter output)."""
        return (3 + int(self.sharded)) * self.master.numel() * 4


def global_norm(squares: list[torch.Tensor]) -> torch.Tensor:
    """The whole model's gradient norm from each optimizer's share on each rank."""
    sq = torch.stack(squares).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)
    return sq.sqrt()


class Optimizers:
    """Several optimizers (dense weights over dp x cp, routed experts over their
    expert-data-parallel group) stepping as one: one global norm, one clipping factor."""

    def __init__(self, parts: list[DistributedOptimizer]) -> None:
        self.parts = parts

    def step(self, lr: float | None = None) -> torch.Tensor:
        norm = global_norm([part.reduce() for part in self.parts])
        for part in self.parts:
            part.apply(norm, lr)
        return norm

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def state_bytes(self) -> int:
        return sum(part.state_bytes() for part in self.parts)
