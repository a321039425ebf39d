"""The serving search space and its candidates: TP x PP x precisions x batch, with the rule each breaks.

Rules (vLLM's and TensorRT-LLM's own): ``tp * pp`` divides the GPUs (the rest are replicas);
attention heads divisible by ``tp``; KV heads divisible by ``tp`` or, when ``tp`` exceeds them,
dividing it (each KV head is then replicated); ``pp`` at most the layer count (uneven splits
are allowed, the fullest stage is priced); FP8 weights need FP8 tensor cores (an FP8 KV cache
is storage only and runs anywhere); heuristic: TP stays inside the NVLink domain.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from autoparallel.costmodel.inference import PRECISIONS
from autoparallel.errors import UserError
from autoparallel.io import from_dict, read_yaml, resolve_preset
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

STRUCTURE = ("tp", "pp", "weight_precision", "kv_precision")


@dataclass(frozen=True)
class InferenceSpace:
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4)
    batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    add_max_batch: bool = True
    weight_precision: tuple[str, ...] = ("bf16",)
    kv_precision: tuple[str, ...] = ("bf16",)
    memory_fraction: float = 0.9
    prefill_chunk_tokens: int = 8192
    tp_within_nvlink_domain: bool = True

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "batch"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        for name in ("weight_precision", "kv_precision"):
            bad = sorted(set(getattr(self, name)) - set(PRECISIONS))
            if bad or not getattr(self, name):
                raise ValueError(f"{name} {bad or '[]'} is not a non-empty list of {', '.join(PRECISIONS)}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be positive, got {self.prefill_chunk_tokens}")

    def pinned(self, **pins: Any) -> InferenceSpace:
        """This space with each given knob fixed to one value (None leaves it searched)."""
        updates = {}
        for name, value in pins.items():
            if value is None:
                continue
            if name in ("tp", "pp", "batch", "weight_precision", "kv_precision"):
                updates[name] = (value,)
            else:
                updates[name] = value
        if "batch" in updates:
            updates["add_max_batch"] = False
        return dataclasses.replace(self, **updates)


def load_space(name_or_path: str = "inference") -> InferenceSpace:
    path = resolve_preset("spaces", name_or_path)
    return from_dict(InferenceSpace, read_yaml(path), str(path))


def _first_reason(n: int, rules: list[tuple[np.ndarray, Any]], frame: pd.DataFrame) -> np.ndarray:
    reason = np.full(n, "", dtype=object)
    for broken, message in rules:
        broken = np.asarray(broken, dtype=bool) & (reason == "")
        if broken.any():
            reason[broken] = message(frame[broken]) if callable(message) else message
    return reason


def structures(model: ModelSpec, hw: HardwareSpec, gpus: int, space: InferenceSpace) -> pd.DataFrame:
    """Every (tp, pp, weight precision, KV precision) with ``replicas`` and ``reason`` ('' = valid)."""
    df = pd.DataFrame(list(itertools.product(*(getattr(space, k) for k in STRUCTURE))), columns=list(STRUCTURE))
    tp, pp = df["tp"].to_numpy(), df["pp"].to_numpy()
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
         lambda d: [f"tp={a} crosses the {hw.nvlink_domain}-GPU NVLink domain" for a in d.tp]),
        (pp > model.num_layers, lambda d: [f"pp={a} exceeds the {model.num_layers} layers" for a in d.pp]),
        ((df["weight_precision"].to_numpy() == "fp8") & (not hw.supports_fp8),
         f"fp8 weights need FP8 tensor cores; {hw.name} has none"),
    ]
    df["reason"] = _first_reason(len(df), rules, df)
    return df


def check_lengths(model: ModelSpec, input_len: int, output_len: int) -> None:
    if input_len < 1 or output_len < 1:
        raise UserError(f"--input-len and --output-len must be positive, got {input_len} and {output_len}")
    if input_len + output_len > model.seq_length:
        raise UserError(f"--input-len {input_len} + --output-len {output_len} = {input_len + output_len} "
                        f"exceeds the context of {model.name} ({model.seq_length} tokens)")


def parse_precision(value: str | None, flag: str) -> str | None:
    """A precision flag's value, or a UserError naming it and the valid choices."""
    if value is None:
        return None
    if value not in PRECISIONS:
        raise UserError(f"{flag} {value!r} is not one of {', '.join(PRECISIONS)}")
    return value
