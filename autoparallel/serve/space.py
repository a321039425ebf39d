"""The serving search space and its candidates: TP x PP x EP x precisions x max batch x max tokens.

Rules (vLLM's and TensorRT-LLM's own): ``tp * pp`` divides the GPUs (the rest are replicas);
attention heads divisible by ``tp``; KV heads divisible by ``tp`` or, when ``tp`` exceeds them,
dividing it (each KV head is then replicated); a hybrid model's Mamba heads divisible by ``tp``
(vLLM's ``MambaStateShapeCalculator`` divides them; B/C groups that ``tp`` does not divide are
replicated: ``mamba_serving.local_groups``); ``pp`` at most the layer count (uneven splits
are allowed, the fullest stage is priced); FP8 weights need FP8 tensor cores (an FP8 KV cache
is storage only and runs anywhere); without chunked prefill a whole prompt must fit in one
iteration (``max_num_tokens >= input_len``); heuristic: TP stays inside the NVLink domain.

Expert parallelism (MoE models only): ``expert_parallel`` puts whole experts on the GPUs of the TP
group, ``ep = tp`` of them sharing the experts (which ``tp`` must divide), instead of a 1/tp share
of every expert. Only ``ep = tp`` is searched: it is what vLLM's ``--enable-expert-parallel``
does, and TensorRT-LLM (``--ep_size``) and SGLang (``--ep-size``) take it too, so every engine's
export can express the winner. At ``tp = 1`` the two are the same layout, kept once.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from autoparallel.costmodel.inference import KV_PRECISIONS, PRECISIONS, ServingEngine
from autoparallel.errors import UserError
from autoparallel.io import from_dict, read_yaml, resolve_preset
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

STRUCTURE = ("tp", "pp", "expert_parallel", "weight_precision", "kv_precision", "max_num_tokens")
PINNABLE = ("tp", "pp", "expert_parallel", "max_batch", "max_num_tokens", "weight_precision", "kv_precision")


@dataclass(frozen=True)
class InferenceSpace:
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4)
    max_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    max_num_tokens: tuple[int, ...] = (2048, 8192)
    add_max_batch: bool = True
    weight_precision: tuple[str, ...] = ("bf16",)
    kv_precision: tuple[str, ...] = ("bf16",)
    expert_parallel: tuple[bool, ...] = (False,)  # MoE: experts whole over the TP group (ep = tp)
    tp_within_nvlink_domain: bool = True

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "max_batch", "max_num_tokens"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        for name, valid in (("weight_precision", PRECISIONS), ("kv_precision", KV_PRECISIONS)):
            bad = sorted(set(getattr(self, name)) - set(valid))
            if bad or not getattr(self, name):
                raise ValueError(f"{name} {bad or '[]'} is not a non-empty list of {', '.join(valid)}")
        if not self.expert_parallel or any(not isinstance(v, bool) for v in self.expert_parallel):
            raise ValueError(f"expert_parallel must be a non-empty list of true / false, got {list(self.expert_parallel)}")

    def pinned(self, **pins: Any) -> InferenceSpace:
        """This space with each given knob fixed to one value (None leaves it searched)."""
        updates = {}
        for name, value in pins.items():
            if value is None:
                continue
            updates[name] = (value,) if name in PINNABLE else value
        if "max_batch" in updates:
            updates["add_max_batch"] = False
        return dataclasses.replace(self, **updates)


def load_space(name_or_path: str = "inference") -> InferenceSpace:
    from autoparallel.io import check_space_kind
    path = resolve_preset("spaces", name_or_path)
    data = read_yaml(path)
    check_space_kind(data, name_or_path, InferenceSpace, "infer")
    return from_dict(InferenceSpace, data, str(path))


def _first_reason(n: int, rules: list[tuple[np.ndarray, Any]], frame: pd.DataFrame) -> np.ndarray:
    reason = np.full(n, "", dtype=object)
    for broken, message in rules:
        broken = np.asarray(broken, dtype=bool) & (reason == "")
        if broken.any():
            reason[broken] = message(frame[broken]) if callable(message) else message
    return reason


def structures(model: ModelSpec, hw: HardwareSpec, gpus: int, space: InferenceSpace, engine: ServingEngine,
               input_len: int) -> pd.DataFrame:
    """Every (tp, pp, expert parallel, precisions, max tokens) with ``replicas``, ``ep`` and
    ``reason`` ('' = valid)."""
    if not model.is_moe and not any(v is False for v in space.expert_parallel):
        raise UserError(f"expert parallelism applies to MoE models; {model.name} is dense")
    df = pd.DataFrame(list(itertools.product(*(getattr(space, k) for k in STRUCTURE))), columns=list(STRUCTURE))
    # A dense model has no experts to spread; at tp = 1 expert parallel is the same layout.
    df = df[~df["expert_parallel"] | ((df["tp"] > 1) & model.is_moe)].reset_index(drop=True)
    df["ep"] = np.where(df["expert_parallel"], df["tp"], 1)
    tp, pp, ep = df["tp"].to_numpy(), df["pp"].to_numpy(), df["ep"].to_numpy()
    per_replica = tp * pp
    df["replicas"] = np.where(gpus % per_replica == 0, gpus // per_replica, 0)
    kv = model.query_groups
    rules = [
        (df["replicas"].to_numpy() == 0,
         lambda d: [f"tp*pp={a * b} does not divide {gpus} GPUs" for a, b in zip(d.tp, d.pp)]),
        (model.num_attention_heads % tp != 0,
         lambda d: [f"{model.num_attention_heads} attention heads not divisible by tp={a}" for a in d.tp]),
        ((kv % tp != 0) & (tp % kv != 0),
         lambda d: [f"{kv} KV heads neither divisible by tp={a} nor dividing it" for a in d.tp]),
        (space.tp_within_nvlink_domain & (tp > hw.nvlink_domain),
         lambda d: [f"tp={a} crosses the {hw.scale_up_domain}" for a in d.tp]),
        (pp > model.num_layers, lambda d: [f"pp={a} exceeds the {model.num_layers} layers" for a in d.pp]),
        (model.is_hybrid and "M" in model.hybrid_layer_pattern and (model.mamba_heads % tp != 0),
         lambda d: [f"{model.mamba_heads} Mamba heads not divisible by tp={a}" for a in d.tp]),
        ((model.num_experts or 1) % ep != 0,
         lambda d: [f"{model.num_experts} experts not divisible by ep={a}" for a in d.ep]),
        ((df["weight_precision"].to_numpy() == "fp8") & (not hw.supports_fp8),
         f"fp8 weights need FP8 tensor cores; {hw.name} has none"),
        ((df["weight_precision"].to_numpy() == "nvfp4") & (hw.fp4_tflops is None),
         f"nvfp4 weights need FP4 tensor cores; {hw.name} has none"),
        ((not engine.chunked_prefill) & (df["max_num_tokens"].to_numpy() < input_len),
         lambda d: [f"max_num_tokens={a} < input {input_len} without chunked prefill ({engine.name})"
                    for a in d.max_num_tokens]),
    ]
    df["reason"] = _first_reason(len(df), rules, df)
    return df


# What vLLM and SGLang need in the environment to serve past the model's context (they refuse otherwise).
LONG_CONTEXT_ENV = {"vllm": "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "sglang": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"}


def check_lengths(model: ModelSpec, input_len: int, output_len: int, max_model_len: int | None = None) -> int:
    """The engine's max model length for the request (default input + output). Longer than the
    model's context is allowed, as the engines allow it with a warning (``context_warning``);
    shorter than one request is not: the engine would refuse every request."""
    if input_len < 1 or output_len < 1:
        raise UserError(f"--input-len and --output-len must be positive, got {input_len} and {output_len}")
    if max_model_len is None:
        return input_len + output_len
    if max_model_len < input_len + output_len:
        raise UserError(f"--max-model-len {max_model_len} is shorter than --input-len {input_len} + --output-len "
                        f"{output_len} = {input_len + output_len}: the engine would refuse every request")
    return max_model_len


def context_warning(model: ModelSpec, input_len: int, output_len: int, max_model_len: int | None = None) -> str | None:
    """One line when the engine's max model length passes the model's context (None otherwise)."""
    length = check_lengths(model, input_len, output_len, max_model_len)
    if length <= model.context_length:
        return None
    return (f"max model length {length} exceeds the context of {model.name} ({model.context_length} tokens): priced "
            f"as asked; engines accept it with a warning (the vLLM and SGLang commands set {LONG_CONTEXT_ENV['vllm']}"
            f" and {LONG_CONTEXT_ENV['sglang']}), and output quality past the context is the model's business")


def parse_precision(value: str | None, flag: str, valid: tuple[str, ...] = PRECISIONS) -> str | None:
    """A precision flag's value, or a UserError naming it and the ``valid`` choices."""
    if value is None:
        return None
    if value not in valid:
        raise UserError(f"{flag} {value!r} is not one of {', '.join(valid)}")
    return value
