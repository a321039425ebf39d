"""The serving assumptions YAML: engines, their fitted ``InferenceEfficiency`` and validation settings.

``search_spaces/inference_assumptions.yaml`` holds ``engines`` (how each serving engine batches
and allocates its KV cache: ``ServingEngine``), ``efficiency`` (fitted constants per engine,
below the marker line that ``python -m autoparallel.serve.fit`` rewrites), ``efficiency_from``
(engines without a fit of their own and whose constants they take), ``nvfp4_unquantized`` (the
modules each model's NVFP4 checkpoint keeps 16-bit: ``inference.nvfp4_16bit_params``),
``attention_dp_host`` (the executor's per-request time under attention DP: ``inference.attention_dp_host_time``) and
``validation`` (how the published rows are read). Unknown keys are errors naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from autoparallel import io
from autoparallel.costmodel.inference import InferenceEfficiency, ServingEngine
from autoparallel.errors import SpecError, UserError

ASSUMPTIONS = io.SEARCH_SPACES / "inference_assumptions.yaml"
FIT_MARKER = "# --- fitted by `python -m autoparallel.serve.fit`"
TOP_KEYS = ("engines", "scenarios", "efficiency_from", "nvfp4_unquantized", "attention_dp_host", "validation",
            "efficiency")
DEFAULT_ENGINE = "tensorrt-llm"
#: TensorRT-LLM's capacity scheduler policies (``CapacitySchedulerPolicy``; trtllm-bench
#: ``--scheduler_policy``) as the KV reservation the cost model and the simulation price:
#: GUARANTEED_NO_EVICT admits a request only when the pool holds its prompt and max new tokens;
#: MAX_UTILIZATION allocates blocks as tokens come and pauses the newest request when the pool is full.
CAPACITY_POLICIES = {"guaranteed_no_evict": "full", "max_utilization": "current"}


def load_assumptions() -> dict:
    data = io.read_yaml(ASSUMPTIONS)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise SpecError(f"{ASSUMPTIONS}: unknown key {unknown[0]!r}; valid keys: {', '.join(TOP_KEYS)}")
    return data


def engine_names() -> tuple[str, ...]:
    return tuple(load_assumptions().get("engines") or {})


def load_engine(name: str) -> ServingEngine:
    """One engine by name, or a UserError listing the valid ones."""
    engines = load_assumptions().get("engines") or {}
    if name not in engines:
        raise UserError(f"unknown serving engine {name!r};{io.did_you_mean(name, engines)} valid: {', '.join(engines)}")
    return io.from_dict(ServingEngine, {"name": name, **engines[name]}, f"{ASSUMPTIONS}: engines[{name!r}]")


def with_capacity_policy(engine: ServingEngine, policy: str | None) -> ServingEngine:
    """``engine`` run under TensorRT-LLM capacity policy ``policy`` (None: as the engine is
    configured). Only TensorRT-LLM has the choice: vLLM and SGLang always allocate as tokens come
    and preempt, FasterTransformer batches statically."""
    if policy is None:
        return engine
    if policy not in CAPACITY_POLICIES:
        raise UserError(f"--capacity-policy {policy!r} is not one of {', '.join(CAPACITY_POLICIES)}")
    if not engine.name.startswith("tensorrt-llm"):
        raise UserError(f"--capacity-policy is TensorRT-LLM's KV capacity scheduler; {engine.name} has no such "
                        "choice (vLLM and SGLang allocate KV blocks as tokens come and preempt when full; "
                        "FasterTransformer batches statically): drop it or use --engine tensorrt-llm")
    return dataclasses.replace(engine, kv_reservation=CAPACITY_POLICIES[policy])


def capacity_policy_of(engine: ServingEngine) -> str:
    """The TensorRT-LLM capacity policy whose KV reservation ``engine`` prices."""
    return next(name for name, reservation in CAPACITY_POLICIES.items() if reservation == engine.kv_reservation)


def efficiency_for(engine: str) -> InferenceEfficiency:
    """The fitted constants of one engine (or of the engine it borrows them from)."""
    data = load_assumptions()
    blocks = data.get("efficiency") or {}
    source = (data.get("efficiency_from") or {}).get(engine, engine)
    if source not in blocks:
        raise SpecError(f"{ASSUMPTIONS}: no efficiency block for engine {engine!r} "
                        f"(fitted: {', '.join(blocks)}; efficiency_from names the others)")
    return io.from_dict(InferenceEfficiency, blocks[source], f"{ASSUMPTIONS}: efficiency[{source!r}]")


@lru_cache(maxsize=None)
def _cached_model(name: str):
    return io.load_model(name)


def validation_model(name: str, shape, defaults: dict, source: str):
    """A validation row's model: a preset name, a shape completed by ``defaults``, or
    ``{preset: name, <key>: <value>}`` (a preset with some keys changed)."""
    from autoparallel.specs.model import ModelSpec
    if isinstance(shape, str):
        return _cached_model(shape)
    if not isinstance(shape, dict):
        raise SpecError(f"{source}: models[{name!r}] must be a preset name or a shape")
    if "preset" in shape:
        base = io.to_dict(_cached_model(shape["preset"]))
        return io.from_dict(ModelSpec, {**base, **{k: v for k, v in shape.items() if k != "preset"}},
                            f"{source}: models[{name!r}]")
    return io.from_dict(ModelSpec, {"name": name, **defaults, **shape}, f"{source}: models[{name!r}]")


__all__ = ["ASSUMPTIONS", "FIT_MARKER", "DEFAULT_ENGINE", "CAPACITY_POLICIES", "load_assumptions", "engine_names",
           "load_engine", "with_capacity_policy", "capacity_policy_of", "efficiency_for", "validation_model"]
