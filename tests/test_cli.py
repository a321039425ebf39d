"""The command line end to end: outputs other tools read, run folders, and user errors."""

import json
import subprocess
import sys

import pytest
import yaml

from autoparallel.cli import main

RECORD_KEYS = {"config", "fits", "peak_memory_gib", "step_time_s", "tokens_per_s_per_gpu",
               "model_tflops_per_gpu", "mfu", "breakdown"}
CONFIG_KEYS = {"tp", "pp", "dp", "cp", "ep", "vp", "sp", "mbs", "gbs", "recompute", "precision"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "autoparallel.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    assert main(["search", "--model", "llama3-70b", "--gpus", "64", "--results", str(root), "--top", "3"]) == 0
    (folder,) = root.iterdir()
    return folder


def test_run_folder_holds_every_file(run_dir):
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.yaml", "candidates.csv", "ranked.md", "best.yaml",
                                                   "train.sh"}
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    assert f"--tensor-model-parallel-size {best['plan']['tp']}" in best["megatron_args"]
    assert best["nemo"]["model"]["tensor_model_parallel_size"] == best["plan"]["tp"]
    manifest = yaml.safe_load((run_dir / "manifest.yaml").read_text())
    assert manifest["inputs"]["gpus"] == 64 and manifest["inputs"]["gbs"] == 128


def test_candidates_keep_rejections_with_reasons(run_dir):
    import pandas as pd
    frame = pd.read_csv(run_dir / "candidates.csv", low_memory=False)
    rejected = frame[~frame.fits]
    assert len(rejected) > 0 and rejected.reason.notna().all()
    assert frame.fits.sum() == frame["rank"].notna().sum()


@pytest.mark.parametrize("fmt, expect", [("megatron", "--pipeline-model-parallel-size"),
                                         ("nemo", "pipeline_model_parallel_size:"),
                                         ("nemo2", "MegatronCommOverlapCallback:"),
                                         ("launch", "pretrain_gpt.py"),
                                         ("yaml", "megatron_args:")])
def test_export_formats(run_dir, fmt, expect, capsys):
    assert main(["export", str(run_dir), "--rank", "2", "--format", fmt]) == 0
    assert expect in capsys.readouterr().out


def test_export_rank_1_matches_best_yaml(run_dir, tmp_path):
    out = tmp_path / "one.yaml"
    assert main(["export", str(run_dir), "--rank", "1", "--format", "yaml", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == yaml.safe_load((run_dir / "best.yaml").read_text())


def test_search_json_entries_have_stable_keys():
    out = run_cli("search", "--model", "llama2-7b", "--gpus", "8", "--json", "--top", "3", "--no-save")
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)
    assert len(entries) == 3
    for e in entries:
        assert RECORD_KEYS <= set(e) and CONFIG_KEYS <= set(e["config"])
    assert entries[0]["tokens_per_s_per_gpu"] >= entries[1]["tokens_per_s_per_gpu"]


def test_estimate_json_one_object():
    out = run_cli("estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "8", "--vp", "5",
                  "--mbs", "1", "--gbs", "256", "--precision", "fp8-delayed", "--json")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert RECORD_KEYS <= set(record)
    assert record["config"]["dp"] == 2 and record["config"]["precision"] == "fp8-delayed"


def test_estimate_pins_are_respected():
    out = run_cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--recompute", "full",
                  "--recompute-num-layers", "3", "--json")
    record = json.loads(out.stdout)
    assert record["config"]["recompute"] == "full" and record["config"]["recompute_num_layers"] == 3


@pytest.mark.parametrize("args, message", [
    (["search", "--model", "gpt-175b", "--gpus", "1024"], "unknown model 'gpt-175b'. Did you mean 'gpt3-175b'?"),
    (["search", "--model", "175b", "--gpus", "1024", "--gpu", "h1000"], "unknown hardware 'h1000'"),
    (["search", "--model", "175b", "--gpus", "7", "--no-save"], "no valid layout of gpt3-175b for 7 GPUs"),
    (["search", "--model", "llama3.1-405b", "--gpus", "8", "--no-save"], "no layout of llama3.1-405b fits on 8"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "3", "--pp", "8"], "invalid layout:"),
    (["estimate", "--model", "175b", "--gpus", "512"], "estimate needs at least --tp and --pp"),
    (["export", "/nonexistent/run"], "is not a run folder"),
])
def test_user_errors_are_one_line_exit_2(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_malformed_model_yaml_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\nnum_attention_heads: 4\n"
                   "vocab_size: 128\nseq_length: 32\nglobal_batch_size: lots\n")
    out = run_cli("search", "--model", str(bad), "--gpus", "8", "--no-save")
    assert out.returncode == 2
    assert "bad.yaml: key 'global_batch_size': expected int or null, got 'lots'" in out.stderr


def test_bad_flag_value_exits_2():
    out = run_cli("search", "--model", "175b", "--gpus", "-4")
    assert out.returncode == 2 and "expected a positive integer" in out.stderr


def test_models_and_hardware_list_presets():
    assert "llama3.1-405b" in run_cli("models").stdout
    assert "gb200" in run_cli("hardware").stdout
