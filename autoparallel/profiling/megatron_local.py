"""``--trainer megatron --executor local``: the short Megatron-LM run on this machine, through
the exported train.sh's own torchrun (issue 26).

Why: a user with one node of GPUs (or a login node's interactive allocation) profiles the tie
band without a scheduler. The job is the one Slurm would run (``MegatronTrainer.script``: the
export as a short run), laid out on this machine's ranks; its log is kept in the job's folder
(``<results>/megatron/<hash>/train.log``, readable by ``runs import``) and read by the same
``MegatronTrainer.collect``. One job at a time; a job past its timeout, or interrupted, has its
process tree (train.sh, torchrun and its ranks) stopped; a failing run becomes the Measurement's
reason (the trainer's out-of-memory line, else the end of its log), and the search goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from autoparallel.profiling.job import JobSpec, Measurement
from autoparallel.profiling.launcher import local_capacity
from autoparallel.profiling.megatron_run import LOG, SCRIPT, MegatronTrainer
from autoparallel.profiling.slurm import task_hash


def failure_reason(log: Path, returncode: int) -> str:
    """Why a run ended without a measurement: its exit, and the log's out-of-memory line or last lines."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    oom = next((line for line in lines if "out of memory" in line.lower()), "")
    detail = oom[:300] or " | ".join(lines[-3:])[:400]
    head = f"exit code {returncode}" if returncode >= 0 else f"killed by signal {-returncode}"
    return ("out of memory: " if oom else "") + f"train.sh ended with {head}" + (f": {detail}" if detail else "")


class MegatronLocalLauncher:
    """The ``LocalLauncher`` interface (``capacity``, ``run``) for Megatron-LM short runs."""

    name = "local"

    def __init__(self, trainer: MegatronTrainer, root: Path) -> None:
        self.root = Path(root).resolve()
        n = local_capacity()[0]
        self.trainer = trainer.with_gpus_per_node(n)  # one node: torchrun starts every rank here

    def capacity(self) -> tuple[int, str]:
        return local_capacity()

    def run(self, job: JobSpec) -> Measurement:
        world = job.plan.num_gpus
        script = self.trainer.script(job)
        folder = self.root / task_hash({**self.trainer.key(), "script": script, "steps": job.steps,
                                        "warmup": job.warmup})
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SCRIPT).write_text(script)
        (folder / "task.json").write_text(json.dumps({"plan": job.plan.as_dict(), **self.trainer.key()}, indent=1))
        env = {**os.environ, "MEGATRON_LM": str(self.trainer.root)}
        with open(folder / LOG, "w") as log:
            proc = subprocess.Popen(["bash", str(folder / SCRIPT)], cwd=folder, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=job.timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return Measurement(ok=False, world_size=world,
                                   reason=f"timed out after {job.timeout_s:.0f} s (log: {folder / LOG})")
            except KeyboardInterrupt:
                _kill(proc)
                raise
        if code != 0:
            return Measurement(ok=False, world_size=world, reason=failure_reason(folder / LOG, code))
        try:
            return self.trainer.collect(job, folder)
        except ValueError as exc:
            return Measurement(ok=False, world_size=world, reason=f"train.sh ran but {exc}")


def _kill(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """train.sh, torchrun and its ranks (torchrun starts each rank in a session of its own, so
    the process tree is read from /proc, not taken from the process group): SIGTERM, then
    SIGKILL to what is left after ``grace_s``."""
    tree = _descendants(proc.pid) + [proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while (tree := [pid for pid in tree if _alive(pid)]) and time.monotonic() < deadline:
            proc.poll()  # reaps train.sh
            time.sleep(0.1)
        if not tree:
            break
    proc.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; its parent reaps it


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux /proc; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
