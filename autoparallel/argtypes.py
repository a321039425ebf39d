"""argparse types shared by the command modules: numbers with a message naming the bad value
and the valid range.

Every count is bounded above as well as below: a count beyond ``MAX_COUNT`` (2^31 - 1) is no
cluster, model or batch anyone runs, and the vectorised cost model multiplies counts together
in 64-bit integers, where 10^21 GPUs would overflow instead of being refused.
"""

from __future__ import annotations

import argparse
import math
import re

MAX_COUNT = 2**31 - 1


def _number_in(low: float, high: float, kind: type, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (low <= value <= high and math.isfinite(value)):  # also rejects nan and inf
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value
    return parse


positive = _number_in(1, MAX_COUNT, int, f"an integer in 1..{MAX_COUNT}")
non_negative = _number_in(0, MAX_COUNT, int, f"an integer in 0..{MAX_COUNT}")
seed = _number_in(0, MAX_COUNT, int, f"a seed in 0..{MAX_COUNT}")
positive_seconds = _number_in(1e-9, math.inf, float, "a positive number of seconds")
positive_number = _number_in(1e-300, math.inf, float, "a positive finite number")
percentile = _number_in(1e-9, 100.0, float, "a percentile in (0, 100]")
dropout = _number_in(0.0, math.nextafter(1.0, 0.0), float, "a dropout probability in [0, 1)")


RELEASE_PATTERN = r"\d+\.\d+(\.\d+)?"


def release(text: str) -> str:
    """A software release number such as 1.6, 1.10 or 2.9.1 (TransformerEngine's)."""
    if not re.fullmatch(RELEASE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"expected a release number such as 1.6 or 2.9, got {text!r}")
    return text
