"""Range checks on the numbers autoparallel did not compute itself (issue 25): measured step
times, throughputs, TFLOP/s and memory from logs and runs CSVs, and the stored metrics of a run
folder read back for ``export`` and ``report``.

A zero, negative, NaN or infinite measurement is never a real run: used, it divides by zero in
an error percentage or drags a fit; read back from a run folder, it means the folder was damaged
(edited, truncated, half copied). So a measured row with such a value is skipped with its reason
(``skip_bad_rows``: the command goes on with the others, or exits 2 when none is left), and a
run folder with one is refused, naming the first damaged value (``first_damage``).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Iterable

import numpy as np
import pandas as pd

from autoparallel.errors import UserError

# Percentages that are a share of a peak: a measured MFU above 100 % is a unit mistake.
PERCENT_COLUMNS = ("measured_mfu_pct",)


def problem(name: str, value, positive: bool = True) -> str:
    """Why ``value`` (of column/field ``name``) is no valid measurement; "" if it is one."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"{name} = {value!r} is not a number"
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        return f"{name} = {value} is not a finite {'positive' if positive else 'non-negative'} number"
    if name in PERCENT_COLUMNS and number > 100:
        return f"{name} = {value} is above 100 %"
    return ""


def row_problems(frame: pd.DataFrame, positive: Iterable[str], non_negative: Iterable[str] = (),
                 required: Iterable[str] = ()) -> pd.Series:
    """Per row, the first bad value among the given columns ("" if none). An empty cell is
    fine (the measurement was not made) unless its column is ``required``."""
    reasons = pd.Series("", index=frame.index, dtype=object)
    required = set(required)
    checks = [(c, True) for c in positive] + [(c, False) for c in non_negative]
    for column, must_be_positive in checks:
        if column not in frame:
            continue
        raw = frame[column]
        numbers = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        given = raw.notna().to_numpy() & (raw.astype(str).str.strip() != "").to_numpy()
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(numbers) & (numbers > 0 if must_be_positive else numbers >= 0)
            if column in PERCENT_COLUMNS:
                ok &= numbers <= 100
        bad = (given & ~ok) | ((~given) & (column in required))
        first = bad & (reasons == "").to_numpy()
        if first.any():
            reasons[first] = [problem(column, v, must_be_positive) if g else f"{column} is empty"
                              for v, g in zip(raw[first], given[first])]
    return reasons


def warn(message: str) -> None:
    """One line on stderr for something skipped; the command goes on."""
    print(f"autoparallel: warning: {' '.join(message.split())}", file=sys.stderr)


def skip_bad_rows(frame: pd.DataFrame, what: str, ids: pd.Series, positive: Iterable[str],
                  required: Iterable[str] = ()) -> pd.DataFrame:
    """``frame`` without its rows holding a bad measurement, each skipped row named on stderr
    with its reason; a UserError (the first reason) when no row is left."""
    reasons = row_problems(frame, positive, required=required)
    bad = reasons != ""
    if not bad.any():
        return frame
    if bad.all():
        first = reasons.index[0]
        raise UserError(f"{what} row {ids[first]}: {reasons[first]}; no usable row is left")
    for i in reasons.index[bad]:
        warn(f"{what} row {ids[i]} skipped: {reasons[i]}")
    return frame[~bad]


def first_damage(frame: pd.DataFrame, path, positive: Iterable[str], non_negative: Iterable[str] = (),
                 measured: Iterable[str] = ()) -> None:
    """A UserError naming ``path``, the row and the value if a stored table lacks one of the
    ``positive`` columns or holds an impossible value: an empty or non-positive ``positive``
    cell, a negative ``non_negative`` one, a non-positive ``measured`` one where given (the
    folder was damaged after it was written)."""
    positive = list(positive)
    missing = [c for c in positive if c not in frame]
    if missing:
        raise UserError(f"{path} is damaged: it has no column {', '.join(missing)} (run the search again)")
    reasons = row_problems(frame, [*positive, *measured], non_negative, required=positive)
    bad = reasons != ""
    if bad.any():
        i = reasons.index[bad][0]
        rank = frame.at[i, "rank"] if "rank" in frame else None
        where = f"rank {rank:.0f}" if isinstance(rank, numbers.Real) and math.isfinite(rank) else f"line {i + 2}"
        raise UserError(f"{path} is damaged: {where}: {reasons[i]} (run the search again)")
