"""``autoparallel validate``: predict published measurements and report the error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoparallel.cli.common import console


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", action="append",
                   help="CSV of measured runs (repeatable; default: the published runs shipped in autoparallel/data/)")
    v.add_argument("--inference", action="store_true",
                   help="validate the serving cost model instead: per engine, GPU and model, the in-sample and "
                        "leave-one-model-out errors on FasterTransformer's (--runs: its CSV) and TensorRT-LLM's "
                        "published runs")
    v.add_argument("--no-cross-validation", action="store_true",
                   help="skip the leave-one-model-out refits (in-sample error only; seconds instead of a minute)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    runs = [Path(r) for r in args.runs] if args.runs else None
    if args.inference:
        from autoparallel.serve import validate as serve_validate
        serve_validate.run(runs[0] if runs else None, args.json, console, cross=not args.no_cross_validation)
        return
    from autoparallel import validate
    report = _training_report(validate, runs, cross=not args.no_cross_validation, quiet=args.json)
    if args.json:
        print(json.dumps({"rows": json.loads(report.to_json(orient="records")),
                          "summary": json.loads(validate.summary(report).to_json(orient="records"))}, indent=1))
        return
    validate.print_report(report, console)


def _training_report(validate, runs, cross: bool, quiet: bool):
    """The report, with a progress bar over the leave-one-model-out refits."""
    if not cross or quiet:
        return validate.validate_training(runs, cross=cross)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("leave-one-model-out refits", total=validate.cross_validation_folds(
            validate.load_runs(runs)))
        return validate.validate_training(runs, cross=True, progress=lambda: bar.advance(task))
