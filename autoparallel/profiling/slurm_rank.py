"""One rank of a built-in-transformer profiling job under Slurm: ``srun python -m
autoparallel.profiling.slurm_rank JOB_DIR``.

Why a module of its own: the process is started by ``srun`` on a compute node, not forked by
the search, so it finds its place from Slurm's environment (rank ``SLURM_PROCID``, world
``SLURM_NTASKS``, rendezvous ``MASTER_ADDR``/``MASTER_PORT`` that the batch script derives from
the node list and ``SLURM_JOB_ID``), reads the job from ``JOB_DIR/job.json`` and leaves its report
in ``JOB_DIR/rank<N>.json`` (or the error that ended it), where the submitting side reads it.
A rank that fails exits non-zero so that ``srun --kill-on-bad-exit`` stops the others.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
from pathlib import Path

JOB_FILE = "job.json"


def job_to_dict(job) -> dict:
    """What ``job.json`` holds: the JobSpec as plain data."""
    from autoparallel import io
    return {"model": io.to_dict(job.model), "plan": job.plan.as_dict(),
            **{k: getattr(job, k) for k in ("steps", "warmup", "timeout_s", "memory_cap_gib", "bf16",
                                             "device", "threads_per_rank", "fault", "seed")}}


def job_from_dict(data: dict):
    from autoparallel import io
    from autoparallel.profiling.job import JobSpec
    from autoparallel.specs.model import ModelSpec
    from autoparallel.specs.plan import Plan
    rest = {k: v for k, v in data.items() if k not in ("model", "plan")}
    return JobSpec(io.from_dict(ModelSpec, data["model"], JOB_FILE), io.from_dict(Plan, data["plan"], JOB_FILE), **rest)


def rank_file(job_dir: Path, rank: int) -> Path:
    return Path(job_dir) / f"rank{rank}.json"


def main(job_dir: str) -> int:
    import torch
    import torch.distributed as dist

    from autoparallel.parallel.spawn import destroy_group
    from autoparallel.profiling.job import run_rank
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    out = rank_file(Path(job_dir), rank)
    try:
        job = job_from_dict(json.loads((Path(job_dir) / JOB_FILE).read_text()))
        if job.threads_per_rank:
            torch.set_num_threads(job.threads_per_rank)
        cuda = job.device != "cpu" and torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=min(job.timeout_s, 120.0)))
        report = run_rank(rank, world, job)
        out.write_text(json.dumps({"ok": True, **report}))
        return 0
    except BaseException as exc:  # noqa: BLE001 - the reason goes to the submitting side
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
        out.write_text(json.dumps({"ok": False, "error": text, "traceback": traceback.format_exc(limit=3)[-800:]}))
        print(text, file=sys.stderr)
        return 1
    finally:
        destroy_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
