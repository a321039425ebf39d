"""DeepSeek-V4-Pro: the preset against its config.json, its parameter counts against the published 1.6T / 49B,
its model FLOPs through DeepSeek-V4's count (flops.dsv4_flops_per_token), and Megatron-Bridge's Pro recipes."""

from __future__ import annotations

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import flops


@pytest.fixture(scope="module")
def pro():
    return io.load_model("deepseek-v4-pro")


def test_preset_layers_as_the_config_states(pro):
    """config.json compress_ratios: 62 entries (61 layers + MTP), 128 on layers 0-1, 4 on the even layers
    2-60, 128 on the odd 3-59, 0 on MTP; the indexer only where the ratio is 4."""
    ratios = pro.csa_compress_ratios
    assert len(ratios) == pro.num_layers + pro.mtp_num_layers == 62
    assert [i for i, r in enumerate(ratios) if r == 0] == [61]
    assert [i for i, r in enumerate(ratios) if r == 4] == list(range(2, 61, 2))
    assert ratios.count(128) == 31 and pro.num_moe_layers == 61 and pro.moe_n_hash_layers == 3
    assert pro.qk_head_dim + pro.qk_pos_emb_head_dim == pro.v_head_dim == 512


def test_attention_weights_as_the_checkpoint_shapes(pro):
    """wq_a [1536, 7168], wkv [512, 7168], wq_b [128 x 512 = 65536, 1536], wo_a grouped 16 x 1024, mHC
    2 x 24 x (4 x 7168): Flash's shapes at Pro's sizes."""
    assert pro.mla_down_params == 1536 * 7168 + 512 * 7168
    assert pro.mla_up_params == 65536 * 1536
    assert pro.hyper_connection_params == 2 * 24 * 4 * 7168


def test_parameters_as_published(pro):
    """1.6T parameters, 49B activated (DeepSeek-V4-Pro as the public summaries the search index holds state
    it): 1,573B without the MTP layer (-1.7 %), 48.85B activated without the input embedding (-0.3 %)."""
    assert pro.num_parameters == pytest.approx(1.6e12, rel=0.02)
    assert pro.num_active_parameters - pro.embedding_params == pytest.approx(49e9, rel=0.02)


def test_model_flops_through_the_dsv4_count(pro):
    """The model FLOPs are Bridge's dsv4_hybrid count (no published Pro row checks them): 322.6 GFLOP per token,
    above six times the activated weights (the sparse attention and the MTP layer on top), and each Pro field
    reaches it."""
    count = flops.model_flops_per_token(pro)
    assert count == flops.dsv4_flops_per_token(pro)
    assert count == pytest.approx(322.6e9, rel=0.001)
    assert 6 * (pro.num_active_parameters - pro.embedding_params) < count
    assert flops.model_flops_per_token(dataclasses.replace(pro, dsa_indexer_topk=512)) < count
    flash = io.load_model("deepseek-v4-flash")
    assert flops.model_flops_per_token(flash) < count / 3


def test_the_perf_recipe_layout_is_a_fitting_candidate(pro):
    """deepseek_v4_pro_pretrain_256gpu_gb300_fp8mx_config: TP1 PP4 VP4 EP64, MBS 1, GBS 4096, MXFP8 (layout
    Et*4|(tttt|)*14tmL) is a candidate of the default space and predicted to fit (recipe_layouts.yaml)."""
    from autoparallel.search.grid import evaluate
    from autoparallel.space import generate, load_space
    hw, space = io.load_hardware("gb300"), load_space()
    pins = dict(tp=1, pp=4, vp=4, cp=1, ep=64, mbs=1, precision="mxfp8")
    valid = generate(pro, hw, 256, 4096, space.pinned(**pins))
    valid = valid[valid.reason == ""]
    assert not valid.empty
    assert evaluate(pro, hw, valid, space.memory_fraction).fits.any()


def test_the_32_gpu_base_recipe_cannot_hold_the_model(pro):
    """deepseek_v4_pro_pretrain_32gpu_gb300_{bf16,fp8mx}_config (TP1 PP4 EP8, GBS 128) is the base the 256-GPU
    recipe edits: 1.6T BF16 weights over 32 GPUs are 98 GB each before gradients and Adam's moments, and with
    them no candidate fits a 288 GB GB300, so recipe_layouts.yaml leaves it out."""
    from autoparallel.search.grid import evaluate
    from autoparallel.space import generate, load_space
    hw, space = io.load_hardware("gb300"), load_space()
    assert pro.num_parameters * 2 / 32 > 95e9
    valid = generate(pro, hw, 32, 128, space.pinned(tp=1, pp=4, vp=1, cp=1, ep=8, mbs=1, precision="bf16"))
    valid = valid[valid.reason == ""]
    assert not valid.empty and not evaluate(pro, hw, valid, space.memory_fraction).fits.any()


def test_exports_refuse_deepseek_v4_pro(pro):
    """As Flash: Megatron-LM d98e8a64dd has no dsv4_hybrid attention."""
    from autoparallel.errors import UserError
    from autoparallel.report.export import export_document, megatron_args
    from autoparallel.specs.plan import Plan
    plan = Plan(tp=1, pp=4, vp=4, dp=64, ep=64, gbs=4096, precision="mxfp8")
    with pytest.raises(UserError, match="not in Megatron-LM d98e8a64dd"):
        megatron_args(pro, plan)
    doc = export_document(pro, plan, {})
    assert "dsv4_hybrid" in doc["megatron_args"]["unsupported"] and "dsv4_hybrid" in doc["nemo2"]["unsupported"]
