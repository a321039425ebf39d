"""report.html: one self-contained page (PNGs embedded as data URIs) a person reads at a glance."""

from __future__ import annotations

import base64
import html

import pandas as pd

from autoparallel.report import plots, tables

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}
img{{max-width:100%;margin:1em 0}}</style></head>
<body><h1>{title}</h1><p>{summary}</p>
<h2>Best layouts</h2>{table}
<h2>Throughput vs memory</h2><img alt="throughput vs peak memory" src="data:image/png;base64,{scatter}">
<h2>Where the step time goes</h2><img alt="step time breakdown" src="data:image/png;base64,{breakdown}">
{measured}
</body></html>
"""


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def render(ranked: pd.DataFrame, title: str, memory_limit_gib: float, hw=None,
           rejections: pd.DataFrame | None = None, feasible_total: int | None = None) -> str:
    """The page; ``rejections`` and ``feasible_total``: a summarised run folder's per-rule counts
    and feasible count (its candidates.csv keeps only the best feasible rows)."""
    feasible = ranked[ranked["fits"]]
    headers = [c.header for c in tables.RANKED_COLUMNS]
    rows = [row[:len(headers)] for row in tables.ranked_rows(ranked, 20, hw)]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    counts = tables.rejection_summary(ranked, rejections)
    rejected = "; ".join(f"{n:,} {html.escape(r)}" for r, n in counts.head(5).items())
    n_feasible = feasible_total or len(feasible)
    total = n_feasible + int(counts.sum())
    summary = f"{total:,} candidates, {n_feasible:,} feasible. Rejected: {rejected or 'none'}."
    measured = ""
    if "measured_step_time_s" in ranked and ranked["measured_step_time_s"].notna().any():
        png = plots.predicted_vs_measured(ranked[ranked["measured_step_time_s"].notna()])
        measured = f'<h2>Predicted vs measured</h2><img alt="predicted vs measured" src="data:image/png;base64,{_b64(png)}">'
    return PAGE.format(title=html.escape(title), summary=summary, table=table,
                       scatter=_b64(plots.throughput_vs_memory(ranked, memory_limit_gib)),
                       breakdown=_b64(plots.step_breakdown(feasible.head(10))), measured=measured)
