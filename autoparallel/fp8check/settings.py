"""The precision check's thresholds and run lengths, read strictly from fp8_check.yaml.

Numbers that decide a verdict live in data, not code, so a team can tighten them without a
release; the file's comments say why each default is what it is (the measured seed noise of the
loss gap, the healthy recipes' underflow / overflow). Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from autoparallel.fp8check.proxy import ProxyRule
from autoparallel.io import SEARCH_SPACES, from_dict, read_flag_yaml, read_yaml

DEFAULT_PATH = SEARCH_SPACES / "fp8_check.yaml"


@dataclass(frozen=True)
class Thresholds:
    """A recipe (or a layer under it) fails when any of these is exceeded."""

    max_loss_gap_pct: float = 5.0     # final loss vs BF16, relative, in %
    max_underflow_pct: float = 5.0    # mean over recorded steps, of one tensor of one layer
    max_overflow_pct: float = 0.5     # same, values clipped at fp8_max

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name}={getattr(self, f.name)} must be >= 0")


@dataclass(frozen=True)
class CheckRun:
    """How long and how often: the same for BF16 and every recipe (identical data and seed)."""

    steps: int = 200
    batch_size: int = 8
    seq_length: int = 32
    seed: int = 0
    stats_every: int = 10   # record the numerics every K steps
    final_window: int = 20  # final loss = mean of the last N steps (the last one alone is noisy)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "seed" and getattr(self, f.name) < 1:
                raise ValueError(f"{f.name}={getattr(self, f.name)} must be >= 1")


@dataclass(frozen=True)
class LayerSearch:
    """Bounds on the search for BF16 layers (each candidate set costs one re-run)."""

    max_bf16_layers: int = 2
    max_reruns: int = 4


@dataclass(frozen=True)
class Fp8CheckSettings:
    thresholds: Thresholds = field(default_factory=Thresholds)
    # NVFP4 flushes to zero what is below a quarter of the smallest E2M1 step of its block
    # (amax / 24) and clips in blocks whose E4M3 scale is subnormal: its limits are its own
    # (the shipped YAML says why each is what it is).
    fp4_thresholds: Thresholds = field(default_factory=lambda: Thresholds(
        max_underflow_pct=60.0, max_overflow_pct=3.0))
    run: CheckRun = field(default_factory=CheckRun)
    proxy: ProxyRule = field(default_factory=ProxyRule)
    layer_search: LayerSearch = field(default_factory=LayerSearch)
    recipes: tuple[str, ...] = ("fp8-delayed", "fp8-current", "fp8-blockwise")


def thresholds_for(settings: Fp8CheckSettings, recipe_name: str) -> Thresholds:
    """The limits a recipe is judged by: ``fp4_thresholds`` for NVFP4, else ``thresholds``."""
    return settings.fp4_thresholds if recipe_name == "nvfp4" else settings.thresholds


def load_settings(path: str | Path | None = None, flag: str = "") -> Fp8CheckSettings:
    """The settings of ``path`` (the shipped ones without it); ``flag``: the flag that named
    ``path``, which a file that cannot be read is named with."""
    path = Path(path) if path else DEFAULT_PATH
    return from_dict(Fp8CheckSettings, read_flag_yaml(flag, path) if flag else read_yaml(path), str(path))
