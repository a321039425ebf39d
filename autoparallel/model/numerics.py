"""FP8 numerics statistics per tensor and layer (DESIGN.md §6), as a pandas DataFrame.

For every operand an Fp8Linear quantizes (input, weight, grad_output) the recorder compares the
high-precision tensor with its FP8 round trip: MSE, cosine similarity, underflow % (non-zero
values that became zero), overflow % (values clipped at fp8_max), amax, scale, and for delayed
scaling the ratio of the scale used to the scale the tensor's own amax would give. These are the
signals FP8 debugging relies on: large underflow in one layer's input says keep it in BF16,
overflow says the scale is stale or the margin wrong.

The recorder is a hook the layers call only while it is attached (``with recorder.attached(
model)``); each call reduces to a few scalars at once, so nothing large is kept alive, and
``every`` skips steps to keep the overhead low on long runs.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from autoparallel.model.fp8 import Fp8Tensor, attach_observer
from autoparallel.model.microscaling import BlockScaled
from autoparallel.model.recipes import Fp8Policy, Recipe

COLUMNS = ("step", "layer", "tensor", "format", "numel", "mse", "cos_sim", "underflow_pct",
           "overflow_pct", "amax", "scale", "delayed_current_ratio")


FP8_FORMATS = {torch.float8_e4m3fn: "E4M3", torch.float8_e5m2: "E5M2"}
E2M1_OVERFLOW = 7.0  # half an ulp (2) above E2M1's max 6, as _overflow_threshold for FP8


def _overflow_threshold(dtype: torch.dtype) -> float:
    """Scaled magnitudes above this would round past fp8_max if the format had more range:
    half an ulp above max (464 for E4M3, 61440 for E5M2). Rounding of the scale itself by an
    fp32 ulp is not overflow."""
    finfo = torch.finfo(dtype)
    ulp_at_max = 2.0 ** (math.floor(math.log2(finfo.max)) - _mantissa_bits(dtype))
    return finfo.max + ulp_at_max / 2


def _mantissa_bits(dtype: torch.dtype) -> int:
    return {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}[dtype]


def format_of(quantized) -> str:
    """E4M3 / E5M2 for an ``Fp8Tensor``, E2M1 (NVFP4) / E4M3 (MXFP8) for a ``BlockScaled``."""
    if isinstance(quantized, BlockScaled):
        return quantized.fmt
    return FP8_FORMATS[quantized.data.dtype]


def _round_trip(quantized) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized values, the magnitude past which each element overflowed) of an FP8 tensor
    or a microscaled one."""
    if isinstance(quantized, BlockScaled):
        past_max = E2M1_OVERFLOW if quantized.fmt == "E2M1" else \
            _overflow_threshold(torch.float8_e4m3fn)
        return quantized.dequantize(), quantized.element_scale() * past_max
    dtype = quantized.data.dtype
    unit = Fp8Tensor(torch.ones_like(quantized.data, dtype=torch.float32).to(dtype),
                     quantized.scale_inv, quantized.block).dequantize()  # scale_inv per element
    return quantized.dequantize(), unit * _overflow_threshold(dtype)


def tensor_stats(high_precision: torch.Tensor, quantized,
                 current_scale: torch.Tensor | None = None) -> dict[str, float]:
    """Statistics of one round trip through FP8 (``Fp8Tensor``) or a microscaled format
    (``BlockScaled``); pure function, tested on its own. ``scale`` is the smallest encode
    scale (for NVFP4 the per-tensor one times the smallest block's)."""
    hp = high_precision.detach().float()
    dq, limit = _round_trip(quantized)
    finite = torch.isfinite(hp)
    diff = torch.where(finite, dq - hp, torch.zeros_like(hp))
    hp_f = torch.where(finite, hp, torch.zeros_like(hp))
    denom = hp_f.norm() * dq.nan_to_num(0.0, 0.0, 0.0).norm()
    cos = (hp_f.flatten() @ dq.nan_to_num(0.0, 0.0, 0.0).flatten()) / denom if denom > 0 else \
        torch.tensor(1.0 if hp_f.abs().sum() == 0 and dq.abs().sum() == 0 else 0.0)
    nonzero = hp != 0
    underflow = (nonzero & (dq == 0)).sum().item()
    overflow = (hp.abs() > limit).sum().item()
    if isinstance(quantized, BlockScaled):
        scale = (quantized.scale * quantized.global_inv).reciprocal().min().item()
    else:
        scale = quantized.scale_inv.reciprocal().min().item()
    ratio = float("nan")
    if current_scale is not None and quantized.block is None:
        ratio = (quantized.scale_inv.reciprocal() / current_scale).item()
    return {
        "numel": hp.numel(),
        "mse": (diff.square().mean()).item() if hp.numel() else 0.0,
        "cos_sim": float(cos),
        "underflow_pct": 100.0 * underflow / max(1, int(nonzero.sum().item())),
        "overflow_pct": 100.0 * overflow / max(1, hp.numel()),
        "amax": hp.abs().max().item() if hp.numel() else 0.0,
        "scale": scale,
        "delayed_current_ratio": ratio,
    }


