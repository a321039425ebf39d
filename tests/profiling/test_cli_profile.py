"""`autoparallel profile`, `search --profile job` and `calibrate --from` end to end (CPU)."""

import json

import pandas as pd
import pytest
import torch
import yaml

from autoparallel.cli import main

from conftest import run_folder


def test_profile_a_plan_file(tmp_path, small_yaml, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"plan": {"tp": 1, "pp": 2, "dp": 1, "gbs": 8, "mbs": 2}}))
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--steps", "2",
                 "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["world_size"] == 2 and out["plan"]["pp"] == 2
    assert out["step_time_s"] > 0 and out["activation_bytes"] > 0



def test_a_terminal_sees_a_spinner_while_the_job_runs(tmp_path, small_yaml, capsys, monkeypatch):
    """`profile` held a still screen for the ~20 s of a CPU job (session 46): a spinner names the job."""
    import io

    from rich.console import Console

    from autoparallel.cli import common
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, force_terminal=True, width=80))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"plan": {"tp": 1, "pp": 1, "dp": 1, "gbs": 4, "mbs": 2}}))
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--steps", "1", "--warmup", "0"]) == 0
    assert "profiling " in buffer.getvalue() and "0 warm-up + 1 timed steps" in buffer.getvalue()
    # the result on the same console, broken between phrases at its 80 columns ("(median" / "of 3)" was not)
    text = buffer.getvalue()
    result = text[text.rindex("\n", 0, text.index("GBS4 on")) + 1:].splitlines()
    assert any("step" in line and "(median of 1)," in line for line in result), result
    assert any(line.startswith("peak ") or " peak " in line for line in result)


def test_profile_s_result_is_one_line_in_a_pipe(tmp_path, small_yaml, capsys, monkeypatch):
    """The result line went to a console of its own, which broke it at 80 columns in a pipe too
    ("step 912.5 ms (median " / "of 3)", session 53): a log or grep gets it whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"plan": {"tp": 1, "pp": 1, "dp": 1, "gbs": 4, "mbs": 2}}))
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--steps", "1", "--warmup", "0"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(line) > 80 and "(median of 1)," in line and " loss " in line

@pytest.mark.skipif(torch.cuda.is_available(), reason="--device cuda is valid on a GPU machine")
def test_profile_device_must_exist(tmp_path, small_yaml, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 1\ngbs: 8\n")
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan), "--device",
                 "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "Traceback" not in err


def test_profile_rejects_unknown_plan_keys(tmp_path, small_yaml, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 1\ngbs: 8\ntensor_parallel: 2\n")
    assert main(["profile", "--model", str(small_yaml), "--plan", str(plan)]) == 2
    assert "tensor_parallel" in capsys.readouterr().err


def test_search_profiles_top_k_and_calibrates_from_the_run(tmp_path, small_yaml, capsys, monkeypatch):
    args = ["search", "--model", str(small_yaml), "--gpus", "2", "--gpu", "cpu-local",
            "--space", "cpu-profiling", "--sp", "--recompute", "none", "--results", str(tmp_path),
            "--profile", "job", "--top-k", "2", "--profile-steps", "2", "--profile-warmup", "1"]
    assert main(args) == 0
    run_dir = run_folder(tmp_path)
    frame = pd.read_csv(run_dir / "candidates.csv")
    measured = frame[frame["measured_step_time_s"].notna()]
    assert len(measured) == 2
    assert (measured["measured_tokens_per_s_per_gpu"] > 0).all()
    # the run folder says which device measured (--device auto: the CPU here)
    from autoparallel.profiling.device import device_name
    profiled = pd.read_csv(run_dir / "profiled.csv")
    assert list(profiled["measured_device"]) == [device_name("cpu")] * 2
    assert list(frame["rank"].head(2)) == [1, 2]  # the measured ones lead, best measured first
    assert frame["measured_tokens_per_s_per_gpu"].iloc[0] >= frame["measured_tokens_per_s_per_gpu"].iloc[1]
    assert "meas. step s" in (run_dir / "ranked.md").read_text()
    capsys.readouterr()
    assert main(["calibrate", "--from", str(run_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "measured layouts" in out and f"fitted to the 2 layouts profiled in {run_dir.name}" in out.splitlines()[0]
    assert main(["calibrate", "--from", str(run_dir), "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # the human lines went to stderr
    assert out["rows"] == 2 and set(out["fitted"]) == {"gemm_max", "gemm_half_gflop", "attention",
                                                       "elementwise_bytes_per_token_hidden", "layer_overhead_s", "nvlink"}
    assert all(hit["name"] in out["fitted"] for hit in out["at_bounds"])
    # --as names the new preset (session 55: it was ignored, and the fit became your cpu-local)
    monkeypatch.setenv("AUTOPARALLEL_HOME", str(tmp_path / "home"))
    assert main(["calibrate", "--from", str(run_dir), "--as", "my-cpu"]) == 0
    written = tmp_path / "home" / "hardware" / "my-cpu.yaml"
    assert f"wrote {written} (use it with --gpu my-cpu)" in " ".join(capsys.readouterr().out.split())
    assert sorted(p.name for p in written.parent.iterdir()) == ["my-cpu.yaml"]
    from autoparallel import io
    mine = io.load_hardware("my-cpu")
    assert mine.name == "my-cpu" and io.load_hardware("cpu-local").efficiency != mine.efficiency
    assert "calibrated copy of cpu-local" in written.read_text()
