"""MLPerf Inference v5.1's LLM results on NVIDIA GPUs (data/mlperf_inference_v51.csv, written by
scripts/mlperf_inference_rows.py) as a held-out check of the serving simulation (serve/mlperf.py
``held_out_sets``): the rows as the script reads them from the results mirror, the layouts each ran as
candidates the inference space accepts and predicts to fit, and ``validate --inference`` showing the
group apart from the v4.1 one.
"""

import json
import os

import numpy as np
import pandas as pd
import pytest

from autoparallel import cli, io, resources
from autoparallel.costmodel.inference import layout
from autoparallel.costmodel.inflight import kv_pool
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.space import InferenceSpace, structures
from autoparallel.serve.workload import load_workload

MIRROR = "/work/.mirror/mlcommons+inference_results_v5.1/repo"
CSV = "mlperf_inference_v51.csv"


@pytest.fixture(scope="module")
def rows():
    (entry,) = [h for h in mlperf.held_out_sets() if h["csv"] == CSV]
    return mlperf.load_rows(CSV, entry["engine"], entry["engine_column"])


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="the MLCommons inference_results_v5.1 mirror is not on this machine")
def test_the_script_rewrites_the_shipped_file_byte_for_byte(tmp_path, script_module):
    out = tmp_path / CSV
    assert script_module("mlperf_inference_rows").main(["--out", str(out)]) == 0
    assert out.read_bytes() == resources.data_file(CSV).read_bytes()


def test_a_config_is_read_without_running_it(script_module):
    """NVIDIA's v5.x configs: attribute keys by name, a ``base`` dict spread into EXPORTS, the
    setting of the result's accuracy target and power picked; a call the reader does not know
    stays text (nothing is executed)."""
    text = ("import code.common.constants as C\nimport os\nos.environ['X'] = '1'\n"
            "base = {llm_fields.tensor_parallelism: 4, model_fields.gpu_batch_size: {'llama3_1-8b': 96},\n"
            "        llm_fields.trtllm_runtime_flags: {'max_num_tokens': 2048}, model_fields.precision: 'fp4'}\n"
            "EXPORTS = {C.WorkloadSetting(C.HarnessType.Custom, C.AccuracyTarget(0.99), C.PowerSetting.MaxP): base,\n"
            "           C.WorkloadSetting(C.HarnessType.Custom, C.AccuracyTarget(0.99), C.PowerSetting.MaxQ):\n"
            "               {**base, llm_fields.tensor_parallelism: 2, 'x': open('/etc/passwd')}}\n")
    module = script_module("mlperf_inference_rows")
    exports = module.read_config(text)
    key, settings = module.pick_setting(exports, "0.99", maxq=False)
    assert "MaxP" in key and settings["tensor_parallelism"] == 4
    lay = module.layout(settings, "llama3.1-8b", "llama3_1-8b", 8)
    assert (lay["tp"], lay["replicas"], lay["max_batch"], lay["max_num_tokens"], lay["weight_precision"]) == (
        4, 2, 96, 2048, "nvfp4")
    _, capped = module.pick_setting(exports, "0.99", maxq=True)
    assert capped["tensor_parallelism"] == 2 and capped["x"] == "open('/etc/passwd')"
    assert module.pick_setting(exports, "0.999", maxq=False) is None


def test_serving_path_is_read_off_the_endpoint_only_flags(script_module):
    """``serving_path`` (s52h6): a setting whose runtime flags carry one only trtllm-serve reads
    (``workers_per_core``, ``max_concurrency``) is the endpoint path, any other the C++ executor."""
    path = script_module("mlperf_inference_rows").serving_path
    assert path({"trtllm_runtime_flags": {"max_num_tokens": 12000, "workers_per_core": 12}}) == "trtllm_endpoint"
    assert path({"trtllm_runtime_flags": {"max_concurrency": -1}}) == "trtllm_endpoint"
    assert path({"trtllm_runtime_flags": {"max_num_tokens": 2048}}) == "trtllm_executor"
    assert path({}) == "trtllm_executor"


