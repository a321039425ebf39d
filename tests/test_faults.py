"""Faults at the level of processes and the file system (issue 25): links, sockets, FIFOs with
a writer, read-only folders (as an unprivileged user), workers and signals. Each case runs the
real command, in a subprocess where the process itself is what is tested, and each is bounded
in time (``timeout``), so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from autoparallel.cli import main

ROOT = Path(__file__).resolve().parents[1]
# Root without the capabilities that let it write anywhere: permission bits apply to it again.
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                "--inh-caps=-dac_override,-dac_read_search,-fowner"]
TIMEOUT = 60  # seconds; every case here takes a few


def _run(args: list[str], unprivileged: bool = False, timeout: float = TIMEOUT, cwd: Path | None = None,
         **environ: str):
    """The command in a subprocess (without root's file powers if ``unprivileged``; ``environ``
    added to its environment): (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd or tempfile.gettempdir()), **environ}
    prefix = UNPRIVILEGED if unprivileged else []
    p = subprocess.run([*prefix, sys.executable, "-m", "autoparallel", *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def _one_line_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert message in err, err


@pytest.fixture(scope="module")
def shared():
    """A folder anyone may read (the unprivileged cases read it) holding a grid run."""
    d = Path(tempfile.mkdtemp(prefix="ap-faults-"))
    os.chmod(d, 0o755)
    assert main(["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--space",
                 "cpu-profiling", "--results", str(d / "runs"), "--top", "1", "--json"]) == 0
    (run,) = (d / "runs").iterdir()
    for p in [d / "runs", *(d / "runs").rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    yield {"dir": d, "run": run}
    shutil.rmtree(d, ignore_errors=True)


# --- writing: through links, never over special files, one line when refused -----------------

def test_a_symlink_is_written_through_and_stays(shared, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (real / "target.yaml").write_text("old\n")
    os.chmod(real / "target.yaml", 0o640)
    link = tmp_path / "out.yaml"
    link.symlink_to(real / "target.yaml")
    assert main(["export", str(shared["run"]), "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real / "target.yaml")
    text = (real / "target.yaml").read_text()
    assert text != "old\n" and "plan" in text
    assert stat.S_IMODE((real / "target.yaml").stat().st_mode) == 0o640  # a replaced file keeps its mode
    assert sorted(p.name for p in real.iterdir()) == ["target.yaml"]  # no temporary file left


def test_a_dangling_symlink_gets_its_target_created(shared, tmp_path):
    link = tmp_path / "out.yaml"
    link.symlink_to(tmp_path / "made.yaml")
    assert main(["export", str(shared["run"]), "-o", str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "made.yaml").is_file()


def test_a_socket_is_not_replaced(shared, capsys):
    folder = Path(tempfile.mkdtemp(prefix="ap-sock-"))  # a short path: sockets allow ~100 bytes
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(folder / "s"))
            code = main(["export", str(shared["run"]), "-o", str(folder / "s")])
            _one_line_error(code, capsys.readouterr().err, f"--output {folder / 's'} is a socket, not a regular file")
            assert stat.S_ISSOCK((folder / "s").lstat().st_mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_runs_import_writes_through_a_symlink(tmp_path, capsys):
    log = ROOT / "tests" / "fixtures" / "runlogs" / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"
    (tmp_path / "runs.csv").symlink_to("mine.csv")  # dangling: the import creates mine.csv
    assert main(["runs", "import", str(log), "--gpu", "h100-sxm", "--runs", str(tmp_path / "runs.csv")]) == 0
    assert (tmp_path / "runs.csv").is_symlink() and "id" in (tmp_path / "mine.csv").read_text()


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="drops root's file capabilities with setpriv, which needs root")


@pytest.fixture
def read_only(shared):
    """A folder the unprivileged user cannot write in, holding a file it cannot write."""
    d = shared["dir"] / "read_only"
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)
    (d / "out.yaml").write_text("keep me\n")
    os.chmod(d / "out.yaml", 0o444)
    os.chmod(d, 0o555)
    return d


@needs_root
@pytest.mark.parametrize("args, message", [
    (["export", "{run}", "-o", "{ro}/new.yaml"], "--output {ro}/new.yaml: cannot write in {ro} (permission denied)"),
    (["export", "{run}", "-o", "{ro}/out.yaml"], "--output {ro}/out.yaml: cannot write in {ro} (permission denied)"),
    (["calibrate", "--gpu", "h100-sxm", "-o", "{ro}/h100.yaml"], "--output {ro}/h100.yaml: cannot write in {ro}"),
    (["runs", "import", "{run}/best.yaml", "--gpu", "h100-sxm", "--runs", "{ro}/runs.csv"], "--runs {ro}/runs.csv: cannot write in {ro}"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--results", "{ro}/runs"],
     "--results {ro}/runs: cannot write in {ro} (permission denied)"),
], ids=["export-new", "export-existing", "calibrate", "runs-import", "search-results"])
def test_an_unwritable_target_is_one_line_and_nothing_changes(args, message, shared, read_only):
    fill = {"run": str(shared["run"]), "ro": str(read_only)}
    code, _, err = _run([a.format(**fill) for a in args], unprivileged=True, cwd=shared["dir"])
    _one_line_error(code, err, message.format(**fill))
    assert sorted(p.name for p in read_only.iterdir()) == ["out.yaml"]
    assert (read_only / "out.yaml").read_text() == "keep me\n"


@needs_root
def test_calibrate_checks_an_unwritable_preset_folder_before_the_fit(shared, read_only):
    """The fit takes seconds to minutes; an unwritable preset folder was a PermissionError
    traceback after it. Now it is one line before it (no "fitting" progress, nothing written)."""
    home = read_only / "home"
    code, out, err = _run(["calibrate", "--gpu", "h100-sxm"], unprivileged=True, cwd=shared["dir"],
                          AUTOPARALLEL_HOME=str(home))
    _one_line_error(code, err, f"your preset folder {home / 'hardware'} (AUTOPARALLEL_HOME={home}): "
                               f"cannot write in {read_only} (permission denied)")
    assert out == "" and sorted(p.name for p in read_only.iterdir()) == ["out.yaml"]


@needs_root
def test_runs_import_into_its_default_file_under_an_unwritable_folder_is_one_line(read_only):
    """`runs import` with no --runs makes results/ where it runs; in a folder it cannot write in,
    that was an OSError traceback after reading the logs (session 53); now one line, as search says it."""
    log = ROOT / "tests" / "fixtures" / "runlogs" / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"
    code, out, err = _run(["runs", "import", str(log), "--gpu", "h100-sxm"], unprivileged=True, cwd=read_only)
    _one_line_error(code, err, "--runs results/runs.csv: cannot write in . (permission denied)")
    assert out == "" and sorted(p.name for p in read_only.iterdir()) == ["out.yaml"]


@needs_root
def test_a_read_only_file_in_a_writable_folder_is_not_replaced(shared):
    d = shared["dir"] / "writable"
    d.mkdir(exist_ok=True)
    (d / "mine.yaml").unlink(missing_ok=True)
    (d / "mine.yaml").write_text("keep me\n")
    os.chmod(d / "mine.yaml", 0o444)
    code, _, err = _run(["export", str(shared["run"]), "-o", str(d / "mine.yaml")], unprivileged=True,
                         cwd=shared["dir"])
    _one_line_error(code, err, f"--output {d / 'mine.yaml'}: the file {d / 'mine.yaml'} is read-only")
    assert (d / "mine.yaml").read_text() == "keep me\n" and sorted(os.listdir(d)) == ["mine.yaml"]


# --- reading: no special file is read, endless or not ----------------------------------------

def _endless_writer(fifo: Path, stop: threading.Event) -> threading.Thread:
    """A thread that keeps writing into ``fifo`` until told to stop (an endless input)."""
    def write() -> None:
        try:
            fd = os.open(fifo, os.O_WRONLY)  # waits for a reader, if any comes
        except OSError:
            return
        try:
            while not stop.is_set():
                os.write(fd, b"a: 1\n" * 4096)
        except OSError:  # the reader went away
            pass
        finally:
            os.close(fd)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def test_a_fifo_with_an_endless_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "model.yaml"
    os.mkfifo(fifo)
    stop = threading.Event()
    _endless_writer(fifo, stop)
    try:
        code, _, err = _run(["search", "--model", str(fifo), "--gpus", "8"], timeout=20)
    finally:
        stop.set()
        try:  # let the writer's open() return, if it is still waiting
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass
    _one_line_error(code, err, f"YAML file {fifo} is a FIFO (named pipe), not a regular file")


def test_a_log_that_is_a_fifo_is_skipped_with_its_reason(tmp_path):
    os.mkfifo(tmp_path / "job.log")
    code, out, err = _run(["runs", "import", str(tmp_path / "job.log"), "--gpu", "h100-sxm", "--runs",
                           str(tmp_path / "runs.csv")], timeout=20)
    _one_line_error(code, err, "the log could not be read (")
    assert "is a FIFO (named pipe), not a regular file); nothing written" in err
    assert "FIFO" not in out  # one log alone: its reason is said once, in the error (s55h8)
    assert not (tmp_path / "runs.csv").exists()


# --- workers: capped, and a signal ends the run within seconds whatever their number -----------

SAMPLER = ["search", "--model", "llama2-7b", "--gpus", "8", "--strategy", "optuna", "--grid-seeds", "0", "--json"]


def test_workers_are_capped_at_the_trials_left(tmp_path):
    code, out, err = _run([*SAMPLER, "--trials", "2", "--workers", "5000", "--results", str(tmp_path)], cwd=tmp_path)
    assert code == 0, err
    assert "autoparallel: warning: --workers 5000 capped at 2 (2 trials left)" in err
    (run,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert run.is_dir() and (run / "candidates.csv").is_file()


def test_workers_are_capped_at_a_multiple_of_the_cores():
    from autoparallel.search import study
    cores = len(os.sched_getaffinity(0))
    assert study.worker_count(10**6, 10**9) == study.WORKERS_PER_CORE * cores
    assert study.worker_count(3, 1) == 1 and study.worker_count(1, 0) == 1


def _interruptible() -> None:
    """Background shells start children with SIGINT ignored: give it back (see test_interrupts)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum, group", [("SIGTERM", False), ("SIGINT", False), ("SIGTERM", True)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-to-the-group"])
def test_a_signal_ends_a_run_with_many_workers_within_seconds(signum, group, tmp_path):
    """Sent to the search, or to its whole process group (as a job scheduler or `kill -- -PGID`
    does: each worker gets it, then the parent's terminate() too), the run ends quietly."""
    import signal
    import time
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "autoparallel", *SAMPLER, "--trials", "1000000", "--workers", "64",
                          "--results", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=tmp_path, preexec_fn=_interruptible, start_new_session=group)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".partial-*/*/study.journal")):  # the workers share it once they run
            assert p.poll() is None and time.monotonic() < deadline, "the search did not start its workers"
            time.sleep(0.1)
        time.sleep(1.0)
        if group:
            os.killpg(p.pid, getattr(signal, signum))
        else:
            p.send_signal(getattr(signal, signum))
        sent = time.monotonic()
        _, err = p.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + getattr(signal, signum), err
    assert took < 10, f"took {took:.1f} s to stop"
    assert "capped at" in err and "Traceback" not in err


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`search --json | head -1`: the pipe closes under the writer; it ends as a tool killed by
    SIGPIPE does (exit 141), not with a BrokenPipeError traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "autoparallel", "search", "--model", "cpu-small", "--gpus", "4",
                          "--gpu", "cpu-local", "--no-save", "--json", "--top", "1000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    p.stdout.readline()
    p.stdout.close()  # the reader leaves after one line
    try:
        err = p.stderr.read().decode()
        p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 141 and "Traceback" not in err, err


# --- shared studies: two searches on one --storage run together as Optuna's workers do --------

def _study_states(storage: str) -> dict:
    import collections

    import optuna
    if storage.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend
        storage = optuna.storages.JournalStorage(JournalFileBackend(storage[len("journal:"):]))
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    return dict(collections.Counter(t.state.name for t in study.get_trials(deepcopy=False)))


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
@pytest.mark.parametrize("stagger_s", [0.0, 1.0], ids=["together", "staggered"])
def test_two_searches_share_one_storage(kind, stagger_s, tmp_path):
    pytest.importorskip("optuna")
    import time
    storage = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 's.journal'}"
    trials = 30
    args = [sys.executable, "-m", "autoparallel", *SAMPLER, "--trials", str(trials), "--storage", storage,
            "--results", str(tmp_path / "runs")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    time.sleep(stagger_s)
    second = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        errors = [p.communicate(timeout=90)[1] for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [first.returncode, second.returncode] == [0, 0], errors
    assert not any("Traceback" in e for e in errors), errors
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert len(runs) == 2 and all((r / "candidates.csv").is_file() for r in runs)
    states = _study_states(storage)
    assert set(states) == {"COMPLETE"} and trials <= states["COMPLETE"] <= trials + 2, states  # each told once


# --- a disk that fills up: the file or run folder is whole or absent ---------------------------

def _small_disk(limit: int):
    """In the child: files can grow to ``limit`` bytes only (EFBIG past it, as a full disk's
    ENOSPC), SIGXFSZ ignored so that the write fails instead of killing the process."""
    def apply() -> None:
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _run_on_small_disk(args: list[str], cwd: Path, limit: int = 2000):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([sys.executable, "-m", "autoparallel", *args], capture_output=True, text=True,
                       timeout=TIMEOUT, env=env, cwd=cwd, preexec_fn=_small_disk(limit))
    return p.returncode, p.stdout, p.stderr


def test_a_full_disk_leaves_the_output_unchanged(shared, tmp_path):
    (tmp_path / "out.txt").write_text("keep me\n")
    code, _, err = _run_on_small_disk(["export", str(shared["run"]), "--format", "launch", "-o",
                                       str(tmp_path / "out.txt")], tmp_path, limit=200)
    _one_line_error(code, err, f"cannot write --output {tmp_path / 'out.txt'}: File too large; the file is unchanged")
    assert (tmp_path / "out.txt").read_text() == "keep me\n" and os.listdir(tmp_path) == ["out.txt"]


def test_a_full_disk_leaves_no_run_folder(tmp_path):
    code, _, err = _run_on_small_disk(["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local",
                                       "--space", "cpu-profiling", "--results", str(tmp_path / "runs"), "--json"],
                                      tmp_path)
    _one_line_error(code, err, f"cannot write a run folder in {tmp_path / 'runs'}: File too large; nothing was written")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # no folder, no staging folder


def test_a_journal_cut_mid_record_is_named_not_a_traceback(tmp_path):
    """A disk-full or kill -9 can leave the study journal cut off in a record; --resume names the
    damage in one line (it raised json's JSONDecodeError)."""
    code, _, err = _run(["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--strategy",
                         "optuna", "--trials", "4", "--workers", "2", "--results", str(tmp_path / "res")],
                        cwd=tmp_path)
    assert code == 0, err
    run_dir = next((tmp_path / "res").iterdir())
    journal = run_dir / "study.journal"
    journal.write_bytes(journal.read_bytes()[:journal.stat().st_size // 2])
    code, _, err = _run(["search", "--resume", str(run_dir)], cwd=tmp_path)
    _one_line_error(code, err, "is damaged (its journal breaks off")