@dataclass
class NumericsRecorder:
    """Collects ``tensor_stats`` rows from every Fp8Linear of a model while attached."""

    every: int = 1
    step: int = 0
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every={self.every} must be >= 1")

    def __call__(self, layer: str, role: str, high_precision: torch.Tensor,
                 quantized: Fp8Tensor, current_scale: torch.Tensor | None) -> None:
        if self.step % self.every:
            return
        with torch.no_grad():
            stats = tensor_stats(high_precision, quantized, current_scale)
        fmt = format_of(quantized)
        self.rows.append({"step": self.step, "layer": layer, "tensor": role, "format": fmt,
                          **stats})

    @contextlib.contextmanager
    def attached(self, model: nn.Module):
        attach_observer(model, self)
        try:
            yield self
        finally:
            attach_observer(model, None)

    def dataframe(self) -> pd.DataFrame:
        """One row per recorded quantization (step, layer, tensor)."""
        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    def summary(self) -> pd.DataFrame:
        """One row per (layer, tensor): means over steps, worst overflow / underflow, max amax."""
        df = self.dataframe()
        if df.empty:
            return df
        return (df.groupby(["layer", "tensor", "format"], sort=False)
                .agg(steps=("step", "nunique"), mse=("mse", "mean"), cos_sim=("cos_sim", "min"),
                     underflow_pct=("underflow_pct", "mean"),
                     max_underflow_pct=("underflow_pct", "max"),
                     overflow_pct=("overflow_pct", "mean"),
                     max_overflow_pct=("overflow_pct", "max"), amax=("amax", "max"),
                     scale=("scale", "last"),
                     delayed_current_ratio=("delayed_current_ratio", "mean"))
                .reset_index())


def collect_numerics(recipe: Recipe, steps: int = 20, every: int = 1, config=None, spec=None
                     ) -> tuple[pd.DataFrame, list[float]]:
    """Train the tiny model with ``recipe`` in every layer; (per-layer summary, losses)."""
    from autoparallel.model.train import TrainConfig, build_model
    from autoparallel.model.transformer import TINY

    spec = spec or TINY
    config = config or TrainConfig(steps=steps, batch_size=8)
    policy = Fp8Policy(recipe)
    recorder, result = train_recorded(policy, config, spec, build_model(policy, spec, config.seed), every)
    return recorder.summary(), result.losses


def train_recorded(policy: Fp8Policy, config, spec, model: nn.Module, every: int):
    """Train ``model`` with a ``NumericsRecorder`` attached that samples every ``every`` steps;
    (the recorder, train's result). The recorder's step is advanced by train's callback, so each
    sample is tagged with the step whose casts it saw (the tiny model's and the FP8 check's runs)."""
    from autoparallel.model.train import train
    recorder = NumericsRecorder(every=every)

    def advance(step: int, _model: nn.Module) -> None:
        recorder.step = step + 1

    with recorder.attached(model):
        result = train(policy, config, spec, model=model, on_step=advance)
    return recorder, result


def policy_from_numerics(summary: pd.DataFrame, recipe: Recipe, max_underflow_pct: float = 5.0,
                         max_overflow_pct: float = 0.1, min_cos_sim: float = 0.99) -> Fp8Policy:
    """Keep in BF16 every layer whose inputs, weights or gradients FP8 represents badly."""
    bad = summary[(summary["underflow_pct"] > max_underflow_pct)
                  | (summary["overflow_pct"] > max_overflow_pct)
                  | (summary["cos_sim"] < min_cos_sim)]
    return Fp8Policy(recipe, bf16_modules=tuple(sorted(set(bad["layer"]))))


__all__ = ["NumericsRecorder", "collect_numerics", "policy_from_numerics", "tensor_stats"]
