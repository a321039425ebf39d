"""How a search's top-k was profiled, kept in its run folder (``profiling.yaml``), so that
``search --resume RUN_DIR`` finishes a profiling that was interrupted (issue 26).

Why: profiling on a cluster outlives the command that started it. A search interrupted while
its Slurm jobs queue (Ctrl-C, SIGTERM, a lost login session) leaves a run folder with the
predictions and, beside it, the job folders; resuming must submit the very same jobs (a job's
folder is named by the hash of what it runs) to pick up the ones that finished meanwhile and
resubmit the rest. So the options that decide what a job runs and where are written here before
the first job starts, ``finished: false``; the re-ranked tables set ``finished: true``.
``--resume RUN_DIR`` without ``--profile`` takes them back from an unfinished record; options
given again on the command line (``--yes``, a Slurm option) win over the record.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel import io
from autoparallel.errors import UserError
from autoparallel.report import run_folder

FILE = "profiling.yaml"
# What decides the jobs of `search --profile job|layer`: options with an argparse default (always
# taken from the record: the command line cannot tell that they were given), then those that are
# None unless given (given again on the command line, they win over the record).
DEFAULTED = ("profile", "top_k", "profile_steps", "profile_warmup", "profile_timeout", "executor", "device")
OPTIONS = DEFAULTED + ("memory_cap_gib", "ray_address", "trainer", "megatron_lm", "slurm_partition", "slurm_account",
                       "slurm_time", "slurm_qos", "sbatch_args", "container_image", "slurm_gpus_per_node",
                       "slurm_array", "slurm_dir")


def write(run_dir: Path, args: argparse.Namespace, slurm_dir: Path | None) -> None:
    """Record ``args``' profiling options (``slurm_dir``: the job folders' root, made absolute)."""
    options = {name: getattr(args, name, None) for name in OPTIONS}
    if slurm_dir is not None:
        options["slurm_dir"] = str(Path(slurm_dir).resolve())
    run_folder.write_yaml(Path(run_dir) / FILE, {"finished": False, "options": options})


def finish(run_dir: Path) -> None:
    path = Path(run_dir) / FILE
    if path.exists():
        data = io.read_yaml(path)
        run_folder.write_yaml(path, {**data, "finished": True})


def restore(args: argparse.Namespace, run_dir: Path) -> None:
    """``search --resume`` without ``--profile``: fill ``args`` from an unfinished record. A
    record that is not one is a UserError naming it."""
    path = Path(run_dir) / FILE
    if getattr(args, "profile", "none") != "none" or not path.exists():
        return
    data = io.read_yaml(path)
    options = data.get("options")
    if not isinstance(options, dict) or set(options) - set(OPTIONS) or not isinstance(data.get("finished"), bool):
        raise UserError(f"{path} is not a profiling record (expected finished: true|false and options: "
                        f"{', '.join(OPTIONS)}); delete it, and profile again with --profile job")
    if data["finished"]:
        return
    if why := _damage(options):
        raise UserError(f"{path}: {why}; delete it, and profile again with --profile job")
    for name, value in options.items():
        if name in DEFAULTED or getattr(args, name, None) is None:
            setattr(args, name, value)


def _damage(options: dict) -> str:
    """What is wrong with a record's values ('' if nothing): the ones a job depends on most."""
    from autoparallel.profiling.commands import EXECUTORS
    choices = {"profile": ("job", "layer"), "executor": EXECUTORS, "trainer": (None, "builtin", "megatron")}
    for name, allowed in choices.items():
        if options.get(name) not in allowed:
            return f"{name} {options.get(name)!r} is not one of {', '.join(map(str, allowed))}"
    for name, least in (("top_k", 1), ("profile_steps", 1), ("profile_warmup", 0), ("profile_timeout", 1e-9)):
        value = options.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
            return f"{name} {value!r} is not a number >= {least:g}"
    return ""
