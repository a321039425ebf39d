"""Tensor (and sequence) parallel for the built-in transformer, applied from outside.

Column-parallel linears (wq, wk, wv, w1, w3, the output layer) keep a slice of the weight's rows
(output features); row-parallel linears (wo, w2) a slice of its columns (input features). The
communication sits at the block edges (``comm.enter_block`` / ``exit_block``), once per attention
and MLP block as in Megatron-LM: all-reduces without sequence parallel, all-gather /
reduce-scatter along the sequence with it. The embedding and the output layer are vocab-parallel
and the loss is computed on vocab shards (``vocab_parallel_cross_entropy``): no rank ever holds
the full logits. Under sequence parallel the norms see a slice of the sequence, so their weight
gradients are partial sums: ``sequence_parallel_params`` names them for a TP all-reduce; and the
column-parallel GEMMs save the sequence shard, not the gathered input (``sequence.py``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoparallel.model.moe import MoeMlp
from autoparallel.parallel import comm, sequence


def _shard_linear(linear: nn.Module, rank: int, size: int, dim: int) -> None:
    """Keep the ``rank``-th of ``size`` slices of ``linear.weight`` along ``dim`` (0 rows, 1 cols)."""
    w = linear.weight
    if w.shape[dim] % size:
        raise ValueError(f"cannot split a {tuple(w.shape)} weight in {size} along dim {dim}")
    part = w.detach().chunk(size, dim=dim)[rank].clone()
    linear.weight = nn.Parameter(part, requires_grad=w.requires_grad)
    linear.out_features, linear.in_features = part.shape


class ParallelBlock(nn.Module):
    """Wraps an attention or MLP block whose linears are sharded: gather/copy in, reduce out."""

    def __init__(self, block: nn.Module, group, sp: bool) -> None:
        super().__init__()
        self.block, self.group, self.sp = block, group, sp

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        y = self.block(comm.enter_block(x, self.group, self.sp), *args)
        return comm.exit_block(y, self.group, self.sp)


class ParallelHead(nn.Module):
    """The vocab-parallel output layer (always a BF16 ``nn.Linear``): local logits out of the
    gathered sequence (SP, saving only the shard) or of the copied hidden states."""

    def __init__(self, linear: nn.Linear, group, sp: bool) -> None:
        super().__init__()
        self.linear, self.group, self.sp = linear, group, sp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sp:
            return sequence.gathered_columns(x, self.group, [self.linear.weight])[1][0]
        return self.linear(comm.copy_to(x, self.group))


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the embedding table; other tokens give zeros, summed over TP."""

    def __init__(self, embedding: nn.Embedding, rank: int, size: int, group, sp: bool) -> None:
        super().__init__()
        vocab = embedding.num_embeddings
        if vocab % size:
            raise ValueError(f"vocab_size={vocab} is not divisible by tp={size}")
        self.per_rank = vocab // size
        self.start = rank * self.per_rank
        self.weight = nn.Parameter(embedding.weight.detach()[self.start:self.start
                                                             + self.per_rank].clone())
        self.group, self.sp = group, sp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.clamp(0, self.per_rank - 1), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return comm.exit_block(out, self.group, self.sp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from logits sharded on the vocab, as Megatron-LM's
    ``_VocabParallelCrossEntropy``: max, sum of exponentials and the target logit are each reduced
    over the TP group, and only the FP32 softmax shard is saved (4 bytes per local logit, the
    cost model's count); the gradient is softmax minus the one-hot target."""

    @staticmethod
    def forward(ctx, logits, targets, start: int, group):
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        peak = logits.max(dim=-1).values
        if comm._size(group) > 1:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - peak.unsqueeze(-1)
        local = targets - start
        inside = (local >= 0) & (local < logits.shape[-1])
        local = local.clamp(0, logits.shape[-1] - 1)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside
        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        if comm._size(group) > 1:
            both = torch.stack((sum_exp, target_logit))
            dist.all_reduce(both, group=group)
            sum_exp, target_logit = both
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, inside)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, local, inside = ctx.saved_tensors
        out = softmax.clone()
        out.scatter_add_(-1, local.unsqueeze(-1), -inside.to(out.dtype).unsqueeze(-1))
        return out * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, start: int,
                                 group) -> torch.Tensor:
    """Mean cross-entropy from logits sharded on the vocab (columns [start, start + V/tp)).

    Every TP rank holds the same loss and backpropagates into its own shard; no rank ever holds
    the full logits.
    """
    return _VocabParallelCrossEntropy.apply(logits, targets, start, group).mean()


def _block(block: nn.Module, group, sp: bool) -> nn.Module:
    names = sequence.column_names(block) if sp else []
    return sequence.SequenceParallelBlock(block, group, names) if names else \
        ParallelBlock(block, group, sp)


def apply_tensor_parallel(model: nn.Module, rank: int, size: int, group, sp: bool) -> None:
    """Shard ``model`` (a ``Transformer``) in place for TP rank ``rank`` of ``size``."""
    spec = model.spec
    if size == 1:
        return
    for key, value in (("num_attention_heads", spec.num_attention_heads),
                       ("num_query_groups", spec.query_groups)):
        if value % size:
            raise ValueError(f"{key}={value} is not divisible by tp={size}")
    if spec.ffn_hidden_size % size:
        raise ValueError(f"ffn_hidden_size={spec.ffn_hidden_size} is not divisible by tp={size}")
    if spec.tie_embeddings:
        raise NotImplementedError("tensor parallel of tied embeddings is not implemented")
    for layer in model.layers:
        att, mlp = layer.attention, layer.mlp
        # A MoE MLP stays whole (experts over EP, expert TP 1; router and shared experts on the
        # rank's sequence shard): ``autoparallel.parallel.expert``.
        moe = isinstance(mlp, MoeMlp)
        for lin in (att.wq, att.wk, att.wv) + (() if moe else (mlp.w1, mlp.w3)):
            if lin is not None:
                _shard_linear(lin, rank, size, 0)
        for lin in (att.wo,) + (() if moe else (mlp.w2,)):
            _shard_linear(lin, rank, size, 1)
        att.heads //= size
        att.groups //= size
        layer.attention = _block(att, group, sp)
        if not moe:
            layer.mlp = _block(mlp, group, sp)
    model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, rank, size, group, sp)
    _shard_linear(model.output, rank, size, 0)
    model.output = ParallelHead(model.output, group, sp)


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    """Parameters replicated over TP whose gradients are partial sums under SP: the norms."""
    return [p for name, p in model.named_parameters() if "norm" in name.split(".")[-2]]


# Which dim of each parameter TP splits (None: replicated), by the single-device name.
SHARD_DIMS = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "wo": 1, "w2": 1,
              "output": 0, "tok_embeddings": 0}


def original_name(name: str) -> str:
    """A parameter's name in the single-device model (TP wrappers add a level)."""
    return name.replace(".block.", ".").replace("output.linear.", "output.")


def shard_dim(name: str) -> int | None:
    parts = original_name(name).split(".")
    if len(parts) > 3 and parts[2] == "mlp" and parts[3] in ("experts", "shared_experts", "router"):
        return None  # a MoE MLP is not split by TP
    return SHARD_DIMS.get(parts[-2])
