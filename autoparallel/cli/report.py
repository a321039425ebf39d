"""``autoparallel report``: re-render a run's tables and write report.html with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel.cli.common import add_table_flags, console


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="re-render a run's tables and write report.html with plots")
    r.add_argument("run_dir", help="a run folder, e.g. results/<date>_<model>_<gpus>x<gpu>")
    add_table_flags(r)  # the table's note and legend name --wide and --explain, as search's do
    r.set_defaults(func=run)


TOP = 50  # rows of the terminal table, as search prints by default


def run(args: argparse.Namespace) -> None:
    """The run's ranked table again (as its search printed it, at the default --top), ranked.md
    re-rendered and report.html written; a run folder that cannot be written gets its table all
    the same, then one line on why report.html was not written (exit 2)."""
    from autoparallel.cli.search import print_table
    from autoparallel.errors import UserError
    from autoparallel.search import run as runs
    with console.status("rendering report...", spinner="dots"):
        result, write = runs.report(Path(args.run_dir))
    print_table(result, TOP, "; all in the run folder's ranked.md", wide=args.wide, explain=args.explain)
    try:
        with console.status("writing report.html...", spinner="dots"):
            path = write()
    except UserError as exc:
        raise UserError(f"report.html not written: {exc}") from None
    console.print(f"wrote {path}")
