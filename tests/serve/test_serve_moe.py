"""MoE and multi-latent-attention serving: routed experts read only when picked, EP over the TP
group, the MLA latent cache, the search's expert-parallel knob and its exports."""

import json

import numpy as np
import pytest

from autoparallel import cli, io
from autoparallel.costmodel.inference import (InferenceEfficiency, kv_bytes_per_token, layout,
                                              routed_experts)
from autoparallel.errors import UserError
from autoparallel.serve.export import commands
from autoparallel.serve.search import Request, search
from autoparallel.serve.space import InferenceSpace, structures
from autoparallel.serve.assumptions import load_engine

H100 = io.load_hardware("h100-sxm")
EFF = InferenceEfficiency()


def _experts(model, tokens, ep=1, tp=2):
    lay = layout(model, H100, EFF, [tp], [1], ["fp8"], ["fp8"], ep)
    hbm = H100.hbm_tbps * 1e12 * EFF.hbm
    return routed_experts(lay, np.array([float(tokens)]), H100.fp8_tflops * 1e12, hbm), hbm


def test_a_decode_step_reads_only_the_experts_its_tokens_pick():
    mixtral = io.load_model("mixtral-8x7b")
    every_expert = mixtral.num_experts * mixtral.expert_params / 2 * 1.0  # TP2, FP8 bytes
    (_, one), hbm = _experts(mixtral, 1)
    (_, many), _ = _experts(mixtral, 4096)
    assert one[0] * hbm == pytest.approx(every_expert * 2 / 8)  # one token: its top-2 of 8 experts
    assert many[0] * hbm == pytest.approx(every_expert)  # thousands of tokens touch every expert
    (_, some), _ = _experts(mixtral, 4)
    assert one[0] < some[0] < many[0]


def test_expert_parallel_costs_the_busiest_rank_its_imbalance():
    qwen = io.load_model("qwen3-30b-a3b")  # routed by a trained router: not force-balanced
    (shared, _), _ = _experts(qwen, 8192, ep=1, tp=8)
    (whole, _), _ = _experts(qwen, 8192, ep=8, tp=8)
    assert whole[0] > shared[0]
    llama = io.load_model("llama3-8b")
    (t, read), _ = _experts(llama, 8192)
    assert t[0] == 0 and read[0] == 0  # a dense model has no routed experts


def test_mla_caches_the_latent_on_every_tp_rank():
    ds = io.load_model("deepseek-v3")
    per_layer = ds.kv_lora_rank + ds.qk_pos_emb_head_dim
    assert per_layer == 576
    for tp in (1, 8):
        assert kv_bytes_per_token(ds, 61, tp, 1.0) == pytest.approx(61 * 576)


def test_the_space_offers_expert_parallel_to_moe_models_only():
    space = InferenceSpace(tp=(1, 2, 8, 16), pp=(1,), expert_parallel=(False, True), tp_within_nvlink_domain=False)
    engine = load_engine("tensorrt-llm")
    mixtral = io.load_model("mixtral-8x7b")
    s = structures(mixtral, H100, 16, space, engine, 128)
    assert set(s.loc[s["expert_parallel"], "ep"]) == {2, 8, 16}
    assert (s.loc[~s["expert_parallel"], "ep"] == 1).all()
    assert not ((s["tp"] == 1) & s["expert_parallel"]).any()  # ep = tp = 1 is the plain layout, kept once
    assert s.loc[s["ep"] == 16, "reason"].str.contains("8 experts not divisible by ep=16").all()
    dense = structures(io.load_model("llama3-8b"), H100, 16, space, engine, 128)
    assert (dense["ep"] == 1).all() and not dense["expert_parallel"].any()
    with pytest.raises(UserError, match="expert parallelism applies to MoE models; llama3-8b is dense"):
        structures(io.load_model("llama3-8b"), H100, 16, space.pinned(expert_parallel=True), engine, 128)


def test_a_moe_search_ranks_both_expert_layouts_and_exports_them():
    space = InferenceSpace(tp=(4,), pp=(1,), max_batch=(64,), max_num_tokens=(2048,), add_max_batch=False,
                           weight_precision=("fp8",), kv_precision=("fp8",), expert_parallel=(False, True))
    result = search(io.load_model("mixtral-8x7b"), H100, 8, Request(1024, 256), space)
    assert sorted(result.feasible["ep"]) == [1, 4]
    row = result.feasible[result.feasible["ep"] == 4].iloc[0]
    cmds = commands(row, "mixtral-8x7b", 1280)
    vllm = cmds["vllm"]
    assert isinstance(vllm, list) and len(vllm) == 2  # one server per replica: vLLM's EP would span them
    assert "--enable-expert-parallel" in vllm[1].text() and "CUDA_VISIBLE_DEVICES=4,5,6,7" in vllm[1].text()
    assert "--data-parallel-size" not in vllm[0].text()
    assert all("--ep_size 4" in c.text() for c in cmds["trtllm-serve"])
    assert "--ep 4" in cmds["trtllm-bench"].text()
    assert all("--ep-size 4" in c.text() for c in cmds["sglang"])
    plain = commands(result.feasible[result.feasible["ep"] == 1].iloc[0], "mixtral-8x7b", 1280)
    assert "--data-parallel-size 2" in plain["vllm"].text() and "--ep" not in plain["vllm"].text()


