"""One training step: the schedule step of the cost model.

The pipeline schedule runs the bottleneck stage m times plus the fill and drain of the others
(``pipeline.schedule_time``); then, once per step, the data-parallel gradient reduction and
parameter gather that overlap leaves exposed (``dataparallel``), the optimizer's pass over its
states and the FP8 cast of the weights. The step's breakdown (``BREAKDOWN_KEYS``) is read on the
bottleneck stage, and its entries add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel.costmodel import dataparallel, finetune, memory, pipeline
from autoparallel.costmodel.candidates import Candidates
from autoparallel.costmodel.layer_time import Layers
from autoparallel.costmodel.stages import StageTimes, present

OPTIMIZER_BYTES_PER_PARAM = 32.0  # Adam reads/writes master, m, v, grad, BF16 copy
BREAKDOWN_KEYS = ("compute_s", "recompute_s", "fp8_cast_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                  "pp_comm_s", "bubble_s", "dp_comm_s", "offload_s", "optimizer_s")


def _pick(masks_and_values, default):
    """Elementwise select: the value of the first mask that holds (np.select, broadcasting)."""
    masks, values = zip(*masks_and_values)
    return np.select(list(masks), [np.broadcast_to(v, np.shape(masks[0])) for v in values], default)


@dataclass
class Schedule:
    """The pipeline's time for one step and its bottleneck stage (the slowest; the last on a
    tie, then the first)."""

    time: np.ndarray
    slowest: np.ndarray  # the bottleneck stage's time per micro-batch
    layers: np.ndarray  # the bottleneck stage's layers, of which ``moe`` MoE layers
    moe: np.ndarray
    kinds: np.ndarray | None  # a hybrid model's: each kind's layers on it (``Candidates.stage_kinds``)
    logits: np.ndarray  # its output layer and loss time (0 unless it is the last stage)
    offload: np.ndarray  # its offloading time (0 unless it is the first stage)


def schedule(x: Candidates, stages: StageTimes) -> Schedule:
    middle = np.where(x.has_middle, stages.middle, 0.0)
    slowest = np.maximum(np.maximum(stages.first, middle), np.where(x.single, 0.0, stages.last))
    stage_total = np.where(x.single, stages.first, stages.first + (x.p - 2) * middle + stages.last)
    last_is_slowest = ~x.single & (stages.last >= slowest)
    first_is_slowest = ~last_is_slowest & (stages.first >= slowest)
    return Schedule(
        time=pipeline.schedule_time(x.m, x.v, slowest, stage_total),
        slowest=slowest,
        layers=_pick([(last_is_slowest, x.last_layers), (first_is_slowest, x.first_layers)], x.middle_layers),
        moe=_pick([(last_is_slowest, x.last_moe), (first_is_slowest, x.first_moe)], x.middle_moe),
        kinds=None if x.stage_kinds is None else np.stack([
            _pick([(last_is_slowest, last), (first_is_slowest, first)], middle) for first, middle, last in zip(*x.stage_kinds)]),
        logits=np.where(last_is_slowest | x.single, stages.logits, 0.0),
        offload=np.where(first_is_slowest, stages.offload, 0.0),
    )


def heaviest_stage_params(x: Candidates, params: list) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters of the stage holding the most: its gradients are the slowest
    to reduce and its optimizer the slowest to step."""
    totals = [np.where(ok, dense + experts, -np.inf) for ok, (dense, experts) in zip(present(x), params)]
    heaviest = np.argmax(np.stack(totals), axis=0)
    return tuple(np.choose(heaviest, [stage[i] for stage in params]) for i in range(2))


