"""Data-parallel traffic that the step cannot hide, as Megatron-LM overlaps it.

**Distributed optimizer** (``megatron/core/distributed``): gradients are reduce-scattered
(all-reduced without the distributed optimizer) once per step, bucket by bucket as each model
chunk's last backward ends; parameters are all-gathered before each chunk's first forward of the
next step. With vp chunks per stage, a chunk's reduce can hide behind the backward work the
schedule still has after that chunk's last backward: about pp chunk-micro-batches for every
chunk but the one that finishes last, which has only its own backward (its buckets start as its
layers finish). The parameter all-gather runs only one bucket ahead of the forward
(``_ParamAndGradBucketGroup.finish_param_sync``: the forward pre-hook waits for a bucket's
all-gather and only then dispatches the next one), so each chunk's gather hides behind one
micro-batch's forward of the chunk before it, not behind the warm-up's other micro-batches. Some
of every collective stays exposed (``dp_overlap``: kernels contend for SMs and memory bandwidth).

**FSDP** (Megatron-FSDP ``optim_grads_params``, PyTorch FSDP2): weights, gradients and optimizer
states sharded over dp*cp; each layer's weights all-gathered before its forward and again before
its backward, its gradients reduce-scattered after its backward, every micro-batch; the next
layer's all-gather is prefetched behind the current layer's compute.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autoparallel.costmodel import comm
from autoparallel.costmodel.candidates import DP_BUCKET_SIZE_COLUMN, DP_MAX_CTAS_COLUMN
from autoparallel.costmodel.memory import WEIGHT_BYTES
from autoparallel.specs.hardware import HardwareSpec

# CTAs an NCCL ring reduce-scatter / all-gather needs to run at the NVLink bandwidth the model
# prices: "we need to launch 2 CTAs per NVLink in order to saturate the BW for large messages"
# (NCCL's maintainers, NVIDIA/nccl#1703), 18 NVLinks on H100 / H200 / B200 / GB200 / B300 / GB300;
# 32 is what NVIDIA's MLPerf Training LoRA configs of the same rounds give these communicators
# (mlcommons/training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama2_70b_lora/implementations/nemo/
# conf/nccl/custom_communicator_cta.yaml: dp and dp_cp max_ctas 32).
FULL_SPEED_CTAS = 32.0


def _hidden(hw: HardwareSpec, comm_time, window):
    """What stays exposed of ``comm_time`` overlapped with ``window`` of compute (``dp_overlap``)."""
    return comm.exposed_behind(comm_time, window, hw.efficiency.dp_overlap)


def cta_capped(x, ranks: comm.Group) -> comm.Group:
    """``ranks`` (the data-parallel group) as NCCL runs it when the config caps its communicators'
    CTAs (``DP_MAX_CTAS_COLUMN``): one CTA is one ring channel, so the NVLink leg carries
    ``max_ctas / FULL_SPEED_CTAS`` of its bandwidth (an assumption: proportional below saturation).
    The network leg keeps its rate: a channel drives a NIC at line rate (NCCL's Blackwell and
    Hopper inter-node search speeds reach 48 GB/s per channel, a 400 Gb/s NIC: src/graph/search.cc
    sm100SpeedArrayInter / sm90SpeedArrayInter), and 8 channels cover a node's 8 NICs.
    MLPerf Training's Llama 3.1 implementations cap both DP communicators at 8 CTAs
    (conf/nccl/custom_communicator_cta.yaml dp / dp_cp max_ctas 8, read through NCCL_CFG_PATH in
    config_common.sh; Megatron-LM parallel_state.get_nccl_options sets it on the process group)."""
    if DP_MAX_CTAS_COLUMN not in x.knobs:
        return ranks
    share = np.minimum(np.asarray(x.knobs[DP_MAX_CTAS_COLUMN], dtype=float) / FULL_SPEED_CTAS, 1.0)
    return dataclasses.replace(ranks, nvlink=ranks.nvlink * share)


def bucket_params(x) -> np.ndarray:
    """Parameters per gradient bucket: the row's own (``DP_BUCKET_SIZE_COLUMN``) where it states one,
    else Megatron-LM's default max(40M, 1M x the DP x CP group's ranks) (NVIDIA/Megatron-LM@d98e8a64dd
    megatron/training/training.py resolve_ddp_bucket_size: larger groups get larger buckets so that
    each stays bandwidth-bound, not latency-bound, in NCCL's ring)."""
    default = np.maximum(40e6, 1e6 * x.dp_ranks.size)
    if DP_BUCKET_SIZE_COLUMN not in x.knobs:
        return default
    stated = np.asarray(x.knobs[DP_BUCKET_SIZE_COLUMN], dtype=float)
    return np.where(np.isfinite(stated) & (stated > 0), stated, default)


def buckets_per_chunk(x, params_gpu) -> np.ndarray:
    """Gradient buckets of each model chunk's ``params_gpu / vp`` parameters: one collective each
    (reduce-scatter, and all-gather of the parameters), each paying its latency. Without
    overlap_grad_reduce Megatron makes one bucket of the whole buffer (bucket_size None)."""
    buckets = np.maximum(np.ceil(params_gpu / x.v / bucket_params(x)), 1.0)
    return np.where(x.flag("overlap_grad_reduce"), buckets, 1.0)


def distributed_optimizer_exposed(hw: HardwareSpec, params_gpu, grad_bytes, ranks: comm.Group, dist_opt,
                                  vp, pp, stage_compute, overlap_grads, overlap_params, gather_bytes=WEIGHT_BYTES,
                                  buckets=1.0):
    """Exposed seconds per step of the gradient reduce and parameter gather of one stage over the
    data-parallel group ``ranks`` (``comm.group``).

    ``stage_compute``: forward + backward of one micro-batch through the stage (all chunks);
    ``gather_bytes``: per parameter gathered (BF16; 1 for weights kept in FP8); ``buckets``: the
    collectives each chunk's reduce and gather are split into (``buckets_per_chunk``).
    """
    chunk_params = params_gpu / vp
    grads = chunk_params * grad_bytes
    reduce = np.where(dist_opt, ranks.reduce_scatter_time(grads, buckets), ranks.all_reduce_time(grads, buckets))
    gather = np.where(dist_opt, ranks.reduce_scatter_time(chunk_params * gather_bytes, buckets), 0.0)
    chunk_backward = (2.0 / 3.0) * stage_compute / vp
    chunk_forward = (1.0 / 3.0) * stage_compute / vp
    later_chunks = vp - 1
    reduce_exposed = (_hidden(hw, reduce, chunk_backward) + later_chunks * _hidden(hw, reduce, pp * chunk_backward))
    gather_exposed = vp * _hidden(hw, gather, chunk_forward)
    return (np.where(overlap_grads, reduce_exposed, vp * reduce)
            + np.where(overlap_params, gather_exposed, vp * gather))


def fsdp_exposed(hw: HardwareSpec, layer_params_gpu, grad_bytes, ranks: comm.Group, layer_forward, layer_backward,
                 gather_bytes=WEIGHT_BYTES):
    """Exposed seconds per layer and micro-batch of FSDP's gathers and reduce-scatter over the
    data-parallel group ``ranks`` (``comm.group``)."""
    gather = ranks.reduce_scatter_time(layer_params_gpu * gather_bytes)
    reduce = ranks.reduce_scatter_time(layer_params_gpu * grad_bytes)
    return _hidden(hw, gather, layer_forward) + _hidden(hw, gather + reduce, layer_backward)
