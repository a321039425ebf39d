"""``autoparallel export``: a ranked entry of a run as Megatron-LM arguments, a launch script,
NeMo 1.x YAML, a NeMo 2 Python recipe or its fields as YAML, or best.yaml's document.

The Megatron-LM format is flags only, so that it can be appended to a ``pretrain_gpt.py``
command; the environment a plan needs goes to stderr as a note (it is in train.sh and in
best.yaml's ``environment`` block)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoparallel.argtypes import positive
from autoparallel.errors import UserError

FORMATS = ("megatron", "launch", "nemo", "nemo2", "nemo2-yaml", "yaml")


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="write a ranked entry of a run as Megatron-LM args, train.sh, NeMo or YAML")
    x.add_argument("run_dir", help="a run folder, e.g. results/<date>_<model>_<gpus>x<gpu>")
    x.add_argument("--rank", type=positive, default=1, help="the ranked entry to export (default 1, the best)")
    x.add_argument("--format", choices=FORMATS, default="yaml",
                   help="megatron: flags only, one per line (the environment they need is noted on stderr); "
                        "launch: train.sh (torchrun, or sbatch/srun across nodes); nemo: NeMo 1.x YAML; nemo2: a "
                        "NeMo 2 Python recipe (llm.<model>.pretrain_recipe with every field set); nemo2-yaml: the "
                        "same fields as YAML (NeMo-Run overrides); yaml: best.yaml's document (default)")
    x.add_argument("--output", "-o", help="file to write (default stdout)")
    x.set_defaults(func=run)


def export_text(result, rank: int, fmt: str) -> str:
    """The text ``export`` writes for one ranked entry of a loaded run."""
    import yaml

    from autoparallel.report.export import megatron_args
    from autoparallel.report.nemo import nemo1_config, nemo2_recipe
    from autoparallel.report.nemo_python import nemo2_python
    from autoparallel.report.shared import nemo_unsupported
    from autoparallel.search import run as runs
    plan, per_node = result.plan(rank), result.hardware.gpus_per_node
    title = f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}, rank {rank}"
    from autoparallel.costmodel.finetune import is_lora
    if is_lora(result.model) and fmt in ("megatron", "launch", "nemo"):
        raise UserError(f"--format {fmt}: the run fine-tunes with LoRA, which Megatron-LM's pretrain_gpt.py and NeMo "
                        "1's pre-training config cannot express; use --format nemo2 or nemo2-yaml (NeMo 2's "
                        "finetune_recipe with its peft fields), or yaml")
    if fmt == "megatron":
        return " \\\n".join(megatron_args(result.model, plan)) + "\n"
    if fmt == "launch":
        return runs.launch_script(result.model, result.hardware, result.entry(rank), title)
    if fmt in ("nemo", "nemo2", "nemo2-yaml") and (why := nemo_unsupported(plan, result.model)):
        if result.model.is_dsv4:  # the model's refusal (it names the model), not the plan's precision
            raise UserError(f"--format {fmt}: {why}")
        if result.model.is_hybrid:
            raise UserError(f"--format {fmt}: {result.model.name}: {why}")
        if plan.lora_input_regather:  # the plan's LoRA knob, not its precision
            raise UserError(f"--format {fmt}: rank {rank}: {why}")
        raise UserError(f"--format {fmt}: rank {rank} is {plan.precision}; {why}")
    if fmt == "nemo2":
        return nemo2_python(result.model, plan, per_node, title)
    if fmt == "nemo":
        return yaml.safe_dump(nemo1_config(result.model, plan, per_node), sort_keys=False)
    if fmt == "nemo2-yaml":
        return yaml.safe_dump(nemo2_recipe(result.model, plan, per_node), sort_keys=False)
    return yaml.safe_dump(runs.plan_document(result.model, result.hardware, result.entry(rank)),
                          sort_keys=False, width=100)


def run(args: argparse.Namespace) -> None:
    from autoparallel import safefile
    from autoparallel.search import run as runs
    if args.output:
        safefile.check_output_file(args.output, "--output")
        _check_not_the_runs_own(Path(args.output), Path(args.run_dir))
    result = runs.load(Path(args.run_dir))
    text = export_text(result, args.rank, args.format)
    if args.format == "megatron":
        _note_environment(result.plan(args.rank))
    if args.output:  # on stderr, so that stdout stays empty; a file replaced is named as such
        existed = Path(args.output).exists()
        safefile.write_atomic(Path(args.output), text, "--output")
        print(f"{'replaced' if existed else 'wrote'} {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _check_not_the_runs_own(output: Path, run_dir: Path) -> None:
    """-o naming a file the run folder is read from (its manifest, tables, measurements, study) would
    leave the folder unreadable or lose what `--profile` measured: refused (best.yaml and train.sh,
    which nothing reads back, may be replaced)."""
    import os

    from autoparallel.report.run_folder import CANDIDATES, MANIFEST, PROFILED
    from autoparallel.search.run import REJECTIONS
    for name in (MANIFEST, CANDIDATES, REJECTIONS, PROFILED, "candidates.parquet", "study.db", "study.journal"):
        try:
            same = os.path.samefile(output, run_dir / name)
        except OSError:  # either is missing (or unreadable): nothing of the run's is replaced
            continue
        if same:
            raise UserError(f"--output {output} is the run folder's own {name}, which export and report read; "
                            f"give another file name")


def _note_environment(plan) -> None:
    """The variables the flags need, on stderr (the flag file itself stays flags only)."""
    from autoparallel.report.export import megatron_env
    env = megatron_env(plan)
    if env:
        print("note: these flags need " + " ".join(f"{k}={v}" for k, v in env.items())
              + " in the environment (train.sh exports it; best.yaml: environment)", file=sys.stderr)
