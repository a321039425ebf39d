"""``--trainer megatron --executor local``: the exported short-run train.sh through its own
torchrun on this machine, its log read with the ``runs import`` reader, the measurements beside
the predictions and the table re-ranked. ``pretrain_gpt.py`` is conftest's STAND-IN TRAINER
(``stand_in_megatron``: no Megatron-LM nor GPU here); torchrun is real."""

import time
from pathlib import Path

import pandas as pd
import pytest

from autoparallel.cli import main

from conftest import run_folder


def test_megatron_short_runs_through_torchrun_here_rerank(stand_in_megatron, tmp_path, small_yaml, capsys,
                                                         monkeypatch):
    monkeypatch.setenv("STAND_IN_OOM_TP", "2")  # the TP2 layout's run dies of OOM, as on a GPU
    results = tmp_path / "results"
    assert main(["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local", "--space", "cpu-profiling",
                 "--recompute", "none", "--mbs", "2", "--no-sp", "--results", str(results), "--profile", "job",
                 "--top-k", "3", "--profile-steps", "3", "--profile-warmup", "1", "--trainer", "megatron",
                 "--megatron-lm", str(stand_in_megatron)]) == 0
    run_dir = run_folder(results)
    frame = pd.read_csv(run_dir / "candidates.csv")
    measured = frame[frame["measured_step_time_s"].notna()].reset_index(drop=True)
    assert len(measured) == 2  # the third is the OOM
    expected_ms = 100.0 * measured["tp"] + 30.0 * measured["pp"]  # the stand-in's iteration time
    assert (abs(measured["measured_step_time_s"] * 1000 - expected_ms) < 1e-6).all()
    assert (measured["measured_peak_memory_gib"] == 2.0).all()
    assert list(frame["rank"].head(2)) == [1, 2] and list(measured["measured_step_time_s"]) == sorted(
        measured["measured_step_time_s"])
    profiled = pd.read_csv(run_dir / "profiled.csv", dtype={"measurement_error": str}).fillna({"measurement_error": ""})
    failed = profiled[profiled["measurement_error"] != ""]
    assert len(failed) == 1 and failed["tp"].iloc[0] == 2
    assert failed["measurement_error"].iloc[0].startswith("out of memory: train.sh ended with exit code 1")
    # each run's folder keeps the short-run train.sh (one torchrun node of 2 ranks) and its log
    logs = sorted((results / "megatron").glob("*/train.log"))
    assert len(logs) == 3 and any("iteration        3/       4" in log.read_text() for log in logs)
    script = next((results / "megatron").glob("*/train.sh")).read_text()
    assert "torchrun --nnodes 1 --nproc-per-node 2" in script and "--mock-data" in script and "srun" not in script


def test_a_local_megatron_run_past_its_timeout_is_killed(stand_in_megatron, tmp_path, small_yaml, capsys,
                                                        monkeypatch):
    monkeypatch.setenv("STAND_IN_HANG", "1")
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    start = time.monotonic()
    with pytest.raises(SystemExit, match="1"):  # a failed profile exits 1
        main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--trainer", "megatron",
              "--megatron-lm", str(stand_in_megatron), "--timeout", "5", "--steps", "2", "--warmup", "1"])
    assert time.monotonic() - start < 30
    assert "timed out after 5 s" in capsys.readouterr().out
    assert _running(stand_in_megatron) == []  # torchrun's ranks (each in a session of its own) stopped too
    assert len(list((tmp_path / "results" / "megatron").glob("*/train.log"))) == 1


def _running(checkout: Path) -> list[int]:
    """Processes running the stand-in's pretrain_gpt.py."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(checkout).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def test_megatron_trainer_is_refused_on_ray(tmp_path, small_yaml, capsys, stand_in_megatron):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--trainer", "megatron",
                 "--megatron-lm", str(stand_in_megatron), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "--trainer megatron has no effect with --executor ray" in err and len(err.strip().splitlines()) == 1
