"""The modules an NVFP4 checkpoint keeps 16-bit (costmodel/inference.py ``nvfp4_16bit_params``):
DeepSeek-V3/R1's MLA projections and router, priced at 2 bytes and the 16-bit peak."""

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import inference as inf


@pytest.fixture(scope="module")
def dsv3():
    return io.load_model("deepseek-v3")


def _lay(model, precisions, tp=8.0):
    n = len(precisions)
    return inf.layout(model, io.load_hardware("b200"), None, np.full(n, tp), np.ones(n), precisions, ["fp8"] * n, ep=tp)


def test_dsv3_attention_projections_and_router_by_hand(dsv3):
    # q_a 7168x1536, kv_a 7168x(512+64), q_b 1536x(128x(128+64)), kv_b 512x(128x(128+128)); o_proj (16384x7168)
    # stays NVFP4 in NVIDIA's checkpoint; the router 7168x256 in 58 of the 61 layers.
    mla = 7168 * 1536 + 7168 * 576 + 1536 * 128 * 192 + 512 * 128 * 256
    assert mla == 69_664_768
    router = 58 / 61 * 7168 * 256
    lay = _lay(dsv3, ["nvfp4", "fp8", "bf16"])
    assert inf.nvfp4_16bit_params(lay) == pytest.approx([mla + router, 0.0, 0.0])
    # Layout.weights: those parameters move from 0.5625 to 2 bytes, on every one of the 61 layers (pp 1, tp 8).
    extra = 61 * (mla + router) * (2.0 - 0.5625) / 8
    nv = _lay(dsv3, ["nvfp4"])
    base = 61 * dsv3.layer_params * 0.5625 / 8
    assert nv.weights()[0] - (base + 2 * dsv3.embedding_params / 8 * 2.0) == pytest.approx(extra, rel=1e-9)
    assert lay.weights()[1] == _lay(dsv3, ["fp8"]).weights()[0]  # FP8: nothing moves


def test_pass_work_splits_bytes_and_flops(dsv3):
    lay = _lay(dsv3, ["nvfp4"])
    kept = float(inf.nvfp4_16bit_params(lay)[0])
    w = inf.pass_work(lay, np.array([512.0]), np.array([512.0]), np.zeros(1), np.zeros(1))
    assert w.lin16_flops[0] == pytest.approx(2.0 * kept / 8 * 512)
    assert (w.lin_flops + w.lin16_flops)[0] == pytest.approx(
        2.0 * (dsv3.active_layer_params - 58 / 61 * 8 * dsv3.expert_params) / 8 * 512)
    stored = dsv3.layer_params - 58 / 61 * 256 * dsv3.expert_params
    assert w.weight_bytes[0] == pytest.approx(((stored - kept) * 0.5625 + kept * 2.0) / 8)


def test_models_without_an_entry_and_llama_keep_every_linear_nvfp4():
    for name in ("llama2-70b", "llama3.1-405b", "mixtral-8x7b"):
        assert inf.nvfp4_16bit_params(_lay(io.load_model(name), ["nvfp4"]))[0] == 0.0


def test_every_group_named_in_the_yaml_is_priced():
    for entry in inf._nvfp4_unquantized().values():
        assert set(entry["groups"]) <= set(inf.NVFP4_UNQUANTIZED_GROUPS) and entry["source"]
