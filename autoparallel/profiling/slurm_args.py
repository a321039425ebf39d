"""The ``--slurm-*`` options of ``profile`` and ``search --profile job``, checked and turned into
``SlurmSettings`` and a launcher.

Why its own module: the options are shared by two commands, each must be refused (one line,
exit 2, naming the value) when it cannot take effect (a Slurm option without ``--executor
slurm``, a malformed ``--slurm-time``), and the launcher gets a live progress display of the
queue. No Slurm command runs at import.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from contextlib import contextmanager
from pathlib import Path

from autoparallel.argtypes import positive
from autoparallel.errors import UserError

# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")
# dest -> the flag (the options that only Slurm reads; --executor slurm must be given with them)
FLAGS = {"slurm_partition": "--slurm-partition", "slurm_account": "--slurm-account", "slurm_time": "--slurm-time",
         "slurm_qos": "--slurm-qos", "sbatch_args": "--sbatch-args", "container_image": "--container-image",
         "slurm_gpus_per_node": "--slurm-gpus-per-node", "slurm_array": "--no-slurm-array",
         "slurm_dir": "--slurm-dir", "yes": "--yes"}


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Slurm (--executor slurm)",
                             "One sbatch job per layout, or one job array for layouts that ask for the same "
                             "nodes; Ctrl-C cancels them (scancel); the same command again picks up the "
                             "finished ones (kept under --slurm-dir) and resubmits the rest.")
    g.add_argument("--slurm-partition", metavar="NAME",
                   help="sbatch --partition (default: the cluster's default partition)")
    g.add_argument("--slurm-account", metavar="NAME", help="sbatch --account")
    g.add_argument("--slurm-time", metavar="TIME",
                   help="sbatch --time per job (default: the job timeout in minutes, plus one)")
    g.add_argument("--slurm-qos", metavar="QOS", help="sbatch --qos")
    g.add_argument("--sbatch-args", metavar="ARGS",
                   help="more sbatch arguments, as one quoted string (e.g. '--exclusive')")
    g.add_argument("--container-image", metavar="IMAGE",
                   help="run the job in this container image (pyxis: srun --container-image)")
    g.add_argument("--slurm-gpus-per-node", metavar="N", type=positive,
                   help="GPUs per node (default: the hardware preset's gpus_per_node)")
    g.add_argument("--no-slurm-array", dest="slurm_array", action="store_false", default=None,
                   help="one job per layout even where a job array would do")
    g.add_argument("--slurm-dir", metavar="DIR", help="job folders, kept for resuming (default: <results>/slurm)")
    g.add_argument("--yes", action="store_true", default=None,
                   help="submit without asking (the jobs and GPU-hours are printed first either way)")
    t = p.add_argument_group("trainer (--executor slurm or local)")
    t.add_argument("--trainer", choices=("builtin", "megatron"), default=None,
                   help="what a job runs: the built-in transformer (default), or a short run of your Megatron-LM "
                        "(the exported train.sh, warm-up + timed steps as --train-iters, mock data unless DATA_PATH; "
                        "through Slurm, or through torchrun on this machine with --executor local)")
    t.add_argument("--megatron-lm", metavar="PATH", help="the Megatron-LM checkout (default: $MEGATRON_LM)")


def check(args: argparse.Namespace) -> None:
    """Slurm options without --executor slurm, a --slurm-time sbatch would refuse, unsplittable
    --sbatch-args, and --profile layer on Slurm: UserError naming the value."""
    given = [flag for dest, flag in FLAGS.items() if getattr(args, dest, None) is not None]
    if given and getattr(args, "executor", "local") != "slurm":
        raise UserError(f"{given[0]} has no effect with --executor {args.executor}: add --executor slurm or drop it")
    trainer = getattr(args, "trainer", None)
    if getattr(args, "megatron_lm", None) is not None and trainer != "megatron":
        raise UserError("--megatron-lm has no effect without --trainer megatron: add it or drop --megatron-lm")
    executor = getattr(args, "executor", "local")
    if trainer == "megatron" and executor == "ray":
        raise UserError("--trainer megatron has no effect with --executor ray: Megatron-LM runs go through Slurm "
                        "(--executor slurm) or torchrun on this machine (--executor local)")
    if trainer == "builtin" and executor != "slurm":
        raise UserError(f"--trainer builtin has no effect with --executor {executor}: it says what a Slurm job "
                        "runs; add --executor slurm or drop it")
    if trainer == "megatron":
        from autoparallel.profiling.megatron_run import checkout
        checkout(args.megatron_lm or os.environ.get("MEGATRON_LM"))
    if executor != "slurm":
        return
    if trainer == "megatron":
        if args.container_image is not None:
            raise UserError("--container-image has no effect with --trainer megatron: train.sh runs torchrun on "
                            "the node; start it in your image with --sbatch-args (e.g. pyxis' --container-image)")
    if getattr(args, "profile", "job") == "layer":
        raise UserError("--executor slurm has no effect with --profile layer: layer profiles are timed in this "
                        "process; use --profile job")
    if args.slurm_time is not None and not _TIME.match(args.slurm_time):
        raise UserError(f"--slurm-time {args.slurm_time!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS, "
                        "D-HH, D-HH:MM or D-HH:MM:SS)")
    extra_args(args)


def extra_args(args: argparse.Namespace) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(args.sbatch_args or ""))
    except ValueError as exc:
        raise UserError(f"--sbatch-args {args.sbatch_args!r}: {exc}") from None


def root(args: argparse.Namespace) -> Path:
    """The job folders' root: --slurm-dir, else <--results>/slurm."""
    return Path(args.slurm_dir) if args.slurm_dir else Path(getattr(args, "results", None) or "results") / "slurm"


