"""``autoparallel runs import``: append the rows of training logs to the user's runs CSV.

One unreadable log is reported with its reason and skipped; the others still go in. A row
already in the file (same content hash in its id, whatever the log was called) is not added
again. The file is rewritten atomically, so an interrupted import leaves the old one intact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from autoparallel import io, safefile
from autoparallel.errors import UserError
from autoparallel.report.run_folder import write_atomic
from autoparallel.runlogs.runrow import ID_PREFIX, UnreadableLog, read_log, runs_columns, to_row

DEFAULT_RUNS = Path("results") / "runs.csv"


@dataclass(frozen=True)
class Imported:
    """What became of one log: its row (and whether it was new to the file), or why not."""

    path: Path
    row: dict[str, Any] | None = None
    added: bool = False
    reason: str = ""


def import_logs(paths: Sequence[Path], gpu: str, runs_file: Path = DEFAULT_RUNS,
                warmup: int | None = None) -> list[Imported]:
    """Read every log, append the new rows to ``runs_file``; one ``Imported`` per log."""
    hw = io.load_hardware(gpu)
    results = []
    for path in paths:
        try:
            row = to_row(read_log(Path(path)), hw.name, warmup)
            _check_runs_on(row, hw.name)
            results.append(Imported(Path(path), row))
        except UnreadableLog as exc:
            results.append(Imported(Path(path), reason=str(exc)))
    rows = [r.row for r in results if r.row]
    added = append_rows(Path(runs_file), rows) if rows else set()
    out = []
    for r in results:  # a log given twice is added once: its first mention
        new = r.row is not None and r.row["id"] in added
        added -= {r.row["id"]} if new else set()
        out.append(Imported(r.path, r.row, new, r.reason))
    return out


def _check_runs_on(row: dict[str, Any], gpu: str) -> None:
    """``UnreadableLog`` where the row's layout cannot run on ``gpu`` as `calibrate` and `validate`
    price it (an FP8 log imported with ``--gpu a100-sxm-80g``): such a row, once in the file, made
    every later `calibrate --runs` of that file fail, whatever its --gpu."""
    from autoparallel.measured_runs import ASSUMPTIONS, prepare_row, recipe_settings
    try:
        prepare_row(pd.Series(row), io.read_yaml(ASSUMPTIONS), recipe_settings())
    except (UserError, ValueError) as exc:
        why = str(exc).removeprefix(f"{row['id']}: ").removeprefix("the stated layout breaks a rule: ")
        raise UnreadableLog(f"its layout (TP{row['tp']} PP{row['pp']} {row['precision']}) cannot run on {gpu}: "
                            f"{why}; is --gpu the GPU the run used?") from None


def _content_key(run_id: str) -> str | None:
    return run_id.rsplit("-", 1)[-1] if run_id.startswith(f"{ID_PREFIX}-") else None


def read_runs_file(path: Path) -> pd.DataFrame:
    try:
        with safefile.open_capped(path, "runs CSV") as f:
            frame = pd.read_csv(f)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        from autoparallel.measured_runs import unreadable_csv
        raise unreadable_csv(path, exc) from None
    if "id" not in frame.columns:
        raise UserError(f"{path} is not a runs CSV: it has no id column")
    # A CSV with an id column but not the runs columns (another table) was rewritten with them appended,
    # its own rows padded with blanks: refused, as calibrate and validate refuse it.
    from autoparallel.measured_runs import RUN_COLUMNS
    missing = [c for c in RUN_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{path} is not a runs CSV: it lacks column(s) {', '.join(missing)}; give --runs a new "
                        f"file or one `runs import` wrote")
    return frame


def append_rows(path: Path, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Append the rows not yet in ``path`` (created with the runs columns if missing); the ids
    written."""
    old = read_runs_file(path) if path.exists() else pd.DataFrame(columns=runs_columns())
    known = {_content_key(str(i)) for i in old["id"]} - {None}
    fresh = []
    for row in rows:
        if _content_key(row["id"]) not in known:
            known.add(_content_key(row["id"]))
            fresh.append(row)
    if not fresh:
        return set()
    columns = list(old.columns) + [c for c in runs_columns() if c not in old.columns]
    new = pd.DataFrame(fresh).reindex(columns=columns)
    out = new if old.empty else pd.concat([old, new], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, out.to_csv(index=False), "--runs")
    return {row["id"] for row in fresh}
