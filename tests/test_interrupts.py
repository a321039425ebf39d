"""Signals and concurrent runs (issue 12): a run folder is complete or absent after Ctrl-C or
SIGTERM, a search's worker processes die with it even under SIGKILL, and two `--resume` of one
folder never run at once. Each test drives the real command in a subprocess and signals it."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autoparallel.cli import main

pytest.importorskip("optuna", reason="the optuna extra is not installed")

OPTUNA = ["search", "--model", "llama2-7b", "--gpus", "8", "--strategy", "optuna", "--grid-seeds", "0",
          "--json"]
# The grid search of one small model, with a disk that takes a minute to write candidates.csv:
# the signal arrives while the run folder is being written.
SLOW_WRITE = textwrap.dedent("""
    import sys, time
    from autoparallel.cli import main
    from autoparallel.report import run_folder
    write_csv = run_folder.write_csv
    def slow_write_csv(path, frame):
        if path.name == "candidates.csv":
            (path.parent / "writing").touch()  # tell the test the folder is half written
            time.sleep(60)
        write_csv(path, frame)
    run_folder.write_csv = slow_write_csv
    sys.exit(main(sys.argv[1:]))
""")


def _interruptible() -> None:
    """A shell starts background jobs (`pytest ... &`, nohup) with SIGINT ignored, and Python
    keeps an ignored SIGINT ignored: give the command Ctrl-C back, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], script: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "autoparallel", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interruptible)


def _wait_for(predicate, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_while_the_grid_run_folder_is_written_leaves_nothing(tmp_path, sig, code):
    results = tmp_path / "results"
    proc = _start(["search", "--model", "llama2-7b", "--gpus", "8", "--results", str(results), "--json"], SLOW_WRITE)
    half = _wait_for(lambda: next(results.glob(".partial-*/*/writing"), None), "the run folder write")
    assert (half.parent / "manifest.yaml").exists() and not (half.parent / "candidates.csv").exists()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert err.strip() == "autoparallel: interrupted"
    assert list(results.iterdir()) == []  # no run folder, no staging folder


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through Linux /proc")
def test_sigkill_of_a_search_kills_its_workers(tmp_path):
    results = tmp_path / "results"
    proc = _start([*OPTUNA, "--trials", "100000", "--workers", "2", "--results", str(results)])
    _wait_for(lambda: next(results.glob(".partial-*/*/study.journal"), None), "the study journal")
    workers = _wait_for(lambda: len(_children(proc.pid)) >= 2 and _children(proc.pid), "two workers")
    proc.kill()
    proc.wait()
    _wait_for(lambda: not any(_alive(w) for w in workers), "the workers to die", timeout=10)
    # The killed search stays resumable from its staging folder (see test_sampler: resume).
    assert next(results.glob(".partial-*/*/study.journal"))


def _locked_by_someone(run_dir: Path) -> bool:
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


POOL = textwrap.dedent("""
    import time
    from autoparallel.cli import _sigterm_interrupts
    from autoparallel.processes import in_processes

    def task(i):
        time.sleep(3 if i else 0.1)
        return i

    with _sigterm_interrupts():  # as main() runs a command: SIGTERM raises KeyboardInterrupt
        try:
            print(in_processes(task, [(i,) for i in range(8)], workers=2), flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
""")


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_to_the_group_stops_a_process_pool_at_once(tmp_path, attempt):
    """`timeout 600 autoparallel validate` (SIGTERM to the whole group) printed "interrupted" and
    then waited on its workers for ever, or for the jobs left (session 55: 3 of 5 runs hung, 2
    took 10.7 s): forked workers had the CLI's SIGTERM handler and broke the pool's queues. Now
    the workers die of it and the parent stops them without waiting."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", POOL], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(1.5)  # the first job done, the others asleep in the workers
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=8)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group, on a failure
        except ProcessLookupError:
            pass
    assert out == "interrupted\n" and "Traceback" not in err and time.monotonic() - start < 5


def test_a_second_resume_of_a_folder_is_refused(tmp_path, capsys, completed_trials):
    results = tmp_path / "results"
    first = _start([*OPTUNA, "--trials", "100000", "--results", str(results)])
    db = _wait_for(lambda: next(results.glob(".partial-*/*/study.db"), None), "the study")
    _wait_for(lambda: completed_trials(db) >= 3, "three completed trials")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "continue with `autoparallel search --resume" in err
    (run_dir,) = results.iterdir()  # the interrupted study, published with its completed trials
    resuming = _start(["search", "--resume", str(run_dir), "--json"])
    try:
        _wait_for(lambda: _locked_by_someone(run_dir), "the first --resume to hold the folder")
        assert main(["search", "--resume", str(run_dir), "--json"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another autoparallel process" in err
    finally:
        resuming.send_signal(signal.SIGINT)
        _, err = resuming.communicate(timeout=60)
    assert resuming.returncode == 130, err  # the first one keeps its trials and ends cleanly
