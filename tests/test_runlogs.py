"""Training logs of the user's own cluster: every field read right from Megatron-LM's and
Megatron-Bridge's real print formats (fixtures and their sources: tests/fixtures/runlogs/), the
runs CSV they go into, ``estimate --from-log`` and ``calibrate --runs ... --as``."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from autoparallel import io, measured_runs
from autoparallel.cli import main
from autoparallel.costmodel import calibrate
from autoparallel.runlogs.arguments import parse_value
from autoparallel.runlogs.metrics import GIB, measure
from autoparallel.runlogs.runrow import UnreadableLog, read_log, runs_columns, to_row
from autoparallel.runlogs.runsfile import import_logs

FIXTURES = Path(__file__).parent / "fixtures" / "runlogs"
FP8_TP2 = FIXTURES / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"
CP2_UNEVEN = FIXTURES / "megatron_cp2_pp4_uneven_full_recompute_bf16.log"
BRIDGE_FSDP = FIXTURES / "bridge_fsdp8_fp8_tensorwise.log"
GOOD = (FP8_TP2, CP2_UNEVEN, BRIDGE_FSDP)
LLAMA3_8B = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
             "ffn_hidden_size": 14336, "kv_channels": 128, "vocab_size": 128256, "activation": "swiglu",
             "seq_length": 8192}


def row_of(path):
    return to_row(read_log(path), "h100-sxm")


def assert_fields(row, expected):
    wrong = {k: (row[k], v) for k, v in expected.items()
             if not (row[k] == pytest.approx(v) if isinstance(v, float) else row[k] == v)}
    assert not wrong, f"read wrong (read, expected): {wrong}"


def test_megatron_lm_fp8_interleaved_log_reads_every_field():
    row = row_of(FP8_TP2)
    assert_fields(row, {
        **LLAMA3_8B, "gpu": "h100-sxm", "num_gpus": 16, "tp": 2, "pp": 2, "vp": 4, "cp": 1, "ep": 1, "sp": 1,
        "recompute": "selective", "recompute_num_layers": 0, "mbs": 1, "gbs": 128, "precision": "fp8-delayed",
        "fsdp": 0, "num_layers_in_first_pipeline_stage": 0, "num_layers_in_last_pipeline_stage": 0,
        "distributed_optimizer": 1, "overlap_grad_reduce": 1, "overlap_param_gather": 1, "grad_reduce_in_fp32": 1,
        "tp_comm_overlap": 1, "flash_attention": 1, "fp8_bf16_edge_layers": 0, "cpu_offloading_num_layers": 0,
        # Median of the ten intervals after the first (iteration 1, 41873.2 ms, is warm-up).
        "measured_iteration_time_s": 6.4523, "measured_model_tflops_per_gpu": 522.8,
        "measured_tokens_per_s_per_gpu": 128 * 8192 / (6.4523 * 16),
        # Largest "max allocated" / "max reserved" over ranks 0, 1, 8, 9 and both reports (MiB).
        "measured_max_allocated_gib": 36731.88 / 1024, "measured_max_reserved_gib": 39481.88 / 1024,
        "tie_embeddings": 0, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "source": f"megatron-lm log {FP8_TP2.name}"})
    assert row["id"].startswith("log-megatron_tp2_pp2_vp4_sp_selective_fp8-")
    log = read_log(FP8_TP2)
    steady = log.measurements.steady()
    assert [i.iteration for i in steady] == list(range(10, 101, 10))
    assert log.measurements.median_timer_ms("optimizer", steady) == pytest.approx(11.6)
    assert log.measurements.median_timer_ms("forward-backward", steady) == pytest.approx(6452.3 - 11.6)


def test_megatron_lm_2024_log_with_srun_prefixes_uneven_split_and_cp():
    row = row_of(CP2_UNEVEN)
    assert_fields(row, {
        "num_layers": 30, "hidden_size": 5120, "num_attention_heads": 40,
        "num_query_groups": 40,  # group_query_attention False: the printed num_query_groups 1 does not apply
        "ffn_hidden_size": 20480, "vocab_size": 50257,  # the tokenizer's, from " > padded vocab (size: 50257) ..."
        "activation": "gelu", "seq_length": 8192, "num_gpus": 32, "tp": 1, "pp": 4, "vp": 1, "cp": 2, "sp": 0,
        "recompute": "full", "recompute_num_layers": 0, "mbs": 1, "gbs": 64, "precision": "bf16",
        "num_layers_in_first_pipeline_stage": 6, "num_layers_in_last_pipeline_stage": 6,
        "distributed_optimizer": 1, "overlap_grad_reduce": 1, "overlap_param_gather": 0, "tp_comm_overlap": 0,
        "flash_attention": 1, "tie_embeddings": 1, "hidden_dropout": 0.1, "attention_dropout": 0.1,
        "measured_iteration_time_s": 4.4015,
        "measured_max_allocated_gib": 23412.8857421875 / 1024, "measured_max_reserved_gib": 25110.0 / 1024})
    assert row["measured_model_tflops_per_gpu"] is None  # run without --log-throughput


def test_megatron_bridge_log_reads_yaml_config_gb_memory_and_world_from_microbatches():
    row = row_of(BRIDGE_FSDP)
    assert_fields(row, {
        **LLAMA3_8B, "num_gpus": 8,  # gbs 128 / (mbs 1 x 16 micro-batches) = dp 8, at TP1 PP1 CP1
        "tp": 1, "pp": 1, "vp": 1, "cp": 1, "sp": 0, "recompute": "none", "mbs": 1, "gbs": 128,
        "precision": "fp8-current", "fsdp": 8, "distributed_optimizer": 1, "grad_reduce_in_fp32": 0,
        "overlap_grad_reduce": 1, "overlap_param_gather": 1, "flash_attention": 1,
        "tie_embeddings": 0, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "measured_iteration_time_s": 9.61035, "measured_model_tflops_per_gpu": 702.0,
        "measured_max_allocated_gib": 55.102e9 / GIB, "measured_max_reserved_gib": 61.765e9 / GIB,
        "source": f"megatron-bridge log {BRIDGE_FSDP.name}"})


@pytest.mark.parametrize("name, reason", [
    ("megatron_warmup_only.log", "the one logged interval is warm-up"),
    ("nemo_lightning_progress.log", 'neither Megatron-LM\'s "arguments" block'),
])
def test_unreadable_logs_say_why(name, reason):
    with pytest.raises(UnreadableLog, match=reason.replace("(", r"\(").replace(")", r"\)")):
        row_of(FIXTURES / name)


@pytest.mark.parametrize("edit, reason", [
    (lambda line: "" if "num_query_groups" in line else line, "the configuration does not state num_query_groups"),
    (lambda line: line.replace(" 8\n", " None\n") if "num_query_groups" in line else line,
     "the configuration does not state num_query_groups"),
    (lambda line: line.replace(" 8\n", " 0\n") if "num_query_groups" in line else line,
     "the configuration's num_query_groups = 0 is not a positive integer"),
], ids=["left out", "None", "zero"])
def test_grouped_query_attention_without_a_group_count_says_why(edit, reason, tmp_path):
    """group_query_attention with num_query_groups left out or None was a KeyError / TypeError
    traceback from `runs import`; 0 was read into a row."""
    log = tmp_path / "gqa.log"
    log.write_text("".join(edit(line) for line in FP8_TP2.read_text().splitlines(keepends=True)))
    with pytest.raises(UnreadableLog, match=reason):
        row_of(log)


def test_warmup_option_keeps_the_first_interval_when_asked():
    row = to_row(read_log(FIXTURES / "megatron_warmup_only.log"), "h100-sxm", warmup=0)
    assert row["measured_iteration_time_s"] == pytest.approx(41.8732)


def test_the_same_run_gets_the_same_id_whatever_the_file_is_called(tmp_path):
    copy = tmp_path / "renamed.log"
    copy.write_text(FP8_TP2.read_text())
    assert row_of(copy)["id"].rsplit("-", 1)[1] == row_of(FP8_TP2)["id"].rsplit("-", 1)[1]


def test_resumed_job_and_batch_rampup_intervals():
    # training_log's line format; a job restarted from iteration 20 counts again, and intervals
    # logged while the batch ramps up are left out.
    def line(it, ms, batch):
        return (" iteration {:8d}/{:8d} |".format(it, 40) + " consumed samples: {:12d} |".format(0)
                + " elapsed time per iteration (ms): {:.1f} |".format(ms)
                + f" learning rate: {1e-4:.6E} |" + f" global batch size: {batch:5d} |")
    lines = [line(10, 900.0, 32), line(20, 500.0, 64), line(30, 400.0, 64), line(20, 950.0, 64), line(30, 410.0, 64)]
    m = measure(lines)
    assert [(i.iteration, i.segment) for i in m.steady()] == [(20, 0), (30, 0), (30, 1)]
    assert [i.global_batch_size for i in m.intervals] == [32, 64, 64, 64, 64]


@pytest.mark.parametrize("text, value", [
    ("None", None), ("True", True), ("False", False), ("4", 4), ("1e-05", 1e-05), ("0.00015", 0.00015),
    ("['core_attn']", ["core_attn"]), ("AttnBackend.auto", "AttnBackend.auto"), ("torch.bfloat16", "torch.bfloat16"),
    ("", None), ("949,50,1", "949,50,1")])
def test_printed_argument_values(text, value):
    assert parse_value(text) == value


def test_import_appends_new_rows_skips_bad_logs_and_never_duplicates(tmp_path):
    runs = tmp_path / "results" / "runs.csv"
    logs = [*GOOD, FIXTURES / "nemo_lightning_progress.log"]
    first = import_logs(logs, "h100", runs)
    assert [r.added for r in first] == [True, True, True, False]
    assert "no printed configuration" in first[3].reason
    again = import_logs(logs[:2], "h100-sxm", runs)
    assert [r.added for r in again] == [False, False]
    frame = pd.read_csv(runs)
    assert len(frame) == 3 and list(frame.columns) == runs_columns()
    assert set(frame["gpu"]) == {"h100-sxm"}  # the alias resolved to the preset's name


def test_imported_rows_price_exactly_the_logged_layout(tmp_path):
    runs = tmp_path / "runs.csv"
    import_logs(GOOD, "h100-sxm", runs)
    prepared = {p.id.split("-")[1]: p for p in measured_runs.load_runs([runs])}
    for p in prepared.values():
        assert len(p.candidates) == 1, p.id  # every knob pinned: nothing left to search
        assert p.software == "log" and p.metric == "iteration_time"
    uneven = prepared["megatron_cp2_pp4_uneven_full_recompute_bf16"].candidates.iloc[0]
    assert (uneven.num_layers_in_first_pipeline_stage, uneven.num_layers_in_last_pipeline_stage) == (6, 6)
    assert bool(uneven.overlap_grad_reduce) and not bool(uneven.overlap_param_gather)
    fsdp = prepared["bridge_fsdp8_fp8_tensorwise"].candidates.iloc[0]
    assert bool(fsdp.fsdp) and fsdp.precision == "fp8-current" and not bool(fsdp.grad_reduce_in_fp32)
    gpt = prepared["megatron_cp2_pp4_uneven_full_recompute_bf16"].model
    assert gpt.tie_embeddings and gpt.hidden_dropout == 0.1
    assert prepared["megatron_tp2_pp2_vp4_sp_selective_fp8"].model.hidden_dropout == 0.0


def test_user_runs_are_the_reference_release():
    assert measured_runs.software_date("log") == math.inf
    assert measured_runs.software_date("nemo 25.02") == pytest.approx(2025.02)


def test_runs_import_cli_exit_codes(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    assert main(["runs", "import", str(FIXTURES / "nemo_lightning_progress.log"), "--gpu", "h100-sxm",
                 "--runs", str(runs)]) == 2
    assert not runs.exists()
    assert "the log could not be read" in capsys.readouterr().err
    assert main(["runs", "import", str(BRIDGE_FSDP), str(FIXTURES / "megatron_warmup_only.log"),
                 "--gpu", "h100-sxm", "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "warm-up" in out and "1 new row in" in out


def test_a_log_whose_layout_cannot_run_on_the_gpu_given_is_not_imported(tmp_path, capsys):
    """An FP8 log imported with --gpu a100-sxm-80g (no FP8 tensor cores) went into the file, and every
    later `calibrate --runs` of it failed, for any --gpu, on "the published layout breaks a rule"
    (session 55): it is skipped with the reason now, the other logs go in, and calibrate reads the file."""
    runs = tmp_path / "runs.csv"
    assert main(["runs", "import", str(FP8_TP2), "--gpu", "a100-sxm-80g", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "its layout (TP2 PP2 fp8-delayed) cannot run on a100-sxm-80g: a100-sxm-80g has no FP8 tensor cores; " \
           "is --gpu the GPU the run used?" in err and not runs.exists()
    assert main(["runs", "import", str(FP8_TP2), str(CP2_UNEVEN), "--gpu", "a100-sxm-80g", "--runs", str(runs)]) == 0
    assert f"1 new row in {runs} (0 already there, 1 log skipped)" in capsys.readouterr().out
    assert list(pd.read_csv(runs)["precision"]) == ["bf16"]
    assert main(["calibrate", "--runs", str(runs), "--gpu", "a100-sxm-80g", "--dry-run"]) == 0


def test_runs_import_counts_read_as_english(tmp_path, capsys):
    """The refusal was built with `'not ' * (n == 1)` (session 48 wrote it out); every count printed
    reads right for 0, 1 and 2: rows added, rows already there, logs skipped, logs unread."""
    runs, unread = tmp_path / "runs.csv", str(FIXTURES / "nemo_lightning_progress.log")
    warmup_only = str(FIXTURES / "megatron_warmup_only.log")
    assert main(["runs", "import", unread, "--gpu", "h100-sxm", "--runs", str(runs)]) == 2
    assert capsys.readouterr().err.startswith("autoparallel: error: the log could not be read (")
    assert main(["runs", "import", unread, warmup_only, "--gpu", "h100-sxm", "--runs", str(runs)]) == 2
    assert "none of the 2 logs could be read (the reasons above); nothing written" in capsys.readouterr().err
    assert main(["runs", "import", str(FP8_TP2), str(BRIDGE_FSDP), "--gpu", "h100-sxm", "--runs", str(runs)]) == 0
    assert f"2 new rows in {runs} (0 already there, 0 logs skipped)" in capsys.readouterr().out
    assert main(["runs", "import", str(FP8_TP2), str(CP2_UNEVEN), unread, "--gpu", "h100-sxm",
                 "--runs", str(runs)]) == 0
    assert f"1 new row in {runs} (1 already there, 1 log skipped)" in capsys.readouterr().out
    assert main(["runs", "import", str(FP8_TP2), unread, warmup_only, "--gpu", "h100-sxm",
                 "--runs", str(runs)]) == 0
    assert f"0 new rows in {runs} (1 already there, 2 logs skipped)" in capsys.readouterr().out


def test_a_log_given_twice_in_one_import_is_one_new_row(tmp_path, capsys):
    """The same run twice on one command line (the same file, or a copy) is written once; the count
    said "2 new rows" and both lines "read" (session 53), where the file got one."""
    runs, copy = tmp_path / "runs.csv", tmp_path / "copy.log"
    copy.write_bytes(FP8_TP2.read_bytes())
    assert main(["runs", "import", str(FP8_TP2), str(FP8_TP2), str(copy), "--gpu", "h100-sxm",
                 "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert len(pd.read_csv(runs)) == 1
    assert f"1 new row in {runs} (2 already there, 0 logs skipped)" in out
    assert [line.split()[0] for line in out.splitlines()[:3]] == ["read", "already", "already"]


def test_estimate_from_log_puts_prediction_beside_measurement(capsys):
    assert main(["estimate", "--from-log", str(FP8_TP2), "--gpu", "h100-sxm", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    terms = {t["term"]: t for t in result["terms"]}
    step = terms["step time (s)"]
    assert step["measured"] == pytest.approx(6.4523)
    assert step["predicted"] == pytest.approx(result["prediction"]["step_time_s"])
    assert step["error_pct"] == pytest.approx(100 * (step["predicted"] / step["measured"] - 1))
    memory = terms["peak memory allocated (GiB)"]
    prediction = result["prediction"]
    assert memory["predicted"] == pytest.approx(prediction["peak_memory_gib"]
                                                - prediction["breakdown"]["memory_gib"]["reserve_gib"])
    assert terms["optimizer timer (s)"]["measured"] == pytest.approx(0.0116)
    config = prediction["config"]
    assert (config["tp"], config["pp"], config["vp"], config["dp"], config["recompute"]) == (2, 2, 4, 4, "selective")


def test_estimate_without_target_or_log_is_a_user_error(capsys):
    assert main(["estimate", "--gpus", "8"]) == 2
    assert "estimate needs --model and --gpus (or --from-log LOG)" in capsys.readouterr().err


def test_fit_never_fits_more_constants_than_rows(tmp_path):
    runs = tmp_path / "runs.csv"
    import_logs([FP8_TP2], "h100-sxm", runs)
    rows = measured_runs.load_runs([runs])
    result = calibrate.fit(rows, io.load_hardware("h100-sxm").efficiency)
    assert len(result.fitted) == 1 and len(result.capped) >= 2
    assert set(result.values) - {"release_speed", "gpu_speed"} == set(result.fitted)
    assert result.after < result.before


def test_calibrate_as_new_preset_from_own_logs(tmp_path, capsys, monkeypatch):
    from autoparallel import resources
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path / "home"))
    runs = tmp_path / "runs.csv"
    import_logs(GOOD, "h100-sxm", runs)
    assert main(["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "--as", "my-cluster"]) == 0
    out = capsys.readouterr().out
    assert "kept, 3 rows fit at most 3 constants" in out
    path = io.resolve_preset("hardware", "my-cluster")
    assert path == tmp_path / "home" / "hardware" / "my-cluster.yaml"
    text = path.read_text()
    data = yaml.safe_load(text)
    assert data["name"] == "my-cluster" and "aliases" not in data and "efficiency_from" not in data
    header = text[text.index(calibrate.MARKER):]
    assert "3 rows of runs.csv" in header and "before" in header and "after" in header
    assert all(r in header for r in pd.read_csv(runs)["id"])
    mine, shipped = io.load_hardware("my-cluster"), io.load_hardware("h100-sxm")
    assert mine.efficiency != shipped.efficiency
    changed = [k for k in calibrate.FITTED if getattr(mine.efficiency, k) != getattr(shipped.efficiency, k)]
    assert 1 <= len(changed) <= 3
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "16", "--gpu", "my-cluster", "--tp", "2",
                 "--pp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_calibrate_as_rejects_a_path_like_name(capsys):
    assert main(["calibrate", "--gpu", "h100-sxm", "--as", "../x", "--dry-run"]) == 2
    assert "--as '../x'" in capsys.readouterr().err


def test_rename_drops_block_style_aliases(tmp_path):
    source = tmp_path / "gpu.yaml"
    source.write_text("name: gpu\naliases:\n  - g1\n  - g2\nbf16_tflops: 100\nmemory_gib: 80\nhbm_tbps: 2\n"
                      "nvlink_domain: 8\nnvlink_gbps: 600\ninternode_gbps: 25\n")
    target = tmp_path / "new.yaml"
    calibrate.write_block(target, {"gemm_max": 0.5}, io.load_hardware("h100-sxm").efficiency, "line one\nline two",
                          "rows", source=source, rename="new")
    data = yaml.safe_load(target.read_text())
    assert data["name"] == "new" and "aliases" not in data and data["bf16_tflops"] == 100
    assert "# line one\n# line two" in target.read_text()


def test_estimate_from_log_reads_at_80_columns():
    """`estimate --from-log` centred its title over three lines as a table title at 80 columns and
    printed tokens/s as 1.016e+04 (session 47)."""
    import io as stdio

    from rich.console import Console

    from autoparallel.runlogs import compare
    out = stdio.StringIO()
    compare.main(FP8_TP2, "h100-sxm", False, Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"{FP8_TP2.name} (megatron-lm): 16 x h100-sxm, TP2 PP2")
    assert lines[1].startswith("VP4 CP1 DP4") and "e+0" not in out.getvalue()  # wrapped, not centred
    assert any(line.split("│")[1].strip() == "tokens/s/GPU" and "10,157" in line for line in lines if "│" in line)
