"""Tensor-parallel traffic of one layer as TransformerEngine's Linears run it, with and without
userbuffers (``--tp-comm-overlap``).

Each TP block (attention, MLP) is a column-parallel Linear (QKV, FC1) then a row-parallel one
(projection, FC2). Under sequence parallelism a block moves five collectives of its BF16
activation (tokens x hidden) per micro-batch, and a recomputed forward two more:

- forward: all-gather of the column Linear's input, reduce-scatter of the row Linear's output;
- backward: all-gather of the row Linear's output gradient before its dgrad; the column Linear
  all-gathers its input again for its wgrad while its dgrad GEMM runs, and reduce-scatters its
  dgrad while its wgrad GEMM runs (TE ``_Linear.backward``: both ``async_op=True``, so they
  hide behind those GEMMs even without userbuffers). A frozen (LoRA) base has no wgrad: no
  second all-gather, and the reduce-scatter has no GEMM to hide behind.

Without SP the block all-reduces the row output forward (exposed) and the column dgrad backward
(asynchronous, behind the wgrad GEMM).

With userbuffers (NeMo's ``tp_overlap_configs/userbuffers.py``: ``*_fprop`` and
``proj_dgrad`` / ``fc2_dgrad`` are ``RingExchangeOverlapCfg`` in every FP8 config) the three
collectives that TE otherwise waits on are ring exchanges: the GEMM is split into tp chunks of
tokens/tp rows, each computed while a chunk travels, so the GEMM runs at the efficiency of
a chunk (``gemm``: smaller GEMMs reach less of peak) and each of the tp-1 transfers hides behind
one chunk's GEMM (``ring_exchange_exposed``). TE moves
a ring exchange's chunks with the copy engines (``initialize_ub``'s default: ``use_ce`` True,
``num_sm`` 1), so only what outlasts its chunked GEMM is exposed. The other two stay bulk
overlaps beside the dgrad / wgrad GEMMs, on SMs: a collective hidden that way keeps
``1 - tp_overlap`` of it exposed (kernels contend for SMs and memory), as ``dataparallel`` does.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import comm, finetune
from autoparallel.costmodel.candidates import Candidates


def _hidden(x: Candidates, collective, window):
    """What stays exposed of ``collective`` overlapped with ``window`` of GEMM time (``tp_overlap``)."""
    return comm.exposed_behind(collective, window, x.hw.efficiency.tp_overlap)


def ring_exchange_exposed(x: Candidates, one, chunked, per_domain):
    """What stays exposed of one userbuffers ring exchange (``one``: the whole all-gather or
    reduce-scatter, ``comm.reduce_scatter_time``) run beside its GEMM split into tp chunks
    (``chunked``: the whole chunked GEMM's time).

    TransformerEngine's ``split_overlap_ag`` / ``split_overlap_rs`` (TE 1.10
    ``transformer_engine/pytorch/csrc/comm_gemm_overlap.h`` ``UbufP2PCommOverlap``, the version the
    fitted rows ran; TE 2.x ``common/comm_gemm_overlap/comm_gemm_overlap.cpp``
    ``CommOverlapP2PBase``, unchanged in structure; ``aggregate`` False in every NeMo /
    Megatron-Bridge config) run tp GEMM chunks and tp-1 transfers of one chunk (tokens/tp rows)
    each: the all-gather computes chunk i while it sends chunk i on to the next rank and the
    next GEMM waits for the receive (``_stop_recv``), so its last chunk has no transfer beside
    it; the reduce-scatter sends chunk i-1's output while it computes chunk i (``_start_comm``
    after GEMM i-1), so its first chunk has none. Each of the tp-1 steps hides its transfer
    (1/(tp-1) of the collective's bytes, plus the latency each ``userbuffers_send`` pays on its
    own) behind one chunk's GEMM (``chunked`` / tp); what outlasts it is exposed, step by step:
    a window of (tp-1)/tp of the chunked GEMM (1/2 at TP2, 3/4 at TP4, 7/8 at TP8)."""
    t = np.asarray(x.t, dtype=float)
    steps = np.maximum(t - 1.0, 1.0)
    latency = comm.group(x.hw, t, per_domain).latency_s
    step = (one - latency) / steps + latency  # one chunk's transfer
    return np.where(t > 1, steps * np.maximum(step - chunked / np.maximum(t, 1.0), 0.0), 0.0)


def ring_reduce_time(x: Candidates):
    """The userbuffers reduce-scatter's last kernel: its ring leaves the tp partial outputs of this
    rank's tokens/tp rows side by side, and a separate kernel on the main stream, after every chunk
    and transfer, sums them (TE 1.10 ``comm_gemm_overlap.h``
    ``UbufP2PCommOverlap::split_overlap_rs``
    ``torch::sum_out(rs_output, reduce_buf, 0)``, TransformerEngine 08a85d3b; TE 2.x
    ``CommOverlapP2PBase::split_overlap_rs`` ``reduce_bf16``, d0067d0d): nothing runs beside it.
    Memory-bound: tp BF16 chunks read, one written (the reduce-scatter's buffers stay BF16: only
    the all-gathers' are FP8, ``all_gather_bytes``)."""
    chunk = 2.0 * x.tokens / x.t * x.model.hidden_size
    return (x.t + 1.0) * chunk / x.hbm


def all_gather_bytes(x: Candidates):
    """Bytes per element of a userbuffers all-gather: TE allocates the all-gather overlaps' buffers
    (``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``, ``fc2_dgrad`` and the bulk ``qkv_dgrad`` /
    ``fc1_dgrad``) in uint8 under FP8 (``initialize_ub``: ``fp8_buf = name in
    layers_all_gather_overlap``, buffer ``torch.uint8 if (use_fp8 and fp8_buf)``; TE 1.6 c81733f1,
    1.10 08a85d3b, 2.x d0067d0d ``module/base.py``), and the LayerNorm writes its FP8 output, the
    row Linear's backward its FP8 output gradient, straight into them (TE 1.10
    ``layernorm_linear.py`` ``get_ubuf_output(0)``; ``base.py`` ``grad_output_preprocess``
    ``cast_to_fp8(..., out=grad_output_c)``): 1 B an element under an FP8 recipe, else BF16's 2."""
    return np.where(x.is_fp8, 1.0, 2.0)


def block_comm_time(x: Candidates, one, gathered, linear, chunked, per_domain):
    """Exposed TP communication of one block (``linear`` / ``chunked``: its column and its row
    Linear's forward GEMM time, whole and in tp chunks), each collective beside its own Linear's
    GEMM, as TE runs them: the column Linear's input AG (forward) and its dgrad RS, the row
    Linear's output RS (forward) and output-gradient AG (before its dgrad), each Linear's dgrad
    and wgrad GEMMs as long as its forward one. ``one``: a BF16 AG or RS of the block's
    activation; ``gathered``: the userbuffers AG of it (``all_gather_bytes``)."""
    (col, row), (col_chunked, row_chunked) = linear, chunked
    wgrad = finetune.linear_passes(x.model) - 2.0  # 1, or 0 for a frozen base
    forwards = 1.0 + x.recomputed_fraction  # a recomputed forward gathers and scatters again
    frozen = 1.0 - wgrad  # a frozen base's dgrad RS has no wgrad GEMM to hide behind
    behind_gemm = wgrad * (_hidden(x, one, col) + _hidden(x, one, col))  # beside its dgrad, wgrad
    plain = (2.0 * forwards + 1.0 + frozen) * one + behind_gemm
    # Userbuffers: the waited collectives ring-exchange beside their own chunked GEMM (copy
    # engines), each RS then summed (``ring_reduce_time``); the wgrad's input AG and dgrad RS
    # stay bulk overlaps.
    ring = lambda nbytes, window: ring_exchange_exposed(x, nbytes, window, per_domain)  # noqa: E731
    reduce = ring_reduce_time(x)
    overlapped = (forwards * (ring(gathered, col_chunked) + ring(one, row_chunked) + reduce)
                  + ring(gathered, row_chunked) + frozen * (ring(one, col_chunked) + reduce)
                  + wgrad * (_hidden(x, gathered, col) + _hidden(x, one, col))
                  + forwards * (col_chunked - col + row_chunked - row) + (row_chunked - row)
                  + frozen * (col_chunked - col))
    no_sp = 2.0 * one * forwards + np.where(wgrad > 0, _hidden(x, 2.0 * one, col), 2.0 * one)
    return np.where(x.sp, np.where(x.flag("tp_comm_overlap"), overlapped, plain), no_sp)


def tp_comm_time(x: Candidates, blocks, t_linear, t_chunked):
    """Exposed TP communication of one layer and micro-batch, plus (userbuffers) the time its
    GEMMs lose to ring-exchange chunking. ``t_linear`` / ``t_chunked``: forward time of the
    TP-split GEMMs, whole and split into tp chunks; ``blocks``: each TP block's (column, row)
    Linear as a share of them (``layer_time.tp_linear_shares``), so that each collective hides
    behind its own Linear's GEMM (TE's userbuffers chunk each Linear's GEMM on its own:
    ``split_overlap_ag`` / ``split_overlap_rs`` per Linear) rather than behind an average one."""
    per_domain = comm.ranks_per_domain(x.hw, x.t, 1)
    activation = x.tokens * x.model.hidden_size
    one = comm.reduce_scatter_time(x.hw, 2.0 * activation, x.t, per_domain)
    gathered = comm.reduce_scatter_time(x.hw, all_gather_bytes(x) * activation, x.t, per_domain)
    total = sum(block_comm_time(x, one, gathered, (col * t_linear, row * t_linear),
                                (col * t_chunked, row * t_chunked), per_domain)
                for col, row in blocks)
    return np.where(x.t > 1, total, 0.0)
