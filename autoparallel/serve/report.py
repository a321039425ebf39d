"""Serving tables for the terminal (rich) and for files (markdown): ranked layouts, the Pareto front.

The terminal gets the columns that fit (``report.fit``): the layout a deployment needs (TP, PP,
EP for MoE models, replicas, max batch) and the measures (TTFT, TPOT, tokens/s, memory) are never
dropped; the concurrency, the token budget and the precisions go whole when it is narrow, and
last the end-to-end latency (TTFT + TPOT per further token: the title gives the output length).
A token budget or precision that tells two shown layouts apart goes after the latency.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from autoparallel.report.fit import Column, cell, print_table

INTEGERS = ("rank", "tp", "pp", "ep", "replicas", "max_batch", "max_num_tokens", "concurrency")
COLUMNS = (
    Column("rank", "#"), Column("tp", "TP", knob=True), Column("pp", "PP", knob=True), Column("ep", "EP", knob=True),
    Column("replicas", "replicas", knob=True), Column("max_batch", "batch", knob=True),
    Column("max_num_tokens", "max tokens", drop=3, knob=True),
    Column("weight_precision", "weights", drop=2, knob=True), Column("kv_precision", "KV", drop=2, knob=True),
    Column("concurrency", "in flight", "{:,}", drop=4),
    Column("ttft_ms", "TTFT ms", "{:,.0f}"), Column("tpot_ms", "TPOT ms", "{:.1f}"),
    Column("latency_ms", "e2e ms", "{:,.0f}", drop=1),
    Column("output_tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"), Column("memory_per_gpu_gib", "mem GiB", "{:.1f}"),
)
LEGEND = ("batch: requests per micro-batch; tok/s/GPU: output tokens per second per GPU",)


def _columns(frame: pd.DataFrame) -> tuple[Column, ...]:
    """Every column, less EP where no row spreads experts (dense models)."""
    has_ep = "ep" in frame and (pd.to_numeric(frame["ep"], errors="coerce") > 1).any()
    return tuple(c for c in COLUMNS if c.key != "ep" or has_ep)


def _cell(row: pd.Series, column: Column) -> str:
    value = row[column.key]
    if pd.isna(value):
        return "-"
    return cell(int(value) if column.key in INTEGERS else value, column.fmt)


def rows(frame: pd.DataFrame, top: int, columns: tuple[Column, ...] = COLUMNS) -> list[list[str]]:
    """The first ``top`` rows of ``frame`` as table cells."""
    return [[_cell(r, c) for c in columns] for _, r in frame.head(top).iterrows()]


def print_ranked(frame: pd.DataFrame, title: str, top: int, console: Console, wide: bool = False,
                 legend: bool = True, where: str = "") -> None:
    """``frame``'s first ``top`` rows in the columns that fit (all with ``wide``); ``where``: see
    ``report.fit.print_table``."""
    columns = _columns(frame)
    print_table(console, title, columns, rows(frame, top, columns), LEGEND if legend else (), wide, where,
                constant_first=True)


def markdown_table(frame: pd.DataFrame, top: int = 50, feasible_only: bool = True) -> str:
    if feasible_only and "feasible" in frame:
        frame = frame[frame["feasible"]]
    headers = [c.header for c in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(frame, top)]
    return "\n".join(lines) + "\n\n" + "".join(f"- {line}\n" for line in LEGEND)
