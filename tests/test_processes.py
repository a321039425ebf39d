import os

import pytest

from autoparallel.processes import call, in_processes


def _pid_and_square(x):
    return os.getpid(), x * x


@pytest.mark.parametrize("workers", [1, 2, None])
def test_results_come_back_in_the_order_of_the_jobs_and_progress_counts_each(workers):
    ticks = []
    out = in_processes(_pid_and_square, [(x,) for x in range(7)], workers, lambda: ticks.append(1))
    assert [square for _, square in out] == [x * x for x in range(7)]
    assert len(ticks) == 7
    pids = {pid for pid, _ in out}
    if workers == 1:
        assert pids == {os.getpid()}
    elif workers == 2:
        assert os.getpid() not in pids  # run in the forked workers, not here


def test_call_runs_a_different_function_per_job():
    assert in_processes(call, [(abs, -3), (max, 1, 5)], 2) == [3, 5]


def test_a_job_that_raises_raises_here():
    with pytest.raises(ZeroDivisionError):
        in_processes(divmod, [(1, 0), (4, 2)], 2)
