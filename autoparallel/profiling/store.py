"""A JSON store of measured layer profiles under results/, so a shape is timed once per machine.

Key: device name, torch version, the per-rank shape and the recipe (precision + recompute), as
DESIGN.md §7 asks; a profile from another GPU or torch release is never reused. Writes are
atomic (temporary file + rename), so an interrupted search leaves a valid store.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

DEFAULT_PATH = Path("results") / "layer_profiles.json"


def make_key(shape: dict, device: str) -> str:
    """``device``: the measuring device's name (``device.device_name``)."""
    import torch
    parts = [device, f"torch{torch.__version__}"]
    parts += [f"{k}={shape[k]}" for k in sorted(shape)]
    return "|".join(parts)


class ProfileStore:
    def __init__(self, path: Path | str = DEFAULT_PATH) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            self.entries = json.loads(self.path.read_text())

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, value: dict) -> None:
        self.entries[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".layer_profiles.")
        with os.fdopen(fd, "w") as f:
            json.dump(self.entries, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)
