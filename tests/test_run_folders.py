"""Run folders and studies as users and their teammates meet them (issue 12): files readable as
the umask says, a folder complete or absent, studies of different searches kept apart in one
storage, ``--no-save`` honoured by sampler searches."""

from __future__ import annotations

import os
import stat

import pytest

from autoparallel.cli import main
from autoparallel.report import run_folder

SMALL = ["--model", "llama2-7b", "--gpus", "8", "--json", "--top", "1"]


@pytest.fixture
def umask_027():
    before = os.umask(0o027)
    yield
    os.umask(before)


def test_run_folder_files_follow_the_umask(tmp_path, umask_027):
    assert main(["search", *SMALL, "--results", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert {"manifest.yaml", "candidates.csv", "ranked.md", "best.yaml"} <= set(modes)
    assert set(modes.values()) == {0o640}


def test_a_published_name_never_overwrites_a_run(tmp_path):
    first = run_folder.staged(tmp_path, lambda s: run_folder.new_dir(s, "x"))
    (first / "a").write_text("first run")
    second = run_folder.staged(tmp_path, lambda s: run_folder.new_dir(s, "x"))
    assert second.name == first.name + "-2" and (first / "a").read_text() == "first run"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])


def test_a_failed_write_leaves_nothing(tmp_path):
    def make(staging):
        run_dir = run_folder.new_dir(staging, "x")
        (run_dir / "manifest.yaml").write_text("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(Exception, match="No space left on device"):
        run_folder.staged(tmp_path, make)
    assert list(tmp_path.iterdir()) == []


optuna = pytest.importorskip("optuna", reason="the optuna extra is not installed")


def test_no_save_sampler_search_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["search", *SMALL, "--strategy", "optuna", "--trials", "5", "--grid-seeds", "0", "--no-save"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_one_storage_keeps_the_studies_of_different_searches_apart(tmp_path, capsys):
    import json
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    common = ["--strategy", "optuna", "--trials", "6", "--grid-seeds", "0", "--storage", url, "--no-save",
              "--json", "--top", "1"]
    assert main(["search", "--model", "175b", "--gpus", "64", *common]) == 0
    capsys.readouterr()
    assert main(["search", "--model", "llama3-8b", "--gpus", "8", *common]) == 0
    best = json.loads(capsys.readouterr().out)[0]["config"]
    assert best["tp"] * best["pp"] * best["cp"] * best["dp"] == 8  # not a layout of the 175B study
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(url))
    assert len(names) == 2 and names[0].startswith("gpt3-175b_64xh100-sxm_")
    assert names[1].startswith("llama3-8b_8xh100-sxm_")
