"""Ranked serving tables for the terminal (rich) and for files (markdown)."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("rank", "#", "{}"), ("tp", "TP", "{}"), ("pp", "PP", "{}"), ("replicas", "replicas", "{}"),
    ("batch", "batch", "{}"), ("weight_precision", "weights", "{}"), ("kv_precision", "KV", "{}"),
    ("ttft_ms", "TTFT ms", "{:,.0f}"), ("tpot_ms", "TPOT ms", "{:.1f}"), ("latency_ms", "e2e ms", "{:,.0f}"),
    ("output_tokens_per_s_per_gpu", "out tok/s/GPU", "{:,.0f}"), ("memory_per_gpu_gib", "mem GiB", "{:.1f}"),
)


def rows(ranked: pd.DataFrame, top: int) -> list[list[str]]:
    feasible = ranked[ranked["feasible"]].head(top)
    out = []
    for _, r in feasible.iterrows():
        out.append([fmt.format(int(r[c]) if c in ("rank", "tp", "pp", "replicas", "batch") else r[c])
                    for c, _, fmt in COLUMNS])
    return out


def print_ranked(ranked: pd.DataFrame, title: str, top: int, console: Console) -> None:
    t = Table(title=title, header_style="bold")
    for _, header, _ in COLUMNS:
        t.add_column(header, justify="right")
    for r in rows(ranked, top):
        t.add_row(*r)
    console.print(t)


def markdown_table(ranked: pd.DataFrame, top: int = 50) -> str:
    headers = [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(ranked, top)]
    return "\n".join(lines) + "\n"
