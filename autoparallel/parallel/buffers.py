"""A rank's parameters in one flat tensor and their gradients in one flat FP32 tensor.

This is how Megatron-LM keeps model states (``DistributedDataParallel`` with its grad buffer,
``--accumulate-allreduce-grads-in-fp32``): the weights in the training dtype (BF16), each
parameter a view of one contiguous buffer, so the distributed optimizer's all-gather of updated
weights writes straight into it; and the gradients accumulated in FP32 in a second contiguous
buffer (``main_grad``), which the reduce-scatter / all-reduce reads in one collective. Each
parameter's BF16 ``.grad`` lives only between its accumulation and a hook that adds it to
``main_grad`` and drops it. Per parameter: 2 bytes of weight and 4 of gradient, the cost model's
count; the FP32 master weights and Adam moments belong to the optimizer.
"""

from __future__ import annotations

import torch
from torch import nn


def _accumulate_main_grad(p: nn.Parameter) -> None:
    p.main_grad.add_(p.grad)
    p.grad = None


class ParamBuffers:
    """Flat ``params`` (``dtype``) and ``grads`` (FP32) for ``named_params``, padded to a
    multiple of ``pad_to`` (the distributed optimizer's shard count).

    The parameters of ``model`` are replaced, wherever a module holds them, by views of the
    buffer with the same shape and ``requires_grad`` (uninitialised: the caller writes them);
    ``named`` lists the new ones with their names, in buffer order.
    """

    def __init__(self, model: nn.Module, named_params: list[tuple[str, nn.Parameter]],
                 dtype: torch.dtype, device: torch.device | str, pad_to: int = 1) -> None:
        self.numels = [p.numel() for _, p in named_params]
        self.total = sum(self.numels)
        self.padded = -(-self.total // pad_to) * pad_to
        self.params = torch.empty(self.padded, dtype=dtype, device=device)
        self.params[self.total:].zero_()  # the rest is written by the caller
        self.grads = torch.zeros(self.padded, dtype=torch.float32, device=device)
        replaced: dict[int, nn.Parameter] = {}
        self.named: list[tuple[str, nn.Parameter]] = []
        self.offsets: list[int] = []
        offset = 0
        for (name, old), n in zip(named_params, self.numels):
            new = nn.Parameter(self.params[offset:offset + n].view(old.shape),
                               requires_grad=old.requires_grad)
            new.main_grad = self.grads[offset:offset + n].view(old.shape)
            if new.requires_grad:
                new.register_post_accumulate_grad_hook(_accumulate_main_grad)
            replaced[id(old)] = new
            self.named.append((name, new))
            self.offsets.append(offset)
            offset += n
        for module in model.modules():
            for key, p in list(module._parameters.items()):
                if p is not None and id(p) in replaced:
                    module._parameters[key] = replaced[id(p)]

    def zero_grad(self) -> None:
        self.grads.zero_()
        for _, p in self.named:
            p.grad = None

    def nbytes(self) -> int:
        return self.params.nbytes + self.grads.nbytes
