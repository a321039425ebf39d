"""Ring attention alone against ``scaled_dot_product_attention`` on the whole sequence.

The CP ranks are simulated in one process: one thread per rank, and a ring whose ``shift`` hands
tensors over through queues instead of ``isend`` / ``irecv`` (the same FIFO order per tag), so
the algorithm (load-balanced split, per-block masks, online-softmax merge, dK/dV travelling back
to their owners) is checked in well under a second per case without launching processes. The
gloo path itself runs in the cp layouts of ``test_equivalence``. Tolerances: fp32 output and
q/k/v gradients within 1e-5 (they differ only in summation order); with BF16 inputs (K/V and
dK/dV travel in BF16) each result within 1e-2 of its largest entry from fp32 SDPA on the same
inputs (measured 2.5e-3 to 3.6e-3 at cp = 4; SDPA run in BF16 is 2.5e-3 to 3.7e-3 away).
"""

import queue
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from autoparallel.parallel import context


class ThreadRing(context.Ring):
    def __init__(self, boxes: dict, size: int, rank: int) -> None:
        super().__init__(None, list(range(size)), rank)
        self.boxes = boxes

    def shift(self, tensor, tag):
        self.boxes[(self.next, tag)].put(tensor.clone())
        buf = torch.empty_like(tensor)
        box = self.boxes[(self.rank, tag)]

        class Receive:
            def wait(self):
                buf.copy_(box.get(timeout=30))

        return buf, [Receive()]


def _inputs(b=2, heads=4, groups=2, seq=24, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, seq, n, dim, generator=g) for n in (heads, groups, groups))
    return q, k, v, torch.randn(b, heads, seq, dim, generator=g)


def _reference(q, k, v, dout, causal):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _ring(q, k, v, dout, cp, causal, dtype=torch.float32):
    """Every CP rank's share through ring attention; results put back in sequence order."""
    boxes = {(r, tag): queue.Queue() for r in range(cp) for tag in (context._KV_TAG,
                                                                    context._DKV_TAG)}
    seq = q.shape[1]

    def rank_work(r):
        idx = context.local_indices(seq, cp, r)
        ql, kl, vl = (t[:, idx].to(dtype).requires_grad_(True) for t in (q, k, v))
        # [batch, heads, seq, dim] views of [batch, seq, heads, dim] memory, as in the model
        out = context.ring_attention(ql.transpose(1, 2), kl.transpose(1, 2), vl.transpose(1, 2),
                                     ThreadRing(boxes, cp, r), causal)
        out.backward(dout[:, :, idx].to(dtype))
        return idx, out.detach(), ql.grad, kl.grad, vl.grad

    with ThreadPoolExecutor(cp) as pool:
        parts = list(pool.map(rank_work, range(cp)))
    out, dq, dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in (dout, q, k, v))
    for idx, o, gq, gk, gv in parts:
        out[:, :, idx] = o.float()
        dq[:, idx], dk[:, idx], dv[:, idx] = gq.float(), gk.float(), gv.float()
    return out, dq, dk, dv


def test_load_balanced_split():
    assert context.local_indices(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert context.local_indices(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert context.local_indices(5, 1, 0).tolist() == [0, 1, 2, 3, 4]
    for cp in (2, 3, 4):
        held = torch.cat([context.local_indices(24, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(24))
    with pytest.raises(ValueError, match="2\\*cp=8"):
        context.local_indices(12, 4, 0)


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_blocks_are_the_causal_mask(cp):
    """Each ring step's (rows, columns, diagonal) block is exactly the causal mask between this
    rank's positions and the positions of the K/V it holds."""
    seq = 4 * cp
    for r in range(cp):
        mine = context.local_indices(seq, cp, r)
        for step in range(cp):
            theirs = context.local_indices(seq, cp, (r - step) % cp)
            rows, cols, diag = context.block(step, r, len(mine))
            got = torch.zeros(len(mine), len(theirs), dtype=torch.bool)
            part = torch.ones(len(mine), len(theirs), dtype=torch.bool)[rows, cols]
            got[rows, cols] = part.tril() if diag else part
            assert torch.equal(got, mine[:, None] >= theirs[None, :]), (cp, r, step)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("groups", [2, 4], ids=["gqa", "mha"])
def test_ring_attention_matches_sdpa(cp, causal, groups):
    q, k, v, dout = _inputs(groups=groups)
    for got, want in zip(_ring(q, k, v, dout, cp, causal), _reference(q, k, v, dout, causal)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_ring_attention_bf16():
    q, k, v, dout = (t.bfloat16() for t in _inputs())
    want = _reference(q.float(), k.float(), v.float(), dout.float(), True)
    got = _ring(q, k, v, dout, 4, True, torch.bfloat16)
    for g, w in zip(got, want):
        assert float((g - w).abs().max() / w.abs().max()) < 1e-2
    out = context.ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 ThreadRing({}, 1, 0))
    assert out.dtype == torch.bfloat16 and out.transpose(1, 2).is_contiguous()


def test_a_ring_attention_layer_saves_what_the_sdpa_layer_saves():
    """q, k, v, the output and the fp32 log-sum-exp, like flash attention: the cost model's
    activation count holds under CP at seq/cp tokens per rank."""
    from autoparallel.model.recipes import Fp8Policy
    from autoparallel.model.transformer import TINY, Recompute, TransformerLayer, rotary_tables
    from autoparallel.profiling.memory import SavedTensors

    def saved(ring: bool) -> int:
        torch.manual_seed(0)
        layer = TransformerLayer(TINY, Fp8Policy(), 0, Recompute())
        if ring:
            layer.attention.core = context.RingAttention(ThreadRing({}, 1, 0))
        cos, sin = rotary_tables(TINY.seq_length, TINY.head_dim)
        x = torch.randn(2, TINY.seq_length, TINY.hidden_size, dtype=torch.bfloat16,
                        requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16), SavedTensors() as tracker:
            out = layer(x, cos, sin)
        out.float().sum().backward()
        return tracker.peak

    assert saved(True) == saved(False)
