"""What an installed wheel needs is package data, and the shipped copies match their sources."""

import filecmp
from pathlib import Path

import pytest

from autoparallel import io, resources

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.parametrize("name", ["training_runs.csv", "training_runs_more.csv", "inference_runs.csv",
                                  "serving_runs.csv", "mlperf_inference_runs.csv",
                                  "mlperf_training_gpt3.csv", "mlperf_training_lora_hopper.csv"])
def test_shipped_measurements_equal_the_shared_originals(name):
    assert resources.data_file(name).is_file()
    if not SHARED_DATA.is_dir():
        pytest.skip(f"no {SHARED_DATA} beside this checkout to compare with")
    assert filecmp.cmp(resources.data_file(name), SHARED_DATA / name, shallow=False), (
        f"autoparallel/data/{name} differs from {SHARED_DATA / name}: copy it again")


def test_presets_and_kernels_live_inside_the_package():
    assert resources.SEARCH_SPACES.is_relative_to(resources.PACKAGE)
    assert {"gpt3-175b", "llama3-8b"} <= set(io.preset_files("models"))
    assert "h100-sxm" in io.preset_files("hardware")
    assert any(resources.KERNELS.glob("*.cu"))


def test_user_presets_come_after_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path))
    (tmp_path / "hardware").mkdir()
    shipped = io.preset_files("hardware")["h100-sxm"]
    (tmp_path / "hardware" / "my-h100.yaml").write_text(shipped.read_text().replace("name: h100-sxm", "name: my-h100")
                                                        .replace("aliases: [h100, h100-80g]", "aliases: []"))
    assert io.load_hardware("my-h100").name == "my-h100"
    assert io.load_hardware("h100-sxm").name == "h100-sxm"


def test_every_data_file_of_the_package_is_package_data():
    """A file the package reads at run time but pyproject's package-data misses is absent from
    the wheel (editable installs hide it)."""
    import fnmatch
    import tomllib
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["autoparallel"]
    missing = []
    for path in resources.PACKAGE.rglob("*"):
        name = path.relative_to(resources.PACKAGE).as_posix()
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
            if not any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/") for g in globs):
                missing.append(name)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_every_shipped_data_file_is_package_data():
    """A file under autoparallel/data that no package-data glob names is missing from the wheel
    (recipe_settings.yaml was, until issue 28 item 4 was finished)."""
    import fnmatch
    import tomllib
    pyproject = tomllib.loads((resources.PACKAGE.parent / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["autoparallel"]
    for path in resources.DATA.iterdir():
        name = f"data/{path.name}"
        if path.is_file() and not path.name.startswith("."):
            assert any(fnmatch.fnmatch(name, g) for g in globs), name
