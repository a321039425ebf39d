"""One forward pass, memory and static batching (costmodel/inference.py)."""

import numpy as np
import pytest

import dataclasses

from autoparallel.costmodel.inference import (OUTPUT_KEYS, InferenceEfficiency, ServingEngine, decode_attention,
                                              decode_kv_reads, estimate_static_columns, kv_bytes_per_token, layout,
                                              microbatch_size)


def _point(model, hw, eff=None, **kw):
    cols = {"tp": [1], "pp": [1], "batch": [1], "input_len": [2048], "output_len": [256],
            "weight_precision": ["bf16"], "kv_precision": ["bf16"]}
    cols.update({k: [v] for k, v in kw.items()})
    out = estimate_static_columns(model, hw, eff or InferenceEfficiency(), {k: np.array(v) for k, v in cols.items()})
    return {k: v[0] for k, v in out.items()}


def test_kv_cache_formula(llama2):
    # 2 (K and V) * 80 layers * 8 KV heads * 128 head_dim * 2 bytes
    assert kv_bytes_per_token(llama2, 80, 1, 2.0) == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token(llama2, 80, 8, 1.0) == 2 * 80 * 1 * 128 * 1
    # tp above the KV heads replicates them: still one head per GPU
    assert kv_bytes_per_token(llama2, 80, 16, 2.0) == kv_bytes_per_token(llama2, 80, 8, 2.0)


def test_decode_kv_reads_follow_the_engines_xqa_shapes(llama2, h100):
    """XQA (one read per KV head) where the engine's dispatcher takes the layer's per-rank shape,
    else the masked-MHA kernel: one CTA, and one read of the KV head's cache, per query head."""
    plain = ServingEngine("any")
    old = ServingEngine("trt-0.10", xqa_group_sizes=(8,), xqa_head_sizes=(128, 256))
    tp = np.array([1.0, 8.0, 16.0])
    assert np.all(decode_kv_reads(plain, llama2, tp) == 1.0)
    # Llama-2-70B: 64 query heads over 8 KV heads, group 8 on every rank up to TP8; TP16 keeps one
    # (replicated) KV head per rank with 4 query heads: masked MHA
    assert decode_kv_reads(old, llama2, tp).tolist() == [1.0, 1.0, 4.0]
    gqa4 = dataclasses.replace(llama2, num_attention_heads=32, num_query_groups=8, kv_channels=128)
    assert decode_kv_reads(old, gqa4, 1.0) == 4.0
    head64 = dataclasses.replace(llama2, kv_channels=64)
    assert decode_kv_reads(old, head64, 8.0) == 8.0  # group 8, but no XQA kernel at head size 64
    lay = layout(gqa4, h100, InferenceEfficiency(), 1.0, 1.0, "fp8", "fp8", engine=old)
    base = layout(gqa4, h100, InferenceEfficiency(), 1.0, 1.0, "fp8", "fp8")
    assert decode_attention(lay, 64, 2048)[1] == pytest.approx(4.0 * decode_attention(base, 64, 2048)[1])
    assert decode_attention(lay, 64, 2048)[0] == pytest.approx(decode_attention(base, 64, 2048)[0])


def test_decode_is_bandwidth_bound_at_batch_one(llama2, h100):
    p = _point(llama2, h100, tp=8)
    floor = llama2.num_parameters * 2 / 8 / (h100.hbm_tbps * 1e12)
    assert floor < p["tpot_s"] < 5 * floor
    assert p["decode_memory_s"] > p["decode_compute_s"]


def test_latency_grows_with_batch_and_falls_with_tp(llama2, h100):
    tpot = [_point(llama2, h100, tp=4, batch=b)["tpot_s"] for b in (1, 16, 256)]
    assert tpot[0] < tpot[1] < tpot[2]
    assert _point(llama2, h100, tp=8)["tpot_s"] < _point(llama2, h100, tp=2)["tpot_s"]
    ttft = [_point(llama2, h100, tp=4, batch=b)["ttft_s"] for b in (1, 8)]
    assert ttft[1] > 4 * ttft[0]  # prefill is compute-bound: ~linear in tokens


def test_fp8_halves_weights_and_kv(llama2, h100):
    bf16 = _point(llama2, h100, tp=2, batch=32)
    fp8 = _point(llama2, h100, tp=2, batch=32, weight_precision="fp8", kv_precision="fp8")
    layers = llama2.num_layers * llama2.layer_params / 2 / 2**30
    assert bf16["weights_gib"] - fp8["weights_gib"] == pytest.approx(layers, rel=1e-6)
    assert fp8["kv_cache_gib"] == pytest.approx(bf16["kv_cache_gib"] / 2)
    assert fp8["tpot_s"] < bf16["tpot_s"]


def test_memory_counts_kv_for_input_plus_output(llama2, h100):
    p = _point(llama2, h100, tp=8, batch=10, input_len=1000, output_len=24)
    expected = 10 * 1024 * kv_bytes_per_token(llama2, 80, 8, 2.0) / 2**30
    assert p["kv_cache_gib"] == pytest.approx(expected)
    assert p["memory_per_gpu_gib"] == pytest.approx(
        p["weights_gib"] + p["kv_cache_gib"] + p["activations_gib"] + p["reserve_gib"])


