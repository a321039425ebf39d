"""Why no layout is valid or fits, naming first the pinned knob or the input that rules them out.

The candidates frame keeps every rejected layout with the first rule it broke (``reason``),
which hides the rules it would have broken later: counting reasons ("1290 x ep>1 needs a MoE
model") names the rules that reject the most layouts, usually knobs the user never touched.
What the user needs is the rule that rejects the layouts that came *closest*: among rejected
structures (tp, pp, vp, cp, ep, mbs) the rule checked last that any of them reached, and
likewise among feature combinations (SP, recompute, precision, ...). Each rule knows the knobs
and inputs it involves, so the message leads with a knob the user pinned (a knob with a single
value in the space) or the input (GPU count, global batch, model, hardware) that makes it
impossible.

The rule patterns follow the messages of ``autoparallel.space`` in the order it checks them; a
reason no pattern matches falls back to the most common reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from autoparallel.space import FEATURE_KNOBS, STRUCTURE_KNOBS, SearchSpace
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec


@dataclass(frozen=True)
class Rule:
    pattern: str  # matches the reason ``autoparallel.space`` writes
    knobs: tuple[str, ...]  # the knobs the rule involves (named first when pinned)


GBS_RULE = Rule(r"^gbs \d+ not divisible by mbs\*dp", ("mbs",))  # explained in numbers (``_gbs_message``)
STRUCTURE_RULES = (
    Rule(r"does not divide \d+ GPUs", ("tp", "pp", "cp")),
    Rule(r"attention heads not divisible by tp", ("tp",)),
    Rule(r"query groups not divisible by tp", ("tp",)),
    Rule(r"crosses the \d+-GPU NVLink domain", ("tp",)),
    Rule(r"interleaving \(vp>1\) needs pp>=2", ("vp", "pp")),
    Rule(r"layers not divisible by pp\*vp", ("pp", "vp")),
    Rule(r"not divisible by 2\*cp", ("cp",)),
    Rule(r"ep>1 needs a MoE model", ("ep",)),
    Rule(r"must divide num_experts and dp\*cp", ("ep",)),
    GBS_RULE,
    Rule(r"interleaving needs micro-batches", ("vp", "pp", "mbs")),
)
FEATURE_RULES = (
    Rule(r"TP comm overlap needs sequence parallel", ("tp_comm_overlap", "sp")),
    Rule(r"has no FP8 tensor cores", ("precision",)),
    Rule(r"mxfp8 needs Blackwell", ("precision",)),
    Rule(r"BF16 edge layers only apply to FP8", ("fp8_bf16_edge_layers", "precision")),
    Rule(r"delayed scaling cannot keep", ("precision", "fp8_bf16_edge_layers")),
    Rule(r"BF16 edge layers cover the whole model", ("fp8_bf16_edge_layers",)),
    Rule(r"param-gather overlap needs the distributed optimizer", ("overlap_dp_comm", "distributed_optimizer")),
    Rule(r"sequence parallel needs tp>1", ("sp", "tp")),
    Rule(r"^fp8-check:", ("precision", "fp8_bf16_edge_layers")),
)
# Knobs that set the memory of a layout, for a search where valid layouts exist but none fits, and
# the value that needs the least memory (None: no such value): a knob pinned there is not the cause.
MEMORY_KNOBS = {"tp": None, "pp": None, "cp": None, "vp": None, "mbs": 1, "recompute": "full",
                "precision": None, "sp": True, "distributed_optimizer": True}


def _deepest(reasons: pd.Series, rules: tuple[Rule, ...]) -> tuple[Rule | None, pd.Series | None]:
    """The last rule (in checking order) that any reason matches, and the rows it rejected."""
    for rule in reversed(rules):
        hit = reasons.str.contains(rule.pattern, regex=True)
        if hit.any():
            return rule, hit
    return None, None


def _fixed(space: SearchSpace) -> dict:
    """Knobs with one value in the space: pinned on the command line or by the space file."""
    out = {}
    for name in STRUCTURE_KNOBS + FEATURE_KNOBS:
        values = getattr(space, name)
        if len(values) == 1:
            out[name] = values[0]
    return out


def _pinned_lead(knobs: tuple[str, ...], fixed: dict) -> str:
    named = [f"{k} pinned to {_show(fixed[k])}" for k in knobs if k in fixed]
    return ("with " + " and ".join(named) + ": ") if named else ""


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _gbs_message(rows: pd.DataFrame, gpus: int, gbs: int, fixed: dict) -> str:
    """gbs not divisible by mbs*dp: too many GPUs, a pinned micro-batch, or a GPU count whose
    data-parallel share never divides the batch."""
    dp = rows["dp"].astype(int)
    product = int((rows["mbs"].astype(int) * dp).min())
    smallest_dp = int(dp.min())
    if smallest_dp > gbs:
        return (f"{gpus} GPUs leave at least {smallest_dp} data-parallel replicas (tp*pp*cp at most "
                f"{gpus // smallest_dp} in this space), more than the {gbs} sequences of a global "
                f"batch: use at most {gbs * (gpus // smallest_dp)} GPUs or a larger --gbs")
    if "mbs" in fixed and gbs % smallest_dp == 0:
        return (f"with mbs pinned to {fixed['mbs']}: gbs {gbs} is not divisible by mbs*dp in any layout "
                f"(the smallest mbs*dp is {product}); lower --mbs or make --gbs a multiple of {product}")
    return (f"gbs {gbs} is not divisible by mbs*dp in any layout of {gpus} GPUs (the smallest mbs*dp "
            f"is {product}): choose a --gbs divisible by {product} or another GPU count")


def _group_message(frame: pd.DataFrame, rules: tuple[Rule, ...], fixed: dict, gpus: int, gbs: int) -> str:
    reasons = frame["reason"].astype(str)
    rule, hit = _deepest(reasons, rules)
    if rule is None:
        return _counts(frame)
    if rule is GBS_RULE:
        return _gbs_message(frame[hit], gpus, gbs, fixed)
    return _pinned_lead(rule.knobs, fixed) + reasons[hit].iloc[0]


def _counts(frame: pd.DataFrame) -> str:
    """The fallback for reasons no rule pattern knows: the three most common."""
    counts = frame.loc[frame["reason"] != "", "reason"].astype(str).value_counts()
    return "; ".join(f"{n} x {reason}" for reason, n in counts.head(3).items())


def explain(frame: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int,
            space: SearchSpace, pinned: dict | None = None) -> str:
    """One line: why none of ``frame``'s candidates is a valid layout that fits.

    ``pinned``: the knobs the user pinned (the command line's); by default every knob with a
    single value in the space counts as pinned.
    """
    fixed = _fixed(space) if pinned is None else {k: v for k, v in pinned.items() if v is not None}
    head = f"no valid layout of {model.name} for {gpus} GPUs and gbs {gbs}: "
    has_structure = frame["tp"].notna()
    has_features = frame["precision"].notna()
    full = frame[has_structure & has_features]
    memory = full[full["reason"].astype(str).str.startswith("out of memory")]
    if not memory.empty:
        need = memory["peak_memory_gib"].min()
        limit = space.memory_fraction * hw.memory_gib
        causes = tuple(k for k, least in MEMORY_KNOBS.items() if k in fixed and fixed[k] != least)
        lead = _pinned_lead(causes, fixed)
        return (f"no layout of {model.name} fits on {gpus} x {hw.name}: {lead}the smallest memory need is "
                f"{need:.1f} GiB against a limit of {limit:.1f} GiB (try more GPUs, recompute, a smaller "
                "--mbs, or fewer pinned knobs)")
    if not full.empty:
        return head + _group_message(full, FEATURE_RULES, fixed, gpus, gbs)
    parts = []
    features = frame[has_features & ~has_structure]  # rejected feature combinations only
    if len(features) >= _combinations(space, FEATURE_KNOBS):  # ... and that is all of them
        parts.append(_group_message(features, FEATURE_RULES, fixed, gpus, gbs))
    structures = frame[has_structure & ~has_features]
    if len(structures) >= _combinations(space, STRUCTURE_KNOBS):
        parts.append(_group_message(structures, STRUCTURE_RULES, fixed, gpus, gbs))
    return head + ("; and ".join(parts) if parts else _counts(frame))


def _combinations(space: SearchSpace, knobs: tuple[str, ...]) -> int:
    return math.prod(len(getattr(space, name)) for name in knobs)
