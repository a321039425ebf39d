"""Where the data autoparallel ships and the user's own presets live.

Everything the product reads at run time (model, hardware and space presets, the thresholds
YAMLs, the CUDA sources, the published measurements that ``validate`` and ``calibrate`` use)
is package data under ``autoparallel/``, found through ``importlib.resources`` so that a wheel
works from any working directory. What a user makes (``calibrate --as``) goes to a per-user
folder (``platformdirs``; ``AUTOPARALLEL_HOME`` overrides it), never into the installed package.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE = Path(str(resources.files("autoparallel")))
SEARCH_SPACES = PACKAGE / "search_spaces"
DATA = PACKAGE / "data"
KERNELS = PACKAGE / "kernels"
HOME_ENV = "AUTOPARALLEL_HOME"


def user_dir() -> Path:
    """The user's own presets: ``<user dir>/hardware/*.yaml`` etc., same layout as search_spaces/."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    import platformdirs
    return Path(platformdirs.user_data_dir("autoparallel", appauthor=False))


def data_file(name: str) -> Path:
    """One of the published-measurement CSVs shipped with the package (see data/README.md)."""
    return DATA / name