def test_shipped_serving_paths_follow_nvidia_readme():
    """NVIDIA's README (closed/NVIDIA/README.md: "Using TRTLLM serve (used for Deepseek-R1 and
    Llama3.1-8b)"): every DeepSeek-R1 row and every Blackwell llama3.1-8b row whose config is published
    runs trtllm-serve; every llama2-70b / llama3.1-405b / mixtral-8x7b row runs a TRT engine on the
    executor; a row without a published config says neither."""
    frame = pd.read_csv(resources.data_file(CSV), keep_default_na=False)
    published = frame[frame["source"].str.contains("/configs/", regex=False)]
    assert (frame.loc[~frame.index.isin(published.index), "serving_path"] == "").all()
    assert set(published["serving_path"]) == {"trtllm_endpoint", "trtllm_executor"}
    endpoint = published[published["serving_path"] == "trtllm_endpoint"]
    assert set(endpoint["model"]) == {"deepseek-r1", "llama3.1-8b"}
    assert (published.loc[published["model"] == "deepseek-r1", "serving_path"] == "trtllm_endpoint").all()
    blackwell_8b = published[(published["model"] == "llama3.1-8b") & published["gpu_family"].isin(["B200", "GB200"])]
    assert len(blackwell_8b) > 10 and (blackwell_8b["serving_path"] == "trtllm_endpoint").all()


def test_rows_kept_and_left_out(rows):
    kept, left_out = rows
    frame = pd.read_csv(resources.data_file(CSV))
    assert len(kept) + len(left_out) == len(frame)
    assert set(frame["round"]) == {"v5.1"} and set(frame["division"]) == {"closed"}
    assert not frame["gpu"].str.contains("MI3").any()  # AMD's rows are another extractor's
    assert set(kept["scenario"]) == {"Offline", "Server", "Interactive"}
    assert {"b200", "gb200", "gb300", "h200", "h200-nvl"} <= set(kept["hardware"])
    assert {"llama2-70b", "llama3.1-8b", "llama3.1-405b", "mixtral-8x7b", "deepseek-r1"} == set(kept["model"])
    # DeepSeek-R1's rows, and only they, run attention DP (tests/serve/test_serve_attention_dp.py)
    assert set(kept.loc[kept["attention_dp"], "model"]) == {"deepseek-r1"}
    assert (kept["weight_precision"] == "nvfp4").sum() > 50  # Blackwell's NVFP4 weights, priced
    # The Interactive rows carry the round's tighter bounds (LoadGen's test parameters).
    inter = kept[(kept["scenario"] == "Interactive") & (kept["model"] == "llama2-70b")]
    assert set(zip(inter["ttft_bound_ms"], inter["tpot_bound_ms"])) == {(450.0, 40.0)}
    reasons = set(left_out)
    assert "model without a preset" not in reasons  # DeepSeek-R1's was the one (deepseek-v3's preset)
    assert "GPU without a preset" in reasons  # RTX PRO 6000 Blackwell Server Edition
    assert "KV cache precision not stated in the config" in reasons
    why = frame.loc[left_out.index, "notes"]
    assert why.str.contains("layout not published|not NVIDIA's TensorRT-LLM|not stated|software", regex=True).all()


def test_each_kept_layout_is_a_candidate_predicted_to_fit(rows):
    """Every layout a v5.1 submission ran is one the inference space accepts (no rule breaks it) and
    whose engine the memory model fits: weights, activations and reserve within the GPU and a KV
    pool that holds the benchmark's longest request."""
    kept, _ = rows
    engine = mlperf.harness_engine()
    s = mlperf.settings()
    layouts = kept.drop_duplicates(["hardware", "model", "gpus", *mlperf.LAYOUT, "kv_fraction"])
    for _, r in layouts.iterrows():
        model, hw = io.load_model(s["models"][r["model"]]), io.load_hardware(r["hardware"])
        wl = load_workload(s["workloads"][r["model"]])
        space = InferenceSpace().pinned(tp=int(r["tp"]), pp=int(r["pp"]), max_num_tokens=int(r["max_num_tokens"]),
                                        weight_precision=r["weight_precision"], kv_precision=r["kv_precision"])
        cand = structures(model, hw, int(r["gpus"]), space, engine, wl.max_input)
        assert len(cand) == 1 and cand["reason"].iloc[0] == "", (r["system"], cand["reason"].tolist())
        assert int(cand["replicas"].iloc[0]) == int(r["replicas"])
        adp = bool(r["attention_dp"])  # DeepSeek-R1: one attention-DP rank's weights and KV pool
        lay = layout(model, hw, efficiency_for("tensorrt-llm"), float(r["tp"]), float(r["pp"]), r["weight_precision"],
                     r["kv_precision"], float(r["tp"]) if adp else 1.0, attention_dp=adp)
        mem = kv_pool(lay, mlperf.harness_engine(float(r["kv_fraction"])), float(r["max_batch"]),
                      float(r["max_num_tokens"]))
        longest = (wl.max_input + wl.max_output) * float(np.ravel(lay.kv_bytes_per_token())[0])
        assert bool(np.ravel(mem["fixed_fits"])[0]) and float(np.ravel(mem["pool"])[0]) > longest, r["system"]


