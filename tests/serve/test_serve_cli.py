"""`autoparallel infer` and `autoparallel validate --inference` from the command line."""

import json

import pytest
import yaml

from autoparallel import cli

POINT_KEYS = {"ttft_ms", "tpot_ms", "latency_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
              "fits", "memory_per_gpu_gib"}


def test_pinned_point_json(capsys):
    rc = cli.main(["infer", "--model", "llama3-70b", "--gpus", "8", "--gpu", "h100-sxm", "--tp", "4",
                   "--pp", "1", "--max-batch", "32", "--json", "--no-save"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert POINT_KEYS <= set(out)
    assert out["fits"] is True
    assert out["output_tokens_per_s"] == pytest.approx(8 * out["output_tokens_per_s_per_gpu"])
    assert out["latency_ms"] == pytest.approx(out["ttft_ms"] + 255 * out["tpot_ms"])
    assert out["config"]["max_num_tokens"] == 8192  # the engine's default budget when not pinned
    assert out["serving"]["concurrency"] == 32


def test_batch_is_the_old_spelling_of_max_batch(capsys):
    base = ["infer", "--model", "llama3-70b", "--gpus", "8", "--tp", "8", "--pp", "1", "--json", "--no-save"]
    assert cli.main([*base, "--batch", "16"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert cli.main([*base, "--max-batch", "16"]) == 0
    assert json.loads(capsys.readouterr().out) == old


def test_pinned_point_that_does_not_fit(capsys):
    rc = cli.main(["infer", "--model", "llama2-70b", "--gpus", "8", "--tp", "1", "--pp", "1", "--max-batch", "64",
                   "--json", "--no-save"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False


@pytest.mark.parametrize("argv, message", [
    (["--weight-precision", "int4"], "--weight-precision 'int4' is not one of bf16, fp16, fp8, nvfp4"),
    (["--kv-precision", "fp4"], "--kv-precision 'fp4' is not one of bf16, fp16, fp8"),
    (["--latency-metric", "p99", "--max-latency-ms", "50"], "--latency-metric 'p99' is not one of ttft, tpot, e2e"),
    (["--tp", "3", "--pp", "1", "--max-batch", "1"], "--tp 3 does not divide --gpus 8: --tp can be 1, 2, 4, 8"),
    (["--engine", "tgi"], "unknown serving engine 'tgi'; valid: tensorrt-llm"),
    (["--max-latency-ms", "50", "--max-tpot-ms", "40"], "contradicts --max-tpot-ms 40"),
    (["--input-len", "2048", "--max-model-len", "2000"], "--max-model-len 2000 is shorter than --input-len 2048"),
])
def test_errors_are_one_line(capsys, argv, message):
    rc = cli.main(["infer", "--model", "llama3-70b", "--gpus", "8", "--no-save", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1


def test_past_the_context_is_accepted_with_one_warning_line(tmp_path, capsys):
    """TensorRT-LLM's published Llama-2-7B benchmark runs 128 + 4096 tokens on a 4096-token model."""
    rc = cli.main(["infer", "--model", "llama2-7b", "--gpus", "8", "--input-len", "128", "--output-len", "4096",
                   "--results", str(tmp_path), "--top", "1"])
    out, err = capsys.readouterr()
    assert rc == 0 and err.count("\n") == 1 and err.startswith("autoparallel: warning: max model length 4224 "
                                                                 "exceeds the context of llama2-7b (4096 tokens)")
    (run,) = tmp_path.iterdir()
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert best["request"]["max_model_len"] == 4224
    assert best["commands"]["vllm"].startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve")
    assert all(c.startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 ") for c in best["commands"]["sglang"])
    assert "--max_seq_len 4224" in best["commands"]["trtllm-bench"]
    assert cli.main(["infer", "--model", "llama2-7b", "--gpus", "8", "--input-len", "128", "--output-len", "256",
                     "--no-save", "--top", "1"]) == 0
    assert capsys.readouterr().err == ""  # within the context: no warning


def test_search_writes_run_folder_with_commands(tmp_path, capsys):
    rc = cli.main(["infer", "--model", "llama3.1-70b", "--gpus", "8", "--gpu", "h100-sxm", "--max-tpot-ms", "50",
                   "--max-ttft-ms", "2000", "--weight-precision", "fp8", "--results", str(tmp_path), "--top", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tok/s/GPU" in out and "Pareto front" in out
    (run,) = tmp_path.iterdir()
    assert {p.name for p in run.iterdir()} >= {"best.yaml", "candidates.csv", "ranked.md", "manifest.yaml"}
    best = yaml.safe_load((run / "best.yaml").read_text())
    layout = best["layout"]
    assert best["engine"] == "tensorrt-llm" and best["request"]["max_tpot_ms"] == 50.0
    assert best["predicted"]["tpot_ms"] <= 50.0 and best["predicted"]["ttft_ms"] <= 2000.0
    vllm = best["commands"]["vllm"]
    assert vllm.startswith("vllm serve ") and f"--tensor-parallel-size {layout['tp']}" in vllm
    assert f"--max-num-seqs {layout['max_batch'] * layout['pp']}" in vllm
    assert len(best["commands"]["trtllm-serve"]) == len(best["commands"]["sglang"]) == layout["replicas"]
    assert "Pareto front" in (run / "ranked.md").read_text()
    manifest = yaml.safe_load((run / "manifest.yaml").read_text())
    assert manifest["inputs"]["kind"] == "inference" and manifest["inputs"]["engine"]["name"] == "tensorrt-llm"


def test_legacy_flags_give_the_same_search(capsys):
    base = ["infer", "--model", "llama3-8b", "--gpus", "2", "--weight-precision", "fp8", "--no-save", "--json"]
    assert cli.main([*base, "--max-latency-ms", "30", "--latency-metric", "tpot"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert cli.main([*base, "--max-tpot-ms", "30"]) == 0
    assert json.loads(capsys.readouterr().out) == old


def test_validate_inference_json(capsys, monkeypatch, held_out):
    from autoparallel.serve import validate
    monkeypatch.setattr(validate, "held_out_report", lambda runs=None, cross=True: held_out)  # refits: once
    assert cli.main(["validate", "--inference", "--no-mlperf", "--json"]) == 0  # MLPerf: test_serve_mlperf.py
    out = json.loads(capsys.readouterr().out)
    engines = {r["engine"] for r in out["by_engine_gpu_model"]}
    assert engines == {"fastertransformer", "tensorrt-llm-0.10", "tensorrt-llm"}
    assert {"in_sample_pct", "lomo_pct", "rows", "hardware", "model"} <= set(out["by_engine_gpu_model"][0])
    assert out["fastertransformer"]["mean_abs_error_pct"] <= 10.0
    mixtral = [r for r in out["by_engine_gpu_model"] if r["model"] == "Mixtral-8x7B"]
    assert sum(r["rows"] for r in mixtral) == 20  # the MoE rows are predicted, not set aside


def test_validate_inference_without_refits(capsys):
    assert cli.main(["validate", "--inference", "--no-cross-validation", "--no-mlperf", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["by_engine_gpu_model"]
    assert all(r["lomo_pct"] is None for r in rows) and all(r["in_sample_pct"] >= 0 for r in rows)


def test_a_pinned_point_writes_its_run_folder_with_the_commands(tmp_path, capsys):
    """Session 56: tp, pp and max batch pinned printed the estimate and wrote nothing, --results and
    --no-save silently ignored, so the one layout a user had chosen had no engine commands."""
    argv = ["infer", "--model", "llama3-70b", "--gpus", "8", "--tp", "4", "--pp", "1", "--max-batch", "32",
            "--results", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    (run,) = tmp_path.iterdir()
    assert f"run folder: {run}" in out
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert best["layout"]["tp"] == 4 and best["layout"]["max_batch"] == 32 and best["layout"]["replicas"] == 2
    assert "--tensor-parallel-size 4" in best["commands"]["vllm"]
    assert cli.main([*argv[:-2], "--results", str(tmp_path / "no"), "--tp", "1", "--max-batch", "64",
                     "--model", "llama2-70b"]) == 0  # does not fit: nothing to deploy, nothing written
    assert "nothing saved" in capsys.readouterr().out and not (tmp_path / "no").exists()
