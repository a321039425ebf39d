"""The seam between search strategies and what prices a layout (DESIGN.md §2).

An evaluator takes candidates as columns (a DataFrame of Plan fields plus ``reason``, '' for a
valid layout) and returns them with predicted or measured metrics, and with ``reason`` filled in
for layouts that do not fit. The grid hands it every candidate at once; a sampler hands it one
trial at a time. The cost model is one evaluator; profiling jobs are another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from autoparallel.costmodel.candidates import STRUCTURE_COLUMNS, structure, structures
from autoparallel.costmodel.estimate import estimate_columns
from autoparallel.space import Source, source_labels
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class AtRows:
    """A column of ``n`` rows known at ``rows`` only (``values[i]`` is row ``rows[i]``'s; NaN, or False,
    elsewhere): the cost model prices the valid rows alone. ``grid.rank`` gathers it from ``values``
    (``taken``): written out at full length first (``full``), each metric cost a fill and a scatter
    over millions of rows before rank gathered it again."""

    values: np.ndarray
    rows: np.ndarray
    n: int

    @property
    def fill(self):
        return False if self.values.dtype == bool else np.nan

    def full(self) -> np.ndarray:
        out = np.full(self.n, self.fill, dtype=self.values.dtype)
        out[self.rows] = self.values
        return out

    def slots(self, order: np.ndarray) -> np.ndarray:
        """Where each row of ``order`` is in ``values`` (``len(values)``: not there), for ``taken``;
        the same for every column known at the same ``rows``."""
        where = np.full(self.n, len(self.rows))
        where[self.rows] = np.arange(len(self.rows))
        return where.take(order)

    def taken(self, slots: np.ndarray) -> np.ndarray:
        """``full().take(order)``, ``slots`` being ``slots(order)``."""
        return np.append(self.values, np.array(self.fill, dtype=self.values.dtype)).take(slots)


class Evaluator(Protocol):
    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        """Candidates with metric columns, ``fits`` and ``reason`` for the rejected."""


class CostModelEvaluator:
    """Prices candidates with the calibrated cost model: microseconds each, vectorised."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, memory_fraction: float,
                 progress: Callable[[int, int], None] | None = None, settings: Mapping[str, object] | None = None):
        """``progress(done, total)``: told after each priced chunk (a progress bar on millions of rows);
        ``settings``: run-level columns every candidate shares (``SearchSpace.cost_settings``)."""
        self.model, self.hardware, self.memory_fraction = model, hardware, memory_fraction
        self.progress = progress
        self.settings = dict(settings or {})

    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        out = candidates.copy()
        for key, column in self.columns(candidates).items():
            out[key] = column.full() if isinstance(column, AtRows) else column
        return out

    def columns(self, candidates: pd.DataFrame,
                sources: Mapping[str, Source] | None = None) -> dict[str, np.ndarray | AtRows]:
        """The metric columns of ``candidates`` (``AtRows``: priced at the valid rows), ``fits``
        first, then ``reason`` with the out-of-memory rows' reasons filled in: what ``evaluate`` adds
        or replaces (the grid ranks them before building one frame; millions of rows are copied
        once, not thrice). ``sources``: string columns of ``candidates`` as codes
        (``space.generate_with_sources``), handed to the cost model as its labels (``estimate_columns``)."""
        reason = candidates["reason"].to_numpy(dtype=object)
        valid = reason == ""
        rows = np.flatnonzero(valid)
        if len(rows):
            # Every row's values: each chunk takes its valid rows on its own thread (``_estimate``).
            cols = {name: candidates[name].to_numpy() for name in Plan.field_names()}
            structure_cols = self._structure_columns(cols, sources or {})
            out = {key: AtRows(values, rows, len(candidates))
                   for key, values in self._estimate(cols, rows, sources or {}, structure_cols).items()}
        else:
            out = {key: AtRows(np.zeros(0, dtype=dtype), rows, len(candidates))
                   for key, dtype in (("fits", bool), ("peak_memory_gib", float), ("tokens_per_s_per_gpu", float))}
        limit = self.memory_fraction * self.hardware.memory_gib
        oom = ~out["fits"].values  # of the valid rows
        # one string per distinct need (to 0.1 GiB), not per row: millions of rows on MoE spaces
        needs, which = np.unique(np.round(out["peak_memory_gib"].values[oom], 1), return_inverse=True)
        texts = np.array([f"out of memory: needs {need:.1f} GiB, limit {limit:.1f} GiB" for need in needs],
                         dtype=object)
        reason = reason.copy()
        reason[rows[oom]] = texts[which.reshape(-1)]
        out["reason"] = reason
        out["fits"] = out["fits"].full()  # reason == "" (every reason is a non-empty string), not compared row by row
        return out

    def _structure_columns(self, cols: dict[str, np.ndarray], sources: Mapping[str, Source]
                           ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """The candidates' structures as the cost model's ``STRUCTURE_COLUMNS`` of each (a short
        frame) and each row's position there: the columns ``sources`` takes from one short frame
        (the structures'), and a column holding one value in every row (the global batch) as that
        value; None where the columns are not all such (a frame without sources)."""
        if "tp" not in sources or set(self.settings) & set(STRUCTURE_COLUMNS):
            return None
        rows = sources["tp"].rows
        short = {name: source.short.to_numpy() for name, source in sources.items() if source.rows is rows}
        for name in set(STRUCTURE_COLUMNS) - set(short):
            values = cols[name]
            if not len(values) or (values != values[0]).any():
                return None
            short[name] = np.full(len(short["tp"]), values[0])
        return short, rows

    def _estimate(self, cols: dict[str, np.ndarray], rows: np.ndarray, sources: Mapping[str, Source],
                  structure_cols: tuple[dict[str, np.ndarray], np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Metric columns of the rows ``rows`` of ``cols`` (``estimate_columns``), one value per
        row of ``rows``. Priced in cache-sized chunks (the cost model's intermediates then stay in the
        CPU cache: twice as fast as one call on millions of rows), on a thread per core (NumPy
        releases the GIL inside each operation). ``structure_cols``: the structures' columns and each row's
        structure (``_structure_columns``): each chunk's structures are priced once each
        (``candidates.structures``)."""
        source_labels(sources, slice(0))  # the codes made once, before the threads ask for them
        every = None
        if structure_cols:  # the structures of the rows priced (the short frame has the rejected ones too), once
            short, of_row = structure_cols
            used = np.zeros(len(short["tp"]), dtype=bool)
            used[of_row[rows]] = True
            every = structure(self.model, self.hardware, {name: values[used] for name, values in short.items()}
                              | self.settings)  # a recipe's BF16 end layers are counted on their stages
            renumbered = np.cumsum(used) - 1  # a structure's position among those

        def price(start: int) -> tuple[int, dict[str, np.ndarray]]:
            at = rows[start:start + CHUNK_ROWS]
            if at[-1] - at[0] + 1 == len(at):  # a run of rows (most chunks: the rejected are few, bunched)
                at = slice(at[0], at[-1] + 1)  # read in place, not copied
            chunk = {k: v[at] for k, v in cols.items()}
            chunk.update(self.settings)
            labels = source_labels(sources, at)
            known = structures(every, renumbered[of_row[at]]) if every is not None else None
            return start, estimate_columns(self.model, self.hardware, chunk, self.memory_fraction, labels, known)

        starts = range(0, len(rows), CHUNK_ROWS)
        workers = min(len(starts), cores())
        out: dict[str, np.ndarray] = {}
        with ThreadPoolExecutor(max(workers, 1)) as pool:  # no thread starts for a single chunk
            for start, metrics in (pool.map if workers > 1 else map)(price, starts):
                for key, values in metrics.items():
                    if key not in out:
                        out[key] = np.empty(len(rows), dtype=values.dtype)
                    out[key][start:start + CHUNK_ROWS] = values
                if self.progress:
                    self.progress(min(start + CHUNK_ROWS, len(rows)), len(rows))
        return out


def cores() -> int:
    """CPUs this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
