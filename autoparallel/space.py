"""Search space -> candidate plans, each valid or rejected with the rule it broke.

Candidates are generated as columns (a pandas DataFrame), never as a list of Plan objects, so
that a space of 10^5 layouts is built and checked in a fraction of a second. Generation runs in
two stages: the *structure* (tp, pp, vp, cp, ep, mbs) is crossed and checked first, and only
valid structures are crossed with the *features* (SP, recompute, precision, overlaps), so an
impossible structure appears once in the results instead of once per feature combination.

Validity rules are Megatron-LM's own (DESIGN.md §4) plus the heuristic that TP stays inside
the NVLink domain. Memory is checked later, by the cost model.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from autoparallel.errors import UserError
from autoparallel.io import from_dict, read_yaml, resolve_preset
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import FP8_PRECISIONS, PRECISION_CHOICES, RECOMPUTE_CHOICES, Plan

# Plan fields the space does not search yet: every candidate takes the Plan's default.
PLAN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Plan)
                 if f.name in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                               "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                               "fsdp")}
STRUCTURE_KNOBS = ("tp", "pp", "vp", "cp", "ep", "mbs")
FEATURE_KNOBS = ("sp", "recompute", "distributed_optimizer", "overlap_dp_comm", "tp_comm_overlap",
                 "grad_reduce_in_fp32", "precision", "fp8_bf16_edge_layers", "flash_attention")


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    vp: tuple[int, ...] = (1, 2, 4)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1, 2, 4)
    sp: tuple[bool, ...] = (True, False)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    full_recompute_fractions: tuple[float, ...] = (1.0,)
    distributed_optimizer: tuple[bool, ...] = (True,)
    overlap_dp_comm: tuple[bool, ...] = (True,)
    tp_comm_overlap: tuple[bool, ...] = (False,)
    grad_reduce_in_fp32: tuple[bool, ...] = (True,)
    precision: tuple[str, ...] = ("bf16",)
    fp8_bf16_edge_layers: tuple[int, ...] = (0,)
    flash_attention: tuple[bool, ...] = (True,)
    memory_fraction: float = 0.95
    tp_within_nvlink_domain: bool = True

    def __post_init__(self) -> None:
        for name in STRUCTURE_KNOBS:
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        bad = set(self.recompute) - set(RECOMPUTE_CHOICES)
        if bad:
            raise ValueError(f"recompute {sorted(bad)} is not one of {', '.join(RECOMPUTE_CHOICES)}")
        bad = set(self.precision) - set(PRECISION_CHOICES)
        if bad:
            raise ValueError(f"precision {sorted(bad)} is not one of {', '.join(PRECISION_CHOICES)}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if any(not 0 < f <= 1 for f in self.full_recompute_fractions):
            raise ValueError(f"full_recompute_fractions must be in (0, 1], got {list(self.full_recompute_fractions)}")

    def pinned(self, **pins: Any) -> SearchSpace:
        """This space with each given knob fixed to one value (None leaves it searched)."""
        updates = {}
        for name, value in pins.items():
            if value is None:
                continue
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise KeyError(name)
            updates[name] = value if name in ("memory_fraction", "tp_within_nvlink_domain") else (value,)
        return dataclasses.replace(self, **updates)


def load_space(name_or_path: str = "training") -> SearchSpace:
    path = resolve_preset("spaces", name_or_path)
    return from_dict(SearchSpace, read_yaml(path), str(path))


def _product(names: tuple[str, ...], space: SearchSpace) -> pd.DataFrame:
    values = [getattr(space, n) for n in names]
    return pd.DataFrame(list(itertools.product(*values)), columns=list(names))


def _first_reason(df: pd.DataFrame, rules: list[tuple[np.ndarray, Any]]) -> np.ndarray:
    """For each row, the message of the first rule it breaks ('' if none)."""
    reason = np.full(len(df), "", dtype=object)
    for broken, message in rules:
        broken = np.asarray(broken, dtype=bool) & (reason == "")
        if broken.any():
            text = message(df[broken]) if callable(message) else np.full(broken.sum(), message)
            reason[broken] = np.asarray(text, dtype=object)
        if (reason != "").all():
            break
    return reason


def _structure_rules(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int,
                     space: SearchSpace) -> np.ndarray:
    tp, pp, vp, cp, ep, mbs = (df[k].to_numpy() for k in STRUCTURE_KNOBS)
    model_parallel = tp * pp * cp
    dp = np.where(gpus % model_parallel == 0, gpus // model_parallel, 0)
    df["dp"] = dp
    safe_dp = np.maximum(dp, 1)
    m = np.where(gbs % (mbs * safe_dp) == 0, gbs // (mbs * safe_dp), 0)
    experts = model.num_experts or 1
    rules = [
        (dp == 0, lambda d: [f"tp*pp*cp={a * b * c} does not divide {gpus} GPUs"
                             for a, b, c in zip(d.tp, d.pp, d.cp)]),
        (model.num_attention_heads % tp != 0,
         lambda d: [f"{model.num_attention_heads} attention heads not divisible by tp={a}" for a in d.tp]),
        (model.query_groups % tp != 0,
         lambda d: [f"{model.query_groups} query groups not divisible by tp={a}" for a in d.tp]),
        (space.tp_within_nvlink_domain & (tp > hw.nvlink_domain),
         lambda d: [f"tp={a} crosses the {hw.nvlink_domain}-GPU NVLink domain" for a in d.tp]),
        ((vp > 1) & (pp < 2), "interleaving (vp>1) needs pp>=2"),
        (model.num_layers % (pp * vp) != 0,
         lambda d: [f"{model.num_layers} layers not divisible by pp*vp={a * b}" for a, b in zip(d.pp, d.vp)]),
        ((cp > 1) & (model.seq_length % (2 * cp) != 0),
         lambda d: [f"seq_length {model.seq_length} not divisible by 2*cp={2 * a}" for a in d.cp]),
        ((ep > 1) & (experts <= 1), "ep>1 needs a MoE model"),
        ((ep > 1) & ((experts % ep != 0) | ((safe_dp * cp) % ep != 0)),
         lambda d: [f"ep={a} must divide num_experts and dp*cp" for a in d.ep]),
        (m == 0, lambda d: [f"gbs {gbs} not divisible by mbs*dp={a * b}" for a, b in zip(d.mbs, d.dp)]),
        ((vp > 1) & (m % pp != 0),
         lambda d: [f"interleaving needs micro-batches ({gbs // (a * b)}) divisible by pp={c}"
                    for a, b, c in zip(d.mbs, d.dp, d.pp)]),
    ]
    return _first_reason(df, rules)


def _feature_rules(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec) -> np.ndarray:
    """Rules on the feature knobs alone (no structure needed)."""
    precision = df["precision"].to_numpy()
    fp8 = np.isin(precision, FP8_PRECISIONS)
    edge = df["fp8_bf16_edge_layers"].to_numpy()
    rules = [
        (df.tp_comm_overlap.to_numpy() & ~df.sp.to_numpy(), "TP comm overlap needs sequence parallel"),
        (fp8 & (not hw.supports_fp8), f"{hw.name} has no FP8 tensor cores"),
        ((precision == "mxfp8") & (not hw.mxfp8), f"mxfp8 needs Blackwell; {hw.name} lacks it"),
        ((edge > 0) & ~fp8, "BF16 edge layers only apply to FP8 precisions"),
        ((edge > 0) & (precision == "fp8-delayed"), "delayed scaling cannot keep first/last layers in BF16"),
        (2 * edge >= model.num_layers, "BF16 edge layers cover the whole model"),
        (df.overlap_param_gather.to_numpy() & ~df.distributed_optimizer.to_numpy(),
         "param-gather overlap needs the distributed optimizer"),
    ]
    return _first_reason(df, rules)


def _cross(structures: pd.DataFrame, features: pd.DataFrame) -> pd.DataFrame:
    """Valid structures x valid features. Sequence parallel means nothing at tp=1 (Megatron turns
    it off), so tp=1 structures only get the SP-off features when the space has any."""
    tp1 = structures.tp == 1
    no_sp = features[~features.sp]
    parts = [structures[~tp1].merge(features, how="cross"),
             structures[tp1].merge(no_sp if not no_sp.empty else features, how="cross")]
    out = pd.concat(parts, ignore_index=True)
    out["reason"] = np.where(out.sp & (out.tp == 1), "sequence parallel needs tp>1", "")
    return out


def generate(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
             recompute_num_layers: int | None = None) -> pd.DataFrame:
    """Every candidate of ``space`` as a DataFrame of Plan columns plus ``reason`` ('' = valid).

    A structure or a feature combination that breaks a rule on its own appears once, with the
    other knobs left empty; everything else is a full layout.
    """
    if gpus < 1:
        raise UserError(f"--gpus must be a positive integer, got {gpus}")
    if gbs < 1:
        raise UserError(f"--gbs must be a positive integer, got {gbs}")
    structures = _product(STRUCTURE_KNOBS, space)
    structures["reason"] = _structure_rules(structures, model, hw, gpus, gbs, space)

    features = _product(FEATURE_KNOBS, space)
    features["overlap_grad_reduce"] = features.pop("overlap_dp_comm")
    features["overlap_param_gather"] = features["overlap_grad_reduce"]
    features["reason"] = _feature_rules(features, model, hw)

    valid_structures = structures[structures.reason == ""].drop(columns="reason")
    valid_features = features[features.reason == ""].drop(columns="reason")
    crossed = _cross(valid_structures, valid_features)
    crossed = _expand_recompute_layers(crossed, model, space, recompute_num_layers)
    out = pd.concat([crossed, structures[structures.reason != ""], features[features.reason != ""]],
                    ignore_index=True)
    out["gbs"] = gbs
    for name, default in PLAN_DEFAULTS.items():
        if name not in out:
            out[name] = default
    return out[list(Plan.field_names()) + ["reason"]]


def _expand_recompute_layers(df: pd.DataFrame, model: ModelSpec, space: SearchSpace,
                             pinned: int | None) -> pd.DataFrame:
    """Give full-recompute rows one row per layer count (fractions of the pipeline chunk)."""
    chunk = model.num_layers // (df.pp * df.vp)
    full = df.recompute == "full"
    parts = [df[~full].assign(recompute_num_layers=0)]
    if pinned is not None:
        parts.append(df[full].assign(recompute_num_layers=np.minimum(pinned, chunk[full])))
    else:
        for fraction in space.full_recompute_fractions:
            layers = np.maximum(1, np.ceil(fraction * chunk[full]).astype(int))
            parts.append(df[full].assign(recompute_num_layers=np.where(layers >= chunk[full], 0, layers)))
    out = pd.concat(parts, ignore_index=True)
    return out.drop_duplicates(ignore_index=True)


def row_to_plan(row: Any) -> Plan:
    """One candidates row (a Series or dict, from a DataFrame or a CSV) as a Plan; a knob the
    row lacks (a run folder written before the knob existed) takes the Plan's default."""
    hints = typing.get_type_hints(Plan)
    values = {}
    for f in dataclasses.fields(Plan):
        if f.name not in row and f.default is not dataclasses.MISSING:
            continue
        value = row[f.name]
        if hints[f.name] is int:
            value = int(value)
        elif hints[f.name] is bool:
            value = value if isinstance(value, (bool, np.bool_)) else str(value).lower() == "true"
            value = bool(value)
        values[f.name] = value
    return Plan(**values)
