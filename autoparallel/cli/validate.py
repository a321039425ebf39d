"""``autoparallel validate``: predict published measurements and report the error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoparallel.cli.common import console
from autoparallel.errors import UserError


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", help="CSV of measured runs (default: the published runs shipped in autoparallel/data/)")
    v.add_argument("--inference", action="store_true",
                   help="validate the inference cost model on FasterTransformer's latencies instead")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    runs = Path(args.runs) if args.runs else None
    if args.inference:
        from autoparallel.serve import validate as serve_validate
        from autoparallel.validate import read_runs_table
        if runs is not None:
            read_runs_table(runs)  # serve/ checks its own columns; here a file that is no table at all
        try:
            report = serve_validate.validate_inference(runs)
        except (ValueError, TypeError, KeyError) as exc:  # a value of the user's CSV serve/ cannot read
            if runs is None:
                raise
            raise UserError(f"runs CSV {runs}: a value the inference validation cannot read "
                            f"({type(exc).__name__}: {' '.join(str(exc).split())[:150]})") from None
        if args.json:
            print(json.dumps({"rows": json.loads(report.drop(columns=["notes", "source"]).to_json(orient="records")),
                              "summary": serve_validate.summary(report)}, indent=1))
        else:
            serve_validate.print_report(report, console)
        return
    from autoparallel import validate
    report = validate.validate_training(runs)
    if args.json:
        print(report.to_json(orient="records", indent=1))
        return
    validate.print_report(report, console)
