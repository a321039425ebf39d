"""Context parallel: the sequence split over the CP group, attention by a ring exchange of K/V.

Why it exists: attention is the only part of a layer where one token needs the others; every
other op is per token. So CP cuts the sequence of every micro-batch across ``cp`` ranks (the
norms, linears, MLP and loss run on the local tokens unchanged) and replaces only the attention
core by ``RingAttention``, as Megatron-LM / TransformerEngine do with ``cp_comm_type="p2p"``:

- Load balancing for causal attention: the sequence is cut into ``2*cp`` chunks and CP rank ``r``
  holds chunks ``r`` and ``2*cp-1-r`` (``local_indices``), so every rank has the same share of
  the causal triangle. Tokens, targets and the rotary cos/sin rows follow the same split.
- Forward: the local K/V block travels around the ring (``isend`` to rank ``r+1``, ``irecv``
  from ``r-1``, started before the block's compute so they overlap). At step ``i`` rank ``r``
  holds the K/V of rank ``j = r-i (mod cp)``, and with the load-balanced layout each block is
  one of three kinds (``block``): ``i == 0`` its own K/V, a causal diagonal over the local
  sequence; ``j < r`` every local query sees the first half of that K/V (chunk ``j``) fully;
  ``j > r`` only the second half of the queries (chunk ``2cp-1-r``) sees all of that K/V fully.
  Each block's output and log-sum-exp are computed in fp32 and merged by online softmax.
- Backward: the ring runs again; each block's probabilities are recomputed from the saved final
  LSE (flash-attention style: only q, k, v, the output and the fp32 LSE are saved), dQ stays
  local, and the dK/dV of the block travel with it (one step behind, overlapped with the next
  block's compute), so after ``cp`` hops each rank holds the full gradient of its own K/V.

GQA (fewer K/V heads than query heads) is computed without repeating K/V: the query heads of a
group share the group's K/V by broadcasting, and dK/dV sum over them. K/V and dK/dV travel in the
K/V dtype (BF16 under autocast, as TransformerEngine sends them); all arithmetic is fp32.
Ring order alternates send/receive by rank parity, as TransformerEngine does, so a blocking
point-to-point backend (NCCL) cannot deadlock around the ring.

Each CP rank's loss is the mean over its own tokens; the gradients then summed over the CP ranks
(averaged over the dp*cp group, as Megatron-LM does) are the single-process model's gradients.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

_KV_TAG, _DKV_TAG = 7001, 7002  # distinct from the pipeline's tags (which use other rank pairs)


def local_indices(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Positions of the global sequence that CP rank ``rank`` holds: chunks r and 2cp-1-r
    (every position, in order, when cp == 1)."""
    if cp == 1:
        return torch.arange(seq, device=device)
    if seq % (2 * cp):
        raise ValueError(f"sequence of {seq} tokens is not divisible by 2*cp={2 * cp}")
    c = seq // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([first, second])


def block(step: int, rank: int, local: int, causal: bool = True
          ) -> tuple[slice, slice, bool]:
    """(query rows, key columns, diagonal-causal) of the block at ring step ``step`` for a local
    sequence of ``local`` tokens in the load-balanced layout."""
    everything, half = slice(0, local), local // 2
    if not causal:
        return everything, everything, False
    if step == 0:
        return everything, everything, True
    if step <= rank:  # K/V of an earlier rank: its first chunk precedes both of ours
        return everything, slice(0, half), False
    return slice(half, local), everything, False  # a later rank: only our second chunk sees it


