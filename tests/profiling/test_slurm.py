"""``--executor slurm`` against a real single-node Slurm (slurmctld + slurmd, scripts/slurm_local.sh):
the built-in transformer's CPU profiling jobs go through sbatch and srun, ranks from SLURM_PROCID.
Covers submit, job arrays, collect and re-rank, a failing job, a timed-out job, scancel on
SIGINT, resume, and a controller that does not answer. Each test is bounded in time."""

import _thread
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
import pytest

from autoparallel.cli import main
from autoparallel.errors import UserError
from autoparallel.profiling.job import JobSpec
from autoparallel.profiling.slurm import Resources, SlurmClient, SlurmSettings, batch_script, time_limit
from autoparallel.profiling.slurm_launcher import SlurmLauncher
from autoparallel.specs.plan import Plan

from conftest import SMALL, run_folder

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(slurm, monkeypatch):
    """The cluster, with this checkout importable in the jobs (sbatch exports the environment)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return slurm


@pytest.fixture(autouse=True)
def _bounded():
    """No test waits forever on the queue: after 150 s the test is interrupted like Ctrl-C
    (which cancels its jobs)."""
    timer = threading.Timer(150, _thread.interrupt_main)
    timer.start()
    yield
    timer.cancel()


def _launcher(root: Path, **settings) -> SlurmLauncher:
    return SlurmLauncher(SlurmSettings(root=root, poll_s=0.3, **settings))


def _job(tp=1, pp=1, dp=2, **options) -> JobSpec:
    return JobSpec(SMALL, Plan(tp=tp, pp=pp, dp=dp, gbs=8), **{"steps": 2, "warmup": 1, "timeout_s": 60, **options})


def _scontrol(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=10).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w).get("JobState", "")


def _queued() -> str:
    return subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=10).stdout


def test_search_profiles_the_top_k_as_one_job_array_and_reranks(cluster, tmp_path, small_yaml, capsys):
    args = ["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local", "--space", "cpu-profiling",
            "--sp", "--recompute", "none", "--results", str(tmp_path), "--profile", "job", "--top-k", "2",
            "--profile-steps", "2", "--profile-warmup", "1", "--executor", "slurm"]
    assert main(args) == 2  # no terminal to ask on: nothing is submitted without --yes
    err = capsys.readouterr().err
    assert "about to submit 2 Slurm jobs, 4 GPUs in all: about" in err and "add --yes" in err
    assert not (tmp_path / "slurm").exists()
    assert main(args + ["--yes"]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours predicted (3 iterations" in out and "submitted 2 Slurm jobs" in out
    run_dir = run_folder(tmp_path)
    frame = pd.read_csv(run_dir / "candidates.csv")
    measured = frame[frame["measured_step_time_s"].notna()]
    assert len(measured) == 2 and (measured["measured_tokens_per_s_per_gpu"] > 0).all()
    assert list(frame["rank"].head(2)) == [1, 2]  # re-ranked: the measured ones lead
    assert len(pd.read_csv(run_dir / "profiled.csv")) == 2
    table = [line for line in (run_dir / "ranked.md").read_text().splitlines() if line.startswith("| ")]
    assert table[0].endswith("| profiled |")  # which rows were measured, said in the table
    assert [line.endswith("| measured |") for line in table[1:]] == [True, True] + [False] * (len(table) - 3)
    states = [json.loads(p.read_text()) for p in (tmp_path / "slurm").glob("*/slurm.json")]
    assert len(states) == 2 and all(s["final"] == "COMPLETED" for s in states)
    assert len({s["job_id"].split("_")[0] for s in states}) == 1  # one array ...
    assert sorted(s["job_id"].split("_")[1] for s in states) == ["0", "1"]  # ... of two tasks


def test_one_job_per_layout_and_a_failing_job_is_recorded(cluster, tmp_path):
    launcher = _launcher(tmp_path, array=False)
    ok, failed = launcher.run_all([_job(tp=2, dp=1), _job(fault="kill:1")])
    assert ok.ok and ok.world_size == 2 and ok.step_time_s > 0 and ok.device.startswith("cpu")
    assert not failed.ok and "FAILED" in failed.reason and "task 1: Exited with exit code 17" in failed.reason
    ids = [json.loads(p.read_text())["job_id"] for p in tmp_path.glob("*/slurm.json")]
    assert len(set(ids)) == 2 and not any("_" in i for i in ids)  # two plain jobs, no array


def test_a_job_past_its_timeout_is_cancelled_and_recorded(cluster, tmp_path):
    start = time.monotonic()
    m = _launcher(tmp_path).run(_job(fault="hang:0", timeout_s=8))
    assert not m.ok and m.reason.startswith("timed out after 8 s (scancel)")
    assert time.monotonic() - start < 60
    job_id = json.loads(next(tmp_path.glob("*/slurm.json")).read_text())["job_id"]
    _wait_until(lambda: job_id not in _queued().split(), 20)  # SIGTERM, SIGKILL after KillWait
    assert _scontrol(job_id) == "CANCELLED"


def test_resume_picks_up_finished_jobs_and_resubmits_cancelled_ones(cluster, tmp_path):
    first, second = _job(tp=2, dp=1), _job()
    assert _launcher(tmp_path).run(first).ok
    done_id = json.loads(next(tmp_path.glob("*/slurm.json")).read_text())["job_id"]
    # Interrupted as soon as the second job is submitted: it is cancelled, the first is kept.
    launcher = _launcher(tmp_path)
    launcher.batch.progress = lambda total: nullcontext(_interrupt)
    with pytest.raises(KeyboardInterrupt, match=r"cancelled 1 Slurm job \(scancel\); 1 finished result kept"):
        launcher.run_all([first, second])
    states = {p.parent: json.loads(p.read_text()) for p in tmp_path.glob("*/slurm.json")}
    cancelled = next(s["job_id"] for s in states.values() if s["job_id"] != done_id)
    _wait_until(lambda: _scontrol(cancelled) == "CANCELLED", 20)
    # Resumed: the finished job is read back, the cancelled one submitted again.
    messages = []
    resumed = SlurmLauncher(SlurmSettings(root=tmp_path, poll_s=0.3), echo=messages.append).run_all([first, second])
    assert all(m.ok for m in resumed)
    assert "1 finished job picked up" in messages[0]
    after = {p.parent: json.loads(p.read_text())["job_id"] for p in tmp_path.glob("*/slurm.json")}
    assert done_id in after.values() and cancelled not in after.values()


def _interrupt(done, counts):
    raise KeyboardInterrupt


def _wait_until(condition, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.3)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_cancels_the_submitted_job(cluster, tmp_path, small_yaml, signum):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    root = tmp_path / "jobs"
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel", "profile", "--model", str(small_yaml),
                             "--plan", str(plan), "--steps", "100000", "--warmup", "0", "--executor", "slurm",
                             "--slurm-dir", str(root), "--yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell's background job inherits SIGINT ignored: give the command Ctrl-C back
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_until(lambda: list(root.glob("*/slurm.json")), 60)
        job_id = json.loads(next(root.glob("*/slurm.json")).read_text())["job_id"]
        _wait_until(lambda: _scontrol(job_id) == "RUNNING", 30)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # it did not stop: stop it and its job
            proc.kill()
            for state in root.glob("*/slurm.json"):
                subprocess.run(["scancel", json.loads(state.read_text())["job_id"]], timeout=10)
    assert proc.returncode == 128 + signum
    assert "cancelled 1 Slurm job (scancel)" in err and str(root) in err
    _wait_until(lambda: _scontrol(job_id) == "CANCELLED", 20)
    assert job_id not in _queued().split()


def test_a_controller_that_does_not_answer_is_an_error_within_seconds(cluster, tmp_path, monkeypatch):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections, never answers
    conf = tmp_path / "slurm.conf"
    text = Path(cluster).read_text()
    conf.write_text("\n".join(f"SlurmctldPort={silent.getsockname()[1]}" if line.startswith("SlurmctldPort=")
                              else line for line in text.splitlines()) + "\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    start = time.monotonic()
    try:
        with pytest.raises(UserError, match="squeue did not answer within 2 s"):
            SlurmClient(SlurmSettings(command_timeout_s=2)).active(["1"])
    finally:
        silent.close()
    assert time.monotonic() - start < 10


def test_gpu_jobs_ask_for_whole_nodes_of_the_presets_gpus(tmp_path):
    launcher = _launcher(tmp_path, gpus_per_node=4, partition="gpu", account="proj", qos="high",
                         container_image="nvcr.io/nvidia/pytorch:25.01-py3")
    launcher._nodes = (16, 64, 4)  # what sinfo says of a partition of 16 nodes with 4 GPUs each
    job = JobSpec(SMALL, Plan(tp=2, pp=2, dp=4, gbs=8))
    assert launcher.resources(job) == Resources(nodes=4, tasks_per_node=4, gpus_per_node=4)
    assert launcher.capacity()[0] == 64
    task = launcher.task(job)
    task.folder = tmp_path / "x"
    script = batch_script([task], launcher.settings, array=False)
    for line in ("#SBATCH --nodes=4", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --qos=high", "#SBATCH --time=11",
                 "--container-image=nvcr.io/nvidia/pytorch:25.01-py3", "MASTER_PORT=$((20000 + SLURM_JOB_ID"):
        assert line in script
    assert time_limit(600) == "11" and time_limit(61) == "3"


@pytest.mark.parametrize("argv, message", [
    (["--slurm-time", "1:2:3:4", "--executor", "slurm"], "--slurm-time '1:2:3:4' is not a Slurm time"),
    (["--slurm-partition", "gpu"], "--slurm-partition has no effect with --executor local"),
    (["--executor", "slurm", "--sbatch-args", "'unclosed"], "--sbatch-args"),
])
def test_bad_slurm_options_are_one_line_exit_2(tmp_path, small_yaml, capsys, argv, message):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_layer_profiles_are_not_run_on_slurm(small_yaml, tmp_path, capsys):
    assert main(["search", "--model", str(small_yaml), "--gpus", "2", "--results", str(tmp_path),
                 "--profile", "layer", "--executor", "slurm"]) == 2
    assert "--executor slurm has no effect with --profile layer" in capsys.readouterr().err


def _search_args(results: Path, small_yaml: Path, *more: str) -> list[str]:
    return ["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local", "--space", "cpu-profiling",
            "--sp", "--recompute", "none", "--results", str(results), "--profile", "job", "--top-k", "2",
            "--profile-steps", "2", "--profile-warmup", "1", "--executor", "slurm", "--yes", *more]


def _measured(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "candidates.csv")
    return frame[frame["measured_step_time_s"].notna()]


def test_an_interrupted_search_is_resumed_from_its_run_folder(cluster, tmp_path, small_yaml, capsys, monkeypatch):
    from autoparallel.profiling import slurm_args
    shown = slurm_args.queue_progress
    monkeypatch.setattr(slurm_args, "queue_progress", lambda total: nullcontext(_interrupt))  # Ctrl-C once submitted
    assert main(_search_args(tmp_path, small_yaml)) == 130
    err = capsys.readouterr().err
    run_dir = run_folder(tmp_path)
    assert "cancelled 2 Slurm jobs (scancel)" in err  # the two tasks of one array
    assert f"continue with `autoparallel search --resume {run_dir}`" in err
    assert "finished: false" in (run_dir / "profiling.yaml").read_text()
    assert "measured_step_time_s" not in pd.read_csv(run_dir / "candidates.csv")  # the predictions, kept
    cancelled = {json.loads(p.read_text())["job_id"] for p in (tmp_path / "slurm").glob("*/slurm.json")}
    _wait_until(lambda: not cancelled & set(_queued().split()), 20)  # a pending array task leaves no record
    # --resume alone goes on with the options profiling.yaml recorded: both jobs submitted again.
    monkeypatch.setattr(slurm_args, "queue_progress", shown)
    assert main(["search", "--resume", str(run_dir), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "about to submit 2 Slurm jobs, 4 GPUs in all" in out  # both were cancelled: both cost again
    assert "resuming: 0 finished jobs picked up, 0 still queued or running, 2 to submit" in out
    assert "submitted 2 Slurm jobs" in out
    assert len(_measured(run_dir)) == 2 and len(pd.read_csv(run_dir / "profiled.csv")) == 2
    assert "finished: true" in (run_dir / "profiling.yaml").read_text()
    again = {json.loads(p.read_text())["job_id"] for p in (tmp_path / "slurm").glob("*/slurm.json")}
    assert not again & cancelled
    # Finished: a grid run has nothing more to resume.
    assert main(["search", "--resume", str(run_dir)]) == 2
    assert "is a grid search: there is nothing to resume" in capsys.readouterr().err


def test_resume_after_the_search_was_killed_picks_up_what_finished_meanwhile(cluster, tmp_path, small_yaml,
                                                                              capsys):
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel", *_search_args(tmp_path, small_yaml, "--no-slurm-array")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until(lambda: len([p for p in (tmp_path / "slurm").glob("*/slurm.json")]) == 2, 90)
    finally:
        proc.kill()  # killed outright: nothing cancels its jobs
        proc.wait(timeout=30)
    states = {p.parent: json.loads(p.read_text())["job_id"] for p in (tmp_path / "slurm").glob("*/slurm.json")}
    kept, lost = sorted(states.values())
    subprocess.run(["scancel", lost], timeout=10, check=True)  # say, an administrator cancelled it
    _wait_until(lambda: not {kept, lost} & set(_queued().split()), 90)  # the other one finishes meanwhile
    assert _scontrol(kept) == "COMPLETED" and _scontrol(lost) == "CANCELLED"
    run_dir = run_folder(tmp_path)
    assert main(["search", "--resume", str(run_dir), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "resuming: 1 finished job picked up, 0 still queued or running, 1 to submit" in out
    # the cost printed first counts only what is submitted again
    assert "about to submit 1 Slurm job, 2 GPUs in all" in out and "; 1 finished earlier, read back" in out
    assert "submitted 1 Slurm job" in out
    after = {json.loads(p.read_text())["job_id"] for p in (tmp_path / "slurm").glob("*/slurm.json")}
    assert kept in after and lost not in after
    assert len(_measured(run_dir)) == 2


@pytest.mark.parametrize("answer, submits", [("y", True), ("yes", True), ("n", False), ("", False)])
def test_the_gpu_hours_are_asked_about_on_a_terminal(monkeypatch, capsys, answer, submits):
    from autoparallel.profiling import budget
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or answer)
    text = budget.summary([1024] * 5, [5.2] * 5, 25, 660)
    assert text.startswith("5 Slurm jobs, 5,120 GPUs in all: about 611.6 GPU-hours predicted")  # 5 x 1,024 x (25 x 5.2 s + 300 s)
    assert text.endswith("at most 938.7 GPU-hours (the time limit of 11 min each)")  # 5,120 GPUs x 660 s
    if submits:
        budget.confirm(text, yes=False)
    else:
        with pytest.raises(UserError, match="nothing submitted"):
            budget.confirm(text, yes=False)
    assert asked == ["submit? [y/N] "]
    budget.confirm(text, yes=True)  # --yes: never asks
    assert len(asked) == 1


@pytest.mark.parametrize("text", ["finished: maybe\noptions: {}\n", "options: {top_k: 2, colour: red}\nfinished: false\n",
                                  "[1, 2]\n", "finished: false\noptions: {profile: job, executor: local, top_k: -3}\n",
                                  "finished: false\noptions: {profile: jobs}\n"])
def test_a_damaged_profiling_record_is_named_on_resume(tmp_path, small_yaml, capsys, text):
    assert main(["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local", "--space", "cpu-profiling",
                 "--results", str(tmp_path)]) == 0
    run_dir = run_folder(tmp_path)
    (run_dir / "profiling.yaml").write_text(text)
    capsys.readouterr()
    assert main(["search", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "profiling.yaml" in err and len(err.strip().splitlines()) == 1
