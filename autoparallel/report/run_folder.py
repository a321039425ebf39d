"""The run folder of one search: results/<date>_<model>_<gpus>x<gpu>/ (DESIGN.md §8).

Every file is written to a temporary name and renamed into place, so an interrupted run never
leaves a half-written file behind.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from autoparallel import __version__

CANDIDATES = "candidates.csv"
CANDIDATES_PARQUET = "candidates.parquet"  # only with pyarrow installed
RANKED = "ranked.md"
BEST = "best.yaml"
MANIFEST = "manifest.yaml"
TRAIN_SCRIPT = "train.sh"  # Megatron-LM launch script of the rank-1 plan
PROFILED = "profiled.csv"  # the rows `search --profile` measured, as measured
FLOAT_DIGITS = 4


def write_atomic(path: Path, content: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    write_atomic(path, _with_integers(frame.round(FLOAT_DIGITS)).to_csv(index=False))


def write_parquet(path: Path, frame: pd.DataFrame) -> bool:
    """The frame as Parquet beside its CSV when pyarrow is installed (``pip install
    autoparallel[parquet]``); False when it is not."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        _with_integers(frame).to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def new_run_dir(root: Path, model: str, gpus: int, gpu: str) -> Path:
    return new_dir(root, f"{model}_{gpus}x{gpu}")


def new_dir(root: Path, name: str) -> Path:
    """A fresh folder <date>_<name>; a second one on the same day gets a -2, -3, ... suffix."""
    base = f"{dt.date.today().isoformat()}_{name}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    path.mkdir(parents=True)
    return path


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
