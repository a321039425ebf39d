"""argparse types shared by the command modules: numbers with a message naming the bad value."""

from __future__ import annotations

import argparse


def _number_at_least(low: float, kind: type, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not value >= low:  # also rejects nan
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


positive = _number_at_least(1, int, "a positive integer")
non_negative = _number_at_least(0, int, "an integer >= 0")
positive_seconds = _number_at_least(1e-9, float, "a positive number of seconds")
