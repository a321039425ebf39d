"""Run a function on N local processes joined in one gloo (CPU) or NCCL (GPU) process group.

Used by the equivalence tests and by the local launcher: torch.multiprocessing ``spawn`` start
method, a free TCP port on 127.0.0.1 only, and each rank's return value (or error) sent back
through a queue (the parent's ``__main__`` is not re-run in them unless the function or its
arguments live there: ``main_left_out``), and each rank ends at once after reporting
(``exit_now``). ``run`` never waits forever: after ``timeout`` seconds, or as soon as one rank
fails, every process still alive is terminated and the result says why.
"""

from __future__ import annotations

import datetime
import io
import os
import pickle
import queue as queue_mod
import socket
import sys
import time
import traceback
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SpawnResult:
    ok: bool
    values: list = field(default_factory=list)  # per rank, None where a rank gave nothing
    reason: str = ""


# When this process's rank function was entered (time.time()): by then the interpreter has
# started, imported torch (and the parent's __main__ where ``needs_main``), and unpickled the
# function and its arguments. A job reports it (``profiling.job``) to split its start-up; None
# outside ``run``.
ENTERED_AT: float | None = None


def _entry(rank, world, port, backend, fn, args, results, collective_timeout_s, threads, parent):
    global ENTERED_AT
    ENTERED_AT = time.time()
    from autoparallel.children import die_with_parent
    die_with_parent(parent)  # a rank never outlives a killed launcher
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        value = fn(rank, world, *args)
        # Bytes, not tensors: torch would share tensor storage by file descriptor, which dies
        # with this process.
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - the reason goes back to the caller
        kind = "oom" if "out of memory" in str(exc).lower() else "error"
        results.put((rank, kind, f"{type(exc).__name__}: {exc}"[:500]
                     + "\n" + traceback.format_exc(limit=3)[-800:]))
    finally:
        destroy_group()
    exit_now(results)


def exit_now(results) -> None:
    """End the rank at once, its report sent: Python's interpreter shutdown with torch loaded
    (module teardown, C++ static destructors; with CUDA, the context's) took 1.3-2.3 s on this
    CPU after every job (benchmarks/RESULTS.md, session 39), which the launcher waited for,
    and the OS frees the memory (and the driver the GPU's) as well as it would. The queue's
    feeder thread is joined first, so the report is in the pipe, then stdout and stderr are
    flushed; the exit code stays 0 (a failure is reported through the queue)."""
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def needs_main(fn, args: tuple) -> bool:
    """Whether a rank must re-run the parent's ``__main__`` to unpickle ``fn`` and ``args``:
    something in them pickled by reference to it (or they do not pickle plainly: then keep
    the spawn start method's default)."""
    try:
        return b"__main__" in pickle.dumps((fn, args))
    except Exception:  # noqa: BLE001 - e.g. a queue, which only a process start may pickle
        return True


@contextmanager
def main_left_out():
    """Start processes that do not re-run the parent's ``__main__``: the spawn start method
    makes each child import the parent's main script or module again (multiprocessing's
    ``spawn.get_preparation_data`` reads ``sys.modules["__main__"]``), so a rank of a job
    started from the ``autoparallel`` console script imported the whole CLI (the cost model,
    pandas) and one started from bench_issue15_gpu.py that script's imports, 0.7-1 s on this
    CPU (benchmarks/RESULTS.md, session 39), for nothing it runs. For as long as the
    processes start, ``__main__`` is a bare module."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def destroy_group() -> None:
    """Leave the process group, if any, at a rank's end: a failed rank's group may be broken, and
    its error is already on the way to the caller."""
    import torch.distributed as dist
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run(fn, world: int, args: tuple = (), timeout: float = 120.0, backend: str = "gloo",
        collective_timeout_s: float = 60.0, threads: int | None = 1) -> SpawnResult:
    """Run ``fn(rank, world, *args)`` on ``world`` processes; ``fn`` must be importable."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    parent = os.getpid()
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, fn, args, results,
                                               collective_timeout_s, threads, parent), daemon=True)
             for r in range(world)]
    values: list = [None] * world
    done: set[int] = set()
    reason = ""
    deadline = time.monotonic() + timeout  # starting the processes counts against the timeout
    starting = nullcontext if needs_main(fn, args) else main_left_out
    try:
        for p in procs:
            if time.monotonic() > deadline:
                reason = f"timed out after {timeout:.0f} s while starting {world} processes"
                break
            with starting():
                p.start()
        while len(done) < world and not reason:
            try:
                rank, status, value = results.get(timeout=0.2)
                done.add(rank)
                if status == "ok":
                    import torch
                    values[rank] = torch.load(io.BytesIO(value), weights_only=False)
                else:
                    first = value.splitlines()[0]
                    reason = (f"out of memory on rank {rank}: {first}" if status == "oom"
                              else f"rank {rank} failed: {first}")
                    # A peer that died makes the others fail in a collective: name the cause.
                    time.sleep(1.0)
                    dead = [r for r, p in enumerate(procs) if r not in done
                            and p.exitcode not in (None, 0)]
                    if dead and status != "oom":
                        reason = (f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}); "
                                  f"then {reason}")
            except queue_mod.Empty:
                pass
            dead = [r for r, p in enumerate(procs)
                    if r not in done and p.exitcode is not None and results.empty()]
            if dead and not reason:
                time.sleep(0.5)  # a result may still be in flight
                if results.empty():
                    r = dead[0]
                    reason = f"rank {r} died (exit code {procs[r].exitcode})"
            if not reason and time.monotonic() > deadline:
                missing = sorted(set(range(world)) - done)
                reason = (f"timed out after {timeout:.0f} s (ranks {missing} still running: "
                          "a hung collective or a slow job)")
    finally:
        procs = [p for p in procs if p.pid is not None]  # started
        for p in procs:
            p.join(timeout=2.0 if not reason else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    return SpawnResult(not reason, values, reason)
