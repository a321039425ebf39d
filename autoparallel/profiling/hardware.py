"""This machine's own peaks, measured: what a hardware YAML's datasheet fields hold for a GPU.

The method check (benchmarks/bench_method_check.py) calibrates the cost model on the CPU it runs
on. A CPU has no datasheet in the cost model's terms, so its "peaks" are measured here, with the
same thread count as a profiling rank (one): the BF16 GEMM rate of a large square GEMM, the
copy bandwidth of a large tensor (the "HBM" of memory-bound kernels) and the bus bandwidth and
small-message latency of a gloo all-reduce between two local processes (the "NVLink" of local
ranks). The efficiency
constants are then fitted to profiling jobs (``calibrate --from``), as for a GPU.
"""

from __future__ import annotations

import time

import torch


def _best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_tflops(n: int = 1024, dtype=torch.bfloat16, threads: int = 1) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / _best_of(lambda: a @ b) / 1e12


def copy_tbps(nbytes: int = 256 * 2**20, threads: int = 1) -> float:
    torch.set_num_threads(threads)
    src = torch.empty(nbytes // 4, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_of(lambda: dst.copy_(src)) / 1e12  # read + write


def _allreduce_rank(rank: int, world: int, nbytes: int) -> float:
    import torch.distributed as dist
    x = torch.ones(nbytes // 4)
    seconds = _best_of(lambda: dist.all_reduce(x), repeats=5)
    return 2 * (world - 1) / world * nbytes / seconds / 1e9  # nccl-tests bus bandwidth, GB/s


def _latency_rank(rank: int, world: int, calls: int) -> float:
    import torch.distributed as dist
    x = torch.ones(16)
    for _ in range(10):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - start) / calls * 1e6


def _spawned(fn, world: int, args: tuple) -> list:
    from autoparallel.parallel import spawn
    result = spawn.run(fn, world, args, timeout=120)
    if not result.ok:
        raise RuntimeError(result.reason)
    return result.values


def allreduce_gbps(world: int = 2, nbytes: int = 16 * 2**20) -> float:
    return min(_spawned(_allreduce_rank, world, (nbytes,)))


def allreduce_latency_us(world: int = 2, calls: int = 200) -> float:
    """Mean time of a 64-byte all-reduce: the per-collective cost the many small TP / SP
    collectives of a CPU job pay (the cost model's ``nvlink_latency_us``)."""
    return max(_spawned(_latency_rank, world, (calls,)))


def measure() -> dict:
    return {"bf16_tflops": gemm_tflops(), "hbm_tbps": copy_tbps(), "allreduce_gbps": allreduce_gbps(),
            "allreduce_latency_us": allreduce_latency_us()}


if __name__ == "__main__":
    print(measure())


def hardware_yaml(figures: dict, name: str = "cpu-local", memory_gib: float = 8.0) -> str:
    """The datasheet part of a hardware YAML for this machine, from ``measure()``'s figures."""
    return (
        f"# This machine's CPU as the cost model's 'GPU': one profiling rank = one process, one\n"
        f"# thread. Peaks measured by autoparallel.profiling.hardware (bf16 GEMM 1024^3, 256 MiB\n"
        f"# copy, gloo all-reduce of 16 MiB between 2 local processes: bus bandwidth x2 as the\n"
        f"# bidirectional figure; latency: a 64-byte all-reduce). Efficiencies below are fitted\n"
        f"# to profiling jobs.\n"
        f"name: {name}\n"
        f"bf16_tflops: {figures['bf16_tflops']:.4g}\n"
        f"memory_gib: {memory_gib}\n"
        f"hbm_tbps: {figures['hbm_tbps']:.4g}\n"
        f"nvlink_domain: 4\n"
        f"nvlink_gbps: {2 * figures['allreduce_gbps']:.4g}\n"
        f"internode_gbps: {figures['allreduce_gbps']:.4g}\n"
        f"nvlink_latency_us: {figures['allreduce_latency_us']:.4g}\n"
        f"internode_latency_us: {figures['allreduce_latency_us']:.4g}\n"
        f"reserve_gib: 0.0\n"
        f"source: measured on this machine ({figures.get('cpu', 'CPU')})\n")
