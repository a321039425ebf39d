"""What a training log measured, read from the lines Megatron-LM and Megatron-Bridge print.

``training_log`` (megatron/training/training.py; Bridge: training/utils/train_utils.py) prints one
line per logging interval::

     [2025-06-01 10:00:00.000000] iteration       20/     100 | consumed samples: ... |
     elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 | ...

(older releases without the timestamp, the throughput only with ``--log-throughput``), the
elapsed time being the mean over the interval's iterations. With ``--timing-log-level`` >= 1 a
``(min, max) time across ranks (ms):`` block of per-iteration timers follows
(megatron/core/timers.py). ``report_memory`` (megatron/training/utils.py) prints on every rank
of data-parallel rank 0::

    [Rank 3] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: ...

and newer Bridge releases ``memory (GB) | mem-max-allocated-gigabytes: ...`` (10^9 bytes).
Megatron's MB are MiB (``mega_bytes = 1024.0 * 1024.0``).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

GIB = 1024.0 ** 3
_ITERATION = re.compile(r"\biteration\s+(?P<iteration>\d+)/\s*\d+ \|(?P<fields>.*)$")
ELAPSED_MS = "elapsed time per iteration (ms)"
THROUGHPUT = "throughput per GPU (TFLOP/s/GPU)"
GLOBAL_BATCH = "global batch size"
_MEMORY = re.compile(r"\[Rank \d+\] \(after \d+ iterations\) memory \((?P<unit>MB|GB)\)(?P<fields>.*)$")
_MEMORY_KEYS = {  # unit -> (max allocated key, max reserved key, bytes per unit)
    "MB": ("max allocated", "max reserved", 1024.0 ** 2),
    "GB": ("mem-max-allocated-gigabytes", "mem-max-reserved-gigabytes", 1e9),
}
_TIMERS = re.compile(r"(?:\(min, max\) |max )time across ranks \(ms\):$")
_TIMER = re.compile(r"^\s+(?P<name>[\w/-]+) \.*: \(?(?P<a>[\d.]+)(?:, (?P<b>[\d.]+))?\)?$")
_WORLD = re.compile(r"using world size: (?P<world>\d+), data-parallel size: (?P<dp>\d+)")
_MICROBATCHES = re.compile(r"setting number of microbatches to constant (?P<m>\d+)")
_VOCAB = re.compile(r"padded vocab \(size: (?P<size>\d+)\) with \d+ dummy tokens \(new size: (?P<padded>\d+)\)")


@dataclass(frozen=True)
class Interval:
    """One logged interval: the iteration it ends at, its mean time per iteration, the logged
    TFLOP/s, which start of the job it belongs to (a resumed job counts again) and its batch."""

    iteration: int
    elapsed_ms: float
    tflops: float | None
    segment: int
    global_batch_size: int | None = None  # smaller than the run's while a batch ramp-up lasts


@dataclass(frozen=True)
class Measurements:
    intervals: tuple[Interval, ...]
    # Timer name -> ((iteration of the interval it follows, max over ranks in ms), ...)
    timers_ms: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    max_allocated_gib: float | None = None  # largest over every rank and report
    max_reserved_gib: float | None = None
    world_size: int | None = None
    microbatches: int | None = None
    vocab_size: int | None = None  # the tokenizer's, before Megatron pads it

    def steady(self, warmup: int | None = None) -> list[Interval]:
        """The intervals after warm-up: past iteration ``warmup`` if given, else all but the
        first logged interval of each start of the job (it holds the first iteration's
        compilation, allocation and NCCL set-up)."""
        if warmup is not None:
            return [i for i in self.intervals if i.iteration > warmup]
        firsts = {}
        for i in self.intervals:
            firsts.setdefault(i.segment, i)
        return [i for i in self.intervals if firsts[i.segment] is not i]

    def median_timer_ms(self, name: str, after: Sequence[Interval]) -> float | None:
        """Median of a timer over the intervals ``after`` keeps (None if it was not logged)."""
        kept = {i.iteration for i in after}
        values = [ms for iteration, ms in self.timers_ms.get(name, ()) if iteration in kept]
        return statistics.median(values) if values else None


def _fields(text: str) -> dict[str, str]:
    out = {}
    for part in text.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def measure(lines: Sequence[str]) -> Measurements:
    intervals: list[Interval] = []
    timers: dict[str, list[tuple[int, float]]] = {}
    allocated: list[float] = []
    reserved: list[float] = []
    world = microbatches = vocab = None
    segment, in_timers = 0, False
    for line in lines:
        if in_timers:
            timer = _TIMER.match(line)
            if timer:
                if intervals:
                    timers.setdefault(timer["name"], []).append(
                        (intervals[-1].iteration, float(timer["b"] or timer["a"])))
                continue
            in_timers = False
        if _TIMERS.search(line):
            in_timers = True
        elif match := _ITERATION.search(line):
            fields = _fields(match["fields"])
            elapsed = _number(fields.get(ELAPSED_MS))
            if elapsed is None:
                continue
            iteration = int(match["iteration"])
            if intervals and iteration <= intervals[-1].iteration:
                segment += 1
            batch = _number(fields.get(GLOBAL_BATCH))
            intervals.append(Interval(iteration, elapsed, _number(fields.get(THROUGHPUT)), segment,
                                      None if batch is None else int(batch)))
        elif match := _MEMORY.search(line):
            allocated_key, reserved_key, unit = _MEMORY_KEYS[match["unit"]]
            fields = _fields(match["fields"])
            for key, into in ((allocated_key, allocated), (reserved_key, reserved)):
                value = _number(fields.get(key))
                if value is not None:
                    into.append(value * unit / GIB)
        elif match := _WORLD.search(line):
            world = int(match["world"])
        elif match := _MICROBATCHES.search(line):
            microbatches = int(match["m"])
        elif match := _VOCAB.search(line):
            vocab = int(match["size"])
    return Measurements(tuple(intervals), {k: tuple(v) for k, v in timers.items()},
                        max(allocated, default=None), max(reserved, default=None), world, microbatches, vocab)
