"""Profile the best predicted layouts and re-rank by what was measured (DESIGN.md §2, §7).

``profile_top`` hands the top-k feasible rows of a ranked frame to a profiling evaluator and
merges the measured columns back; ``rerank`` puts layouts that ran first (by measured tokens/s
per GPU), then those not profiled (by prediction), then those whose job failed, which keep their
predicted ``fits`` but carry the failure in ``measurement_error``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoparallel.search.grid import RANK_METRIC


def profile_top(ranked: pd.DataFrame, evaluator, k: int) -> pd.DataFrame:
    feasible = ranked.index[ranked["fits"].to_numpy(dtype=bool)][:k]
    measured = evaluator.evaluate(ranked.loc[feasible])
    out = ranked.copy()
    for col in measured.columns:
        if col not in out.columns:
            out[col] = "" if col == "measurement_error" else np.nan
        out.loc[feasible, col] = measured[col]
    return rerank(out)


def rerank(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.drop(columns=["rank"], errors="ignore")
    fits = frame["fits"].to_numpy(dtype=bool)
    measured = frame["measured_tokens_per_s_per_gpu"].to_numpy(dtype=float)
    error = frame["measurement_error"].fillna("").astype(str).to_numpy()
    group = np.where(~fits, 3, np.where(error != "", 2, np.where(np.isfinite(measured), 0, 1)))
    metric = np.where(group == 0, measured, frame[RANK_METRIC].to_numpy(dtype=float))
    order = np.lexsort((-np.nan_to_num(metric, nan=-1.0), group))
    out = frame.iloc[order].reset_index(drop=True)
    ranks = pd.array(np.arange(1, len(out) + 1), dtype="Int64")
    ranks[~out["fits"].to_numpy(dtype=bool)] = pd.NA
    out.insert(0, "rank", ranks)
    return out
