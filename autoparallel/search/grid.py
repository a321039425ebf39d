"""Exhaustive search: price every valid candidate in one vectorised call, then rank.

Right whenever an evaluation costs microseconds (the cost model); a sampler that spends few
trials well (``autoparallel.search.sampler``) is for evaluations that cost minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from autoparallel.search.evaluators import AtRows, CostModelEvaluator, cores
from autoparallel.space import Source
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

RANK_METRIC = "tokens_per_s_per_gpu"


def rank(frame: pd.DataFrame, columns: dict[str, np.ndarray | AtRows] | None = None,
         sources: dict[str, Source] | None = None) -> pd.DataFrame:
    """Sort best first; ``rank`` is 1.. for feasible plans and NA for the rejected. ``columns``:
    arrays (or ``AtRows``) to set on ``frame`` (new ones appended, existing ones replaced in place), set
    after sorting so that each row is copied once. ``sources``: columns of ``frame`` as short columns
    and positions (``space.generate_with_sources``): the positions are gathered once per short
    frame, each column from its short one, which stays in the CPU cache (a random gather of
    millions of rows per column otherwise, and of Python strings, holding the GIL row by row)."""
    columns = columns or {}
    sources = sources or {}
    if any(len(source.rows) != len(frame) for source in sources.values()):
        raise ValueError("sources of another frame: not as many positions as rows")
    fits = _full(columns["fits"]) if "fits" in columns else frame["fits"].to_numpy(dtype=bool)
    metric = _full(columns[RANK_METRIC]) if RANK_METRIC in columns else frame[RANK_METRIC].to_numpy(dtype=float)
    feasible = np.asarray(fits, dtype=bool)
    order = np.lexsort((-np.nan_to_num(np.asarray(metric, dtype=float), nan=-1.0), ~feasible))
    slots = {}  # per set of rows that ``AtRows`` columns are known at (the same object for all of them)
    for column in columns.values():
        if isinstance(column, AtRows) and id(column.rows) not in slots:
            slots[id(column.rows)] = column.slots(order)
    # Every column gathered in ``order`` on the pool, the frame's as well as the new ones: a random
    # gather of millions of rows waits on memory, column by column (frame.iloc[order] gathered the
    # frame's 40 columns on one thread before the pool started). One frame from the columns, not
    # column by column: setting a column copies it (a DataFrame owns what it is given).
    replaced = {name: values for name, values in columns.items() if name in frame.columns}
    names = list(frame.columns) + [name for name in columns if name not in replaced]

    def gathered(name: str):
        if name in replaced or name not in frame.columns:
            column = columns[name]
            return column.taken(slots[id(column.rows)]) if isinstance(column, AtRows) else column.take(order)
        values = frame[name].array
        if _one_value(values):
            return values.copy()
        if name in sources:
            return sources[name].short.take(ordered[id(sources[name].rows)])
        return values.take(order)

    with ThreadPoolExecutor(cores()) as pool:  # NumPy's and pandas' takes release the GIL
        # Each short frame's positions in ``order`` (the structures', the combinations'), gathered once.
        positions = {id(source.rows): source.rows for source in sources.values()}
        ordered = dict(zip(positions, pool.map(lambda rows: rows.take(order), positions.values())))
        out = dict(zip(names, pool.map(gathered, names)))
    if "rank" in out:
        raise ValueError("cannot insert rank, already exists")  # as DataFrame.insert: a frame ranked twice
    ranks = pd.array(np.arange(1, len(order) + 1), dtype="Int64")
    ranks[~np.asarray(out["fits"], dtype=bool)] = pd.NA
    return pd.DataFrame({"rank": ranks, **out}, copy=False)


def _full(column: np.ndarray | AtRows) -> np.ndarray:
    return column.full() if isinstance(column, AtRows) else column


def _one_value(values) -> bool:
    """Whether a NumPy-backed column holds one value in every row, bit for bit (then it reads the
    same in any order: a search's frame has a dozen such knobs, each a random gather saved)."""
    if not isinstance(values, pd.arrays.NumpyExtensionArray) or values.dtype.kind not in "biuf" or not len(values):
        return False
    bits = values.to_numpy()
    bits = bits.view(f"u{bits.itemsize}")
    return bool((bits == bits[0]).all())


def evaluate(model: ModelSpec, hw: HardwareSpec, candidates: pd.DataFrame, memory_fraction: float,
             progress: Callable[[int, int], None] | None = None, settings: dict | None = None,
             sources: dict[str, Source] | None = None) -> pd.DataFrame:
    """Every candidate priced by the cost model and ranked; ``progress(done, total)`` as it goes;
    ``settings``: the space's run-level facts (``SearchSpace.cost_settings``); ``sources``: see ``rank``."""
    evaluator = CostModelEvaluator(model, hw, memory_fraction, progress, settings)
    return rank(candidates, evaluator.columns(candidates, sources), sources)
