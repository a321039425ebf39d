"""``--executor slurm`` for the built-in transformer: each profiling job becomes a Slurm task.

Why apart from ``slurm``: that module knows Slurm (submit, wait, cancel, resume) and nothing of
what a job runs; this one knows the built-in transformer's jobs: their resources (one task per
rank; on GPU nodes one GPU per rank, ``gpus_per_node`` ranks a node; on CPU nodes every rank on
one node), the ranks' command (``slurm_rank``) and how a finished job's rank reports become one
``Measurement``. The launcher has the ``LocalLauncher``'s interface (``capacity``, ``run``) and
``run_all``, which the evaluator uses to submit a whole tie band at once. With a ``trainer``
(``megatron_run.MegatronTrainer``) the job is a short run of the user's Megatron-LM instead.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from autoparallel.profiling.job import JobSpec, Measurement, summarize
from autoparallel.profiling.slurm import Resources, SlurmBatch, SlurmClient, SlurmSettings, Task, srun_prefix
from autoparallel.profiling.slurm_rank import JOB_FILE, job_to_dict, rank_file


def failure(reason: str, world: int) -> Measurement:
    oom = "out of memory" in reason.lower() and not reason.startswith("out of memory")
    return Measurement(ok=False, world_size=world, reason=("out of memory: " if oom else "") + reason)


class SlurmLauncher:
    name = "slurm"

    def __init__(self, settings: SlurmSettings, echo: Callable[[str], None] | None = None, progress=None,
                 trainer=None) -> None:
        self.settings = settings
        self.trainer = trainer.with_gpus_per_node(settings.gpus_per_node) if trainer is not None else None
        self.client = SlurmClient(settings)
        self.batch = SlurmBatch(settings, self.client, echo, progress)
        self._nodes: tuple[int, int, int] | None = None

    def nodes(self) -> tuple[int, int, int]:
        """(nodes, CPUs a node, GPUs a node) of the partition; asked once (it also proves
        that slurmctld answers, before a search starts)."""
        if self._nodes is None:
            self._nodes = self.client.partition_nodes()
        return self._nodes

    def gpu_jobs(self, job: JobSpec | None = None) -> bool:
        """GPU jobs unless --device cpu, or --device auto on a partition without GPUs."""
        device = job.device if job is not None else "auto"
        return device == "cuda" or (device == "auto" and self.nodes()[2] > 0)

    def capacity(self) -> tuple[int, str]:
        nodes, cpus, gpus = self.nodes()
        if self.gpu_jobs():
            return nodes * gpus, f"the Slurm partition's {nodes * gpus} GPUs ({nodes} nodes x {gpus})"
        return cpus, f"the {cpus} CPUs of one node of the Slurm partition (CPU jobs run on one node)"

    def resources(self, job: JobSpec) -> Resources:
        world = job.plan.num_gpus
        if self.gpu_jobs(job):
            per_node = min(world, self.settings.gpus_per_node)
            return Resources(nodes=-(-world // per_node), tasks_per_node=per_node, gpus_per_node=per_node)
        return Resources(nodes=1, tasks_per_node=world, cpus_per_task=job.threads_per_rank or 1)

    def task(self, job: JobSpec) -> Task:
        world = job.plan.num_gpus
        if self.trainer is not None:
            t = self.trainer
            script = t.script(job)
            resources = t.resources(job, self.gpu_jobs(job))
            return Task(key={**t.key(), "script": script, "resources": resources.__dict__,
                             "warmup": job.warmup, "steps": job.steps},
                        body=t.body(), resources=resources, timeout_s=job.timeout_s,
                        collect=lambda folder: t.collect(job, folder), fail=lambda why: failure(why, world),
                        files={"train.sh": script}, name="autoparallel-megatron")
        python = "python" if self.settings.container_image else sys.executable
        spec = job_to_dict(job)
        body = [f'{srun_prefix(self.settings, [str(self.settings.root.resolve())])} '
                f'{shlex.quote(python)} -m autoparallel.profiling.slurm_rank "$TASK_DIR"']
        return Task(key={"trainer": "builtin", "job": spec, "resources": self.resources(job).__dict__,
                         "container": self.settings.container_image, "python": python},
                    body=body, resources=self.resources(job), timeout_s=job.timeout_s,
                    collect=lambda folder: collect(job, folder), fail=lambda why: failure(why, world),
                    files={JOB_FILE: json.dumps(spec, indent=1)}, name="autoparallel-profile")

    def run_all(self, jobs: Sequence[JobSpec], on_result: Callable[[int, Measurement], None] | None = None) -> list[Measurement]:
        return self.batch.run([self.task(job) for job in jobs], on_result)

    def run(self, job: JobSpec) -> Measurement:
        return self.run_all([job])[0]


def collect(job: JobSpec, folder: Path) -> Measurement:
    """The job's Measurement from its ranks' reports; ValueError when a report is missing."""
    reports = []
    for rank in range(job.plan.num_gpus):
        path = rank_file(folder, rank)
        if not path.exists():
            raise ValueError(f"rank {rank} left no report ({path.name})")
        report = json.loads(path.read_text())
        if not report.get("ok"):
            return failure(f"rank {rank}: {report.get('error', '')}", job.plan.num_gpus)
        reports.append(report)
    return summarize(job, reports, 0.0)