def test_nvfp4_weights_are_priced_as_nvfp4():
    """NVFP4 weights: 4.5 bits an element (E2M1 and an E4M3 scale per 16) and FP4 GEMMs at the
    measured NVFP4 / FP8 kernel ceiling; a GPU without FP4 tensor cores cannot run them."""
    model, hw = io.load_model("llama2-70b"), io.load_hardware("b200")
    eff = efficiency_for("tensorrt-llm")
    fp8, fp4 = (layout(model, hw, eff, 1.0, 1.0, w, "fp8") for w in ("fp8", "nvfp4"))
    assert float(np.ravel(fp4.weights())[0]) < 0.6 * float(np.ravel(fp8.weights())[0])
    h200 = io.load_hardware("h200")
    cand = structures(model, h200, 8, InferenceSpace().pinned(tp=1, pp=1, weight_precision="nvfp4",
                                                              kv_precision="fp8"), mlperf.harness_engine(), 1024)
    assert cand["reason"].iloc[0].startswith("nvfp4 weights need FP4 tensor cores")


def test_validate_inference_shows_the_held_out_group(capsys, monkeypatch, rows):
    """The v5.1 table and line after the v4.1 ones (those, and the serving tables before them, are
    other tests' and stubbed here), and its part of ``--json``."""
    from autoparallel.serve import validate
    # one short run per scenario (the fewest Offline samples, the shortest minimum duration): seconds
    small = rows[0].sort_values(["offline_requests", "min_duration_ms"]).groupby("scenario").head(1)
    report = mlperf.predict_rows(small, cross=False)
    for name in ("fastertransformer_report", "held_out_report", "not_predicted_serving_rows"):
        monkeypatch.setattr(validate, name, lambda *a, **k: None)
    monkeypatch.setattr(validate, "mlperf_report", lambda *a, **k: (None, None))
    for name in ("print_report", "print_mlperf"):
        monkeypatch.setattr(validate, name, lambda *a, **k: None)
    monkeypatch.setattr(validate, "json_report", lambda *a, **k: {})
    entry = next(h for h in mlperf.held_out_sets() if h["csv"] == CSV)
    monkeypatch.setattr(validate, "held_out_mlperf_reports", lambda: [(entry, report, rows[1])])
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["validate", "--inference"]) == 0
    raw = capsys.readouterr().out
    table = [line for line in raw.splitlines() if line.strip().startswith("v5.1")]
    assert table and max(len(line) for line in table) <= 80
    out = " ".join(raw.split())
    assert "MLPerf Inference held out (never fitted): nvidia v5.1, mlperf_inference_v51.csv" in out
    assert "MLPerf nvidia v5.1 held out, mean |error| of tokens/s per GPU: Interactive" in out
    assert "GPU without a preset" in out
    monkeypatch.setattr(validate, "mlperf_json", lambda *a, **k: {})
    assert cli.main(["validate", "--inference", "--json"]) == 0
    v51 = json.loads(capsys.readouterr().out)["mlperf"]["held_out"]["nvidia v5.1"]
    assert {m["scenario"] for m in v51["by_scenario"]} == {"Offline", "Server", "Interactive"}
    assert len(v51["rows"]) == len(report)
    inter = next(m for m in v51["by_scenario"] if m["scenario"] == "Interactive")
    assert np.isfinite(inter["tokens_pct"]) and "ttft_p99_pct" in inter


@pytest.mark.parametrize("model, rel", [("llama3.1-8b", 0.01), ("llama3.1-405b", 0.02)])
def test_workload_output_is_what_loadgen_counted(model, rel):
    """The llama3.1 workloads' mean output is LoadGen's tokens per sample over the v5.1 Offline runs
    (first assumed 73 and 684 tokens: 43 % and 5 % off)."""
    frame = pd.read_csv(resources.data_file(CSV))
    offline = frame[(frame["model"] == model) & (frame["scenario"] == "Offline")]
    wl = load_workload(mlperf.settings()["workloads"][model])
    assert len(offline) >= 10
    assert wl.mean_output == pytest.approx(offline["out_tokens_per_sample_perf"].mean(), rel=rel)
    assert wl.max_output >= offline["out_tokens_per_sample_perf"].max() - 1
