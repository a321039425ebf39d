"""The mixture-of-experts MLP of the built-in transformer, free of parallel code.

Megatron-LM's MoE layer as the cost model prices it (``costmodel.moe``): a router (a BF16
linear, hidden -> experts, computed in FP32) picks each token's top-k experts and softmaxes their
k logits into weights (Megatron's default, top-k before softmax); the routed experts are MLPs of
``moe_ffn_hidden_size`` (FP8 or BF16 as the policy says); a shared expert of
``moe_shared_expert_intermediate_size`` sees every token. Routing is dropless.

Which GPU computes an expert is the ``dispatcher``'s business: ``LocalDispatch`` (this module)
runs every expert here; expert parallel (``autoparallel.parallel.expert``) swaps in one that
sends each token to the rank holding its expert with an all-to-all and keeps only that rank's
experts in ``experts``, a ``ModuleDict`` keyed by the expert's global index so that parameter
names stay those of the single-device model.
"""

from __future__ import annotations

import torch
from torch import nn


class LocalDispatch:
    """Every expert is local: run each on the rows routed to it."""

    def __call__(self, moe: MoeMlp, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        return run_experts(moe.experts, x, expert_ids)


def run_experts(experts: nn.ModuleDict, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` through the expert each row names; the output in the rows' order."""
    out = x.new_zeros(x.shape)
    for key, expert in experts.items():
        rows = (expert_ids == int(key)).nonzero(as_tuple=True)[0]
        if rows.numel():
            out = out.index_copy(0, rows, expert(x.index_select(0, rows)).to(out.dtype))
    return out


class MoeMlp(nn.Module):
    def __init__(self, spec, make_mlp) -> None:
        """``make_mlp(name, ffn)``: a dense MLP of ``ffn`` named ``name`` under this module
        (its linears FP8 or BF16 as the layer's policy says); the router is always BF16."""
        super().__init__()
        self.num_experts, self.topk = spec.num_experts, spec.moe_router_topk
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(i): make_mlp(f"experts.{i}", spec.expert_ffn_hidden_size)
                                      for i in range(spec.num_experts)})
        ffn = spec.shared_expert_ffn_hidden_size
        self.shared_experts = make_mlp("shared_experts", ffn) if ffn else None
        self.dispatcher = LocalDispatch()

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids [tokens, k] and their weights (softmax over the k logits)."""
        with torch.autocast(tokens.device.type, enabled=False):
            logits = nn.functional.linear(tokens.float(), self.router.weight.float())
        top, ids = logits.topk(self.topk, dim=-1)
        return ids, torch.softmax(top, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        ids, weights = self.route(tokens)
        # One row per (token, chosen expert), token-major.
        copies = tokens.repeat_interleave(self.topk, dim=0)
        routed = self.dispatcher(self, copies, ids.reshape(-1))
        out = (routed.float() * weights.reshape(-1, 1)).reshape(-1, self.topk, shape[-1]).sum(1)
        out = out.to(x.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.reshape(shape)
