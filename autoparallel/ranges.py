"""Range checks on the numbers autoparallel did not compute itself (issue 25): measured step
times, throughputs, TFLOP/s and memory from logs and runs CSVs, and the stored metrics of a run
folder read back for ``export`` and ``report``.

A zero, negative, NaN or infinite measurement is never a real run: used, it divides by zero in
an error percentage or drags a fit; read back from a run folder, it means the folder was damaged
(edited, truncated, half copied). So a measured row with such a value is skipped with its reason
(``skip_bad_rows``: the command goes on with the others, or exits 2 when none is left), and a
run folder with one is refused, naming the first damaged value (``first_damage``).

A finite positive number can still be no measurement: 10^30 TFLOP/s, a 10^-12 s step or 10^15 MB
of memory are unit mistakes or damage, and used they would drag a fit as surely as a NaN does.
So each measured quantity has a plausible range (``PLAUSIBLE``), wide enough for any GPU a
decade from now and narrow enough to catch a unit slip of a thousand; and a count (``tp``,
``num_gpus``, ``gbs``) must be a whole number of at least 1 (``COUNT_COLUMNS``): ``tp=1.5`` was
read as 1.
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

# The plausible range of each measured unit: (lowest, highest, unit, why the bounds).
_STEP_S = (1e-4, 86_400.0, "s", "a training step launches hundreds of kernels, over 0.1 ms, and one of a day is no run")
_TFLOPS = (1e-3, 1e5, "TFLOP/s", "the top is over 6x the densest FP4 peak of any GPU, GB300's 15,000")
_GIB = (1e-3, 4096.0, "GiB", "the top is over 14x the largest GPU memory, B300's 288 GB")
_TOKENS_PER_GPU = (1e-3, 1e9, "tokens/s", "at 10^15 FLOP/s even a 10^6-parameter model trains under 2e8 tokens/s")
_TOKENS = (1e-3, 1e10, "tokens/s", "the top is over 10^5 times the fastest published 8-GPU server")
_LATENCY_MS = (1e-2, 86_400_000.0, "ms", "a kernel launch alone takes ~5 us, and a request of a day is no measurement")
PLAUSIBLE = {
    "measured_iteration_time_s": _STEP_S,
    "elapsed time per iteration (ms)": (1e-1, 86_400_000.0, "ms", _STEP_S[3]),
    "measured_hw_tflops_per_gpu": _TFLOPS, "measured_model_tflops_per_gpu": _TFLOPS, "TFLOP/s": _TFLOPS,
    "measured_forced_tflops_per_gpu": _TFLOPS, "measured_dropless_tflops_per_gpu": _TFLOPS,
    "measured_max_allocated_gib": _GIB, "measured_max_reserved_gib": _GIB,
    "measured_tokens_per_s_per_gpu": _TOKENS_PER_GPU, "throughput_tokens_per_s": _TOKENS,
    "ttft_ms": _LATENCY_MS, "tpot_ms": _LATENCY_MS, "latency_ms": _LATENCY_MS,
}

# Counts a measured training row states: whole numbers of at least 1 where given.
COUNT_COLUMNS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                 "vocab_size", "seq_length", "num_gpus", "tp", "pp", "cp", "vp", "ep", "etp", "mbs", "gbs")


def _outside(name: str, number: float) -> str:
    """Why ``number`` is outside ``name``'s plausible range; "" if inside or not bounded."""
    if name not in PLAUSIBLE:
        return ""
    low, high, unit, why = PLAUSIBLE[name]
    if low <= number <= high:
        return ""
    return f"{name} = {number:g} is outside the plausible {low:g}..{high:g} {unit}: {why}"


def count_problem(name: str, value) -> str:
    """Why ``value`` is no count (a whole number of at least 1); "" if it is one."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"{name} = {value!r} is not a positive integer"
    if not (math.isfinite(number) and number >= 1 and number % 1 == 0):
        return f"{name} = {value} is not a positive integer"
    return ""


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
    return _outside(name, number)


def _numbers(raw: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A column's cells as floats (NaN where not a number) and whether each is given (not empty)."""
    numbers = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    return numbers, raw.notna().to_numpy() & (raw.astype(str).str.strip() != "").to_numpy()


def row_problems(frame: pd.DataFrame, positive: Iterable[str], non_negative: Iterable[str] = (),
                 required: Iterable[str] = (), counts: Iterable[str] = ()) -> pd.Series:
    """Per row, the first bad value among the given columns ("" if none): ``counts`` first, then
    the measurements. An empty cell is fine (the measurement was not made) unless its column is
    ``required``."""
    reasons = pd.Series("", index=frame.index, dtype=object)
    for column in counts:
        if column in frame:
            raw = frame[column]
            numbers, given = _numbers(raw)
            with np.errstate(invalid="ignore"):
                bad = given & ~(np.isfinite(numbers) & (numbers >= 1) & (numbers % 1 == 0))
            first = bad & (reasons == "").to_numpy()
            if first.any():
                reasons[first] = [count_problem(column, v) for v in raw[first]]
    required = set(required)
    checks = [(c, True) for c in positive] + [(c, False) for c in non_negative]
    for column, must_be_positive in checks:
        if column not in frame:
            continue
        raw = frame[column]
        numbers, given = _numbers(raw)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(numbers) & (numbers > 0 if must_be_positive else numbers >= 0)
            if column in PERCENT_COLUMNS:
                ok &= numbers <= 100
            if column in PLAUSIBLE:
                ok &= (numbers >= PLAUSIBLE[column][0]) & (numbers <= PLAUSIBLE[column][1])
        bad = (given & ~ok) | ((~given) & (column in required))
        first = bad & (reasons == "").to_numpy()
        if first.any():
            reasons[first] = [problem(column, v, must_be_positive) if g else f"{column} is empty"
                              for v, g in zip(raw[first], given[first])]
    return reasons


def warn(message: str) -> None:
    """One line on stderr for something skipped (broken between phrases on a terminal); the command goes on."""
    from autoparallel.report.fit import for_stderr
    print(for_stderr(f"autoparallel: warning: {' '.join(message.split())}"), file=sys.stderr)


def skip_bad_rows(frame: pd.DataFrame, what: str, ids: pd.Series, positive: Iterable[str],
                  required: Iterable[str] = (), counts: Iterable[str] = ()) -> pd.DataFrame:
    """``frame`` without its rows holding a bad measurement or count, each skipped row named on
    stderr with its reason; a UserError (the first reason) when no row is left."""
    reasons = row_problems(frame, positive, required=required, counts=counts)
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
