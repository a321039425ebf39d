"""Step time and peak memory of every candidate plan, as columns.

The time of one step is built bottom-up (DESIGN.md §5) in four steps, each its own module of
named terms:

1. ``layer_time``: one layer's forward and backward for one micro-batch on one GPU (GEMMs at a
   size-dependent efficiency, attention core, memory-bound kernels, FP8 casts, recompute,
   exposed TP, CP, FSDP and EP communication), for a dense and a MoE layer;
2. ``stages``: each pipeline stage is its layers plus what only it does (the output layer and
   loss on the last stage, offloading on the first, point-to-point sends);
3. ``step_time``: the schedule runs the bottleneck stage m times plus the fill and drain of the
   others, then the exposed data-parallel traffic, the optimizer step and the weights' FP8 cast;
4. ``peak_memory``: model states and activations in flight on the fullest stage.

``candidates`` turns the plan columns into the arrays and shapes every term reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autoparallel.costmodel import flops
from autoparallel.costmodel.candidates import Candidates, Structures, candidates
from autoparallel.costmodel.layer_time import layer_params
from autoparallel.costmodel.layer_time import layers as layer_costs
from autoparallel.costmodel.peak_memory import MEMORY_KEYS, peak_memory
from autoparallel.costmodel.stages import stage_params, stage_times, trainable_params
from autoparallel.costmodel.step_time import BREAKDOWN_KEYS, heaviest_stage_params, step_breakdown
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

__all__ = ["BREAKDOWN_KEYS", "MEMORY_KEYS", "estimate_candidates", "estimate_columns", "estimate_plan", "plan_columns",
           "record"]


def estimate_columns(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
                     memory_fraction: float = 1.0, labels: Mapping[str, tuple] | None = None,
                     structures: Structures | None = None) -> dict[str, np.ndarray]:
    """Predict every plan in ``cols`` (Plan field name -> array). Returns metric columns.

    ``memory_fraction``: a plan fits when its peak (the fixed reserve included) is at most this
    share of GPU memory. ``labels``: string columns of ``cols`` already factorized, as
    ``pipeline.factorize`` gives them (``Candidates.labels``); ``structures``: the plans'
    structures where the caller knows them (``candidates.structures``: the same figures, sooner).
    """
    return estimate_candidates(candidates(model, hw, cols, labels, structures), memory_fraction)


def estimate_candidates(x: Candidates, memory_fraction: float = 1.0) -> dict[str, np.ndarray]:
    """``estimate_columns`` of candidates already made (``candidates``, ``candidates.on_hardware``)."""
    model, hw = x.model, x.hw
    layers = layer_costs(x)
    params, heaviest = x.by_structure(structure_params)
    time = step_breakdown(x, layers, stage_times(x, layers), heaviest)
    mem = peak_memory(x, layers, params, memory_fraction)

    step = time.pop("step_time_s")
    n_gpus = x.t * x.p * x.c * x.dp
    tokens_per_s_per_gpu = x.gbs * model.seq_length / (step * n_gpus)
    model_tflops = flops.model_flops_per_token(model, x.t) * tokens_per_s_per_gpu / 1e12
    precision_peak = np.select([x.is_fp4, x.is_fp8], [hw.fp4_tflops or hw.fp8_tflops or hw.bf16_tflops,
                                                      hw.fp8_tflops or hw.bf16_tflops], hw.bf16_tflops)
    return {
        "fits": mem["fits"],
        "peak_memory_gib": mem["peak_memory_gib"],
        "step_time_s": step,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_tflops_per_gpu": model_tflops,
        # Model FLOP utilisation against the dense BF16 peak, as Megatron-LM and NeMo users read
        # it; against the peak of the plan's GEMM precision (the FP8 peak under an FP8 recipe).
        "mfu": model_tflops / hw.bf16_tflops,
        "precision_utilization": model_tflops / precision_peak,
        "num_microbatches": x.m,
        # Breakdown of the step on the bottleneck stage (they add up to step_time_s).
        **time,
        # Memory by kind (GiB on the fullest GPU).
        **{k: mem[k] for k in MEMORY_KEYS},
    }


def structure_params(s) -> tuple[list, tuple]:
    """Each priced stage's parameters on one GPU (``stage_params``) and the trainable ones of the
    stage holding the most (``heaviest_stage_params``): the structure's alone (``layer_params``),
    for ``Candidates.by_structure``."""
    layers = layer_params(s)
    params = stage_params(s, layers)
    return params, heaviest_stage_params(s, trainable_params(s, layers, params))


def plan_columns(plans: list[Plan]) -> dict[str, np.ndarray]:
    """Plans as the columns ``estimate_columns`` takes."""
    return {name: np.array([getattr(pl, name) for pl in plans]) for name in Plan.field_names()}


def estimate_plan(model: ModelSpec, hw: HardwareSpec, plan: Plan,
                  memory_fraction: float = 1.0, settings: Mapping | None = None) -> dict:
    """One plan's prediction as the stable JSON record (config, fits, metrics, breakdown);
    ``settings``: run-level columns (``SearchSpace.cost_settings``)."""
    cols = estimate_columns(model, hw, {**plan_columns([plan]), **(settings or {})}, memory_fraction)
    return record(plan.as_dict(), {k: v[0] for k, v in cols.items()})


def record(config: dict, row: Mapping) -> dict:
    """The stable output record other tools read (keys named in issue 2)."""
    return {
        "config": config,
        "fits": bool(row["fits"]),
        "peak_memory_gib": float(row["peak_memory_gib"]),
        "step_time_s": float(row["step_time_s"]),
        "tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
        "model_tflops_per_gpu": float(row["model_tflops_per_gpu"]),
        "mfu": float(row["mfu"]),
        "precision_utilization": float(row["precision_utilization"]),
        "breakdown": {
            "time_s": {k: float(row[k]) for k in BREAKDOWN_KEYS},
            "memory_gib": {k: float(row[k]) for k in MEMORY_KEYS},
        },
    }
