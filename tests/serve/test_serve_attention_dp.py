"""Attention data parallelism (TensorRT-LLM's ``enable_attention_dp``; costmodel/inference.py
``attention_dp_dispatch``): its terms against a hand computation on a small case, the layouts and
engines it is refused for, ``infer --attention-dp``, and the MLPerf v5.1 DeepSeek-R1 rows it lets
``validate --inference`` predict (serve/mlperf.py)."""

import dataclasses

import numpy as np
import pytest

from autoparallel import cli, io
from autoparallel.costmodel import comm, moe
from autoparallel.costmodel.inference import (attention_dp_dispatch, attention_dp_host_time, decode_attention, layout,
                                              moe_dispatch_time, pass_work, price_pass, routed_expert_work,
                                              unsplit_expert_bytes)
from autoparallel.errors import UserError
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for, load_engine

CSV = "mlperf_inference_v51.csv"


def _v(x) -> float:
    return float(np.ravel(x)[0])


@pytest.fixture(scope="module")
def small():
    """Mixtral-8x7B (8 experts, top 2, every layer MoE) as 4 attention-DP ranks on B200, NVFP4 weights."""
    model, hw = io.load_model("mixtral-8x7b"), io.load_hardware("b200")
    eff = efficiency_for("tensorrt-llm")
    return model, hw, eff, layout(model, hw, eff, 4.0, 1.0, "nvfp4", "fp8", 4.0, load_engine("tensorrt-llm"), True)


def test_an_attention_dp_rank_is_tp1_with_the_experts_spread(small):
    model, hw, eff, lay = small
    assert (_v(lay.tp), _v(lay.dp), _v(lay.ep)) == (1.0, 4.0, 4.0)
    wb = 0.5625
    routed = model.num_experts * model.expert_params  # every layer is a MoE layer
    # Attention, router and norms whole on the rank; the experts a quarter each; embedding and output in 16 bit.
    hand = model.num_layers * ((model.layer_params - routed) + routed / 4) * wb + 2 * model.embedding_params * 2.0
    assert _v(lay.weights()) == pytest.approx(hand, rel=1e-12)
    assert _v(unsplit_expert_bytes(lay)) == pytest.approx(model.num_layers * routed * 0.75 * wb, rel=1e-12)
    tp = layout(model, hw, eff, 4.0, 1.0, "nvfp4", "fp8", 4.0)
    assert _v(unsplit_expert_bytes(tp)) == 0.0 and _v(attention_dp_dispatch(tp, 64.0)) == 0.0


def test_the_routed_experts_take_every_ranks_tokens(small):
    """64 tokens on each of 4 ranks: 256 tokens reach the experts, each rank's two of the eight."""
    model, hw, _, lay = small
    flops, _, nbytes = routed_expert_work(lay, np.array(64.0))
    k, experts, pe = model.moe_router_topk, model.num_experts, model.expert_params
    imbalance = _v(moe.load_imbalance(hw, model, 4.0))
    assert _v(flops) == pytest.approx(2.0 * 256 * k * pe / 4 * imbalance, rel=1e-12)
    picked = 1.0 - (1.0 - k / experts) ** 256
    assert _v(nbytes) == pytest.approx(picked * experts * pe / 4 * 0.5625, rel=1e-12)


def test_the_dispatch_is_a_gather_and_a_reduce_scatter_by_hand(small):
    """One MoE layer's exchange for 64 tokens a rank: 256 x 4096 hidden values gathered in NVFP4
    (0.5625 bytes) and reduce-scattered in 16 bit, each moving 3/4 of its buffer over NVLink plus
    one hop's latency; priced with the fitted all-reduce latency once per collective."""
    model, hw, eff, lay = small
    values = 64 * 4 * model.hidden_size
    nvlink = _v(comm.scale_up_bandwidth(hw, 4.0)) * hw.efficiency.nvlink
    one = lambda nbytes: 0.75 * nbytes / nvlink + hw.nvlink_latency_us * 1e-6  # noqa: E731
    hand = one(values * 0.5625) + one(values * 2.0)
    assert _v(attention_dp_dispatch(lay, np.array(64.0))) == pytest.approx(hand, rel=1e-12)
    w = pass_work(lay, np.array([64.0]), np.array([64.0]), np.zeros(1), np.zeros(1))
    assert _v(moe_dispatch_time(eff, w)) == pytest.approx(hand + 2 * eff.allreduce_latency_us * 1e-6, rel=1e-12)
    # No TP all-reduce on a rank: its communication is the 32 MoE layers' exchanges alone.
    assert _v(price_pass(eff, w)["tp_comm"]) == pytest.approx(32 * _v(moe_dispatch_time(eff, w)), rel=1e-12)


