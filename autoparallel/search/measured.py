"""Profile the best predicted layouts and re-rank by what was measured (DESIGN.md §2, §7).

One path for both search strategies, so a grid run and a sampler run profile the same layouts
the same way: ``choose`` picks the layouts from a ranked frame, an evaluator (profiling jobs or
layer profiles) measures them, and ``merge`` writes the measured rows back and re-ranks.
``rerank`` puts layouts that ran first (by measured tokens/s per GPU), then those not profiled
(by prediction), then those whose job failed, which keep their predicted ``fits`` but carry the
failure in ``measurement_error``. Layer profiles measure no throughput (they re-price the
prediction), so a frame with only those re-ranks by the re-priced prediction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoparallel.report.plots import pareto_front
from autoparallel.report.tables import LAYOUT_KEYS
from autoparallel.search.grid import RANK_METRIC, rank
from autoparallel.specs.plan import Plan

# Profiling measures a layout: it never changes which layout a row is, nor the prediction's
# verdict on it (a failed job is a ``measurement_error``), so ``merge`` leaves these alone.
_IDENTITY = frozenset(Plan.field_names()) | {"rank", "trial", "fits", "reason"}
_TEXT_COLUMNS = ("measurement_error", "measured_device")  # '' where not profiled, like ``reason``


def choose(ranked: pd.DataFrame, k: int, pareto: bool = False) -> pd.Index:
    """Index labels of ``k`` feasible candidates to measure: the best predicted variant of each
    distinct layout (TP/PP/CP/DP/EP) first, by predicted throughput, then the other variants (a
    profiling job per layout tells more than two recompute variants of one: issue 26).
    ``pareto``: only from the throughput/memory Pareto front (a two-objective study asked for
    the trade-off, so profiling confirms the trade-off rather than k near-twins of its top)."""
    pool = ranked[ranked["fits"].to_numpy(dtype=bool)]
    if pareto and not pool.empty:
        front = pareto_front(pool["peak_memory_gib"].to_numpy(dtype=float),
                             pool[RANK_METRIC].to_numpy(dtype=float))
        pool = pool.iloc[np.sort(front)]
    order = pool.sort_values(RANK_METRIC, ascending=False, kind="stable")
    first = ~order.duplicated([c for c in LAYOUT_KEYS if c in order]).to_numpy()
    return order.index[first].append(order.index[~first])[:max(k, 0)]


def profile_top(ranked: pd.DataFrame, evaluator, k: int,
                pareto: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure the layouts ``choose`` picks; return (the re-ranked frame, the profiled rows)."""
    rows = ranked.loc[choose(ranked, k, pareto)].drop(columns=["rank"], errors="ignore")
    profiled = evaluator.evaluate(rows)
    return merge(ranked, profiled), profiled


def merge(ranked: pd.DataFrame, profiled: pd.DataFrame) -> pd.DataFrame:
    """``ranked`` with the measured columns of ``profiled`` written into the rows of the same
    index label (columns it lacks are added, empty elsewhere), re-ranked."""
    out = ranked.drop(columns=["rank"], errors="ignore").copy()
    for col in profiled.columns:
        if col in _IDENTITY:
            continue
        if col not in out.columns:
            out[col] = "" if col in _TEXT_COLUMNS else np.nan
        out.loc[profiled.index, col] = profiled[col]
    return rerank(out)


def rerank(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.drop(columns=["rank"], errors="ignore")
    if "measured_tokens_per_s_per_gpu" not in frame:  # layer profiles only: re-priced prediction
        return rank(frame)
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
