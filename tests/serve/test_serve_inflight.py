"""In-flight batching steady state (costmodel/inflight.py): paged KV, token budget, chunked prefill, load."""

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel.inference import kv_bytes_per_token
from autoparallel.costmodel.inflight import estimate_inflight_columns, kv_pool
from autoparallel.costmodel.memory import GIB


def _run(model, hw, eff, engine, **kw):
    cols = {"tp": 1, "pp": 1, "max_batch": 2048, "max_num_tokens": 8192, "input_len": 2048, "output_len": 256,
            "weight_precision": "fp8", "kv_precision": "fp8"}
    cols.update(kw)
    n = max(len(v) if isinstance(v, list) else 1 for v in cols.values())
    arrays = {k: np.array(v if isinstance(v, list) else [v] * n) for k, v in cols.items()}
    return estimate_inflight_columns(model, hw, eff, engine, arrays)


@pytest.fixture(scope="module")
def llama8b():
    return io.load_model("llama3-8b")


def test_kv_pool_holds_whole_blocks_per_request(llama8b, h100, trtllm, trtllm_eff):
    """GUARANTEED_NO_EVICT reserves ceil((input + output) / block) blocks per request."""
    out = _run(llama8b, h100, trtllm_eff, trtllm, input_len=2000, output_len=49)  # 2049 tokens: 33 blocks of 64
    per_token = kv_bytes_per_token(llama8b, 32, 1, 1.0)
    blocks = np.floor(out["kv_cache_gib"][0] * GIB / (64 * per_token))
    assert out["kv_capacity_requests"][0] == np.floor(blocks / 33)
    fine = _run(llama8b, h100, trtllm_eff, dataclasses.replace(trtllm, kv_block_tokens=1), input_len=2000, output_len=49)
    assert fine["kv_capacity_requests"][0] > out["kv_capacity_requests"][0]  # no block rounding


def test_allocating_as_tokens_arrive_admits_more(llama8b, h100, trtllm, trtllm_eff):
    full = _run(llama8b, h100, trtllm_eff, trtllm, input_len=128, output_len=2048)
    current = _run(llama8b, h100, trtllm_eff, dataclasses.replace(trtllm, kv_reservation="current"),
                   input_len=128, output_len=2048)
    ratio = current["kv_capacity_requests"][0] / full["kv_capacity_requests"][0]
    assert ratio == pytest.approx((128 + 2048) / (128 + 1024), rel=0.03)


def test_kv_pool_rules_free_vs_total(llama8b, h100, trtllm):
    """The pool by hand on one small case: Llama-3-8B in BF16 on one H100 (79.65 GiB, nvidia-smi),
    max batch 256, max_num_tokens 8192. Weights: 32 layers of 4096 x (4096 + 2 x 1024) attention
    in, 4096 x 4096 out, 3 x 4096 x 14336 MLP, + embedding and output layer (128,256 x 4096 each),
    2 bytes each. Activations: 8192 tokens x 2 bytes x (4 x 4096 + (32 + 2 x 8) x 128 + 2 x 14336)
    + FP32 logits of 256 sequences. TensorRT-LLM (``free``): 0.9 of what cudaMemGetInfo reports
    free after the engine and the CUDA context, i.e. of 79.65 - 0.55 (kept by the driver) - 0.77
    (context, cuBLAS) - weights - activations (NVIDIA/TensorRT-LLM@7ff53023
    docs/source/reference/memory.md FAQ 1: total 79.10 GiB, 70.48 free beside 7.85 of engine).
    vLLM (``total``): 0.9 of cudaMemGetInfo's total (79.65 - 0.55) less the profiled peak
    (weights + activations; the context was made before vLLM's first reading)."""
    from autoparallel.costmodel.inference import layout
    from autoparallel.serve.assumptions import efficiency_for
    lay = layout(llama8b, h100, efficiency_for("tensorrt-llm"), [1], [1], ["bf16"], ["bf16"])
    free = kv_pool(lay, trtllm, np.array([256]), np.array([8192]))
    total = kv_pool(lay, dataclasses.replace(trtllm, kv_memory="total"), np.array([256]), np.array([8192]))
    h, kv, ffn, vocab = 4096, 1024, 14336, 128_256
    weights = 2.0 * (32 * (h * (h + 2 * kv) + h * h + 3 * h * ffn) + 2 * vocab * h)
    activations = 8192 * 2.0 * (4 * h + (32 + 2 * 8) * 128 + 2 * ffn) + 256 * vocab * 4.0
    assert free["weights"][0] == pytest.approx(weights, rel=1e-4)
    assert free["activations"][0] == pytest.approx(activations, rel=1e-9)
    gib = 2.0 ** 30
    assert free["pool"][0] / gib == pytest.approx(0.9 * (79.65 - 0.55 - 0.77 - (weights + activations) / gib),
                                                  rel=1e-3)
    assert free["pool"][0] / gib == pytest.approx(56.22, abs=0.05)  # the same sum, written out
    assert total["pool"][0] / gib == pytest.approx(0.9 * (79.65 - 0.55) - (weights + activations) / gib, rel=1e-3)
    assert total["pool"][0] / gib == pytest.approx(55.33, abs=0.05)
    # over two GPUs NCCL's communicators exist too (unmeasured): the hardware's 4 GiB reserve stays
    tp2 = kv_pool(layout(llama8b, h100, efficiency_for("tensorrt-llm"), [2], [1], ["bf16"], ["bf16"]),
                  trtllm, np.array([256]), np.array([8192]))
    assert free["reserve"][0] / gib == pytest.approx(0.55 + 0.77)
    assert tp2["reserve"][0] / gib == pytest.approx(h100.reserve_gib) == 4.0


