"""A model small enough that a 2-rank profiling job takes seconds on a 2-core CI machine."""

import pytest

from autoparallel.specs.model import ModelSpec

SMALL = ModelSpec(name="prof-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                  num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=32,
                  activation="swiglu", normalization="rmsnorm", global_batch_size=8)

SMALL_YAML = """name: prof-small
num_layers: 2
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
num_query_groups: 2
vocab_size: 128
seq_length: 32
activation: swiglu
normalization: rmsnorm
global_batch_size: 8
"""


@pytest.fixture
def small():
    return SMALL


@pytest.fixture
def small_yaml(tmp_path):
    path = tmp_path / "prof-small.yaml"
    path.write_text(SMALL_YAML)
    return path


# --- a real Slurm cluster (issue 26) ---------------------------------------------------------

import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

SLURM_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"


def _slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _no_slurm(reason: str):
    """In CI the Slurm tests must run: no cluster is a failure there, a skip elsewhere."""
    if os.environ.get("CI") == "true" or os.environ.get("AUTOPARALLEL_SLURM_REQUIRED") == "1":
        pytest.fail(f"no Slurm cluster in CI: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """SLURM_CONF of a cluster that answers: the one .ci/run started, else one started here by
    scripts/slurm_local.sh where Slurm is installed (on free ports, stopped at the end)."""
    if os.environ.get("SLURM_CONF") and _slurm_answers():
        yield os.environ["SLURM_CONF"]
        return
    if shutil.which("slurmctld") is None:
        _no_slurm("Slurm is not installed (scripts/slurm_local.sh start DIR installs and starts one)")
    folder = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURMCTLD_PORT": str(_free_port()), "SLURMD_PORT": str(_free_port())}
    try:
        done = subprocess.run([str(SLURM_SCRIPT), "start", str(folder)], capture_output=True, text=True,
                              timeout=180, env=env)
    except subprocess.TimeoutExpired:
        _no_slurm("scripts/slurm_local.sh start did not finish in 180 s")
    if done.returncode != 0:
        subprocess.run([str(SLURM_SCRIPT), "stop", str(folder)], timeout=60)
        _no_slurm(f"slurmctld could not start: {done.stderr.strip()[-300:]}")
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(folder / "slurm.conf"))
    try:
        yield str(folder / "slurm.conf")
    finally:
        mp.undo()
        subprocess.run([str(SLURM_SCRIPT), "stop", str(folder)], timeout=60)
