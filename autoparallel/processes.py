"""Independent, deterministic jobs (leave-one-out refits, seeded simulations) spread over the CPUs.

One place for the process pool that ``validate`` (the training folds) and ``serve`` (the serving
refits and the MLPerf simulations) both use: forked workers, so that a child inherits what the
parent set up (monkeypatches in tests included); one after another where the platform cannot fork.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
from collections.abc import Callable


def in_processes(task: Callable, args: list[tuple], workers: int | None = 1,
                 progress: Callable[[], None] | None = None) -> list:
    """``[task(*a) for a in args]``, in ``workers`` processes (None: one per CPU) where the platform
    forks, else one after another; ``progress()`` after each. The jobs must be independent and
    deterministic: then the results are the same in any number of processes."""
    workers = min(workers or os.cpu_count() or 1, len(args))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for a in args:
            out.append(task(*a))
            if progress is not None:
                progress()
        return out
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                                  initializer=_signals_to_the_parent)
    try:
        futures = [pool.submit(task, *a) for a in args]
        for _ in concurrent.futures.as_completed(futures):
            if progress is not None:
                progress()
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM (the CLI's KeyboardInterrupt): stop the workers, do not wait
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _signals_to_the_parent() -> None:
    """A worker ignores Ctrl-C and dies of SIGTERM: the parent alone turns them into a clean stop.
    Forked, a worker inherited the CLI's SIGTERM handler, and `timeout validate` (SIGTERM to the
    whole group) raised KeyboardInterrupt inside the pool's queues: the command printed
    "interrupted" and then waited on its workers for ever (session 55)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def call(task: Callable, *args):
    """``task(*args)``: lets ``in_processes`` run a different function per job."""
    return task(*args)
