"""FP8 check verdicts as search restrictions (``autoparallel search --fp8-check``).

A verdict on the proxy becomes, for the real model:

* ``ok``: the recipe stays in the space unchanged;
* ``reject``: the recipe leaves the space (its rows never get generated);
* ``ok with BF16 layers``: if the layers are the first / last n proxy layers, the plan must keep
  at least n first and last layers of the real model in BF16 (the search knob
  ``fp8_bf16_edge_layers``, exported as Megatron-LM's ``--first-last-layers-bf16``
  ``--num-layers-at-start-in-bf16 n --num-layers-at-end-in-bf16 n``); the first and last layers
  are special by position (embeddings in, logits out), so n carries over unscaled. Under delayed
  scaling Megatron-LM refuses BF16 edge layers, so such a recipe is removed with that reason.
  A middle proxy layer stands for its block of real layers (``proxy.real_layers``): the rows keep
  their edge knob and carry the real layer list, which best.yaml exports as a list (Megatron-LM
  has no flag for it; TransformerEngine's per-module fp8_autocast does it).

Pure pandas: the search imports this without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoparallel.errors import UserError
from autoparallel.fp8check.proxy import edge_count, real_layers
from autoparallel.space import SearchSpace
from autoparallel.specs.plan import FP8_PRECISIONS

OK, OK_BF16, REJECT = "ok", "ok-bf16-layers", "reject"  # the statuses of fp8check.verdict


@dataclass(frozen=True)
class RecipeDecision:
    """What the search does with one precision after the check."""

    precision: str
    status: str                       # ok | ok-bf16-layers | reject
    verdict: str                      # the text shown in the ranked table (real-model layers)
    edge_layers: int = 0              # minimum fp8_bf16_edge_layers
    bf16_layers: tuple[int, ...] = ()  # real-model layers, when not expressible as edges
    reason: str = ""

    @property
    def layer_list(self) -> str:
        return compress(self.bf16_layers)


def compress(layers: tuple[int, ...]) -> str:
    """(20, 21, ..., 39, 60) -> '20-39,60'."""
    parts, run = [], []
    for i in sorted(layers):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def decide(precision: str, status: str, verdict_text: str, proxy_bf16_layers: tuple[int, ...],
           proxy_layers: int, model_layers: int, reason: str = "") -> RecipeDecision:
    """Map one proxy verdict onto the real model."""
    if status == REJECT:
        return RecipeDecision(precision, REJECT, verdict_text, reason=reason or verdict_text)
    if status == OK or not proxy_bf16_layers:
        return RecipeDecision(precision, OK, verdict_text)
    n = edge_count(tuple(proxy_bf16_layers), proxy_layers)
    if n is not None:
        if precision == "fp8-delayed":
            return RecipeDecision(precision, REJECT, verdict_text, reason=(
                f"fp8-check: needs the first/last {n} layer(s) in BF16, which Megatron-LM does "
                "not allow with delayed scaling"))
        if 2 * n >= model_layers:
            return RecipeDecision(precision, REJECT, verdict_text,
                                  reason="fp8-check: the BF16 edge layers cover the whole model")
        return RecipeDecision(precision, OK_BF16, f"ok with BF16 first/last {n} layer(s)",
                              edge_layers=n)
    layers = tuple(sorted({r for i in proxy_bf16_layers
                           for r in real_layers(i, proxy_layers, model_layers)}))
    return RecipeDecision(precision, OK_BF16, f"ok with BF16 layers {compress(layers)}",
                          bf16_layers=layers)


def decisions_from_check(result) -> dict[str, RecipeDecision]:
    """Decisions for every recipe of an ``fp8check.check.CheckResult``."""
    return {label: decide(label, v.status, v.text, v.bf16_layers, result.proxy.num_layers,
                          result.model.num_layers, v.reason)
            for label, v in result.verdicts.items()}


def restrict_space(space: SearchSpace, decisions: dict[str, RecipeDecision]) -> SearchSpace:
    """The space without rejected recipes, with every required edge-layer count searchable."""
    keep = tuple(p for p in space.precision
                 if p not in decisions or decisions[p].status != REJECT)
    if not keep:
        why = "; ".join(f"{p}: {d.reason}" for p, d in decisions.items() if p in space.precision)
        raise UserError(f"fp8-check rejected every precision of the search space ({why})")
    needed = {d.edge_layers for p, d in decisions.items() if p in keep and d.edge_layers}
    edges = tuple(sorted(set(space.fp8_bf16_edge_layers) | needed))
    return dataclasses.replace(space, precision=keep, fp8_bf16_edge_layers=edges)


def apply_to_candidates(candidates: pd.DataFrame, decisions: dict[str, RecipeDecision]
                        ) -> pd.DataFrame:
    """Candidates with ``fp8_check`` (the verdict of the row's precision) and ``fp8_bf16_layers``
    columns; a valid row with fewer BF16 edge layers than its recipe needs gets a reason."""
    out = candidates.copy()
    precision = out["precision"].astype(object)
    fp8 = precision.isin(FP8_PRECISIONS).to_numpy()
    verdict = np.where(fp8, "not checked", "-").astype(object)  # bf16 rows: "-"
    layer_list = np.full(len(out), "", dtype=object)
    reason = out["reason"].to_numpy(dtype=object).copy()
    edges = pd.to_numeric(out["fp8_bf16_edge_layers"], errors="coerce").to_numpy()
    for name, d in decisions.items():
        rows = (precision == name).to_numpy()
        verdict[rows] = d.verdict
        layer_list[rows] = d.layer_list
        if d.status == REJECT:
            broken = rows & (reason == "")
            reason[broken] = f"fp8-check: {d.reason}"
        elif d.edge_layers:
            broken = rows & (reason == "") & (edges < d.edge_layers)
            reason[broken] = (f"fp8-check: {name} needs the first/last {d.edge_layers} layer(s) "
                              "in BF16")
    out["reason"] = reason
    out["fp8_check"] = verdict
    out["fp8_bf16_layers"] = layer_list
    return out


def document(row: pd.Series) -> dict | None:
    """best.yaml's ``fp8_check`` block for a ranked row (None when the search ran without it)."""
    text = row.get("fp8_check", "")
    if not isinstance(text, str) or text in ("", "-"):
        return None
    doc = {"verdict": text, "bf16_edge_layers": int(row["fp8_bf16_edge_layers"])}
    layers = row.get("fp8_bf16_layers", "")
    if isinstance(layers, str) and layers:
        doc["bf16_layers"] = layers
        doc["note"] = ("Megatron-LM has no flag for a BF16 layer list: keep these layers out of "
                       "TransformerEngine's fp8_autocast (or exclude them in your FP8 config)")
    return doc
