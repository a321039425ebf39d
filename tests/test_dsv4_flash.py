"""DeepSeek-V4-Flash: the preset against its sources, its parameter counts against the model card,
its model FLOPs against Megatron-Bridge's published TFLOP/s, and the held-out 26.08 rows."""

from __future__ import annotations

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import flops


@pytest.fixture(scope="module")
def flash():
    return io.load_model("deepseek-v4-flash")


def test_preset_layers_as_the_config_states(flash):
    ratios = flash.csa_compress_ratios
    assert len(ratios) == flash.num_layers + flash.mtp_num_layers == 44
    assert [i for i, r in enumerate(ratios) if r == 0] == [0, 1, 43]
    assert ratios.count(4) == 21 and ratios.count(128) == 20
    assert flash.num_moe_layers == 43 and flash.moe_n_hash_layers == 3 and flash.hc_mult == 4
    assert flash.qk_head_dim + flash.qk_pos_emb_head_dim == flash.v_head_dim == 512


def test_parameters_as_the_model_card_states(flash):
    """Hugging Face model card (deepseek-ai/DeepSeek-V4-Flash): 284B parameters, 13B activated. The
    total leaves the MTP layer out (as DeepSeek-V3's 671B does); the activated count is taken
    without the input embedding (a lookup, no GEMM): 13.27B (13.80B with it)."""
    assert flash.num_parameters == pytest.approx(284e9, rel=0.005)
    assert flash.num_active_parameters - flash.embedding_params == pytest.approx(13e9, rel=0.03)


def test_attention_weights_as_the_checkpoint_shapes(flash):
    """wq_a [1024, 4096], wq_b [32768, 1024], wkv [512, 4096], wo_a [8192, 4096], wo_b [4096, 8192]."""
    assert flash.mla_down_params == 1024 * 4096 + 512 * 4096
    assert flash.mla_up_params == 32768 * 1024
    projections = flash.mla_down_params + flash.mla_up_params + 2 * 8192 * 4096
    extra = (flash.attention_params - projections - flash.hyper_connection_params) * 43
    assert flash.hyper_connection_params == 2 * 24 * 16384
    assert extra == pytest.approx(21 * flash.csa_extra_params(4) + 20 * flash.csa_extra_params(128), abs=43)


@pytest.mark.parametrize("tokens, tflops", [(8224, 748), (7776, 706)], ids=["gb300", "gb200"])
def test_model_flops_reproduce_the_published_tflops(flash, tokens, tflops):
    """Megatron-Bridge 26.08 performance summary: model TFLOP/s / tokens/s per GPU is the FLOPs per
    token its flop_utils counts; the preset's count within 1 % of both rows (the table rounds both)."""
    assert flops.model_flops_per_token(flash) == pytest.approx(tflops * 1e12 / tokens, rel=0.01)


def test_the_count_moves_with_each_dsv4_part(flash):
    """Each DeepSeek-V4 field reaches the count: no MTP, a wider window or no indexer move it."""
    base = flops.model_flops_per_token(flash)
    no_mtp = dataclasses.replace(flash, mtp_num_layers=0, csa_compress_ratios=flash.csa_compress_ratios[:43])
    assert flops.model_flops_per_token(no_mtp) < 0.97 * base
    assert flops.model_flops_per_token(dataclasses.replace(flash, csa_window_size=512)) > base
    assert flops.model_flops_per_token(dataclasses.replace(flash, dsa_indexer_topk=2048)) > base


def test_standard_models_refuse_dsv4_only_fields():
    with pytest.raises(ValueError, match="csa_compress_ratios"):
        dataclasses.replace(io.load_model("deepseek-v3"), o_groups=8)
    with pytest.raises(ValueError, match="one of 0, 4, 128"):
        dataclasses.replace(io.load_model("deepseek-v4-flash"), csa_compress_ratios=(0,) * 43)
