"""The decision rule: per-layer statistics and a loss gap in, ``ok`` / ``ok with BF16 layers`` /
``reject`` out. Pure pandas (no torch), so it is tested on constructed tables.

A run *passes* when (1) its final loss (mean of the last ``final_window`` steps) is within
``max_loss_gap_pct`` of the BF16 run's, and (2) no tensor (input, weight, grad_output) of any
layer still running in FP8 has a mean underflow above ``max_underflow_pct`` or a mean overflow
above ``max_overflow_pct`` over the recorded steps. (1) catches damage that the statistics do
not show; (2) catches damage the 200-step loss is too short or too noisy to show (95 % overflow
in one FC2 can cost less than the seed noise of the loss over a short run, and hurt later).

The full-FP8 run passing gives ``ok``. Otherwise candidate sets of transformer layers to keep in
BF16 are re-run, smallest first (``candidate_sets``): the damaged layers must be in the set,
then the layers are taken by severity, then the first / last layers (the usual FP8 practice).
The first set whose run passes gives ``ok with BF16 layers [...]``; if none does (or more layers
are damaged than ``max_bf16_layers`` allows), ``reject`` with the failure of the full-FP8 run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

OK, OK_BF16, REJECT = "ok", "ok-bf16-layers", "reject"
SUMMARY_COLUMNS = ("layer", "layer_index", "tensor", "format", "steps", "mse", "cos_sim",
                   "underflow_pct", "max_underflow_pct", "overflow_pct", "max_overflow_pct",
                   "amax", "scale", "delayed_current_ratio")


def summarize(stats: pd.DataFrame) -> pd.DataFrame:
    """Per-step rows -> one row per (module, tensor): means over the recorded steps, the worst
    cosine similarity and step, the largest amax. Blockwise recipes quantize some operands twice
    per step (two tilings); both count."""
    if stats.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    return (stats.groupby(["layer", "layer_index", "tensor", "format"], sort=False)
            .agg(steps=("step", "nunique"), mse=("mse", "mean"), cos_sim=("cos_sim", "min"),
                 underflow_pct=("underflow_pct", "mean"),
                 max_underflow_pct=("underflow_pct", "max"),
                 overflow_pct=("overflow_pct", "mean"), max_overflow_pct=("overflow_pct", "max"),
                 amax=("amax", "max"), scale=("scale", "last"),
                 delayed_current_ratio=("delayed_current_ratio", "mean"))
            .reset_index())


def loss_gap_pct(loss: float, bf16_loss: float) -> float:
    """Relative gap of the final loss to BF16's, in %; inf when the run diverged."""
    if not math.isfinite(loss):
        return math.inf
    return 100.0 * (loss - bf16_loss) / bf16_loss


def damaged(summary: pd.DataFrame, thresholds) -> pd.DataFrame:
    """Rows of ``summary`` over a threshold, with a ``problem`` column naming what and how much."""
    under = summary["underflow_pct"] > thresholds.max_underflow_pct
    over = summary["overflow_pct"] > thresholds.max_overflow_pct
    out = summary[under | over].copy()
    out["problem"] = [
        (f"overflow {r.overflow_pct:.2f} %" if r.overflow_pct > thresholds.max_overflow_pct
         else f"underflow {r.underflow_pct:.2f} %")
        for r in out.itertuples()]
    out["severity"] = [max(r.overflow_pct / max(thresholds.max_overflow_pct, 1e-12),
                           r.underflow_pct / max(thresholds.max_underflow_pct, 1e-12))
                       for r in out.itertuples()]
    return out.sort_values("severity", ascending=False)


def describe_damage(bad: pd.DataFrame, limit: int = 3) -> str:
    """'layers.1.mlp.w2 input overflow 95.1 %; ...' for the worst ``limit`` tensors."""
    parts = [f"{r.layer} {r.tensor} {r.problem}" for r in bad.head(limit).itertuples()]
    more = len(bad) - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def failures(gap: float, bad: pd.DataFrame, thresholds) -> list[str]:
    """Why a run does not pass (empty: it passes)."""
    why = []
    if not gap <= thresholds.max_loss_gap_pct:
        what = "diverged (non-finite loss)" if math.isinf(gap) else \
            f"loss gap {gap:+.2f} % > {thresholds.max_loss_gap_pct:g} %"
        why.append(what)
    if not bad.empty:
        n_layers = bad["layer_index"].nunique()
        why.append(f"{n_layers} layer(s) beyond the numerics thresholds: {describe_damage(bad)}")
    return why


def layer_severity(summary: pd.DataFrame, thresholds) -> pd.Series:
    """One score per transformer layer, worst first: its worst tensor's underflow or overflow
    relative to the threshold, with 1 - cos_sim breaking ties among healthy layers."""
    score = pd.concat([
        summary["overflow_pct"] / max(thresholds.max_overflow_pct, 1e-12),
        summary["underflow_pct"] / max(thresholds.max_underflow_pct, 1e-12),
        (1.0 - summary["cos_sim"]) * 1e-3,
    ], axis=1).max(axis=1)
    return score.groupby(summary["layer_index"]).max().sort_values(ascending=False, kind="stable")


def candidate_sets(summary: pd.DataFrame, bad: pd.DataFrame, num_layers: int, thresholds,
                   max_layers: int) -> list[tuple[int, ...]]:
    """Sets of layers to try in BF16, smallest first; each contains every damaged layer."""
    must = set(bad["layer_index"].astype(int))
    limit = min(max_layers, num_layers - 1)
    if len(must) > limit:
        return []
    order = [int(i) for i in layer_severity(summary, thresholds).index]
    order += [i for i in range(num_layers) if i not in order]
    sets: list[tuple[int, ...]] = []
    for k in range(max(1, len(must)), limit + 1):
        by_severity = list(must) + [i for i in order if i not in must]
        edges = list(must) + [i for pair in zip(range(num_layers), range(num_layers - 1, -1, -1))
                              for i in pair if i not in must]
        for source in (by_severity, edges):
            chosen = tuple(sorted(list(dict.fromkeys(source))[:k]))
            if chosen not in sets:
                sets.append(chosen)
    return sets


def end_sets(bad: pd.DataFrame, num_layers: int, max_layers: int) -> list[tuple[int, ...]]:
    """The last 1, 2, ... ``max_layers`` layers (fewer than all), each containing every damaged
    layer: the only BF16 sets Megatron's ``--num-layers-at-end-in-bf16`` expresses."""
    first_bad = int(bad["layer_index"].min()) if not bad.empty else num_layers
    return [tuple(range(num_layers - n, num_layers))
            for n in range(1, min(max_layers, num_layers - 1) + 1) if num_layers - n <= first_bad]


@dataclass
class Verdict:
    """The outcome for one recipe (``bf16_layers`` are proxy layer indices)."""

    recipe: str
    status: str
    loss_gap_pct: float          # of the full-FP8 run
    bf16_layers: tuple[int, ...] = ()
    gap_with_bf16_layers_pct: float = math.nan
    reason: str = ""
    worst: str = ""              # the worst tensors of the full-FP8 run, for the printout
    reruns: int = 0
    flags: str = ""              # the Megatron flag that keeps those layers in BF16, if one does

    @property
    def text(self) -> str:
        if self.status == OK:
            return "ok"
        if self.status == OK_BF16:
            return f"ok with BF16 layers {list(self.bf16_layers)}" + \
                (f" ({self.flags})" if self.flags else "")
        return f"reject: {self.reason}"
