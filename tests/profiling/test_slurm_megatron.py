"""``--trainer megatron`` end to end through a real Slurm: submit the exported short-run train.sh,
read its log with the ``runs import`` reader, write the measurements beside the predictions,
re-rank, refit with ``calibrate --from``.

There is no Megatron-LM (nor a GPU) here, so ``pretrain_gpt.py`` is conftest's STAND-IN TRAINER
(``stand_in_megatron``). torchrun and Slurm are real."""


import pandas as pd
import pytest

from autoparallel.cli import main

from conftest import run_folder

pytestmark = pytest.mark.slurm


@pytest.fixture
def megatron_lm(stand_in_megatron, slurm):
    return stand_in_megatron


def test_megatron_short_runs_through_slurm_rerank_and_calibrate(megatron_lm, tmp_path, small_yaml, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("STAND_IN_OOM_TP", "2")  # the TP2 layout's run dies of OOM, as on a GPU
    results = tmp_path / "results"
    args = ["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local", "--space", "cpu-profiling",
            "--recompute", "none", "--mbs", "2", "--no-sp", "--results", str(results), "--profile", "job", "--top-k", "3",
            "--profile-steps", "3", "--profile-warmup", "1", "--executor", "slurm", "--trainer", "megatron",
            "--megatron-lm", str(megatron_lm), "--yes"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "submitted 3 Slurm jobs" in out
    run_dir = run_folder(results)
    frame = pd.read_csv(run_dir / "candidates.csv")
    measured = frame[frame["measured_step_time_s"].notna()].reset_index(drop=True)
    # the stand-in's iteration time (warm-up iteration dropped), its logged TFLOP/s and max allocated
    expected_ms = 100.0 * measured["tp"] + 30.0 * measured["pp"]
    assert (abs(measured["measured_step_time_s"] * 1000 - expected_ms) < 1e-6).all()
    assert (abs(measured["measured_model_tflops_per_gpu"] - (1000.0 / expected_ms).round(1)) < 1e-6).all()
    assert (measured["measured_peak_memory_gib"] == 2.0).all()
    # re-ranked by measurement: the fastest measured layout first, the OOM one after the measured ones
    assert list(measured["measured_step_time_s"]) == sorted(measured["measured_step_time_s"])
    profiled = pd.read_csv(run_dir / "profiled.csv", dtype={"measurement_error": str}).fillna({"measurement_error": ""})
    failed = profiled[profiled["measurement_error"] != ""]
    assert len(failed) == 1 and failed["tp"].iloc[0] == 2 and "out of memory" in failed["measurement_error"].iloc[0]
    ranked_md = (run_dir / "ranked.md").read_text()
    assert "meas. TFLOP/s" in ranked_md and "| failed: out of memory" in ranked_md and "| measured |" in ranked_md
    # the job was the exported short run: train.sh in the job folder, saved nothing
    script = next((results / "slurm").glob("*/train.sh")).read_text()
    assert "--mock-data" in script and "--exit-interval 4" in script and "--save " not in script
    # the loop closes: calibrate refits the hardware constants to the measured runs
    assert main(["calibrate", "--from", str(run_dir), "--dry-run"]) == 0
    assert "measured layouts" in capsys.readouterr().out


def test_megatron_trainer_needs_a_checkout(tmp_path, small_yaml, capsys, monkeypatch):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 2\ngbs: 8\n")
    base = ["profile", "--model", str(small_yaml), "--plan", str(plan)]
    cases = [(["--trainer", "megatron"], "--trainer megatron needs a Megatron-LM checkout"),
             (["--executor", "slurm", "--trainer", "megatron"], "--trainer megatron needs a Megatron-LM checkout"),
             (["--executor", "slurm", "--trainer", "megatron", "--megatron-lm", str(tmp_path)],
              f"--megatron-lm {tmp_path}: no pretrain_gpt.py there"),
             (["--megatron-lm", str(tmp_path)], "--megatron-lm has no effect without --trainer megatron")]
    for argv, message in cases:
        assert main(base + argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_short_run_script_is_the_export_with_a_short_recipe(small_yaml):
    from autoparallel import io
    from autoparallel.report.launch import train_script
    from autoparallel.specs.plan import Plan
    model, plan, hw = io.load_model(str(small_yaml)), Plan(tp=2, pp=1, dp=1, gbs=8), io.load_hardware("h100-sxm")
    full, short = train_script(model, plan, hw, "t"), train_script(model, plan, hw, "t", short_run=25)
    block = full[full.index("MODEL_ARGS=("):full.index("DATA_ARGS=(")]
    assert block in short  # the layout's flags are the export's, unchanged
    for flag in ("--train-iters 25", "--exit-interval 25", "--log-interval 1", "--log-throughput",
                 "--timing-log-level 1", "DATA_ARGS=(--mock-data)", "CHECKPOINT_ARGS=()"):
        assert flag in short
    assert "CHECKPOINT_DIR" not in short and "DATA_PATH:?" not in short
