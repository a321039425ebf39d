"""Shared fixtures: presets are loaded once per session (they are frozen)."""

import os
import sqlite3
from contextlib import closing

import pytest

from autoparallel import io, resources

# The CLI's console takes its width from COLUMNS at import; tests that want a width set it themselves.
os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True, scope="session")
def _private_user_presets(tmp_path_factory):
    """Tests never read or write the real user's preset folder (calibrate writes there)."""
    mp = pytest.MonkeyPatch()
    mp.setenv(resources.HOME_ENV, str(tmp_path_factory.mktemp("autoparallel_home")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def gpt175b():
    return io.load_model("175b")


@pytest.fixture(scope="session")
def h100():
    return io.load_hardware("h100-sxm")


@pytest.fixture(scope="session")
def hw(h100):
    """The GPU a cost-model test prices on where which GPU does not matter (a module that needs
    another one overrides ``hw``, e.g. tests/test_gemm_precision.py's GB300)."""
    return h100


@pytest.fixture(scope="session")
def a100():
    return io.load_hardware("a100-sxm-80g")


@pytest.fixture(scope="session")
def gb300():
    return io.load_hardware("gb300")


@pytest.fixture(scope="session")
def dsv4_pro():
    return io.load_model("deepseek-v4-pro")


@pytest.fixture(scope="session")
def mlperf_lora_runs():
    """The MLPerf LoRA rows prepared (``measured_runs.load_runs`` of mlperf_training_lora_hopper.csv,
    ~10 s): once for the tests that read them (none changes them)."""
    from autoparallel.measured_runs import load_runs
    return load_runs([resources.data_file("mlperf_training_lora_hopper.csv")])


@pytest.fixture(scope="session")
def script_module():
    """Imports ``scripts/<name>.py`` as a module (the row extractors are scripts, not package
    modules; their tests call their functions)."""
    import importlib.util
    from pathlib import Path
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread per torch test: the tensors in these tests are small, and a second
    thread makes them several times slower whenever another process shares the two cores.
    Tests that never imported torch are left alone (and do not import it)."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def completed_trials():
    """Counts the COMPLETE trials of a study.db that another process is writing (0 while the
    study is still being created)."""
    def count(db) -> int:
        try:
            with closing(sqlite3.connect(db, timeout=5)) as c:
                return c.execute("select count(*) from trials where state='COMPLETE'").fetchone()[0]
        except sqlite3.Error:
            return 0
    return count