def test_the_executors_per_request_time_adds_per_sequence_by_hand(small):
    """64 sequences sampled on one attention-DP rank: 64 x 94.4 us of the executor's per-request work
    (``attention_dp_host`` in inference_assumptions.yaml) on top of the pass, once per pass, not per layer;
    nothing on a TP layout."""
    model, hw, eff, lay = small
    us = io.read_yaml(io.SEARCH_SPACES / "inference_assumptions.yaml")["attention_dp_host"]["us_per_sequence"]
    assert us == 94.4
    assert _v(attention_dp_host_time(lay, 64.0)) == pytest.approx(64 * 94.4e-6, rel=1e-12)
    w = pass_work(lay, np.array([64.0]), np.array([64.0]), np.zeros(1), np.zeros(1))
    without = dataclasses.replace(w, host=np.zeros(1))
    assert _v(price_pass(eff, w)["time"]) - _v(price_pass(eff, without)["time"]) == pytest.approx(64 * 94.4e-6,
                                                                                                rel=1e-9)
    tp = layout(model, hw, eff, 4.0, 1.0, "nvfp4", "fp8", 4.0)
    assert _v(attention_dp_host_time(tp, 64.0)) == 0.0
    assert _v(pass_work(tp, np.array([64.0]), np.array([64.0]), np.zeros(1), np.zeros(1)).host) == 0.0


@pytest.mark.parametrize("batch, kv, tokens_per_s", [(384, "bf16", 4548.0105), (896, "fp8", 5393.2755)])
def test_the_per_request_rate_gives_nvidias_two_b200_iterations(batch, kv, tokens_per_s):
    """The rate's source: NVIDIA's two B200 trtllm-bench runs of DeepSeek-R1 (ISL 1024 / OSL 2048, TP8 EP8
    attention DP, every rank full: NVIDIA/TensorRT-LLM@f0c873f5 docs/source/blogs/
    Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md) run an iteration in batch / tokens-per-s-per-GPU:
    84.43 and 166.13 ms. One rank's pass at that shape (``batch`` sequences at the mean context 2,048 beside
    batch / 2 prompt tokens an iteration), with the per-request time, is within 3 % of each; without it the
    pass is 45-51 % short."""
    model, hw = io.load_model("deepseek-v3"), io.load_hardware("b200")
    eff = efficiency_for("tensorrt-llm")
    lay = layout(model, hw, eff, 8.0, 1.0, "nvfp4", kv, 8.0, load_engine("tensorrt-llm"), True)
    flops, nbytes = decode_attention(lay, float(batch), 2048.0)
    w = pass_work(lay, np.array([1.5 * batch]), np.array([float(batch)]), np.ravel(flops), np.ravel(nbytes))
    measured = batch / tokens_per_s
    assert _v(price_pass(eff, w)["time"]) == pytest.approx(measured, rel=0.03)
    assert _v(price_pass(eff, dataclasses.replace(w, host=np.zeros(1)))["time"]) < 0.6 * measured


