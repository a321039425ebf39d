"""The Ray launcher's checks, run by tests/profiling/test_ray.py in a child process of their own.

A Ray driver ends its own process (exit code 1, nothing printed) when it loses its raylet, so
the driver lives in a child: a Ray crash then fails one test with what the child and the raylet
printed instead of ending the whole pytest run. Usage: python ray_driver_checks.py CHECK
"""

import sys
import time
from dataclasses import replace
from pathlib import Path

import ray

from autoparallel.profiling.job import JobSpec
from autoparallel.profiling.launcher import RayLauncher, run_local
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SMALL = ModelSpec(name="prof-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                  num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=32,
                  activation="swiglu", normalization="rmsnorm", global_batch_size=8)


def same_job_same_result(launcher: RayLauncher) -> None:
    job = JobSpec(SMALL, Plan(tp=1, pp=2, dp=1, gbs=8, mbs=2), steps=2, warmup=1, timeout_s=180)
    local, remote = run_local(job), launcher.run(job)
    assert local.ok, local.reason
    assert remote.ok, remote.reason
    assert remote.world_size == local.world_size == 2
    assert remote.loss == local.loss  # same seed, same data, same arithmetic
    assert remote.activation_bytes == local.activation_bytes
    assert [r["state_bytes"] for r in remote.per_rank] == [r["state_bytes"] for r in local.per_rank]
    assert remote.step_time_s > 0


def failures_become_reasons(launcher: RayLauncher) -> None:
    too_big = JobSpec(SMALL, Plan(tp=1, pp=1, dp=4, gbs=8), steps=1, warmup=0, timeout_s=60)
    m = launcher.run(too_big)
    assert not m.ok and "a job of 4 ranks is larger than the Ray cluster's" in m.reason, m.reason
    oom = JobSpec(SMALL, Plan(tp=1, pp=1, dp=2, gbs=8), steps=1, warmup=0, timeout_s=120,
                  memory_cap_gib=1e-5)
    m = launcher.run(oom)
    assert not m.ok and "out of memory" in m.reason, m.reason


def ranks_alive() -> list[int]:
    """PIDs of Ray workers running a rank (Ray titles a worker's process by its task)."""
    alive = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"ray::_ray_rank" in (proc / "cmdline").read_bytes():
                alive.append(int(proc.name))
        except OSError:
            pass
    return alive


def hung_job_times_out_and_frees_its_ranks(launcher: RayLauncher) -> None:
    hung = JobSpec(SMALL, Plan(tp=1, pp=1, dp=2, gbs=8), steps=2, warmup=1, timeout_s=30,
                   fault="hang:1")
    m = launcher.run(hung)
    assert not m.ok and "timed out" in m.reason, m.reason
    deadline = time.monotonic() + 30
    while ranks_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ranks_alive(), f"ranks still running after the timeout: {ranks_alive()}"
    m = launcher.run(replace(hung, fault="", timeout_s=300))  # the CPUs it held are free again
    assert m.ok, m.reason


CHECKS = {f.__name__: f for f in (same_job_same_result, failures_become_reasons,
                                  hung_job_times_out_and_frees_its_ranks)}

if __name__ == "__main__":
    temp_dir = sys.argv[2]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
    try:
        CHECKS[sys.argv[1]](RayLauncher())
    finally:
        ray.shutdown()
    print("check passed")