def test_kernels_add_up_rather_than_overlap(llama2, h100):
    """Attention and GEMMs are separate kernels: a long-context decode step costs about the
    weight read plus the KV read, not the larger of the two."""
    eff = InferenceEfficiency(layer_overhead_us=0.0, allreduce_latency_us=0.0, sampling_ns_per_logit=0.0,
                              elementwise_bytes_per_token_hidden=0.0)
    short = _point(llama2, h100, eff, tp=8, batch=64, input_len=16, output_len=2)
    long = _point(llama2, h100, eff, tp=8, batch=64, input_len=8000, output_len=2)
    kv_read = 64 * (8000 + 1.5) * kv_bytes_per_token(llama2, 80, 8, 2.0) / (h100.hbm_tbps * 1e12 * eff.hbm)
    assert long["tpot_s"] - short["tpot_s"] == pytest.approx(kv_read, rel=0.1)


def test_fastertransformer_microbatching():
    # FT getLocalBatchSize: divide by pp if it divides, then halve while > 1024 tokens
    assert microbatch_size([256], 1, [3], "fastertransformer")[0] == 256
    assert microbatch_size([6], 1, [3], "fastertransformer")[0] == 2
    assert microbatch_size([256], 128, [3], "fastertransformer")[0] == 8
    assert microbatch_size([8], 1, [4], "even")[0] == 2
    assert microbatch_size([2], 1, [4], "even")[0] == 1


def test_pipeline_adds_latency_at_batch_one(llama2, h100):
    assert _point(llama2, h100, tp=2, pp=2)["tpot_s"] > _point(llama2, h100, tp=4)["tpot_s"]


def test_pipeline_steady_state_keeps_stages_busy(llama2, h100):
    one = _point(llama2, h100, tp=2, pp=2, batch=1)["tpot_s"]
    two = _point(llama2, h100, tp=2, pp=2, batch=2)["tpot_s"]
    assert two == pytest.approx(one, rel=0.05)  # the second micro-batch fills the idle stage


def test_output_keys_documented(llama2, h100):
    assert set(_point(llama2, h100)) == set(OUTPUT_KEYS)


def test_efficiency_rejects_out_of_range():
    with pytest.raises(ValueError, match="hbm must be in"):
        InferenceEfficiency(hbm=1.5)


def test_the_gated_activation_pass_costs_its_bytes_by_hand(llama2, h100):
    """SwiGLU between FC1 and FC2 (TensorRT-LLM's ``FusedGatedMLP.fc_gate``, the MoE plugin's
    ``doActivation``, vLLM's ``silu_and_mul``): read FC1's 16-bit gate and up outputs (2 x inter /
    tp), write FC2's input (inter / tp: 1 byte under FP8, 2 in 16 bit). Llama-2-70B at TP2:
    inter / tp = 28672 / 2 = 14336, so 14336 x (2 x 2 + 1) = 71,680 bytes per token in FP8 and
    14336 x 6 = 86,016 in BF16; Mixtral at TP2 (no EP) runs it on 2 copies of each token through
    experts of 14336 / 2: the same 71,680. A non-gated MLP (GPT) pays nothing here."""
    from autoparallel import io
    from autoparallel.costmodel import inference
    eff = InferenceEfficiency()
    lay = inference.layout(llama2, h100, eff, [2, 2], [1, 1], ["fp8", "bf16"], ["fp8", "bf16"])
    assert inference.gated_activation_bytes(lay, 1000.0) / 1000.0 == pytest.approx([71680.0, 86016.0])
    mixtral = inference.layout(io.load_model("mixtral-8x7b"), h100, eff, [2], [1], ["fp8"], ["fp8"])
    assert inference.gated_activation_bytes(mixtral, 1000.0) / 1000.0 == pytest.approx([71680.0])
    gpt = inference.layout(io.load_model("gpt3-175b"), h100, eff, [8], [1], ["fp8"], ["fp8"])
    assert inference.gated_activation_bytes(gpt, 1000.0) == pytest.approx([0.0])


def test_the_gated_activation_pass_is_priced_once_at_hbm(llama2, h100, monkeypatch):
    """``stage_pass`` adds the pass's bytes once, at the achieved HBM bandwidth, to the layer's
    time and memory: fails if the term is deleted (difference 0) or counted twice (2x)."""
    from autoparallel.costmodel import inference
    eff = InferenceEfficiency()
    lay = inference.layout(llama2, h100, eff, [2], [1], ["fp8"], ["fp8"])
    tokens = np.array([4096.0])
    args = (tokens, np.zeros(1), np.zeros(1), np.zeros(1))
    priced = inference.stage_pass(lay, *args)
    monkeypatch.setattr(inference, "gated_activation_bytes", lambda lay, t: np.zeros_like(lay.tp))
    without = inference.stage_pass(lay, *args)
    extra = lay.stage_layers * 71680.0 * tokens / (h100.hbm_tbps * 1e12 * eff.hbm)
    assert priced["time"] - without["time"] == pytest.approx(extra)
    assert priced["memory"] - without["memory"] == pytest.approx(extra)
