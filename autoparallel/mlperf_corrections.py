"""MLPerf rows whose CSV is not what the submission ran (``data/mlperf_corrections.yaml``): a
layout the result logs contradict, or a setting the submission's config states that the CSV left
out; set right before the rows are priced.

The shipped CSVs stay byte-identical to the published ``../shared/data`` copies; the corrections
sit beside them, each with the log or config file that shows it. Each change is written
``old -> new`` and the old value must be the CSV's (``unset`` for a knob ``other_knobs`` does not
name): once the published CSV is mended, the entry fails loudly instead of silently doing nothing.
"""

from __future__ import annotations

import pandas as pd
import yaml

from autoparallel import resources
from autoparallel.errors import UserError

CORRECTIONS = "mlperf_corrections.yaml"
KEYS = ("round", "submitter", "system")
UNSET = "unset"  # the old value of a knob the CSV's other_knobs does not name


def load() -> list[dict]:
    return yaml.safe_load(resources.data_file(CORRECTIONS).read_text()) or []


def _change(text: str) -> tuple[str, str]:
    old, new = (part.strip() for part in str(text).split("->"))
    return old, new


def _parse(dtype, text: str):
    """A written value as the CSV column's type reads it."""
    if pd.api.types.is_bool_dtype(dtype):
        if text not in ("True", "False"):
            raise UserError(f"{CORRECTIONS}: expected True or False, got {text!r}")
        return text == "True"
    return int(text) if pd.api.types.is_integer_dtype(dtype) else text


def _set_knob(other_knobs: str, name: str, old: str, new: str, where: str) -> str:
    parts = [p.strip() for p in str(other_knobs).split(";")]
    if old == UNSET:
        if any(p.split("=")[0].strip() == name for p in parts):
            raise UserError(f"{CORRECTIONS}: {where} expects no {name} in other_knobs, which has {other_knobs!r}")
        return "; ".join([*parts, f"{name}={new}"])
    if f"{name}={old}" not in parts:
        raise UserError(f"{CORRECTIONS}: {where} expects {name}={old} in other_knobs, which has {other_knobs!r}")
    return "; ".join(f"{name}={new}" if p == f"{name}={old}" else p for p in parts)


def apply(frame: pd.DataFrame, entries: list[dict] | None = None) -> pd.DataFrame:
    """``frame`` (an MLPerf table) with the entries that name its rows applied; an entry whose
    round, submitter and system match no row of an MLPerf table of its model is left for the
    table it belongs to, but one matching a row whose value is not the entry's old value fails."""
    frame = frame.copy()
    for entry in load() if entries is None else entries:
        match = (frame["round"] == entry["round"]) & (frame["submitter"] == entry["submitter"]) & (
            frame["system"] == entry["system"])
        if match.sum() > 1:
            raise UserError(f"{CORRECTIONS}: {entry['system']} ({entry['round']}) names {match.sum()} rows")
        if not match.any():
            continue
        i = frame.index[match][0]
        where = f"{entry['round']} {entry['submitter']} {entry['system']}"
        for column, text in entry.get("set", {}).items():
            old, new = _change(text)
            dtype = frame[column].dtype
            if frame.at[i, column] != _parse(dtype, old):
                raise UserError(f"{CORRECTIONS}: {where} expects {column} {old}, the CSV has "
                                f"{frame.at[i, column]} (mended upstream? drop the entry)")
            frame.at[i, column] = _parse(dtype, new)
        for name, text in entry.get("knobs", {}).items():
            frame.at[i, "other_knobs"] = _set_knob(frame.at[i, "other_knobs"], name, *_change(text), where)
    return frame


def unmatched(frames: list[pd.DataFrame]) -> list[str]:
    """Entries that match no row of any of ``frames`` (a test keeps the file free of them)."""
    rows = pd.concat([f[list(KEYS)] for f in frames], ignore_index=True)
    keys = set(map(tuple, rows.astype(str).to_numpy()))
    return [f"{e['round']} {e['submitter']} {e['system']}" for e in load()
            if (e["round"], e["submitter"], e["system"]) not in keys]
