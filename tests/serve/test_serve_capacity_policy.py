"""`infer --capacity-policy`: TensorRT-LLM's KV capacity scheduler chosen from the command line (issue 29).

GUARANTEED_NO_EVICT admits a request only when the pool holds its prompt and its max new tokens;
MAX_UTILIZATION allocates as tokens come, so the same pool holds more requests (and may pause
some). The flag must reach the steady-state model, the traffic simulation and the exported
trtllm-bench command, and be refused where the engine has no such choice.
"""

import json

import pytest
import yaml

from autoparallel import cli
from autoparallel.serve.assumptions import capacity_policy_of, load_engine, with_capacity_policy

POINT = ["infer", "--model", "llama2-70b", "--gpus", "8", "--gpu", "h100-sxm", "--tp", "2", "--pp", "1",
         "--max-batch", "2048", "--weight-precision", "fp8", "--kv-precision", "fp8", "--input-len", "1024",
         "--output-len", "1024", "--json", "--no-save"]


def _point(capsys, *extra) -> dict:
    assert cli.main([*POINT, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_policy_maps_to_the_engine_reservation():
    trt = load_engine("tensorrt-llm")
    assert capacity_policy_of(trt) == "guaranteed_no_evict"  # trtllm-bench's default (inference_assumptions.yaml)
    util = with_capacity_policy(trt, "max_utilization")
    assert util.kv_reservation == "current" and capacity_policy_of(util) == "max_utilization"
    assert with_capacity_policy(util, "guaranteed_no_evict").kv_reservation == "full"
    assert with_capacity_policy(trt, None) is trt
    assert capacity_policy_of(load_engine("tensorrt-llm-0.10")) == "max_utilization"  # its benchmark's setting


def test_max_utilization_holds_more_requests_in_the_same_pool(capsys):
    """Steady state: the same layout's pool holds more requests when blocks come as tokens do
    (prompt + half the answer on average instead of prompt + the whole answer)."""
    no_evict = _point(capsys, "--capacity-policy", "guaranteed_no_evict")
    default = _point(capsys)
    util = _point(capsys, "--capacity-policy", "max_utilization")
    assert default == no_evict  # tensorrt-llm's default policy
    assert util["memory_per_gpu_gib"] == pytest.approx(no_evict["memory_per_gpu_gib"])  # same pool
    held = lambda r: r["serving"]["kv_capacity_requests"]  # noqa: E731
    assert held(util) == pytest.approx(held(no_evict) * 2048 / (1024 + 512), rel=0.02)
    assert util["output_tokens_per_s"] > no_evict["output_tokens_per_s"]


def test_policy_reaches_the_simulation(capsys):
    """Simulated offline over the MLPerf workload on a small pool: no-evict reserves 1,024 new
    tokens per request and admits fewer; max-utilization admits more and pauses some."""
    base = ["infer", "--model", "llama2-70b", "--gpus", "2", "--gpu", "h100-sxm", "--tp", "2", "--pp", "1",
            "--max-batch", "1024", "--max-num-tokens", "4096", "--weight-precision", "fp8", "--kv-precision", "fp8",
            "--workload", "mlperf-llama2-70b", "--scenario", "offline", "--requests", "3000", "--no-save", "--json"]
    runs = {}
    for policy in ("guaranteed_no_evict", "max_utilization"):
        assert cli.main([*base, "--capacity-policy", policy]) == 0
        (runs[policy],) = json.loads(capsys.readouterr().out)["ranked"]
    assert runs["guaranteed_no_evict"]["preemptions"] == 0  # never evicts, by construction
    assert runs["max_utilization"]["output_tokens_per_s"] > 1.05 * runs["guaranteed_no_evict"]["output_tokens_per_s"]


def test_export_runs_the_policy_predicted(tmp_path, capsys):
    argv = ["infer", "--model", "llama3-8b", "--gpus", "1", "--gpu", "h100-sxm", "--top", "1", "--results",
            str(tmp_path)]
    assert cli.main([*argv, "--capacity-policy", "max_utilization"]) == 0
    capsys.readouterr()
    (run,) = tmp_path.iterdir()
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert "--scheduler_policy max_utilization" in best["commands"]["trtllm-bench"]
    manifest = yaml.safe_load((run / "manifest.yaml").read_text())
    assert manifest["inputs"]["engine"]["kv_reservation"] == "current"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "fastertransformer"])
def test_refused_where_the_engine_has_no_choice(capsys, engine):
    rc = cli.main(["infer", "--model", "llama3-8b", "--gpus", "1", "--engine", engine, "--capacity-policy",
                   "max_utilization", "--no-save"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"--capacity-policy is TensorRT-LLM's KV capacity scheduler; {engine} has no such choice" in err


def test_unknown_policy_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        cli.main(["infer", "--model", "llama3-8b", "--gpus", "1", "--capacity-policy", "fcfs"])
    assert "invalid choice: 'fcfs'" in capsys.readouterr().err


def test_help_names_both_policies(capsys):
    with pytest.raises(SystemExit):
        cli.main(["infer", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--capacity-policy {guaranteed_no_evict,max_utilization}" in text
    assert "pauses the newest request when the pool is full" in text
