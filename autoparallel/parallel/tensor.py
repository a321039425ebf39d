"""Tensor (and sequence) parallel for the built-in transformer, applied from outside.

Column-parallel linears (wqkv, w1, the output layer) keep a slice of the weight's rows (output
features); row-parallel linears (wo, w2) a slice of its columns (input features). Which rows
and columns a rank keeps is one function, ``shard_region``: a contiguous block for most, and for
the fused SwiGLU ``w1`` ([gate; up]) the rank's slice of the gate followed by its slice of the up
projection. The model is sharded on the meta device (``apply_tensor_parallel``), and each rank
then writes only its region (``autoparallel.parallel.parallelize``). The
communication sits at the block edges (``comm.enter_block`` / ``exit_block``), once per attention
and MLP block as in Megatron-LM: all-reduces without sequence parallel, all-gather /
reduce-scatter along the sequence with it. The embedding and the output layer are vocab-parallel
and the loss is computed on vocab shards (``vocab_parallel_cross_entropy``): no rank ever holds
the full logits. A MoE layer's routed experts and router are not split (expert parallel is
``expert.py``); its shared expert is, like a dense MLP. Under sequence parallel the norms and
the routers see a slice of the sequence, so their weight gradients are partial sums:
``sequence_parallel_params`` names them for a TP all-reduce; and the
column-parallel GEMMs save the sequence shard, not the gathered input (``sequence.py``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoparallel.model.moe import MoeMlp, is_routed_expert
from autoparallel.parallel import comm, sequence


Region = tuple[tuple[range, ...], range]  # (row ranges, concatenated in order; columns)

# Which dim of each parameter TP splits (None: replicated), by the single-device name.
SHARD_DIMS = {"wqkv": 0, "w1": 0, "wo": 1, "w2": 1, "output": 0, "tok_embeddings": 0}


def original_name(name: str) -> str:
    """A parameter's name in the single-device model (TP wrappers add a level)."""
    return name.replace(".block.", ".").replace("output.linear.", "output.")


def shard_dim(name: str) -> int | None:
    parts = original_name(name).split(".")
    if len(parts) < 2 or is_routed_expert(name):  # routed experts: expert TP 1
        return None
    return SHARD_DIMS.get(parts[-2])


def shard_region(name: str, full_shape, rank: int, size: int, gated_mlp: bool) -> Region:
    """The rows and columns of parameter ``name`` (full shape ``full_shape``) that TP rank
    ``rank`` of ``size`` holds."""
    rows = full_shape[0]
    cols = full_shape[1] if len(full_shape) > 1 else 1
    dim = shard_dim(name) if size > 1 else None
    if dim is None:
        return (range(rows),), range(cols)
    extent = full_shape[dim]
    if extent % size:
        raise ValueError(f"cannot split {name} of shape {tuple(full_shape)} in {size} along "
                         f"dim {dim}")
    part = extent // size
    if dim == 1:
        return (range(rows),), range(rank * part, (rank + 1) * part)
    if gated_mlp and original_name(name).endswith(".w1.weight"):  # [gate; up]
        half, part = rows // 2, rows // 2 // size
        return ((range(rank * part, (rank + 1) * part),
                 range(half + rank * part, half + (rank + 1) * part)), range(cols))
    return (range(rank * part, (rank + 1) * part),), range(cols)


def region_shape(region: Region, ndim: int) -> tuple[int, ...]:
    rows = sum(len(r) for r in region[0])
    return (rows, len(region[1])) if ndim == 2 else (rows,)


def take_region(full: torch.Tensor, region: Region) -> torch.Tensor:
    """The part of ``full`` a region names, as a new tensor."""
    rows, cols = region
    parts = [full[r.start:r.stop] for r in rows]
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    return (out[:, cols.start:cols.stop] if full.dim() == 2 else out).clone()


def put_region(full: torch.Tensor, region: Region, part: torch.Tensor) -> None:
    """Write a rank's ``part`` back into ``full`` at its region (inverse of ``take_region``)."""
    rows, cols = region
    at = 0
    for r in rows:
        target = full[r.start:r.stop]
        source = part[at:at + len(r)]
        if full.dim() == 2:
            target[:, cols.start:cols.stop] = source
        else:
            target.copy_(source)
        at += len(r)


def _shard_linear(linear: nn.Module, name: str, rank: int, size: int, gated: bool) -> None:
    """Keep rank ``rank``'s region of ``linear.weight``: an empty meta tensor of the shard's
    shape on the meta device (materialised later), else a copy of the region."""
    w = linear.weight
    region = shard_region(name, w.shape, rank, size, gated)
    part = (torch.empty(region_shape(region, 2), device="meta", dtype=w.dtype)
            if w.is_meta else take_region(w.detach(), region))
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
        w = embedding.weight.detach()
        self.weight = nn.Parameter(w.new_empty(self.per_rank, w.shape[1]) if w.is_meta
                                   else w[self.start:self.start + self.per_rank].clone())
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
    cost model's count); the gradient is softmax minus the one-hot target. Like Megatron-LM it
    makes one FP32 copy of the (BF16) logits and turns it in place into the shifted logits, their
    exponentials and the softmax: no second full-size FP32 tensor."""

    @staticmethod
    def forward(ctx, logits, targets, start: int, group):
        wide = torch.promote_types(logits.dtype, torch.float32)
        shifted = logits.to(wide, copy=True)  # the one FP32 copy; never the caller's tensor
        peak = shifted.max(dim=-1).values
        if comm._size(group) > 1:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        shifted.sub_(peak.unsqueeze(-1))
        local = targets - start
        inside = (local >= 0) & (local < shifted.shape[-1])
        local = local.clamp(0, shifted.shape[-1] - 1)
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
        out = softmax  # reused in place, as Megatron-LM does: backward runs once
        out.scatter_add_(-1, local.unsqueeze(-1), -inside.to(out.dtype).unsqueeze(-1))
        return out.mul_(grad.unsqueeze(-1)), None, None, None


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
    if spec.tie_embeddings:
        raise NotImplementedError("tensor parallel of tied embeddings is not implemented")
    gated = spec.gated_mlp
    for i, layer in enumerate(model.layers):
        att = layer.attention
        for lin, name in ((att.wqkv, "attention.wqkv"), (att.wo, "attention.wo")):
            _shard_linear(lin, f"layers.{i}.{name}.weight", rank, size, gated)
        att.heads //= size
        att.groups //= size
        layer.attention = _block(att, group, sp)
        # A MoE MLP stays whole on every TP rank, each routing its own sequence shard (experts
        # over EP, expert TP 1: ``expert``); only its shared expert is split like a dense MLP.
        moe = isinstance(layer.mlp, MoeMlp)
        mlp = layer.mlp.shared_experts if moe else layer.mlp
        if mlp is None:
            continue
        prefix = f"layers.{i}.mlp" + (".shared_experts" if moe else "")
        for lin, name in ((mlp.w2, "w2"), (mlp.w1, "w1")):  # w2 first: its FFN width divides
            _shard_linear(lin, f"{prefix}.{name}.weight", rank, size, gated)
        if moe:
            layer.mlp.shared_experts = _block(mlp, group, sp)
        else:
            layer.mlp = _block(mlp, group, sp)
    model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, rank, size, group, sp)
    _shard_linear(model.output, "output.weight", rank, size, gated)
    model.output = ParallelHead(model.output, group, sp)


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    """Parameters replicated over TP whose gradients are partial sums under SP: the norms and
    the MoE routers."""
    return [p for name, p in model.named_parameters()
            if "norm" in name.split(".")[-2] or name.split(".")[-2] == "router"]
