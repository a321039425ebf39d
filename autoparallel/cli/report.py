"""``autoparallel report``: re-render a run's tables and write report.html with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel.cli.common import console


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="re-render a run's tables and write report.html with plots")
    r.add_argument("run_dir")
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from autoparallel.search import run as runs
    with console.status("rendering report...", spinner="dots"):
        path = runs.report(Path(args.run_dir))
    console.print(f"wrote {path}")
