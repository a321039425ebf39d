"""Time to train (issue 24): what a predicted throughput means in the units people plan in.

``--tokens 15T`` turns tokens/s/GPU into wall-clock days and GPU-hours for the whole run;
``--train-days D`` into the tokens a run of D days trains (its GPU-hours are then D x 24 x GPUs);
``--gpu-hour-cost USD`` prices the GPU-hours. The same numbers go beside every ranked layout, into
the line about the winner and into ``--json``. Restarts, evaluation and checkpoint stalls are not
in it: it is the steady-state prediction, stretched.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
MAX_TOKENS = 1e18  # a million times today's largest runs: beyond it, a typo
MAX_DAYS = 36_525.0  # a century
SECONDS_PER_DAY = 86_400.0
TOKENS_HELP = "a positive token count up to 1e18 such as 15T, 300B or 2.5e12 (suffixes K, M, B, T)"


def tokens(text: str) -> float:
    """argparse type of --tokens: a count with an optional K/M/B/T suffix."""
    body = text.strip()
    scale = SUFFIXES.get(body[-1:].upper(), 1.0) if body else 1.0
    number = body[:-1] if scale != 1.0 else body
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {TOKENS_HELP}, got {text!r}") from None
    if not (math.isfinite(value) and 1 <= value <= MAX_TOKENS):
        raise argparse.ArgumentTypeError(f"expected {TOKENS_HELP}, got {text!r}")
    return value


def _positive(what: str, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and 0 < value <= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value
    return parse


days = _positive(f"a positive number of days, at most {MAX_DAYS:g}", MAX_DAYS)
usd = _positive("a positive price in USD per GPU-hour, at most 1e6", 1e6)


def si(value: float) -> str:
    """1234567 -> 1.23M: the big counts of a training run, short enough for a table cell."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def dollars(value: float) -> str:
    return f"${si(value)}"


@dataclass(frozen=True)
class TimeToTrain:
    """A run's length (``tokens`` or ``days``, one of them), its GPUs and the price of a GPU-hour."""

    gpus: int
    tokens: float | None = None
    days: float | None = None
    gpu_hour_cost: float | None = None

    def __post_init__(self):
        if (self.tokens is None) == (self.days is None):
            raise ValueError("a time to train needs exactly one of tokens and days")

    def settings(self) -> dict:
        """What a run folder's manifest keeps (``TimeToTrain(gpus, **settings)`` rebuilds it)."""
        return {"tokens": self.tokens, "days": self.days, "gpu_hour_cost": self.gpu_hour_cost}

    def columns(self, tokens_per_s_per_gpu) -> dict[str, np.ndarray]:
        """What differs between layouts: train_days, gpu_hours (and cost_usd with a price) for
        --tokens; train_tokens for --train-days (its GPU-hours and cost are every layout's)."""
        rate = np.asarray(tokens_per_s_per_gpu, dtype=float) * self.gpus  # tokens/s of the whole run
        if self.days is not None:
            return {"train_tokens": rate * self.days * SECONDS_PER_DAY}
        seconds = self.tokens / rate
        out = {"train_days": seconds / SECONDS_PER_DAY, "gpu_hours": seconds * self.gpus / 3600.0}
        if self.gpu_hour_cost is not None:
            out["cost_usd"] = out["gpu_hours"] * self.gpu_hour_cost
        return out

    def record(self, tokens_per_s_per_gpu: float) -> dict:
        """The whole run of one layout: tokens, days, GPUs, GPU-hours and, with a price, its cost."""
        rate = float(tokens_per_s_per_gpu) * self.gpus
        seconds = self.tokens / rate if self.tokens is not None else self.days * SECONDS_PER_DAY
        out = {"tokens": self.tokens if self.tokens is not None else rate * seconds,
               "days": seconds / SECONDS_PER_DAY, "gpus": self.gpus, "gpu_hours": seconds * self.gpus / 3600.0}
        if self.gpu_hour_cost is not None:
            out.update(gpu_hour_cost_usd=self.gpu_hour_cost, cost_usd=out["gpu_hours"] * self.gpu_hour_cost)
        return out

    def summary(self, tokens_per_s_per_gpu: float, who: str | None = "rank 1") -> str:
        """One line for the winner (``who``): days, GPU-hours and cost of the whole run."""
        r = self.record(tokens_per_s_per_gpu)
        head = (f"{si(r['tokens'])} tokens in {r['days']:,.1f} days" if self.tokens is not None
                else f"{r['days']:g} days train {si(r['tokens'])} tokens")
        head = f"{who}: {head}" if who else head
        cost = f", {dollars(r['cost_usd'])} at ${self.gpu_hour_cost:g}/GPU-h" if self.gpu_hour_cost is not None else ""
        return f"{head} on {self.gpus:,} GPUs: {si(r['gpu_hours'])} GPU-hours{cost}"


def from_args(args: argparse.Namespace, gpus: int) -> TimeToTrain | None:
    """The --tokens / --train-days / --gpu-hour-cost of a command line, or None without them."""
    from autoparallel.errors import UserError
    if args.tokens is None and args.train_days is None:
        if args.gpu_hour_cost is not None:
            raise UserError(f"--gpu-hour-cost {args.gpu_hour_cost:g} needs --tokens N or --train-days D "
                            "(the length of the run it prices)")
        return None
    return TimeToTrain(gpus, args.tokens, args.train_days, args.gpu_hour_cost)


def add_flags(p: argparse.ArgumentParser) -> None:
    """--tokens | --train-days, and --gpu-hour-cost."""
    g = p.add_argument_group("time to train (the whole run, from the predicted throughput)")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--tokens", type=tokens, help="tokens to train (15T, 300B, 2.5e12): prints days and "
                                                      "GPU-hours per layout")
    length.add_argument("--train-days", metavar="DAYS", type=days,
                        help="days of training: prints the tokens trained per layout")
    g.add_argument("--gpu-hour-cost", type=usd, metavar="USD", help="price of one GPU-hour: prints the run's cost")
