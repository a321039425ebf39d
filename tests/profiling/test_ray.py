"""The Ray launcher gives the same measurement as the local one (a local Ray with 2 CPUs).

Each check runs in its own process (ray_driver_checks.py): Ray ends a driver that loses its
raylet with exit code 1 and no message, which in-process would end the whole test run.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'autoparallel[ray]')")
pytestmark = pytest.mark.ray
CHECKS = Path(__file__).with_name("ray_driver_checks.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def temp_dir():
    """Ray's session folder: short, since its socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ray-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_check(name: str, temp_dir: Path) -> None:
    """Runs one check in a child process; on failure, says what the child, the raylet and the
    driver's Ray core logged."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(CHECKS), name, str(temp_dir)], capture_output=True,
                          text=True, env=env, timeout=400)
    if proc.returncode != 0:
        logs = [p for pattern in ("raylet.*", "python-core-driver-*.log")  # a driver's crash is here
                for p in sorted(temp_dir.glob(f"session_2*/logs/{pattern}"))]  # not session_latest, a link
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)
        pytest.fail(f"{name} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                    f"--- stderr\n{proc.stderr[-3000:]}\n{tails}", pytrace=False)
    assert "check passed" in proc.stdout


def test_same_job_same_result_through_both_launchers(temp_dir):
    run_check("same_job_same_result", temp_dir)


def test_ray_failures_become_reasons(temp_dir):
    run_check("failures_become_reasons", temp_dir)


def test_a_hung_job_times_out_and_its_ranks_are_killed(temp_dir):
    run_check("hung_job_times_out_and_frees_its_ranks", temp_dir)
