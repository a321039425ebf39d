"""Exhaustive search: price every valid candidate with the cost model in one vectorised call.

Right whenever an evaluation costs microseconds (the cost model); a sampler that spends few
trials well is for evaluations that cost minutes (profiling jobs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoparallel.costmodel.estimate import estimate_columns
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

RANK_METRIC = "tokens_per_s_per_gpu"


def evaluate(model: ModelSpec, hw: HardwareSpec, candidates: pd.DataFrame,
             memory_fraction: float) -> pd.DataFrame:
    """Add predicted metrics to every valid candidate, reject those that do not fit, and rank.

    Returns the candidates sorted best first; ``rank`` is 1.. for feasible plans and empty for
    the rest, whose ``reason`` says why they were rejected.
    """
    out = candidates.copy()
    valid = (out["reason"] == "").to_numpy()
    cols = {name: out.loc[valid, name].to_numpy() for name in Plan.field_names()}
    predicted = estimate_columns(model, hw, cols, memory_fraction) if valid.any() else {}
    for key, values in predicted.items():
        column = np.full(len(out), np.nan if values.dtype != bool else False, dtype=values.dtype)
        column[valid] = values
        out[key] = column
    if not valid.any():
        out["fits"] = False
        out["peak_memory_gib"] = np.nan
        out[RANK_METRIC] = np.nan
    limit = memory_fraction * hw.memory_gib
    oom = valid & ~out["fits"].to_numpy(dtype=bool)
    out.loc[oom, "reason"] = [f"out of memory: needs {need:.1f} GiB, limit {limit:.1f} GiB"
                              for need in out.loc[oom, "peak_memory_gib"]]
    feasible = (out["reason"] == "").to_numpy()
    out["fits"] = feasible
    order = np.lexsort((-np.nan_to_num(out[RANK_METRIC].to_numpy(), nan=-1.0), ~feasible))
    out = out.iloc[order].reset_index(drop=True)
    out.insert(0, "rank", pd.array(np.where(out["fits"], np.arange(1, len(out) + 1), 0), dtype="Int64"))
    out.loc[~out["fits"], "rank"] = pd.NA
    return out
