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

A plan may run the forward reduce-scatters (``proj_fprop``, ``fc2_fprop``) with TE's ``pipeline``
method instead (``tp_overlap_rs_pipeline``; ``pipelined_rs_exposed``), as NVIDIA's MLPerf
Llama-2-70B LoRA configs do at TP4 (``conf/tp_overlap/h100tp4mbs1.yaml``, ``h100tp4cp2mbs1.yaml``).
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import comm, finetune
from autoparallel.costmodel.candidates import Candidates


def _hidden(x: Candidates, collective, window):
    """What stays exposed of ``collective`` overlapped with ``window`` of GEMM time (``tp_overlap``)."""
    return comm.exposed_behind(collective, window, x.hw.efficiency.tp_overlap)


def ring_exchange_exposed(x: Candidates, one, chunked):
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
    latency = x.tp_ranks.latency_s
    step = (one - latency) / steps + latency  # one chunk's transfer
    return np.where(t > 1, steps * np.maximum(step - chunked / np.maximum(t, 1.0), 0.0), 0.0)


# TE ``pipeline`` settings of NVIDIA's MLPerf LoRA TP4 configs (every round v4.0-v5.1, each submitter's
# ``conf/tp_overlap/h100tp4mbs1.yaml`` / ``h100tp4cp2mbs1.yaml``; ``measured_runs.MLPERF_LORA_RS_PIPELINE_ROUNDS``;
# e.g. training_results_v4.1 b87b9e39 Azure/.../conf/tp_overlap/h100tp4mbs1.yaml): ``num_splits: 4``,
# ``set_sm_margin: 1``, ``atomic_gemm: 1``, and per Linear its ``num_sm`` and ``fp8_buf`` (proj_fprop 32 and 1,
# fc2_fprop 16 and 0, "FP8 does not improve perf"). Their TP2 files run the ring exchange (v4.0 NVIDIA's own
# h100tp2mbs1.yaml too), so these are constants, not per-row settings.
PIPELINE_RS_SPLITS = 4
PIPELINE_RS_LINEARS = {"proj_fprop": {"num_sm": 32, "fp8_buf": 1}, "fc2_fprop": {"num_sm": 16, "fp8_buf": 0}}


def pipelined_rs_exposed(x: Candidates, one, gemm):
    """What a forward reduce-scatter run with TE's ``pipeline`` method costs beyond its GEMM:
    exposed communication plus the time the GEMM loses to the SMs it leaves to the collective;
    the mean of a block's two (``PIPELINE_RS_LINEARS``).

    TE 1.x ``UbufCommOverlap::atomic_gemm_overlap_rs`` / ``split_overlap_rs``
    (``transformer_engine/pytorch/csrc/comm_gemm_overlap.h``; TE 2.x ``CommOverlapBase``): the GEMM
    (``gemm``: its whole, unchunked time; an atomic GEMM is one kernel) runs on ``sm_count - num_sm``
    SMs (``set_sm_margin``), so it takes ``num_sm / (sm_count - num_sm)`` longer; its output is
    reduce-scattered in ``num_splits`` pieces, each (1/num_splits of ``one``'s bytes plus a
    collective's latency) beside the next piece's GEMM; the last piece has no GEMM left beside it
    and is exposed whole. With ``fp8_buf`` and an FP8 recipe the GEMM writes FP8 into the buffer and
    the pieces move one byte per value (TE 1.10 ``initialize_ub``: a ``torch.uint8`` buffer when
    ``use_fp8 and fp8_buf``; ``comm_gemm_overlap.h`` ``reducescatter2_userbuff_*_fp8`` where
    ``_ubuf.element_size() == 1``): half of ``one``'s BF16 bytes."""
    splits = float(PIPELINE_RS_SPLITS)
    sms = float(x.hw.sm_count)
    latency = x.tp_ranks.latency_s
    moved = one - latency  # the bytes' share of the whole reduce-scatter, BF16
    cost = 0.0
    for linear in PIPELINE_RS_LINEARS.values():
        loss = linear["num_sm"] / (sms - linear["num_sm"])
        piece = moved * np.where(x.is_fp8 & bool(linear["fp8_buf"]), 0.5, 1.0) / splits + latency
        cost = cost + gemm * loss + (splits - 1.0) * np.maximum(piece - gemm * (1.0 + loss) / splits, 0.0) + piece
    return cost / len(PIPELINE_RS_LINEARS)


def tp_comm_time(x: Candidates, blocks, t_linear, t_chunked):
    """Exposed TP communication of one layer and micro-batch, plus (userbuffers) the time its
    GEMMs lose to ring-exchange chunking. ``t_linear`` / ``t_chunked``: forward time of the
    TP-split GEMMs, whole and split into tp chunks; each block's column and row Linear are taken
    as half of its share."""
    one = x.tp_ranks.reduce_scatter_time(2.0 * x.tokens * x.model.hidden_size)
    half = t_linear / blocks / 2.0  # one Linear of a block, forward (its dgrad and wgrad alike)
    half_chunked = t_chunked / blocks / 2.0
    wgrad = finetune.linear_passes(x.model) - 2.0  # 1, or 0 for a frozen base
    forward = 2.0 + 2.0 * x.recomputed_fraction  # AG and RS per forward, recomputed ones too
    waited = forward + 1.0 + (1.0 - wgrad)  # ... the output-gradient AG, a frozen base's RS
    behind_gemm = wgrad * 2.0 * _hidden(x, one, half)  # AG beside dgrad, RS beside wgrad
    plain = waited * one + behind_gemm
    # Ring exchange (copy engines): each waited collective beside its own chunked GEMM.
    exposed = ring_exchange_exposed(x, one, half_chunked)
    chunking = waited * (half_chunked - half)  # the chunked GEMMs: forward, row dgrad (a frozen base's col dgrad)
    overlapped = waited * exposed + behind_gemm + chunking
    # TE's pipeline method for the forward reduce-scatters (one per forward, recomputed ones too).
    pipeline = x.flag("tp_overlap_rs_pipeline")
    if pipeline.any():  # pinned only (the default space keeps the ring exchange): priced where asked
        ring = exposed + (half_chunked - half)  # one ring exchange: exposed, and its GEMM's chunking
        forward_rs = 1.0 + x.recomputed_fraction
        pipelined = overlapped + forward_rs * (pipelined_rs_exposed(x, one, half) - ring)
        overlapped = np.where(pipeline, pipelined, overlapped)
    no_sp = 2.0 * one * (1.0 + x.recomputed_fraction) + np.where(wgrad > 0, _hidden(x, 2.0 * one, half), 2.0 * one)
    per_block = np.where(x.sp, np.where(x.flag("tp_comm_overlap"), overlapped, plain), no_sp)
    return np.where(x.t > 1, blocks * per_block, 0.0)
