"""The seam between search strategies and what prices a layout (DESIGN.md §2).

An evaluator takes candidates as columns (a DataFrame of Plan fields plus ``reason``, '' for a
valid layout) and returns them with predicted or measured metrics, and with ``reason`` filled in
for layouts that do not fit. The grid hands it every candidate at once; a sampler hands it one
trial at a time. The cost model is one evaluator; profiling jobs are another.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd

from autoparallel.costmodel.estimate import estimate_columns
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


class Evaluator(Protocol):
    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        """Candidates with metric columns, ``fits`` and ``reason`` for the rejected."""


class CostModelEvaluator:
    """Prices candidates with the calibrated cost model: microseconds each, vectorised."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, memory_fraction: float):
        self.model, self.hardware, self.memory_fraction = model, hardware, memory_fraction

    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        out = candidates.copy()
        valid = (out["reason"] == "").to_numpy()
        if valid.any():
            cols = {name: out[name].to_numpy()[valid] for name in Plan.field_names()}
            for key, values in estimate_columns(self.model, self.hardware, cols, self.memory_fraction).items():
                column = np.full(len(out), False if values.dtype == bool else np.nan, dtype=values.dtype)
                column[valid] = values
                out[key] = column
        else:
            out["fits"], out["peak_memory_gib"], out["tokens_per_s_per_gpu"] = False, np.nan, np.nan
        limit = self.memory_fraction * self.hardware.memory_gib
        oom = valid & ~out["fits"].to_numpy(dtype=bool)
        # one string per distinct need (to 0.1 GiB), not per row: millions of rows on MoE spaces
        needs, which = np.unique(np.round(out["peak_memory_gib"].to_numpy()[oom], 1), return_inverse=True)
        texts = np.array([f"out of memory: needs {need:.1f} GiB, limit {limit:.1f} GiB" for need in needs],
                         dtype=object)
        reason = out["reason"].to_numpy(dtype=object).copy()
        reason[oom] = texts[which.reshape(-1)]
        out["reason"] = reason
        out["fits"] = (out["reason"] == "").to_numpy()
        return out
