"""A batch of profiling jobs on a Slurm cluster: submit, wait, collect, cancel, resume (issue 26).

Why not one blocking ``srun`` per candidate: a cluster queues jobs, so the candidates of a tie
band are submitted together (one job each, or one job array when they ask for the same
resources) and waited on together. Every Slurm command runs with a timeout, so a controller
that does not answer is a ``UserError`` within seconds, not a hang.

Each task has a folder named by the hash of what it runs (``<root>/<hash>/``): the batch script,
Slurm's output, what the job leaves behind, and ``slurm.json`` (the job id and the final state).
That is what makes a batch resumable: an interrupted batch is cancelled (``scancel``) and leaves
its folders; submitting the same tasks again picks up the ones that finished (also those that
ended, or are still queued, after an earlier run was killed outright) and resubmits the rest
(cancelled, timed out, preempted, node failure: ``RETRIED``).
A job's end is read from ``squeue`` while it is queued or running, then ``scontrol show job``
(kept for ``MinJobAge``), then ``sacct`` where the cluster keeps accounting. Out of memory, a
node failure, a time limit or a cancellation become the task's failure reason; the batch goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from autoparallel.errors import UserError
from autoparallel.profiling.job import out_of_memory_line
from autoparallel.words import plural

STATE_FILE = "slurm.json"
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# Final states other than COMPLETED, with the reason a failed task records.
FAILED = {"FAILED": "the job failed", "OUT_OF_MEMORY": "out of memory (Slurm)",
          "TIMEOUT": "Slurm time limit reached", "NODE_FAIL": "node failure", "CANCELLED": "cancelled",
          "PREEMPTED": "preempted", "BOOT_FAIL": "node boot failure", "DEADLINE": "deadline reached",
          "REVOKED": "revoked"}
# A task that ended so is measured again on resume; the others (it ran, or failed on its own) are kept.
RETRIED = {"TIMEOUT", "NODE_FAIL", "CANCELLED", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "TIMED_OUT"}


@dataclass(frozen=True)
class SlurmSettings:
    """What every job of a batch asks Slurm for, besides its own resources."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # sbatch --time; default: the task's timeout rounded up to minutes, +1
    qos: str | None = None
    extra: tuple[str, ...] = ()  # more sbatch arguments, as given
    container_image: str | None = None  # pyxis: srun --container-image
    gpus_per_node: int = 8
    array: bool = True  # tasks asking for the same resources go in one job array
    poll_s: float = 1.0
    again: str = "run the same command again"  # how to resume, said when interrupted
    command_timeout_s: float = 15.0
    root: Path = Path("results") / "slurm"


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1


@dataclass
class Task:
    """One job: ``body`` is the script's command lines (``$TASK_DIR`` is its folder), ``key`` what
    it runs (the folder's name is its hash), ``collect`` reads a finished job's folder into a
    result (or raises ValueError naming what is missing), ``fail`` makes a failure result from a
    reason, ``timeout_s`` bounds its running time."""

    key: dict
    body: list[str]
    resources: Resources
    collect: Callable[[Path], object]
    fail: Callable[[str], object]
    timeout_s: float
    name: str = "autoparallel"
    files: dict[str, str] = field(default_factory=dict)  # written into the folder before it is submitted
    folder: Path = field(default=Path("."))