class Ring:
    """The CP group as a ring: this rank's index and its neighbours' global ranks."""

    def __init__(self, group, ranks: list[int] | tuple[int, ...], rank: int) -> None:
        self.group, self.ranks = group, list(ranks)
        self.size, self.rank = len(self.ranks), rank
        self.next = self.ranks[(rank + 1) % self.size]
        self.prev = self.ranks[(rank - 1) % self.size]

    def shift(self, tensor: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        """Start sending ``tensor`` to the next rank and receiving the previous rank's; returns
        the receive buffer and the pending works."""
        tensor = tensor.contiguous()
        buf = torch.empty_like(tensor)
        ops = [lambda: dist.isend(tensor, self.next, group=self.group, tag=tag),
               lambda: dist.irecv(buf, self.prev, group=self.group, tag=tag)]
        if self.rank % 2:
            ops.reverse()
        return buf, [op() for op in ops] + [tensor]  # keep the sent tensor alive until waited


def _wait(pending: list) -> None:
    for work in pending:
        if not isinstance(work, torch.Tensor):
            work.wait()


def _scores(q: torch.Tensor, kv: torch.Tensor, rows: slice, cols: slice, diag: bool,
            scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 scaled scores of one block (-inf above the diagonal of a diagonal block) and its K
    and V; q [b, groups, heads/groups, s, d], kv [2, b, groups, s, d]."""
    k, v = (kv[i, :, :, cols].float().unsqueeze(2) for i in (0, 1))
    scores = q[..., rows, :] @ k.transpose(-1, -2) * scale
    if diag:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores.masked_fill_(mask, -math.inf)
    return scores, k, v


class _RingAttention(torch.autograd.Function):
    """q [b, heads, s, d], k / v [b, groups, s, d] (local tokens) -> out [b, heads, s, d]."""

    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, causal: bool):
        b, h, s, d = q.shape
        g = k.shape[1]
        scale = 1.0 / math.sqrt(d)
        with torch.autocast(q.device.type, enabled=False):
            qf = q.float().reshape(b, g, h // g, s, d)
            acc = torch.zeros_like(qf)
            lse = torch.full(qf.shape[:-1], -math.inf, device=q.device)
            kv = torch.stack([k, v])
            for step in range(ring.size):
                if step < ring.size - 1:
                    nxt, pending = ring.shift(kv, _KV_TAG)
                rows, cols, diag = block(step, ring.rank, s, causal)
                scores, _, vf = _scores(qf, kv, rows, cols, diag, scale)
                block_lse = scores.logsumexp(-1)
                block_out = (scores - block_lse.unsqueeze(-1)).exp() @ vf
                old = lse[..., rows]
                new = torch.logaddexp(old, block_lse)
                acc[..., rows, :] = (acc[..., rows, :] * (old - new).exp().unsqueeze(-1)
                                     + block_out * (block_lse - new).exp().unsqueeze(-1))
                lse[..., rows] = new
                if step < ring.size - 1:
                    _wait(pending)
                    kv = nxt
            # [b, s, heads, d] memory seen as [b, heads, s, d], like SDPA's output, so the
            # model's transpose back to [b, s, heads * d] is a view.
            out = torch.empty(b, s, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
            out.copy_(acc.view(b, h, s, d))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal = ring, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal = ctx.ring, ctx.causal
        b, h, s, d = q.shape
        g = k.shape[1]
        scale = 1.0 / math.sqrt(d)
        with torch.autocast(q.device.type, enabled=False):
            qf = q.float().reshape(b, g, h // g, s, d)
            do = dout.float().reshape(b, g, h // g, s, d)
            delta = (do * out.float().reshape(b, g, h // g, s, d)).sum(-1)
            dq = torch.zeros_like(qf)
            kv = torch.stack([k, v])
            dkv_pending = None
            for step in range(ring.size):
                if step < ring.size - 1:
                    nxt, pending = ring.shift(kv, _KV_TAG)
                rows, cols, diag = block(step, ring.rank, s, causal)
                scores, kf, vf = _scores(qf, kv, rows, cols, diag, scale)
                qs, dos = qf[..., rows, :], do[..., rows, :]
                p = (scores - lse[..., rows].unsqueeze(-1)).exp()
                ds = p * (dos @ vf.transpose(-1, -2) - delta[..., rows].unsqueeze(-1))
                dq[..., rows, :] += ds @ kf * scale
                dkv = torch.zeros(2, b, g, s, d, device=q.device)
                dkv[0, :, :, cols] = (ds.transpose(-1, -2) @ qs).sum(2) * scale
                dkv[1, :, :, cols] = (p.transpose(-1, -2) @ dos).sum(2)
                if dkv_pending is not None:  # the partial sum of the previous holders
                    received, pending_dkv = dkv_pending
                    _wait(pending_dkv)
                    dkv += received.float()
                if ring.size > 1:
                    dkv_pending = ring.shift(dkv.to(kv.dtype), _DKV_TAG)
                if step < ring.size - 1:
                    _wait(pending)
                    kv = nxt
            if dkv_pending is not None:  # after cp hops each K/V's gradient is back home
                received, pending_dkv = dkv_pending
                _wait(pending_dkv)
                dkv = received
            dq = dq.view(b, h, s, d).to(q.dtype)
            dk, dv = dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        return dq, dk, dv, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring,
                   causal: bool = True) -> torch.Tensor:
    """softmax(QK^T/sqrt(d))V over the whole (CP-split) sequence; q [b, heads, s_local, d],
    k / v [b, groups, s_local, d] in the load-balanced layout of ``local_indices``."""
    if causal and ring.size > 1 and q.shape[2] % 2:
        raise ValueError(f"local sequence of {q.shape[2]} tokens must be even (two chunks)")
    return _RingAttention.apply(q, k, v, ring, causal)


class RingAttention:
    """A drop-in for ``Attention.core`` on one CP rank (a plain callable, so module and
    parameter names do not change, and selective recompute checkpoints it like the original)."""

    def __init__(self, ring: Ring, causal: bool = True) -> None:
        self.ring, self.causal = ring, causal

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.ring, self.causal)


def apply_context_parallel(model: torch.nn.Module, ring: Ring) -> int:
    """Replace the attention core of every layer of ``model`` by ring attention; returns how
    many were replaced."""
    from autoparallel.model.transformer import Attention
    count = 0
    for module in model.modules():
        if isinstance(module, Attention):
            module.core = RingAttention(ring)
            count += 1
    return count
