"""The run folder of one search: results/<date>_<model>_<gpus>x<gpu>/ (DESIGN.md §8).

A run folder is complete or absent. It is built inside a hidden staging folder beside its final
place (``results/.partial-XXXX/<name>/``) and renamed into place when the run has its results
(``staged``); a run that fails, or is interrupted (Ctrl-C, SIGTERM: the CLI turns both into
KeyboardInterrupt) before that leaves nothing. Only SIGKILL can leave a staging folder behind;
an Optuna search's staging folder holds its study, so ``search --resume`` accepts it and
publishes it when the study finishes. Every file is written to a temporary name and renamed into
place, with the permissions the user's umask gives (not ``mkstemp``'s 0600), so teammates can
read a run. One process at a time works on a folder (``locked``).
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from autoparallel import __version__
from autoparallel.errors import UserError
from autoparallel.specs.names import name_problem
from autoparallel.safefile import WriteError, check_folder, current_umask, replacing, write_atomic  # noqa: F401 (re-exported)

CANDIDATES = "candidates.csv"
CANDIDATES_PARQUET = "candidates.parquet"  # only with pyarrow installed
RANKED = "ranked.md"
BEST = "best.yaml"
MANIFEST = "manifest.yaml"
TRAIN_SCRIPT = "train.sh"  # Megatron-LM launch script of the rank-1 plan
PROFILED = "profiled.csv"  # the rows `search --profile` measured, as measured
FLOAT_DIGITS = 4
# Fractions shown as percentages to 0.1% (MFU, FP8 util) keep two digits more: at four, a stored
# 0.7435 prints 74.4% in `report` where the search printed 74.3% for the same layout.
FRACTION_COLUMNS = ("mfu", "precision_utilization")
FRACTION_DIGITS = 6


def write_yaml(path: Path, data: dict) -> None:
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=100))


# Columns that count things: written as integers even where pandas holds them as floats.
INTEGER_COLUMNS = ("rank", "trial", "num_microbatches")


def _with_integers(frame: pd.DataFrame) -> pd.DataFrame:
    """Counts as integers (empty where missing), not '32.0'."""
    from autoparallel.specs.plan import Plan
    ints = [c for c in (*INTEGER_COLUMNS, *Plan.field_names()) if c in frame and frame[c].dtype.kind == "f"
            and (frame[c].dropna() % 1 == 0).all()]
    return frame.astype({c: "Int64" for c in ints})


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """``frame`` as CSV, floats rounded to FLOAT_DIGITS: byte for byte what pandas' ``to_csv``
    writes, four times faster on the million-row tables of MoE searches (pandas formats every
    float; here each distinct value of a column is formatted once)."""
    write_atomic(path, _csv_pieces(_with_integers(rounded(frame))))


def rounded(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a run table stores it: FLOAT_DIGITS decimals, FRACTION_DIGITS for fractions."""
    return frame.round({c: FRACTION_DIGITS if c in FRACTION_COLUMNS else FLOAT_DIGITS for c in frame.columns})


CSV_ROWS_PER_PIECE = 100_000


def _csv_field(text: str) -> str:
    """One field as the csv module's minimal quoting writes it."""
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


def _csv_column(column: pd.Series) -> np.ndarray:
    """The column's fields: floats as their shortest repr (as pandas), missing values empty."""
    codes, values = pd.factorize(column, use_na_sentinel=True)
    text = [repr(float(v)) for v in values] if column.dtype.kind == "f" else [_csv_field(str(v)) for v in values]
    return np.array([*text, ""], dtype=object)[codes]


def _csv_pieces(frame: pd.DataFrame) -> Iterator[str]:
    yield ",".join(_csv_field(str(name)) for name in frame.columns) + "\n"
    for start in range(0, len(frame), CSV_ROWS_PER_PIECE):
        piece = frame.iloc[start:start + CSV_ROWS_PER_PIECE]
        fields = [_csv_column(piece[name]) for name in piece.columns]
        yield "".join(",".join(row) + "\n" for row in zip(*fields))