def test_infer_pins_expert_parallel_and_refuses_it_for_a_dense_model(capsys):
    args = ["infer", "--model", "mixtral-8x7b", "--gpus", "8", "--tp", "8", "--pp", "1", "--max-batch", "64",
            "--weight-precision", "fp8", "--kv-precision", "fp8", "--json", "--no-save"]
    assert cli.main([*args, "--expert-parallel"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 8
    assert cli.main([*args, "--no-expert-parallel"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 1
    assert cli.main(["infer", "--model", "llama3-8b", "--gpus", "2", "--expert-parallel", "--no-save"]) == 2
    assert "expert parallelism applies to MoE models; llama3-8b is dense" in capsys.readouterr().err


# Today's in-sample mean |error| over all 20 Mixtral-8x7B rows of TensorRT-LLM 0.10 (2026-11-28): the expected failure's reason and the guard's bound.
# 25.2 before the MoE plugin's permute and top-k sum bytes were priced (session 39); 25.1 before
# the gated activation's pass was priced for dense and MoE layers alike and refitted (session 40);
# 24.6 before 0.10's decode attention read Mixtral's KV cache once per query head (masked MHA,
# group 4) and 0.10 was refitted (session 44: tightened; the L40S and A100 FP16 rows now miss most).
MIXTRAL_MEAN = 17.9


@pytest.fixture(scope="module")
def mixtral_010():
    from autoparallel.serve.measured import load_serving_runs, predict
    from autoparallel.serve.assumptions import efficiency_for
    m = next(x for x in load_serving_runs() if x.engine.name == "tensorrt-llm-0.10")
    return predict(m, efficiency_for("tensorrt-llm-0.10"), m.predicted_rows[m.predicted_rows["model"] == "Mixtral-8x7B"])


def test_every_published_mixtral_row_is_predicted_to_fit(mixtral_010):
    assert len(mixtral_010) == 20 and mixtral_010["fits"].all()


@pytest.mark.xfail(strict=True, reason=f"issue 16 target: mean |error| <= 15 % in sample; {MIXTRAL_MEAN} % over "
                                       "all 20 Mixtral-8x7B rows of TensorRT-LLM 0.10 on 2026-11-28")
def test_mixtral_rows_in_sample_target(mixtral_010):
    assert mixtral_010["error_pct"].abs().mean() <= 15.0


def test_mixtral_rows_in_sample_regression_guard(mixtral_010):
    """All 20 rows, not the ones that pass."""
    assert mixtral_010["error_pct"].abs().mean() <= MIXTRAL_MEAN + 0.1


def test_the_moe_plugins_permute_and_topk_sum_cost_their_bytes_at_hbm(monkeypatch):
    """TensorRT-LLM's MoE plugin (05316d33 ``moe_kernels.cu`` ``runMoe``): expand the T tokens to
    T*k rows in FP8, read FC2's k 16-bit rows per token and write their 16-bit sum. TP does not
    split them (hidden is whole on every rank); a dense model pays nothing."""
    from autoparallel.costmodel import inference
    mixtral = io.load_model("mixtral-8x7b")
    lay = layout(mixtral, H100, EFF, [1, 2], [1, 1], ["fp8", "fp8"], ["fp8", "fp8"])
    h = mixtral.hidden_size
    expand, finalize = h * 1 + 2 * h * 1, 2 * h * 2 + h * 2
    per_token = inference.moe_plugin_bytes(lay, 1000.0) / 1000.0
    assert per_token == pytest.approx([expand + finalize] * 2)
    dense = layout(io.load_model("llama2-70b"), H100, EFF, [1], [1], ["fp8"], ["fp8"])
    assert inference.moe_plugin_bytes(dense, 1000.0) == pytest.approx([0.0])
    tokens = np.array([4096.0, 4096.0])
    args = (tokens, np.zeros(2), np.zeros(2), np.zeros(2))
    priced = inference.stage_pass(lay, *args)
    monkeypatch.setattr(inference, "moe_plugin_bytes", lambda lay, t: np.zeros_like(lay.tp))
    without = inference.stage_pass(lay, *args)
    share = mixtral.num_moe_layers / mixtral.num_layers
    extra = lay.stage_layers * share * per_token * tokens / (H100.hbm_tbps * 1e12 * EFF.hbm)
    assert priced["time"] - without["time"] == pytest.approx(extra)
    assert priced["memory"] - without["memory"] == pytest.approx(extra)
