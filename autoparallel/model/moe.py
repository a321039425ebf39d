"""The mixture-of-experts MLP of the built-in transformer, free of parallel code.

Megatron-LM's MoE layer as the cost model prices it (``costmodel.moe``): a router (a BF16
linear, hidden -> experts, computed in FP32) picks each token's top-k experts and softmaxes their
k logits into weights (Megatron's default, top-k before softmax; with
``moe_router_force_load_balancing`` the logits are random normals, Megatron's benchmarking
switch); the routed experts are MLPs of ``moe_ffn_hidden_size`` (FP8 or BF16 as the policy says);
a shared expert of ``moe_shared_expert_intermediate_size`` sees every token. Routing is dropless:
every token reaches its k experts however unbalanced (a capacity factor is not implemented).

The experts live in a ``ModuleDict`` keyed by the expert's global index, so parameter names
(``layers.{i}.mlp.experts.{e}.w1.weight``) are those of the single-device model whatever subset a
rank keeps. Which rank computes an expert is the ``dispatcher``'s business: ``LocalDispatch``
(here) runs every expert in this process; expert parallel (``autoparallel.parallel.expert``)
keeps a rank's experts only and swaps in a dispatcher that moves the rows with all-to-alls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.model.fp8 import Fp8Linear
from autoparallel.model.recipes import BlockwiseScaling


def is_routed_expert(name: str) -> bool:
    """A routed expert's parameter (not split by TP; reduced over the expert-data-parallel
    group), by its single-device name."""
    return ".mlp.experts." in name


def _row_multiple(expert: nn.Module, device: torch.device) -> int:
    """Rows an expert's GEMMs need a multiple of: torch._scaled_mm takes M and K in multiples of
    16 (of 128 for block scales, where the weight gradient's K is the tokens); emulated FP8 and
    BF16 take any count. TransformerEngine pads each expert's tokens the same way (Fp8Padding)."""
    multiple = 1
    for m in expert.modules():
        if isinstance(m, Fp8Linear) and m.native(device):
            multiple = max(multiple, 128 if isinstance(m.recipe, BlockwiseScaling) else 16)
    return multiple


def _run_expert(expert: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    n = rows.shape[0]
    multiple = _row_multiple(expert, rows.device)
    if n % multiple:  # zero rows: zero outputs, zero amax, no gradient
        return expert(F.pad(rows, (0, 0, 0, multiple - n % multiple)))[:n]
    return expert(rows)


def run_experts(experts: nn.ModuleDict, x: torch.Tensor, expert_ids: torch.Tensor,
                counts: list[int] | None = None) -> torch.Tensor:
    """Rows of ``x`` through the expert each row names (global ids of ``experts``' keys, which are
    consecutive); the outputs in the rows' order. ``counts``: the rows of each expert, when the
    caller knows them; else found here (a host sync)."""
    keys = list(experts)
    order = torch.argsort(expert_ids, stable=True)
    if counts is None:
        counts = torch.bincount(expert_ids - int(keys[0]), minlength=len(keys)).tolist()
    parts = x.index_select(0, order).split(counts)
    outs = [_run_expert(experts[k], part) if n else part for k, part, n in zip(keys, parts, counts)]
    return unsort(torch.cat([o.to(x.dtype) for o in outs]), order)


def unsort(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``rows`` taken in ``order`` (``x.index_select(0, order)``), back in x's order."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return rows.index_select(0, inverse)


class LocalDispatch:
    """Every expert is in this process."""

    def __call__(self, moe: MoeMlp, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        return run_experts(moe.experts, x, expert_ids)


class MoeMlp(nn.Module):
    def __init__(self, spec, make_mlp) -> None:
        """``make_mlp(name, ffn)``: a dense MLP of width ``ffn`` named ``name`` under this module
        (its linears FP8 or BF16 as the layer's policy says); the router is always BF16."""
        super().__init__()
        self.num_experts, self.topk = spec.num_experts, spec.moe_router_topk
        self.random_routing = spec.moe_router_force_load_balancing
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): make_mlp(f"experts.{e}", spec.expert_ffn_hidden_size)
                                      for e in range(spec.num_experts)})
        ffn = spec.shared_expert_ffn_hidden_size
        self.shared_experts = make_mlp("shared_experts", ffn) if ffn else None
        self.dispatcher = LocalDispatch()

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids [tokens, k] and their weights (softmax over the k logits, FP32)."""
        with torch.autocast(tokens.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.router.weight.float())
        if self.random_routing:
            logits = torch.randn_like(logits)
        top, ids = logits.topk(self.topk, dim=-1)
        return ids, torch.softmax(top, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        ids, weights = self.route(tokens)
        copies = tokens.repeat_interleave(self.topk, dim=0)  # one row per (token, expert)
        routed = self.dispatcher(self, copies, ids.reshape(-1))
        out = (routed.float() * weights.reshape(-1, 1)).view(-1, self.topk, shape[-1]).sum(1)
        out = out.to(x.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).reshape(out.shape)
        return out.reshape(shape)