def dp_comm_time(x: Candidates, params_gpu, experts_gpu, stage_compute):
    """Gradient reduce-scatter (all-reduce) and parameter all-gather over the data-parallel group
    (experts over theirs), what overlap with the last/first micro-batches leaves exposed; FSDP
    prices its traffic per layer instead (``layer_time.fsdp_time``)."""
    def exposed(params, ranks):
        return np.where(x.fsdp, 0.0, dataparallel.distributed_optimizer_exposed(
            x.hw, params, x.grad_bytes, ranks, x.distributed_optimizer, x.v, x.p, stage_compute,
            x.flag("overlap_grad_reduce"), x.flag("overlap_param_gather"), x.gather_bytes,
            dataparallel.buckets_per_chunk(x, params)))
    total = exposed(params_gpu, dataparallel.cta_capped(x, x.dp_ranks))
    if x.model.is_moe:
        total = total + exposed(experts_gpu, x.edp_ranks)
    return total


def optimizer_time(x: Candidates, params_gpu, experts_gpu):
    """Adam's pass over its share of the states (HBM-bound; BF16 moments, the precision-aware
    optimizer, halve the bytes of the two moments, each read and written once), plus the step's
    fixed cost (``Efficiency.step_overhead_s``: launches, syncs and the host loop)."""
    shards, expert_shards = x.optimizer_shards()
    per_param = OPTIMIZER_BYTES_PER_PARAM - 2 * 2 * (memory.ADAM_MOMENT_BYTES - x.moment_bytes)
    return (params_gpu / shards + experts_gpu / expert_shards) * per_param / x.hbm + x.hw.efficiency.step_overhead_s


def weight_cast_time(x: Candidates, layers: Layers, bottleneck: Schedule):
    """The FP8 copies of the bottleneck stage's weights, cast once per step (a frozen LoRA base
    is kept in FP8: never cast)."""
    if finetune.is_lora(x.model):
        return np.zeros_like(x.t)
    layer_params = layers.on("params", bottleneck.layers, bottleneck.moe, bottleneck.kinds) + bottleneck.moe * layers.moe["expert_params"]
    return layer_params * x.quantized_fraction * x.cast_bytes / x.hbm


def step_breakdown(x: Candidates, layers: Layers, stages: StageTimes, heaviest: tuple) -> dict:
    """The step time and its breakdown on the bottleneck stage (``BREAKDOWN_KEYS``, which add up
    to ``step_time_s``). ``heaviest``: the (dense, expert) trainable parameters of the stage that
    holds the most (``heaviest_stage_params`` of ``stages.trainable_params``)."""
    bottleneck = schedule(x, stages)
    on_bottleneck = lambda key: layers.on(key, bottleneck.layers, bottleneck.moe, bottleneck.kinds)  # noqa: E731
    per_microbatch = lambda key: x.m * on_bottleneck(key)  # noqa: E731
    params_gpu, experts_gpu = heaviest
    dp_exposed = dp_comm_time(x, params_gpu, experts_gpu, on_bottleneck("time"))
    t_optimizer = optimizer_time(x, params_gpu, experts_gpu)
    weight_cast = weight_cast_time(x, layers, bottleneck)
    return {
        "step_time_s": bottleneck.time + dp_exposed + t_optimizer + weight_cast,
        "compute_s": x.m * (on_bottleneck("compute") + bottleneck.logits + on_bottleneck("lora_adapters")
                            + on_bottleneck("cp_merge")),
        "fp8_cast_s": per_microbatch("fp8_cast") + per_microbatch("amax_reduction") + weight_cast,
        "recompute_s": per_microbatch("recompute"),
        "tp_comm_s": per_microbatch("tp_comm"),
        # Every standard layer has the same CP exchange; a hybrid model's kinds each their own.
        "cp_comm_s": (per_microbatch("cp_comm") if layers.kinds is not None
                      else x.m * bottleneck.layers * layers.dense["cp_comm"]),
        "ep_comm_s": per_microbatch("ep_comm"),
        "pp_comm_s": x.m * stages.pp_comm,
        "bubble_s": bottleneck.time - x.m * bottleneck.slowest,
        "dp_comm_s": dp_exposed + per_microbatch("fsdp"),
        "offload_s": x.m * bottleneck.offload,
        "optimizer_s": t_optimizer,
    }
