"""``autoparallel export``: a ranked entry of a run as Megatron-LM arguments, a launch script,
NeMo 1.x YAML, NeMo 2.x recipe fields or best.yaml's document."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoparallel.argtypes import positive

FORMATS = ("megatron", "launch", "nemo", "nemo2", "yaml")


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="write a ranked entry of a run as Megatron-LM args, train.sh, NeMo or YAML")
    x.add_argument("run_dir")
    x.add_argument("--rank", type=positive, default=1)
    x.add_argument("--format", choices=FORMATS, default="yaml",
                   help="megatron: flags (with the environment they need), one per line; launch: train.sh "
                        "(torchrun, or sbatch/srun across nodes); nemo: NeMo 1.x YAML; nemo2: NeMo 2.x llm recipe "
                        "fields; yaml: best.yaml's document (default)")
    x.add_argument("--output", "-o", help="file to write (default stdout)")
    x.set_defaults(func=run)


def export_text(result, rank: int, fmt: str) -> str:
    """The text ``export`` writes for one ranked entry of a loaded run."""
    import yaml

    from autoparallel.report.export import megatron_args, megatron_env
    from autoparallel.report.nemo import nemo1_config, nemo2_recipe
    from autoparallel.search import run as runs
    plan, per_node = result.plan(rank), result.hardware.gpus_per_node
    if fmt == "megatron":
        env = "".join(f"export {k}={v}\n" for k, v in megatron_env(plan).items())
        return env + " \\\n".join(megatron_args(result.model, plan)) + "\n"
    if fmt == "launch":
        title = f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}, rank {rank}"
        return runs.launch_script(result.model, result.hardware, result.entry(rank), title)
    if fmt == "nemo":
        return yaml.safe_dump(nemo1_config(result.model, plan, per_node), sort_keys=False)
    if fmt == "nemo2":
        return yaml.safe_dump(nemo2_recipe(result.model, plan, per_node), sort_keys=False)
    return yaml.safe_dump(runs.plan_document(result.model, result.hardware, result.entry(rank)),
                          sort_keys=False, width=100)


def run(args: argparse.Namespace) -> None:
    from autoparallel import safefile
    from autoparallel.search import run as runs
    if args.output:
        safefile.check_output_file(Path(args.output), "--output")
    text = export_text(runs.load(Path(args.run_dir)), args.rank, args.format)
    if args.output:
        safefile.write_atomic(Path(args.output), text, "--output")
    else:
        sys.stdout.write(text)
