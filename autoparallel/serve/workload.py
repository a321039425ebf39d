"""Request-length workloads: the (input, output) tokens of the requests a deployment serves.

A serving layout's throughput and tail latency depend on the spread of request lengths, not only
their means (a few long prompts stall the chunked-prefill budget; a few long answers hold KV
blocks). ``--workload`` names one of the distributions in ``search_spaces/workloads.yaml`` (the
MLPerf Inference LLM benchmarks and a ShareGPT chat mix, each with its source and which of its
numbers are published, the rest stated assumptions) or a user's CSV / JSONL / JSON-array file of
pairs. Fixed ``--input-len/--output-len`` is the degenerate workload (every request the same).

``Workload.sample(n, seed)`` draws ``n`` requests deterministically: named distributions as a
clipped log-normal per side whose sample mean is rescaled to the stated mean; files by drawing
their rows with replacement (all rows in file order when ``n`` equals their count).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autoparallel import io, safefile
from autoparallel.argtypes import MAX_COUNT
from autoparallel.errors import UserError

WORKLOADS = io.SEARCH_SPACES / "workloads.yaml"
SIDE_KEYS = ("mean", "max", "min", "sigma")
#: Column / key names a user file may use for the two lengths.
INPUT_KEYS = ("input_len", "input_tokens", "input", "prompt_tokens")
OUTPUT_KEYS = ("output_len", "output_tokens", "output", "completion_tokens")
_RESCALE_STEPS = 20


@dataclass(frozen=True)
class LengthDistribution:
    """One side (input or output) of a named workload: clipped log-normal with a target mean."""

    mean: float
    max: int
    min: int = 1
    sigma: float = 0.8

    def __post_init__(self) -> None:
        if not (1 <= self.min <= self.mean <= self.max) or self.sigma < 0:
            raise ValueError(f"need 1 <= min <= mean <= max and sigma >= 0, got {self}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths in [min, max] whose mean is the target (to within rounding)."""
        x = np.exp(rng.normal(0.0, self.sigma, n))
        scale = self.mean / x.mean()
        for _ in range(_RESCALE_STEPS):  # clipping moves the mean: rescale until it holds
            y = np.clip(x * scale, self.min, self.max)
            if abs(y.mean() - self.mean) < 1e-3 * self.mean:
                break
            scale *= self.mean / y.mean()
        return np.clip(np.rint(y), self.min, self.max).astype(np.int64)


@dataclass(frozen=True)
class Workload:
    """A request-length workload: a named distribution, a file of pairs, or one fixed pair."""

    name: str
    source: str = ""
    input: LengthDistribution | None = None
    output: LengthDistribution | None = None
    pairs: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False)

    @staticmethod
    def fixed(input_len: int, output_len: int) -> Workload:
        return Workload(f"fixed {input_len}/{output_len}",
                        pairs=(np.array([input_len]), np.array([output_len])))

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(input lengths, output lengths) of ``n`` requests, the same for the same seed."""
        rng = np.random.default_rng(seed)
        if self.pairs is not None:
            inp, out = self.pairs
            idx = np.arange(n) if n == len(inp) else rng.integers(0, len(inp), n)
            return inp[idx].astype(np.int64), out[idx].astype(np.int64)
        return self.input.sample(rng, n), self.output.sample(rng, n)

    @property
    def mean_input(self) -> float:
        return float(self.pairs[0].mean()) if self.pairs is not None else self.input.mean

    @property
    def mean_output(self) -> float:
        return float(self.pairs[1].mean()) if self.pairs is not None else self.output.mean

    @property
    def max_input(self) -> int:
        return int(self.pairs[0].max()) if self.pairs is not None else self.input.max

    @property
    def max_output(self) -> int:
        return int(self.pairs[1].max()) if self.pairs is not None else self.output.max

    def describe(self) -> str:
        return (f"workload {self.name} (mean input {self.mean_input:.0f} / output {self.mean_output:.0f} "
                f"tokens, max {self.max_input} / {self.max_output})")


def workload_names() -> tuple[str, ...]:
    return tuple(io.read_yaml(WORKLOADS))


def _named(name: str, spec: dict) -> Workload:
    where = f"{WORKLOADS}: {name}"
    sides = {}
    for side in ("input", "output"):
        values = spec.get(side) or {}
        unknown = sorted(set(values) - set(SIDE_KEYS))
        if unknown:
            raise UserError(f"{where}.{side}: unknown key {unknown[0]!r}; valid: {', '.join(SIDE_KEYS)}")
        try:
            sides[side] = LengthDistribution(**values)
        except (TypeError, ValueError) as e:
            raise UserError(f"{where}.{side}: {e}") from None
    return Workload(name, str(spec.get("source", "")), sides["input"], sides["output"])


def _pick(row: dict, keys: tuple[str, ...], where: str) -> int:
    row = {str(k).strip().lower() if k is not None else k: v for k, v in row.items()}  # " Output_Len" as output_len
    for key in keys:
        if key in row and row[key] not in (None, ""):
            if isinstance(row[key], bool):  # JSON true/false: float() would read them as 1 and 0
                raise UserError(f"{where}: {key} {json.dumps(row[key])} is not a whole number of tokens in 1..{MAX_COUNT}")
            try:
                value = float(row[key])
            except (TypeError, ValueError):
                raise UserError(f"{where}: {key} {row[key]!r} is not a number") from None
            if not (1 <= value <= MAX_COUNT and value == int(value)):
                raise UserError(f"{where}: {key} {row[key]!r} is not a whole number of tokens in 1..{MAX_COUNT}")
            return int(value)
    if any(key in row for key in keys):  # the column is there, empty or null in this row
        raise UserError(f"{where}: no {' / '.join(keys)} value")
    columns = ", ".join(repr(k) for k in row if k is not None) or "none"
    raise UserError(f"{where}: no {' / '.join(keys)} value (its columns: {columns})")


def _parsed(path: Path, text: str, what: str, where) -> object:
    """``text`` as JSON, or a UserError: ``what`` is wrong, and where (``where(error)``) or why."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--workload {path}: {what} ({e.msg} at {where(e)})") from None
    except RecursionError:
        raise UserError(f"--workload {path}: {what} (nested too deeply to read)") from None


