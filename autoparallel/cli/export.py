"""``autoparallel export``: a ranked entry of a run as Megatron-LM arguments, NeMo YAML or YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoparallel.argtypes import positive


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="write a ranked entry of a run as Megatron-LM args, NeMo YAML or YAML")
    x.add_argument("run_dir")
    x.add_argument("--rank", type=positive, default=1)
    x.add_argument("--format", choices=("megatron", "nemo", "yaml"), default="yaml")
    x.add_argument("--output", "-o", help="file to write (default stdout)")
    x.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    import yaml

    from autoparallel.report import run_folder
    from autoparallel.report.export import megatron_args, nemo_config
    from autoparallel.search import run as runs
    if args.output:
        run_folder.check_output_file(Path(args.output), "--output")
    result = runs.load(Path(args.run_dir))
    plan = result.plan(args.rank)
    if args.format == "megatron":
        text = " \\\n  ".join(megatron_args(result.model, plan)) + "\n"
    elif args.format == "nemo":
        text = yaml.safe_dump(nemo_config(result.model, plan), sort_keys=False)
    else:
        text = yaml.safe_dump(runs.plan_document(result.model, result.entry(args.rank)), sort_keys=False, width=100)
    if args.output:
        run_folder.write_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)
