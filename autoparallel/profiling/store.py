"""A JSON store of measured layer profiles in the results folder, so a shape is timed once per
machine: ``<--results>/layer_profiles.json``.

Key: device name, torch version, the per-rank shape and the recipe (precision + recompute), as
DESIGN.md §7 asks; a profile from another GPU or torch release is never reused. Writes are
atomic (temporary file + rename) and made under a file lock (``.layer_profiles.json.lock``
beside it), re-reading the file first, so two searches profiling at once keep each other's
entries. A file that is not such a store is a UserError naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autoparallel import safefile
from autoparallel.errors import UserError

FILE_NAME = "layer_profiles.json"
DEFAULT_PATH = Path("results") / FILE_NAME


def make_key(shape: dict, device: str) -> str:
    """``device``: the measuring device's name (``device.device_name``)."""
    import torch
    parts = [device, f"torch{torch.__version__}"]
    parts += [f"{k}={shape[k]}" for k in sorted(shape)]
    return "|".join(parts)


class ProfileStore:
    def __init__(self, path: Path | str = DEFAULT_PATH) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        try:
            entries = json.loads(safefile.read_bytes(self.path, "layer-profile store"))
        except (UserError, ValueError) as exc:
            raise UserError(f"{self.path} is not a layer-profile store ({' '.join(str(exc).split())[:120]}); "
                            "delete it to profile the layers again") from None
        if not isinstance(entries, dict) or not all(isinstance(v, dict) and "fwd_bwd_s" in v
                                                    for v in entries.values()):
            raise UserError(f"{self.path} is not a layer-profile store (expected an object of profiles); "
                            "delete it to profile the layers again")
        return entries

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, value: dict) -> None:
        from autoparallel.report.run_folder import write_atomic
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self.entries = {**self._read(), key: value}
            write_atomic(self.path, json.dumps(self.entries, indent=1, sort_keys=True))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path.parent / f".{self.path.name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
