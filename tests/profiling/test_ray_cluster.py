"""--executor ray against a cluster started by `ray start --head` in a separate process, as users
run it (issue 26 item 5): Ray >= 2.59 turns token authentication on for such clusters, so a
client without RAY_AUTH_MODE=token cannot connect and the error says what is missing; with it,
profiling works."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'autoparallel[ray]')")
from autoparallel.cli import main  # noqa: E402

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """host:port of a `ray start --head --block` process group, stopped by its PID at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(["ray", "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(temp)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    address = None
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        if "ray start --address=" in line:
            address = line.split("--address=")[1].strip().strip("'")
        if "block forever" in line or time.monotonic() > deadline:
            break
    try:
        if address is None:
            pytest.skip("ray start --head did not start")
        yield address
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # ray start --block, the GCS, the raylet, the workers
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        try:  # what did not stop on SIGTERM (the GCS lingers)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    return path


def _profile(head: str, plan: Path, model: Path, **env) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as a user runs it: Ray reads RAY_AUTH_MODE once a process."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "autoparallel", "profile", "--model", str(model), "--plan", str(plan),
                           "--executor", "ray", "--ray-address", head, "--steps", "2", "--warmup", "1", "--json"],
                          capture_output=True, text=True, timeout=180, env={**environ, **env})


def test_without_token_auth_the_error_says_what_is_missing(head, plan, small_yaml):
    done = _profile(head, plan, small_yaml)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "Ray could not connect" in error and "set RAY_AUTH_MODE=token" in error


def test_with_token_auth_profiling_on_the_cluster_works(head, plan, small_yaml):
    done = _profile(head, plan, small_yaml, RAY_AUTH_MODE="token")
    assert done.returncode == 0, done.stderr[-500:]
    assert '"ok": true' in done.stdout and '"world_size": 2' in done.stdout


def test_token_mode_without_a_token_is_refused_at_once(plan, small_yaml, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "none"))
    with socket.socket() as listener:  # something answers at the address, so the token check decides
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--executor", "ray",
                     "--ray-address", address]) == 2
    assert "RAY_AUTH_MODE=token but no token" in capsys.readouterr().err