def test_max_batch_beyond_the_kv_cache_changes_nothing(llama8b, h100, trtllm, trtllm_eff):
    out = _run(llama8b, h100, trtllm_eff, trtllm, input_len=2048, output_len=2048, max_batch=[100000, 200000])
    assert out["concurrency"][0] == out["concurrency"][1] == out["kv_capacity_requests"][0]
    assert out["output_tokens_per_s_per_replica"][0] == pytest.approx(out["output_tokens_per_s_per_replica"][1],
                                                                      rel=1e-3)


def test_token_budget_caps_the_decode_batch(llama8b, h100, trtllm, trtllm_eff):
    """Each iteration holds d decode tokens and lam * input prompt tokens within max_num_tokens."""
    out = _run(llama8b, h100, trtllm_eff, trtllm, input_len=2048, output_len=128, max_num_tokens=2048)
    tokens = out["decode_batch"][0] + out["prefill_tokens_per_iteration"][0]
    assert tokens == pytest.approx(2048, rel=1e-6)
    assert out["decode_batch"][0] == pytest.approx(2048 * 127 / (2048 + 127), rel=1e-6)


def test_chunked_prefill_spreads_a_prompt_over_iterations(llama8b, h100, trtllm, trtllm_eff):
    small = _run(llama8b, h100, trtllm_eff, trtllm, input_len=2048, output_len=256, max_num_tokens=512, max_batch=8)
    big = _run(llama8b, h100, trtllm_eff, trtllm, input_len=2048, output_len=256, max_num_tokens=8192, max_batch=8)
    # the first token waits for the prompt's iterations, each heavier than the mean decode step
    assert big["ttft_s"][0] > 3 * big["tpot_s"][0]
    assert small["ttft_s"][0] > big["ttft_s"][0]  # 2048 tokens in > 4 chunks: weights read per chunk
    no_chunks = _run(llama8b, h100, trtllm_eff, dataclasses.replace(trtllm, chunked_prefill=False),
                     input_len=2048, output_len=256, max_num_tokens=512, max_batch=8)
    assert no_chunks["ttft_s"][0] == pytest.approx(big["ttft_s"][0], rel=0.05)  # the whole prompt in one iteration


def test_gqa_serves_more_than_mha_at_long_outputs(h100, trtllm, trtllm_eff):
    """Llama-3-8B's KV cache per token is 4x smaller than Llama-2-7B's: more requests fit and
    each decode step reads less (the issue's complaint about the static model)."""
    l3 = _run(io.load_model("llama3-8b"), h100, trtllm_eff, trtllm, input_len=128, output_len=2048)
    l2 = _run(io.load_model("llama2-7b"), h100, trtllm_eff, trtllm, input_len=128, output_len=2048)
    assert l3["kv_capacity_requests"][0] > 3 * l2["kv_capacity_requests"][0]
    assert l3["output_tokens_per_s_per_replica"][0] > 1.5 * l2["output_tokens_per_s_per_replica"][0]


def test_request_rate_below_capacity(llama8b, h100, trtllm, trtllm_eff):
    sat = _run(llama8b, h100, trtllm_eff, trtllm)
    cap = sat["capacity_requests_per_s"][0]
    low = _run(llama8b, h100, trtllm_eff, trtllm, request_rate=0.5 * cap)
    assert not low["overloaded"][0]
    assert low["output_tokens_per_s_per_replica"][0] == pytest.approx(0.5 * cap * 256, rel=1e-6)
    assert low["tpot_s"][0] < sat["tpot_s"][0]
    # Little's law: requests in flight = arrival rate x time in the system
    assert low["concurrency"][0] == pytest.approx(0.5 * cap * low["latency_s"][0], rel=0.05)
    over = _run(llama8b, h100, trtllm_eff, trtllm, request_rate=1.2 * cap)
    assert over["overloaded"][0]


def test_pipeline_micro_batches_share_the_kv_cache(llama2, h100, trtllm, trtllm_eff):
    tp2 = _run(llama2, h100, trtllm_eff, trtllm, tp=2, pp=1, max_batch=16)
    pp2 = _run(llama2, h100, trtllm_eff, trtllm, tp=1, pp=2, max_batch=16)
    assert pp2["concurrency"][0] == 32  # two micro-batches of max_batch each
    assert tp2["concurrency"][0] == 16
    assert pp2["decode_tp_comm_s"][0] == 0 < tp2["decode_tp_comm_s"][0]
    assert pp2["decode_pp_s"][0] > 0 == tp2["decode_pp_s"][0]


def test_does_not_fit_when_one_request_has_no_room(llama2, h100, trtllm, trtllm_eff):
    out = _run(llama2, h100, trtllm_eff, trtllm, tp=1, weight_precision="bf16", kv_precision="bf16")
    assert not out["fits"][0]  # 140 GB of BF16 weights on one 80 GB GPU
    long = _run(llama2, h100, trtllm_eff, trtllm, tp=2, max_model_len=2_000_000)
    assert not long["fits"][0]  # the engine refuses a max length its KV pool cannot hold once