def settings(args: argparse.Namespace, gpus_per_node: int | None = None, again: str | None = None):
    """``again``: how to resume an interrupted batch (default: the same command again)."""
    from autoparallel.profiling.slurm import SlurmSettings
    return SlurmSettings(partition=args.slurm_partition, account=args.slurm_account, time=args.slurm_time,
                         qos=args.slurm_qos, extra=extra_args(args), container_image=args.container_image,
                         gpus_per_node=args.slurm_gpus_per_node or gpus_per_node or 8,
                         array=args.slurm_array is not False, root=root(args),
                         **({"again": again} if again else {}))


def launcher(args: argparse.Namespace, console=None, hw=None, again: str | None = None):
    """A SlurmLauncher for candidates priced on ``hw`` (its GPUs per node; default h100-sxm's);
    with a console, it says what it submits and shows the queue's progress."""
    from autoparallel.profiling.slurm_launcher import SlurmLauncher
    return SlurmLauncher(settings(args, hw.gpus_per_node if hw else None, again),
                         echo=console.print if console is not None else None,
                         progress=queue_progress if console is not None else None, trainer=megatron(args, hw))


def megatron(args: argparse.Namespace, hw=None):
    """The MegatronTrainer of ``--trainer megatron`` for candidates priced on ``hw`` (default
    h100-sxm), else None."""
    if getattr(args, "trainer", None) != "megatron":
        return None
    from autoparallel import io
    from autoparallel.profiling.megatron_run import MegatronTrainer, checkout
    return MegatronTrainer(checkout(args.megatron_lm or os.environ.get("MEGATRON_LM")), hw or io.load_hardware("h100-sxm"))


def confirm(args: argparse.Namespace, gpus: list[int], step_times_s, iterations: int, timeout_s: float,
            console=None, note: str = "") -> None:
    """Print what the jobs cost in GPU-hours (and ``note``) and ask before submitting (``budget``)."""
    from autoparallel.profiling import budget
    from autoparallel.profiling.slurm import time_limit, time_seconds
    limit = time_seconds(args.slurm_time or time_limit(timeout_s))
    budget.confirm(budget.summary(gpus, step_times_s, iterations, limit) + note, bool(args.yes), console)


@contextmanager
def queue_progress(total: int):
    """A progress bar over a batch's jobs; yields update(done, jobs per state in the last poll)."""
    from autoparallel.cli.common import progress_bar
    with progress_bar("Slurm jobs", total) as (p, task):
        def update(done: int, counts: dict[str, int]) -> None:
            waiting = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
            p.update(task, completed=done, description=f"Slurm jobs ({waiting})" if waiting else "Slurm jobs")
        yield update