@pytest.mark.parametrize("model, engine, tp, ep, message", [
    ("llama2-70b", "tensorrt-llm", 8.0, 8.0, "not a (non-hybrid) MoE model"),
    ("deepseek-v3", "vllm", 8.0, 8.0, "valid engines: tensorrt-llm"),
    ("deepseek-v3", "tensorrt-llm", 8.0, 1.0, "ep = tp"),
    ("deepseek-v3", "tensorrt-llm", 1.0, 1.0, "tp >= 2"),
])
def test_attention_dp_is_refused_where_not_priced(model, engine, tp, ep, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout(io.load_model(model), io.load_hardware("b200"), None, tp, 1.0, "fp8", "fp8", ep,
               load_engine(engine), True)


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama2-70b", "--scenario", "offline"], "not a (non-hybrid) MoE model"),
    (["--model", "deepseek-v3", "--engine", "sglang", "--scenario", "offline"], "valid engines: tensorrt-llm"),
    (["--model", "deepseek-v3"], "traffic simulation only"),
    (["--model", "deepseek-v3", "--scenario", "offline", "--no-expert-parallel"], "drop --no-expert-parallel"),
])
def test_infer_refuses_attention_dp_in_one_line(capsys, argv, message):
    assert cli.main(["infer", "--gpu", "b200", "--gpus", "8", "--attention-dp", "--no-save", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_infer_simulates_a_pinned_attention_dp_layout(capsys):
    """The point NVIDIA's B200 DeepSeek-R1 Offline config runs, simulated per rank: the title says
    attention DP and the per-GPU rate is a rank's (8 ranks a replica), not a TP8 replica's / 8."""
    argv = ["infer", "--model", "deepseek-v3", "--gpu", "b200", "--gpus", "8", "--workload", "mlperf-deepseek-r1",
            "--scenario", "offline", "--tp", "8", "--pp", "1", "--max-batch", "512", "--max-num-tokens", "4608",
            "--weight-precision", "nvfp4", "--kv-precision", "fp8", "--requests", "2000", "--json", "--no-save"]
    import json
    assert cli.main([*argv, "--attention-dp"]) == 0
    adp = json.loads(capsys.readouterr().out)["ranked"][0]
    assert cli.main(argv) == 0
    tp8 = json.loads(capsys.readouterr().out)["ranked"][0]
    assert adp["config"]["ep"] == 8 and adp["output_tokens_per_s_per_gpu"] > 0
    # 8 ranks of up to 512 requests each against one TP8 engine of 512: more in flight per GPU.
    assert adp["request_rate"] > 2 * tp8["request_rate"]


@pytest.fixture(scope="module")
def deepseek():
    (entry,) = [h for h in mlperf.held_out_sets() if h["csv"] == CSV]
    rows, _ = mlperf.load_rows(CSV, entry["engine"], entry["engine_column"])
    return rows[rows["model"] == "deepseek-r1"]


def test_the_deepseek_rows_run_attention_dp_with_loadgens_sample_count(deepseek):
    assert len(deepseek) == 16 and deepseek["attention_dp"].all()
    assert set(deepseek["scenario"]) == {"Offline", "Server"} and set(deepseek["tp"]) == {8}
    offline = deepseek[deepseek["scenario"] == "Offline"].set_index("system")["offline_requests"]
    # requested_min_query_count of each run's mlperf_log_detail.txt (6 x the dataset for the B200 runs), not
    # the 1.1 x 600 s x 10 QPS = 6,600 the expected QPS alone gives
    assert offline["XE9680L_B200_SXM_180GBx8_TRT"] == 26_328
    assert offline["GB200-NVL72_GB200-186GB_aarch64x72_TRT"] == 210_624


def test_the_deepseek_rows_are_predicted(deepseek):
    """Every DeepSeek-R1 row gets a finite prediction; the mean errors are printed (run with -s):
    they are what the report states, not a bound this test holds."""
    report = mlperf.predict_rows(deepseek, cross=False)
    assert len(report) == 16 and np.isfinite(report["in_sample_tokens_per_s"]).all()
    assert (report["in_sample_tokens_per_s"] > 0).all()
    for m in mlperf.held_out_means(report, ("hardware", "scenario")):
        print(f"deepseek-r1 {m['hardware']} {m['scenario']}: {m['runs']} runs, tokens/s per GPU mean |error| "
              f"{m['tokens_pct']:.1f} % (signed {m['tokens_signed_pct']:+.1f} %)"
              + (f", p99 TTFT {m['ttft_p99_pct']:.1f} %, TPOT {m['tpot_p99_pct']:.1f} %" if "ttft_p99_pct" in m else ""))


@pytest.mark.parametrize("attention_dp", [True, False])
def test_a_simulated_run_folder_holds_the_layout_the_table_ranked_first(tmp_path, capsys, attention_dp):
    """best.yaml of a simulated `infer` is the simulated rank 1, not the steady-state search's (it was:
    TP2 PP4 under a table whose first row was TP8 attention DP), with what the simulation measured;
    under attention DP it says so, and only TensorRT-LLM's commands are given, each told
    enable_attention_dp through --extra_llm_api_options (TensorRT-LLM@4c05a748
    tensorrt_llm/commands/serve.py loads that YAML over the LLM args; BaseLlmArgs.enable_attention_dp in
    @fcd3f316 tensorrt_llm/llmapi/llm_args.py)."""
    import json

    import yaml
    argv = ["infer", "--model", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "--scenario", "offline",
            "--requests", "200", "--json", "--results", str(tmp_path)] + (["--attention-dp"] if attention_dp else [])
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)["ranked"][0]
    (run_dir,) = tmp_path.iterdir()
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    assert {k: best["layout"][k] for k in first["config"]} == first["config"]
    assert best["simulated"]["output_tokens_per_s_per_gpu"] == pytest.approx(first["output_tokens_per_s_per_gpu"])
    assert first["config"].get("attention_dp", False) is attention_dp
    assert best["layout"].get("attention_dp", False) is attention_dp
    if attention_dp:
        assert set(best["commands"]) == {"trtllm-serve", "trtllm-bench"}
        assert best["extra_llm_api_options"] == {"enable_attention_dp": True}
        texts = [*best["commands"]["trtllm-serve"], best["commands"]["trtllm-bench"]]
        assert all("--extra_llm_api_options extra_llm_api_options.yaml" in t for t in texts)
    else:
        assert {"vllm", "sglang"} <= set(best["commands"])