def write_parquet(path: Path, frame: pd.DataFrame) -> bool:
    """The frame as Parquet beside its CSV when pyarrow is installed (``pip install
    autoparallel[parquet]``); False when it is not."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    with replacing(path) as (fd, tmp):
        os.close(fd)
        _with_integers(frame).to_parquet(tmp, index=False)
    return True


def new_run_dir(root: Path, model: str, gpus: int, gpu: str) -> Path:
    return new_dir(root, f"{model}_{gpus}x{gpu}")


def new_dir(root: Path, name: str) -> Path:
    """A fresh folder <date>_<name>; a second one on the same day gets a -2, -3, ... suffix.
    ``name`` is made of preset names, which are checked when read (``specs.names``); this is the
    last guard that a run folder stays inside ``root``."""
    problem = name_problem(name, limit=240)  # 255 bytes less the date and a -N suffix
    if problem:
        raise UserError(f"cannot name a run folder {name!r}: it {problem}")
    path = _free_name(root, f"{dt.date.today().isoformat()}_{name}")
    path.mkdir(parents=True)
    return path


def _free_name(root: Path, base: str) -> Path:
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return path


def check_root(root: Path) -> None:
    """A UserError now, before any work, if run folders cannot be made under ``root``."""
    check_folder(root, f"--results {root}")


STAGING_PREFIX = ".partial-"


def is_staged(run_dir: Path) -> bool:
    """A run folder still in its staging folder (a search killed by SIGKILL)."""
    return Path(run_dir).resolve().parent.name.startswith(STAGING_PREFIX)


def staged(root: Path, make: Callable[[Path], Path]) -> Path:
    """Build a run folder with ``make(staging)`` (which returns the folder it made inside
    ``staging``), then rename it into ``root``; on any error or interrupt remove it instead.
    Returns the published folder."""
    staging = make_staging(root)
    try:
        run_dir = make(staging)
        return publish(run_dir)
    except OSError as exc:
        raise UserError(f"cannot write a run folder in {root}: {exc.strerror or exc}") from None
    except WriteError as exc:  # a file of it: the folder is removed, so say so, not the staged file
        raise UserError(f"cannot write a run folder in {root}: {exc.reason}; nothing was written") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def make_staging(root: Path) -> Path:
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=STAGING_PREFIX))
        os.chmod(staging, 0o777 & ~current_umask())
    except OSError as exc:
        raise UserError(f"cannot make a run folder in {root}: {exc.strerror or exc}") from None
    return staging


def publish(run_dir: Path) -> Path:
    """Rename a staged run folder into the results folder above its staging folder (a -2, -3
    suffix if its name was taken meanwhile) and remove the then empty staging folder; a folder
    not in staging is returned as it is."""
    run_dir = Path(run_dir)
    if not is_staged(run_dir):
        return run_dir
    staging = run_dir.parent
    while True:
        final = _free_name(staging.parent, run_dir.name)
        try:
            os.rename(run_dir, final)  # fails if a complete folder of that name appeared meanwhile
            break
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    shutil.rmtree(staging, ignore_errors=True)
    return final


@contextmanager
def locked(run_dir: Path, what: str = "search") -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (flock on the folder itself, so nothing is left
    behind and a killed holder releases it); a UserError if another process holds it."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{run_dir} is in use by another autoparallel process (a search or "
                            f"--resume still running); wait for it to end before this {what}") from None
        yield
    finally:
        os.close(fd)


def git_sha() -> str:
    """The commit of autoparallel's own checkout, or "" when the package is not one (a wheel).

    Only a checkout whose top level holds this very package counts: a wheel installed into a
    virtual environment inside the user's repository must not record the user's commit.
    """
    package = Path(__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=5, cwd=package).stdout.strip()
        if not top or (Path(top) / "autoparallel").resolve() != package:
            return ""
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=package).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def manifest(command: list[str], inputs: dict) -> dict:
    import numpy
    return {
        "command": " ".join(command),
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "inputs": inputs,
        "versions": {"autoparallel": __version__, "python": platform.python_version(),
                     "numpy": numpy.__version__, "pandas": pd.__version__},
        "git_sha": git_sha(),
    }
