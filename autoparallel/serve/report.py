"""Serving tables for the terminal (rich) and for files (markdown): ranked layouts, the Pareto front."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

INTEGERS = ("rank", "tp", "pp", "ep", "replicas", "max_batch", "max_num_tokens", "concurrency")
COLUMNS = (
    ("rank", "#", "{}"), ("tp", "TP", "{}"), ("pp", "PP", "{}"), ("ep", "EP", "{}"), ("replicas", "replicas", "{}"),
    ("max_batch", "max batch", "{}"), ("max_num_tokens", "max tokens", "{}"),
    ("weight_precision", "weights", "{}"), ("kv_precision", "KV", "{}"),
    ("concurrency", "in flight", "{:,}"),
    ("ttft_ms", "TTFT ms", "{:,.0f}"), ("tpot_ms", "TPOT ms", "{:.1f}"), ("latency_ms", "e2e ms", "{:,.0f}"),
    ("output_tokens_per_s_per_gpu", "out tok/s/GPU", "{:,.0f}"), ("memory_per_gpu_gib", "mem GiB", "{:.1f}"),
)


def _cell(row: pd.Series, column: str, fmt: str) -> str:
    value = row[column]
    if pd.isna(value):
        return "-"
    return fmt.format(int(value) if column in INTEGERS else value)


def rows(frame: pd.DataFrame, top: int) -> list[list[str]]:
    """The first ``top`` rows of ``frame`` as table cells."""
    return [[_cell(r, c, fmt) for c, _, fmt in COLUMNS] for _, r in frame.head(top).iterrows()]


def print_ranked(frame: pd.DataFrame, title: str, top: int, console: Console) -> None:
    t = Table(title=title, header_style="bold")
    for _, header, _ in COLUMNS:
        t.add_column(header, justify="right")
    for r in rows(frame, top):
        t.add_row(*r)
    console.print(t)


def markdown_table(frame: pd.DataFrame, top: int = 50, feasible_only: bool = True) -> str:
    if feasible_only and "feasible" in frame:
        frame = frame[frame["feasible"]]
    headers = [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(frame, top)]
    return "\n".join(lines) + "\n"
