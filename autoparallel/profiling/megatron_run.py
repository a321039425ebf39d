"""``--trainer megatron``: a profiling job that is a short run of the user's own Megatron-LM.

Why: the built-in transformer measures a layout as autoparallel implements it; the last word on
a layout is the trainer that will train with it. The job is the ``train.sh`` that ``export``
writes for the candidate, made a short run (``launch.short_run_args``: ``--train-iters`` =
warm-up + timed steps, ``--mock-data`` unless ``DATA_PATH`` is set, ``--log-interval 1``,
``--log-throughput``, timers, ``--exit-interval``, no checkpoint), started by Slurm with
``MEGATRON_LM`` pointing at the user's checkout. Its log is read by the reader of ``runs
import`` (``runlogs``): the median iteration time after the warm-up iterations, the TFLOP/s it
logged and the peak memory PyTorch allocated become the candidate's measurement, and the layout
the log states must be the candidate's.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from autoparallel.errors import UserError
from autoparallel.profiling.job import JobSpec, Measurement
from autoparallel.profiling.slurm import Resources
from autoparallel.specs.hardware import HardwareSpec

LOG = "train.log"
SCRIPT = "train.sh"
_LAYOUT = ("tp", "pp", "cp", "vp", "mbs", "gbs", "num_gpus")  # the log's runs row must state the candidate's


def checkout(path: str | None) -> Path:
    """The Megatron-LM checkout ``--megatron-lm`` or MEGATRON_LM names, checked before any job."""
    if not path:
        raise UserError("--trainer megatron needs a Megatron-LM checkout: --megatron-lm PATH or MEGATRON_LM=PATH")
    root = Path(path).expanduser().resolve()
    if not (root / "pretrain_gpt.py").is_file():
        raise UserError(f"--megatron-lm {path}: no pretrain_gpt.py there (is it a Megatron-LM checkout?)")
    return root


class MegatronTrainer:
    """Turns a JobSpec into the body, files and resources of a Slurm task, and its log into a
    Measurement. ``hw``: the hardware the candidate was priced on (its GPUs per node lay out the
    nodes, as in the exported train.sh)."""

    name = "megatron"

    def __init__(self, root: Path, hw: HardwareSpec) -> None:
        self.root, self.hw = root, hw

    def with_gpus_per_node(self, gpus_per_node: int) -> MegatronTrainer:
        return MegatronTrainer(self.root, dataclasses.replace(self.hw, gpus_per_node=gpus_per_node))

    def script(self, job: JobSpec) -> str:
        from autoparallel.report.launch import train_script
        return train_script(job.model, job.plan, self.hw, f"autoparallel profiling run of {job.plan.num_gpus} GPUs",
                            short_run=job.warmup + job.steps)

    def resources(self, job: JobSpec, gpus: bool) -> Resources:
        from autoparallel.report.shared import node_layout
        nodes, per_node = node_layout(job.plan.num_gpus, self.hw.gpus_per_node)
        # torchrun starts the node's ranks itself: one Slurm task a node, all of its GPUs (CPUs).
        return Resources(nodes=nodes, tasks_per_node=1, gpus_per_node=per_node if gpus else 0,
                         cpus_per_task=1 if gpus else per_node)

    def body(self) -> list[str]:
        return [f"export MEGATRON_LM={shlex.quote(str(self.root))}",
                f'bash "$TASK_DIR/{SCRIPT}" 2>&1 | tee "$TASK_DIR/{LOG}"']

    def key(self) -> dict:
        return {"trainer": self.name, "megatron_lm": str(self.root), "gpu": self.hw.name,
                "gpus_per_node": self.hw.gpus_per_node}

    def collect(self, job: JobSpec, folder: Path) -> Measurement:
        """The log's measurement; ValueError naming what is wrong with the log."""
        from autoparallel.runlogs.runrow import read_log, to_row
        try:
            row = to_row(read_log(folder / LOG), self.hw.name, warmup=job.warmup)
        except UserError as exc:
            raise ValueError(f"its log {folder / LOG} is not readable: {exc}") from None
        plan = {**job.plan.as_dict(), "num_gpus": job.plan.num_gpus}
        differs = [f"{k} {row[k]} (candidate {plan[k]})" for k in _LAYOUT if int(row[k]) != int(plan[k])]
        if differs:
            raise ValueError(f"its log states another layout: {', '.join(differs)}")
        tflops = row.get("measured_model_tflops_per_gpu")
        memory = row.get("measured_max_allocated_gib")
        return Measurement(ok=True, step_time_s=row["measured_iteration_time_s"],
                           tokens_per_s_per_gpu=row["measured_tokens_per_s_per_gpu"],
                           peak_memory_gib=float("nan") if memory is None else memory,
                           model_tflops_per_gpu=float("nan") if tflops is None else tflops,
                           world_size=job.plan.num_gpus, device=f"megatron-lm on {self.hw.name}")
