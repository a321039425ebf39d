"""Ranked tables for the terminal (rich) and for files (markdown), from the candidates frame."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

# (column, header, format); the layout columns first, then what was predicted.
RANKED_COLUMNS = (
    ("rank", "#", "{:.0f}"),
    ("tp", "TP", "{:.0f}"), ("pp", "PP", "{:.0f}"), ("vp", "VP", "{:.0f}"), ("cp", "CP", "{:.0f}"),
    ("ep", "EP", "{:.0f}"), ("dp", "DP", "{:.0f}"), ("mbs", "MBS", "{:.0f}"),
    ("sp", "SP", "{}"), ("recompute", "recompute", "{}"), ("precision", "precision", "{}"),
    ("tp_comm_overlap", "TP ovl", "{}"),
    ("peak_memory_gib", "mem GiB", "{:.1f}"),
    ("step_time_s", "step s", "{:.2f}"),
    ("tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"),
    ("model_tflops_per_gpu", "TFLOP/s", "{:.0f}"),
    ("mfu", "MFU", "{:.1%}"),
)
# Shown only when the frame has them: the verdict of `search --fp8-check` for the row's recipe.
OPTIONAL_COLUMNS = (("fp8_check", "FP8 check", "{}"),
                    # `search --profile job` (issue 4): measured beside predicted
                    ("measured_step_time_s", "meas. step s", "{:.3f}"),
                    ("measured_tokens_per_s_per_gpu", "meas. tok/s/GPU", "{:,.0f}"),
                    ("measured_peak_memory_gib", "meas. mem GiB", "{:.3f}"),
                    ("measurement_error", "profiling", "{}"))


def _columns(ranked: pd.DataFrame) -> tuple:
    return RANKED_COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c[0] in ranked.columns)


def _cell(row: pd.Series, column: str, fmt: str) -> str:
    value = row[column]
    if value is None or (isinstance(value, float) and value != value):
        return "-"  # not measured (only the top-k are profiled)
    if column == "recompute" and value == "full" and row.get("recompute_num_layers", 0):
        return f"full({int(row['recompute_num_layers'])})"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "yes" if value else "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def ranked_rows(ranked: pd.DataFrame, top: int) -> list[list[str]]:
    feasible = ranked[ranked["fits"]].head(top)
    return [[_cell(row, c, f) for c, _, f in _columns(ranked)] for _, row in feasible.iterrows()]


def print_ranked(ranked: pd.DataFrame, title: str, top: int = 10, console: Console | None = None) -> None:
    table = Table(title=title, header_style="bold")
    for _, header, _ in _columns(ranked):
        table.add_column(header, justify="right")
    for row in ranked_rows(ranked, top):
        table.add_row(*row)
    (console or Console()).print(table)


def markdown_table(ranked: pd.DataFrame, top: int = 50) -> str:
    headers = [h for _, h, _ in _columns(ranked)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in ranked_rows(ranked, top)]
    return "\n".join(lines) + "\n"


def rejection_summary(ranked: pd.DataFrame) -> pd.Series:
    """How many candidates each rule rejected, memory rejections counted together."""
    reasons = ranked.loc[~ranked["fits"], "reason"].astype(str)
    reasons = reasons.where(~reasons.str.startswith("out of memory"), "out of memory")
    return reasons.value_counts()
