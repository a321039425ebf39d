import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.specs.hardware import Efficiency, HardwareSpec


def test_fitted_block_replaces_itself_and_reloads(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("name: gpu\nbf16_tflops: 100\nmemory_gib: 80\nhbm_tbps: 2\nnvlink_domain: 8\n"
                    "nvlink_gbps: 600\ninternode_gbps: 25\n")
    for gemm_max in (0.61, 0.62):
        calibrate.write_block(path, {"gemm_max": gemm_max, "layer_overhead_s": 3e-5}, Efficiency(),
                              "test note", "test rows")
    text = path.read_text()
    assert text.count(calibrate.MARKER) == 1
    hw = io.from_dict(HardwareSpec, io.read_yaml(path), str(path))
    assert hw.efficiency.gemm_max == 0.62 and hw.efficiency.layer_overhead_s == 3e-5
    assert hw.calibrated_on == "test rows"


def test_committed_presets_name_their_calibration_data():
    for name in ("a100-sxm-80g", "h100-sxm"):
        assert "training_runs.csv" in io.load_hardware(name).calibrated_on


def test_calibration_goes_to_the_user_preset_folder_not_the_package(tmp_path, monkeypatch):
    from autoparallel import resources
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path))
    shipped = io.resolve_preset("hardware", "h100-sxm")
    before = shipped.read_text()
    target = calibrate.user_preset("h100-sxm")
    calibrate.write_block(target, {"gemm_max": 0.5}, Efficiency(), "test note", "test rows", source=shipped)
    assert shipped.read_text() == before
    assert target.parent == tmp_path / "hardware"
    assert io.resolve_preset("hardware", "h100-sxm") == target  # the user's copy now takes its place
    assert io.load_hardware("h100-sxm").efficiency.gemm_max == 0.5


def test_a_constant_at_its_upper_bound_is_nudged_down_not_past_it():
    # calibrate --dry-run on b200 once crashed: tp_overlap at 0.95, nudged to 1.16, refused by
    # Efficiency. The nudge that finds which constants the rows see must stay inside the bounds.
    seen = []

    def errors(values):
        seen.append(values["x"])
        assert 0.1 <= values["x"] <= 0.95, values
        return np.array([values["x"] - 0.5])
    result = calibrate._least_squares(["x"], [(0.1, 0.95)], [0.95], errors, 1)
    assert result.values["x"] == pytest.approx(0.5, abs=1e-3)
    assert max(seen) <= 0.95


@pytest.mark.parametrize("moe", [False, True])
def test_reading_the_runs_is_under_the_progress_bar(moe, monkeypatch):
    """Preparing the published rows takes seconds (12 s on a loaded 2-core machine) before the fit's
    bar started: calibrate showed a blank terminal. The rows are now read under the bar."""
    import io as stdio

    from rich.console import Console

    from autoparallel.errors import UserError

    class Watched(Console):
        live = 0

        def set_live(self, live):
            self.live += 1
            return super().set_live(live)

        def clear_live(self):
            self.live -= 1
            return super().clear_live()

    console, seen = Watched(file=stdio.StringIO(), force_terminal=True), []

    def load_runs(paths, moe=False):
        seen.append(console.live)
        return []
    monkeypatch.setattr(calibrate, "load_runs", load_runs)
    with pytest.raises(UserError):
        (calibrate.main_moe if moe else calibrate.main)("h100-sxm", None, write=False, console=console)
    assert seen == [1] and console.live == 0
    shown = console.file.getvalue()  # a pulse and the time so far; rich's default columns said "-:--:--"
    assert "reading the" in shown and "0:00:0" in shown and "-:--:--" not in shown


def test_a_fits_residual_is_the_log_of_predict_rows_ratio(mlperf_lora_runs):
    # The fits read ``log_error`` (no record built per trial); it must stay predict_row's figure,
    # with the row's own constants and with a trial's (the candidates then repriced, not rebuilt).
    import dataclasses

    from autoparallel.measured_runs import log_error, predict_row
    for p in mlperf_lora_runs[:4]:
        trial = dataclasses.replace(p.hardware.efficiency, gemm_max=0.5 * p.hardware.efficiency.gemm_max)
        for eff in (None, trial):
            record = predict_row(p, eff)
            assert log_error(p, eff) == np.log(record["predicted"] / record["measured"])
        assert predict_row(p, trial)["predicted"] != predict_row(p)["predicted"]  # the trial's constants used


def test_a_dry_run_says_it_wrote_nothing(tmp_path, monkeypatch, capsys):
    """`calibrate --dry-run` printed the fitted constants and errors as a calibration does and no word
    that nothing was written (session 46)."""
    from pathlib import Path

    from autoparallel import resources
    from autoparallel.cli import main
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path / "home"))
    logs = Path(__file__).parent / "fixtures" / "runlogs"
    runs = tmp_path / "runs.csv"
    assert main(["runs", "import", str(logs / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"),
                 str(logs / "bridge_fsdp8_fp8_tensorwise.log"), "--gpu", "h100-sxm", "--runs", str(runs)]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "mean |error|" in out and "dry run: nothing written" in out
    # the fitted constants under a line that says what they are, as the other commands' tables
    assert out.startswith("h100-sxm's efficiency constants, fitted to 2 measured runs (before -> after):\n  ")
    assert not (tmp_path / "home").exists()


def test_a_calibration_over_an_existing_preset_says_it_replaced_it(tmp_path, monkeypatch, capsys):
    """`calibrate --as my-cluster` a second time (another --runs) replaced the first fit and said
    "wrote", as for a new file (session 53); it now says "replaced"."""
    from pathlib import Path

    from autoparallel import resources
    from autoparallel.cli import main
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path / "home"))
    logs = Path(__file__).parent / "fixtures" / "runlogs"
    runs = tmp_path / "runs.csv"
    assert main(["runs", "import", str(logs / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"),
                 str(logs / "bridge_fsdp8_fp8_tensorwise.log"), "--gpu", "h100-sxm", "--runs", str(runs)]) == 0
    target = tmp_path / "home" / "hardware" / "my-cluster.yaml"
    for word in ("wrote", "replaced"):
        capsys.readouterr()
        assert main(["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "--as", "my-cluster"]) == 0
        assert f"\n{word} {target} (use it with --gpu my-cluster)\n" in capsys.readouterr().out
    # -o may replace a fit (a hardware preset), not another file (session 55: a run's candidates.csv went)
    output = tmp_path / "fit.yaml"
    for word in ("wrote", "replaced"):
        assert main(["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "-o", str(output)]) == 0
        assert f"\n{word} {output}\n" in capsys.readouterr().out
    output.write_text("id,model\nrun-1,llama3-8b\n")
    assert main(["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "-o", str(output)]) == 2
    assert "exists and is not a hardware preset" in capsys.readouterr().err
    assert output.read_text() == "id,model\nrun-1,llama3-8b\n"


def test_the_moe_fit_says_what_its_lines_are(capsys):
    from autoparallel.cli import main
    assert main(["calibrate", "--gpu", "h100-sxm", "--moe", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("h100-sxm's MoE constants, fitted to ") and lines[0].endswith(" MoE runs (before -> after):")
    assert lines[1].startswith("  alltoall: ")
