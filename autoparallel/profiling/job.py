"""One profiling job: a plan of the built-in transformer run for real on every rank.

``run_rank`` is what each process executes: build the rank's share (``autoparallel.parallel``),
run ``warmup`` untimed and ``steps`` timed steps on generated tokens (a barrier before each, so a
step's time is the slowest rank's), and report per-step seconds, the loss, saved-tensor bytes,
model states and the seconds it took to build the rank's share of the model (``build_s``: the
meta-device build and the materialisation of the shard), with wall-clock stamps that split the
job's time before its first step (``startup_split``). ``device`` "auto" runs on GPUs (NCCL,
one per rank) when torch sees them, else on the CPU (gloo). ``summarize`` turns the ranks'
reports into one ``Measurement``: the median step time, tokens/s per GPU, the peak memory of the
fullest rank. Faults can be injected (a rank that dies, one that hangs) so that the failure path
is testable; the launcher turns any failure into a ``Measurement`` with ``ok=False`` and the
reason.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import asdict, dataclass, field

from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

GIB = float(2**30)


@dataclass(frozen=True)
class JobSpec:
    model: ModelSpec
    plan: Plan
    steps: int = 20
    warmup: int = 5
    timeout_s: float = 600.0
    memory_cap_gib: float | None = None  # CPU: fail like an OOM above this (saved + states)
    bf16: bool = True  # BF16 weights and activations, FP32 main grads and optimizer state
    device: str = "auto"  # auto | cpu | cuda
    threads_per_rank: int | None = 1
    fault: str = ""  # "", "kill:RANK" (the rank exits at step 1), "hang:RANK" (it sleeps)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"steps={self.steps} must be >= 1 and warmup={self.warmup} >= 0")
        if self.fault and not re.fullmatch(r"(kill|hang):\d+", self.fault):  # "hang" alone failed in the rank
            raise ValueError(f"fault={self.fault!r}: use kill:RANK or hang:RANK")
        from autoparallel.profiling.device import DEVICE_CHOICES
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device={self.device!r} is not valid; choose one of "
                             f"{', '.join(DEVICE_CHOICES)}")


@dataclass
class Measurement:
    ok: bool
    reason: str = ""
    step_time_s: float = float("nan")
    tokens_per_s_per_gpu: float = float("nan")
    peak_memory_gib: float = float("nan")
    activation_bytes: float = float("nan")  # saved for backward, fullest rank
    loss: float = float("nan")
    world_size: int = 0
    device: str = ""  # the name of the device that measured (device.device_name)
    build_s: float = float("nan")  # slowest rank's model build (meta build + its shard)
    # the rest of the time before the first step (local launcher; NaN where unknown): starting
    # the processes (interpreter, imports, unpickling), joining the process group, the first
    # (warm-up) step, and after the last step until the launcher returns (results, exit)
    spawn_s: float = float("nan")
    group_s: float = float("nan")
    first_step_s: float = float("nan")
    exit_s: float = float("nan")
    model_tflops_per_gpu: float = float("nan")  # as the trainer logs it (Megatron-LM --log-throughput)
    wall_s: float = 0.0
    per_rank: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def out_of_memory_line(lines: list[str]) -> str:
    """The first line of a failed job's output that says it ran out of memory (torch's
    OutOfMemoryError, wherever the launcher put it), stripped; empty if none does."""
    return next((line.strip() for line in lines if "out of memory" in line.lower()), "")


def _inject(job: JobSpec, rank: int, step: int) -> None:
    if not job.fault or step != 1:
        return
    kind, who = job.fault.split(":")
    if int(who) != rank:
        return
    if kind == "kill":
        os._exit(17)
    time.sleep(10**6)


def run_rank(rank: int, world: int, job: JobSpec) -> dict:
    ready = time.time()
    import torch
    import torch.distributed as dist

    from autoparallel.parallel import spawn
    from autoparallel.parallel.parallelize import ParallelModel, StepConfig
    from autoparallel.profiling.device import device_name
    from autoparallel.profiling.memory import SavedTensors

    cuda = dist.get_backend() == "nccl"  # the launcher picked NCCL for a CUDA job
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    config = StepConfig(bf16=job.bf16, seed=job.seed)
    start = time.perf_counter()
    pm = ParallelModel(job.model, job.plan, config, device)
    if cuda:
        torch.cuda.synchronize()
    build_s = time.perf_counter() - start
    states = pm.model_state_bytes()
    cap = None if job.memory_cap_gib is None else int(job.memory_cap_gib * GIB)
    gen = torch.Generator().manual_seed(job.seed + 1)
    seq = job.model.seq_length
    times, losses = [], []
    tracker = SavedTensors(states, cap)
    for step in range(job.warmup + job.steps):
        _inject(job, rank, step)
        tokens = torch.randint(0, job.model.vocab_size, (job.plan.gbs, seq + 1), generator=gen)
        if world > 1:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with tracker:
            loss = pm.step(tokens[:, :-1], tokens[:, 1:])
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step == 0:
            first_step_s = elapsed
        if step >= job.warmup:
            times.append(elapsed)
            losses.append(loss)
    states = pm.model_state_bytes()  # now with the optimizer moments and FP8 weight copies
    peak = (torch.cuda.max_memory_allocated(device) if cuda else tracker.peak + states)
    return {"rank": rank, "times": times, "loss": losses[-1], "saved_bytes": tracker.peak,
            "state_bytes": states, "peak_bytes": peak, "device": device_name(str(device)),
            "build_s": build_s, "first_step_s": first_step_s,
            "stamps": {"entered": spawn.ENTERED_AT, "ready": ready, "done": time.time()}}


def startup_split(ranks: list[dict], started_at: float | None, ended_at: float | None) -> dict:
    """Where a job's time outside its timed steps went, from the ranks' wall-clock stamps and
    the launcher's (``time.time()`` at its start and end; None: unknown, as on Ray, whose ranks
    run on other machines' clocks and join their group before ``run_rank``): each phase's
    slowest rank, since the job waits for it. NaN where a stamp is missing."""
    nan = float("nan")
    entered = [r["stamps"]["entered"] for r in ranks]
    spawned = None not in entered
    return {"spawn_s": max(entered) - started_at if spawned and started_at else nan,
            "group_s": max(r["stamps"]["ready"] - r["stamps"]["entered"] for r in ranks)
            if spawned else nan,
            "first_step_s": max(r["first_step_s"] for r in ranks),
            "exit_s": ended_at - max(r["stamps"]["done"] for r in ranks) if ended_at else nan}


def summarize(job: JobSpec, ranks: list[dict], wall_s: float, started_at: float | None = None,
              ended_at: float | None = None) -> Measurement:
    """One Measurement from the ranks' reports; ``started_at`` / ``ended_at``: the launcher's
    ``time.time()`` around the job, to split its start-up (``startup_split``)."""
    world = len(ranks)
    per_step = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
    step = statistics.median(per_step)
    tokens = job.plan.gbs * job.model.seq_length
    return Measurement(
        ok=True, step_time_s=step, tokens_per_s_per_gpu=tokens / (step * world),
        peak_memory_gib=max(r["peak_bytes"] for r in ranks) / GIB,
        activation_bytes=float(max(r["saved_bytes"] for r in ranks)),
        loss=float(ranks[0]["loss"]), world_size=world, device=ranks[0]["device"],
        build_s=max(r["build_s"] for r in ranks), wall_s=wall_s,
        **startup_split(ranks, started_at, ended_at),
        per_rank=[{k: r[k] for k in ("rank", "saved_bytes", "state_bytes", "peak_bytes")}
                  for r in ranks])
