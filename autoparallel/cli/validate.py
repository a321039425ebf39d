"""``autoparallel validate``: predict published measurements and report the error."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel.cli.common import console


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", help="CSV of measured runs (default: the published runs shipped in autoparallel/data/; "
                                  "with --inference: FasterTransformer's inference_runs.csv)")
    v.add_argument("--inference", action="store_true",
                   help="validate the serving cost model instead: per engine, GPU and model, the in-sample and "
                        "leave-one-model-out errors on FasterTransformer's and TensorRT-LLM's published runs")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    runs = Path(args.runs) if args.runs else None
    if args.inference:
        from autoparallel.serve import validate as serve_validate
        serve_validate.run(runs, args.json, console)
        return
    from autoparallel import validate
    report = validate.validate_training(runs)
    if args.json:
        print(report.to_json(orient="records", indent=1))
        return
    validate.print_report(report, console)