def _json_array(path: Path, text: str) -> list[dict]:
    """The objects of a JSON file that holds one array of them (the whole file one document)."""
    rows = _parsed(path, text, "not a JSON array of objects", lambda e: f"line {e.lineno}")
    for i, obj in enumerate(rows, 1):
        if not isinstance(obj, dict):
            raise UserError(f"--workload {path}: element {i} of the array is not a JSON object")
    return rows


def _one_object(text: str) -> dict | None:
    """The object a whole JSON file holds, or None where it holds something else or is no one document."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _json_line(path: Path, i: int, line: str) -> dict:
    """The object on line ``i`` of a JSON-lines file, or a UserError saying why it is not one."""
    obj = _parsed(path, line, f"line {i} is not valid JSON", lambda e: f"column {e.colno}")
    if not isinstance(obj, dict):
        raise UserError(f"--workload {path}: line {i} is not a JSON object")
    return obj


def _from_file(path: Path) -> Workload:
    """Pairs from a CSV (header with input_len,output_len), JSONL (one object a line) or a JSON
    file holding one array of such objects."""
    try:
        text = safefile.read_text(path, "workload file")
    except UnicodeDecodeError as e:
        raise UserError(f"--workload {path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    text = text.removeprefix("\ufeff")  # the byte-order mark a spreadsheet's "CSV UTF-8" starts with
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        rows = _json_array(path, text)
    elif path.suffix.lower() == ".json" and text.lstrip().startswith("{") and _one_object(text) is not None:
        rows = [_one_object(text)]  # one request as one (pretty-printed) object, as one JSON line would be
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = [_json_line(path, i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        try:
            rows = list(csv.DictReader(text.splitlines(), skipinitialspace=True))
        except csv.Error as e:  # e.g. a field past csv's limit of 128 KiB
            raise UserError(f"--workload {path}: not a CSV of {INPUT_KEYS[0]},{OUTPUT_KEYS[0]} pairs ({e})") from None
        for i, row in enumerate(rows, 1):
            if None in row:  # csv.DictReader keeps the fields past the header's under the key None
                fields = len(row) - 1 + len(row[None])
                raise UserError(f"--workload {path} row {i}: {fields} fields, the header names {len(row) - 1}: "
                                f"quote a field that holds a comma, or fix the row")
    if not rows:
        raise UserError(f"--workload {path}: no requests (expected {INPUT_KEYS[0]},{OUTPUT_KEYS[0]} pairs: a CSV with "
                        "that header, JSON lines or a JSON array of such objects)")
    inp = np.array([_pick(r, INPUT_KEYS, f"--workload {path} row {i}") for i, r in enumerate(rows, 1)])
    out = np.array([_pick(r, OUTPUT_KEYS, f"--workload {path} row {i}") for i, r in enumerate(rows, 1)])
    return Workload(path.name, str(path), pairs=(inp, out))


def load_workload(name_or_path: str) -> Workload:
    """A named workload of ``workloads.yaml`` or a user file; a UserError naming the valid ones."""
    specs = io.read_yaml(WORKLOADS)
    if name_or_path in specs:
        return _named(name_or_path, specs[name_or_path])
    path = Path(name_or_path)
    if path.suffix.lower() in (".csv", ".jsonl", ".json") or os.path.lexists(path):
        if not os.path.lexists(path):
            raise UserError(f"--workload {name_or_path}: no such file")
        return _from_file(path)  # only a regular file under its size limit is read (safefile)
    raise UserError(f"--workload {name_or_path!r} is neither a file nor a known workload;"
                    f"{io.did_you_mean(name_or_path, specs)} valid: "
                    f"{', '.join(specs)}, or a CSV, JSONL or JSON-array file of input_len,output_len pairs")
