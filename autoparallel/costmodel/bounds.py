"""Fitted constants that a fit left on (or next to) one of their bounds.

Why: every fitted constant has bounds, physical ones (100 % of peak, zero overhead) or the edge
of what is plausible. A least-squares fit that stops on one is no longer measuring the hardware:
it is absorbing a cost the model lacks (or too much of one it has), and the constant then means
something else than its name says. ``calibrate`` and ``serve.fit`` warn about each one, so
whoever reads or ships the constants knows which figures are stand-ins.

"Next to" is within ``TOLERANCE`` of the interval the fit moves in: in log space for training's
fits (they search the logarithm of each constant), in linear space for serving's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TOLERANCE = 1e-3  # share of the searched interval


@dataclass(frozen=True)
class AtBound:
    """One constant on a bound: its name, fitted value, the bound and which side (lower / upper)."""

    name: str
    value: float
    bound: float
    side: str

    def message(self) -> str:
        return (f"{self.name} = {self.value:.4g} is at its {self.side} bound {self.bound:.4g}: the fit is "
                "absorbing a cost the model lacks, not measuring this constant")

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "bound": self.bound, "side": self.side}


def at_bounds(values: Mapping[str, float], bounds: Mapping[str, tuple[float, float]], log: bool,
              tolerance: float = TOLERANCE) -> list[AtBound]:
    """The constants of ``values`` (those that have ``bounds``) within ``tolerance`` of the searched
    interval from a bound; ``log``: the fit searched log(value)."""
    scale = math.log if log else float
    out = []
    for name, value in values.items():
        if name not in bounds:
            continue
        low, high = bounds[name]
        position = (scale(value) - scale(low)) / (scale(high) - scale(low))
        if position <= tolerance:
            out.append(AtBound(name, float(value), float(low), "lower"))
        elif position >= 1 - tolerance:
            out.append(AtBound(name, float(value), float(high), "upper"))
    return out


def warn_at_bounds(console, hits) -> None:
    """One warning line per constant on a bound, on a rich ``console`` (what every fit command prints)."""
    for hit in hits:
        console.print(f"  [yellow]warning:[/yellow] {hit.message()}")