def run_command(args: Sequence[str], timeout_s: float, check: bool = True) -> subprocess.CompletedProcess:
    """A Slurm command with a timeout; a missing command or no answer is a UserError."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise UserError(f"--executor slurm: {args[0]} is not on PATH (is this a Slurm login node?)") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"--executor slurm: {args[0]} did not answer within {timeout_s:g} s; is slurmctld "
                        f"up (SLURM_CONF={os.environ.get('SLURM_CONF', 'default')})?") from None
    if check and done.returncode != 0:
        text = " ".join((done.stderr or done.stdout).split())[:300]
        raise UserError(f"--executor slurm: {' '.join(args[:2])} failed: {text}")
    return done


def task_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def time_limit(seconds: float) -> str:
    """sbatch --time for a task that may run ``seconds``: whole minutes (Slurm's unit), one spare."""
    return str(int(-(-seconds // 60)) + 1)


def time_seconds(text: str) -> float:
    """Seconds of an sbatch --time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))  # D-HH[:MM[:SS]]
        h, m, sec = parts
    else:
        h, m, sec = ([0, 0] + parts)[-3:] if len(parts) == 3 else (0, parts[0], parts[1] if len(parts) > 1 else 0)
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + sec


def batch_script(tasks: list[Task], settings: SlurmSettings, array: bool) -> str:
    """The sbatch script of one task, or of a job array over ``tasks`` (same resources)."""
    r = tasks[0].resources
    folders = [str(t.folder) for t in tasks]
    lines = ["#!/bin/bash", f"#SBATCH --job-name={tasks[0].name}", f"#SBATCH --nodes={r.nodes}",
             f"#SBATCH --ntasks-per-node={r.tasks_per_node}", f"#SBATCH --cpus-per-task={r.cpus_per_task}",
             f"#SBATCH --time={settings.time or time_limit(max(t.timeout_s for t in tasks))}"]
    if r.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={r.gpus_per_node}")
    for flag in ("partition", "account", "qos"):
        if getattr(settings, flag):
            lines.append(f"#SBATCH --{flag}={getattr(settings, flag)}")
    # Each task writes its output into its own folder (an array's tasks have different folders).
    lines.append("#SBATCH --output=/dev/null")
    if array:
        lines += [f"#SBATCH --array=0-{len(tasks) - 1}", "FOLDERS=(" + " ".join(shlex.quote(f) for f in folders) + ")",
                  'TASK_DIR=${FOLDERS[$SLURM_ARRAY_TASK_ID]}']
    else:
        lines.append(f"TASK_DIR={shlex.quote(folders[0])}")
    lines += ['exec >"$TASK_DIR/slurm-$SLURM_JOB_ID.out" 2>&1',
              "export TASK_DIR",
              'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))  # one port per job: jobs may share a node",
              "set -euo pipefail"]
    return "\n".join(lines + tasks[0].body) + "\n"


def srun_prefix(settings: SlurmSettings, mounts: Sequence[str] = ()) -> str:
    """srun that stops every rank when one fails, inside the container image if one is given."""
    words = ["srun", "--kill-on-bad-exit=1"]
    if settings.container_image:
        words.append(f"--container-image={settings.container_image}")
        if mounts:  # the job folders, at the same path inside
            words.append(f"--container-mounts={','.join(f'{m}:{m}' for m in mounts)}")
    return " ".join(shlex.quote(w) for w in words)


def _read_state(folder: Path) -> dict:
    try:
        return json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(folder: Path, state: dict) -> None:
    tmp = folder / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, folder / STATE_FILE)


class SlurmClient:
    """The Slurm commands a batch needs, each with ``settings.command_timeout_s``."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_command(args, self.settings.command_timeout_s, check)

    def partition_nodes(self) -> tuple[int, int, int]:
        """(nodes, CPUs per node, GPUs per node) of the partition (the default one if unset)."""
        args = ["sinfo", "-h", "-o", "%D|%c|%G|%P"] + (["-p", self.settings.partition] if self.settings.partition else [])
        rows = [line.split("|") for line in self._run(*args).stdout.splitlines() if line.count("|") == 3]
        if not self.settings.partition:
            rows = [r for r in rows if r[3].endswith("*")] or rows
        if not rows:
            where = f"partition {self.settings.partition!r}" if self.settings.partition else "a default partition"
            raise UserError(f"--executor slurm: sinfo shows no {where}")
        nodes = sum(int(r[0]) for r in rows)
        cpus = max(int(r[1].rstrip("+")) for r in rows)
        gpus = 0
        for gres in rows[0][2].split(","):
            parts = gres.split("(")[0].split(":")
            if parts[0] == "gpu" and parts[-1].isdigit():
                gpus = int(parts[-1])
        return nodes, cpus, gpus

    def submit(self, script: Path) -> str:
        out = self._run("sbatch", "--parsable", *self.settings.extra, str(script)).stdout.strip()
        return out.split(";")[0]

    def active(self, job_ids: Sequence[str]) -> dict[str, str]:
        """State of each of ``job_ids`` still queued or running (array tasks one by one)."""
        if not job_ids:
            return {}
        parents = sorted({j.split("_")[0] for j in job_ids})
        done = self._run("squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(parents), check=False)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return {}
            raise UserError(f"--executor slurm: squeue failed: {' '.join(done.stderr.split())[:300]}")
        states = dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
        return {j: states[j] for j in job_ids if j in states}

    def final(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job that left the queue: scontrol, then sacct; ('', '') if neither knows."""
        done = self._run("scontrol", "show", "job", "-o", job_id, check=False)
        if done.returncode == 0 and "JobState=" in done.stdout:
            fields = dict(w.split("=", 1) for w in done.stdout.split() if "=" in w)
            state = fields.get("JobState", "")
            return state, f"{state} (reason {fields.get('Reason', 'None')}, exit code {fields.get('ExitCode', '?')})"
        done = self._run("sacct", "-n", "-P", "-X", "-o", "State,ExitCode", "-j", job_id, check=False)
        if done.returncode == 0 and done.stdout.strip():
            state, _, code = done.stdout.splitlines()[0].partition("|")
            state = state.split()[0]
            return state, f"{state} (exit code {code})"
        return "", ""

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._run("scancel", *job_ids, check=False)


def _tail(folder: Path, lines: int = 3) -> str:
    outs = sorted(folder.glob("slurm-*.out"), key=lambda p: p.stat().st_mtime)
    if not outs:
        return ""
    text = [line for line in outs[-1].read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(text[-lines:])[:400]


class SlurmBatch:
    """Run tasks on Slurm and return one result per task, in order (see the module docstring)."""

    def __init__(self, settings: SlurmSettings, client: SlurmClient | None = None,
                 echo: Callable[[str], None] | None = None, progress=None) -> None:
        """``echo``: where to say what is submitted or picked up; ``progress(total)``: a context
        manager giving update(done, jobs per state) for a display of the queue."""
        self.settings, self.client = settings, client or SlurmClient(settings)
        self.echo = echo or (lambda text: None)
        self.progress = progress

    def run(self, tasks: list[Task], on_result: Callable[[int, object], None] | None = None) -> list:
        results: dict[int, object] = {}
        waiting: dict[int, str] = {}  # task index -> job id
        fresh: list[int] = []
        earlier = 0  # tasks an earlier run submitted
        for i, t in enumerate(tasks):
            t.folder = (self.settings.root / task_hash(t.key)).resolve()
            t.folder.mkdir(parents=True, exist_ok=True)
            (t.folder / "task.json").write_text(json.dumps(t.key, indent=1, sort_keys=True, default=str))
            state = _read_state(t.folder)
            earlier += bool(state.get("job_id"))
            if state.get("final") and state["final"] not in RETRIED:
                results[i] = self._collect(t, state["final"], state.get("reason", ""))
            elif state.get("job_id") and not state.get("final"):
                waiting[i] = state["job_id"]  # submitted by an earlier run that was killed outright
            else:
                fresh.append(i)
        fresh += self._settle(tasks, waiting, results)
        if earlier:
            self.echo(f"resuming: {plural(len(results), 'finished job')} picked up, "
                      f"{len(waiting)} still queued or running, "
                      f"{len(fresh)} to submit (in {self.settings.root})")
        for i, r in results.items():
            if on_result:
                on_result(i, r)
        try:
            with self.progress(len(tasks)) if self.progress else nullcontext(lambda done, counts: None) as update:
                waiting.update(self._submit(tasks, fresh))
                self._wait(tasks, waiting, results, on_result, update)
        except KeyboardInterrupt:
            left = sorted(set(waiting.values()))
            self.client.cancel(left)
            for i, job in waiting.items():  # submitted again on resume
                _write_state(tasks[i].folder, {"job_id": job, "final": "CANCELLED", "reason": "interrupted (scancel)"})
            raise KeyboardInterrupt(f"cancelled {plural(len(left), 'Slurm job')} (scancel); "
                                    f"{plural(len(results), 'finished result')} "
                                    f"kept in {self.settings.root}: {self.settings.again} to pick them up "
                                    "and resubmit the rest") from None
        return [results[i] for i in range(len(tasks))]

    def finished_earlier(self, tasks: list[Task]) -> list[bool]:
        """Which tasks an earlier run saw end for good: their results are read back, not
        submitted again (what ``run`` will do with them, asked before it runs)."""
        states = [_read_state(self.settings.root / task_hash(t.key)) for t in tasks]
        unseen = [s["job_id"] for s in states if s.get("job_id") and not s.get("final")]  # a killed run's
        active = self.client.active(unseen)

        def ended(state: dict) -> bool:
            final = state.get("final")
            if not final and state.get("job_id") and state["job_id"] not in active:
                final = self.client.final(state["job_id"])[0]
            return bool(final) and final not in RETRIED and final not in ACTIVE
        return [ended(s) for s in states]

    def _settle(self, tasks: list[Task], waiting: dict[int, str], results: dict) -> list[int]:
        """Jobs an earlier run submitted and never saw end: those still queued stay in ``waiting``;
        those that ended meanwhile are collected into ``results``, except the ones that ended
        before measuring (cancelled, timed out, node failure: ``RETRIED``, or forgotten by Slurm
        without leaving a result), which are returned to be submitted again."""
        again = []
        states = self.client.active(list(waiting.values()))
        for i, job in list(waiting.items()):
            if states.get(job) in ACTIVE:
                continue
            final, reason = self.client.final(job)
            if final in ACTIVE:  # it left squeue's answer between the two commands: wait for it
                continue
            del waiting[i]
            if final in RETRIED:
                again.append(i)
            elif final:
                results[i] = self._collect(tasks[i], final, reason)
                _write_state(tasks[i].folder, {**_read_state(tasks[i].folder), "final": final, "reason": reason})
            else:  # Slurm forgot it: what it left behind, if anything
                try:
                    results[i] = tasks[i].collect(tasks[i].folder)
                except ValueError:
                    again.append(i)
                    continue
                _write_state(tasks[i].folder, {**_read_state(tasks[i].folder), "final": "UNKNOWN",
                                               "reason": "Slurm no longer knows the job; its results were read"})
        return again

    def _submit(self, tasks: list[Task], indices: list[int]) -> dict[int, str]:
        groups: dict[tuple, list[int]] = {}
        for i in indices:
            groups.setdefault((tasks[i].resources, tuple(tasks[i].body), tasks[i].name) if self.settings.array else (i,),
                              []).append(i)
        submitted: dict[int, str] = {}
        for members in groups.values():
            array = self.settings.array and len(members) > 1
            script = tasks[members[0]].folder / ("array.sbatch" if array else "job.sbatch")
            script.write_text(batch_script([tasks[i] for i in members], self.settings, array))
            for i in members:  # a resubmitted task starts clean
                for old in list(tasks[i].folder.glob("rank*.json")) + list(tasks[i].folder.glob("slurm-*.out")):
                    old.unlink()
                for name, text in tasks[i].files.items():
                    (tasks[i].folder / name).write_text(text)
            job = self.client.submit(script)
            for n, i in enumerate(members):
                submitted[i] = f"{job}_{n}" if array else job
                _write_state(tasks[i].folder, {"job_id": submitted[i], "submitted": time.time()})
        if submitted:
            ids = sorted(set(j.split('_')[0] for j in submitted.values()))
            self.echo(f"submitted {plural(len(submitted), 'Slurm job')}: {', '.join(ids)}")
        return submitted

    def _wait(self, tasks, waiting: dict[int, str], results: dict, on_result, update) -> None:
        started: dict[int, float] = {}
        while waiting:
            states = self.client.active(list(waiting.values()))
            counts: dict[str, int] = {}
            for state in states.values():
                counts[state] = counts.get(state, 0) + 1
            update(len(results), counts)
            now = time.monotonic()
            for i, job in list(waiting.items()):
                state = states.get(job)
                if state in ACTIVE:
                    if state == "RUNNING":
                        started.setdefault(i, now)
                    if i in started and now - started[i] > tasks[i].timeout_s:
                        self.client.cancel([job])
                        self._finish(tasks, i, waiting, results, on_result, "TIMED_OUT",
                                     f"timed out after {tasks[i].timeout_s:.0f} s (scancel)")
                    continue
                final, reason = self.client.final(job)
                if final in ACTIVE:  # between squeue and scontrol it moved on: next poll
                    continue
                self._finish(tasks, i, waiting, results, on_result, final or "UNKNOWN", reason)
            if waiting:
                time.sleep(self.settings.poll_s)

    def _finish(self, tasks, i, waiting, results, on_result, final: str, reason: str) -> None:
        t = tasks[i]
        _write_state(t.folder, {**_read_state(t.folder), "final": final, "reason": reason})
        results[i] = self._collect(t, final, reason)
        del waiting[i]
        if on_result:
            on_result(i, results[i])

    def _collect(self, t: Task, final: str, reason: str):
        if final in ("COMPLETED", "UNKNOWN"):
            try:
                return t.collect(t.folder)
            except ValueError as exc:
                if final == "COMPLETED":
                    return t.fail(f"the job completed but {exc}")
        detail = FAILED.get(final)  # None for our own timeout and an unknown end: the reason says it
        head = f"{detail}: {reason}" if detail and reason else detail or reason or "ended in an unknown state"
        return t.fail("; ".join(part for part in (head, _failure_detail(t)) if part))


def _failure_detail(t: Task) -> str:
    """What ended the job: the first rank srun saw exit (or be killed for memory), and the
    error a rank reported, else the end of the job's output."""
    parts = []
    outs = sorted(t.folder.glob("slurm-*.out"), key=lambda p: p.stat().st_mtime)
    lines = outs[-1].read_text(errors="replace").splitlines() if outs else []
    if oom := out_of_memory_line(lines):
        parts.append(oom[:300])
    for line in lines:
        if "srun: error:" in line and ("Exited with exit code" in line or "memory" in line.lower()):
            parts.append(line.split("srun: error:", 1)[1].strip())
            break
    for path in sorted(t.folder.glob("rank*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not report.get("ok", True):
            parts.append(f"{path.stem}: {report.get('error', '')}")
            break
    return "; ".join(parts) or _tail(t.folder)
