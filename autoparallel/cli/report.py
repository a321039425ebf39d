"""``autoparallel report``: re-render a run's tables and write report.html with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel.cli.common import console


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="re-render a run's tables and write report.html with plots")
    r.add_argument("run_dir")
    r.set_defaults(func=run)


TOP = 50  # rows of the terminal table, as search prints by default


def run(args: argparse.Namespace) -> None:
    """The run's ranked table again (as its search printed it, at the default --top), ranked.md
    re-rendered and report.html written."""
    from autoparallel.costmodel.finetune import is_lora
    from autoparallel.report.tables import print_ranked
    from autoparallel.search import run as runs
    shown: dict = {}
    with console.status("rendering report...", spinner="dots"):
        path = runs.report(Path(args.run_dir), shown)
    result = shown["result"]
    feasible = len(result.feasible)
    title = (f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}, "
             f"seq {result.model.seq_length}: top {min(TOP, feasible)} of {feasible:,} feasible")
    print_ranked(result.ranked, title, TOP, console, result.hardware, result.space.memory_fraction, False, False,
                 "; all in the run folder's ranked.md", result.train, moe=result.model.is_moe,
                 lora=is_lora(result.model))
    console.print(f"wrote {path}")
