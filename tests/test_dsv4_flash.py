"""DeepSeek-V4-Flash: the preset against its sources, its parameter counts against the model card,
its model FLOPs against Megatron-Bridge's published TFLOP/s, and the held-out 26.08 rows."""

from __future__ import annotations

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import dsv4, flops


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


@pytest.fixture(scope="module")
def rows():
    from autoparallel import measured_runs, resources
    return measured_runs.load_runs([resources.data_file("training_runs_dsv4.csv")], moe=True)


def test_the_published_rows_build_the_preset_and_are_held_out(rows, flash):
    from autoparallel import measured_runs
    from autoparallel.validate import HELD_APART_KINDS
    assert len(rows) == 2 and {r.kind for r in rows} == {"dsv4-newer"} <= set(HELD_APART_KINDS)
    for r in rows:
        assert r.validation_only and "training_runs_dsv4.csv" in measured_runs.VALIDATION_ONLY_RUNS
        assert r.model.csa_compress_ratios == flash.csa_compress_ratios and r.model.hc_mult == 4
        assert r.model.num_parameters == flash.num_parameters
    assert "training_runs_dsv4.csv" not in measured_runs.TRAINING_RUNS


def test_the_published_layouts_are_candidates_and_fit(rows):
    """Each row's layout (TP1 PP1 EP64, MBS 1, its recipe's knobs) is a candidate the row's space
    generates and the cost model predicts it to fit."""
    from autoparallel import measured_runs
    for r in rows:
        out = measured_runs.predict_row(r)
        assert out["fits"], r.id
        assert out["predicted"] > 0


@pytest.mark.parametrize("gpu", ["gb300", "gb200"])
def test_the_default_space_offers_the_published_layout(flash, gpu):
    """The default search space on 128 GPUs offers TP1 PP1 CP1 EP64 MBS1 at GBS 2048 in MXFP8 and
    predicts it to fit."""
    from autoparallel.search.grid import evaluate
    from autoparallel.space import generate, load_space
    hw = io.load_hardware(gpu)
    space = load_space()
    pins = dict(tp=1, pp=1, cp=1, vp=1, ep=64, mbs=1, precision="mxfp8")
    candidates = generate(flash, hw, 128, 2048, space.pinned(**pins))
    valid = candidates[candidates.reason == ""]
    assert not valid.empty, candidates.reason.iloc[0]
    assert evaluate(flash, hw, valid, space.memory_fraction).fits.any()


def test_exports_refuse_deepseek_v4(flash):
    """Megatron-LM d98e8a64dd has no dsv4_hybrid attention: the flags, NeMo and best.yaml refuse it."""
    from autoparallel.errors import UserError
    from autoparallel.report.export import export_document, megatron_args
    from autoparallel.specs.plan import Plan
    plan = Plan(tp=1, pp=1, dp=128, ep=64, gbs=2048, precision="mxfp8")
    with pytest.raises(UserError, match="not in Megatron-LM d98e8a64dd"):
        megatron_args(flash, plan)
    doc = export_document(flash, plan, {})
    assert "dsv4_hybrid" in doc["megatron_args"]["unsupported"]
    assert "dsv4_hybrid" in doc["nemo"]["unsupported"] and "dsv4_hybrid" in doc["nemo2"]["unsupported"]


def test_the_built_in_transformer_and_fp8_check_refuse_deepseek_v4(flash):
    pytest.importorskip("torch")
    import subprocess
    import sys
    from autoparallel.model.transformer import check_spec
    with pytest.raises(NotImplementedError, match="DeepSeek-V4"):
        check_spec(flash)
    out = subprocess.run([sys.executable, "-m", "autoparallel.cli", "fp8-check", "--model", "deepseek-v4-flash",
                          "--no-save"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "DeepSeek-V4" in out.stderr, out.stderr


def test_estimate_prices_deepseek_v4_with_its_parts(flash):
    """The sparse attention core is far below dense MLA's; mHC adds time and memory; a hash-routed
    layer runs no router GEMM."""
    dense_mla = flops.attention_core_flops(dataclasses.replace(
        flash, csa_compress_ratios=None, o_groups=None, o_lora_rank=None, dsa_indexer_n_heads=None,
        dsa_indexer_head_dim=None, dsa_indexer_topk=None), 1, 4096, causal=True)
    assert flops.attention_core_flops(flash, 1, 4096, causal=True) < 0.25 * dense_mla
    assert dsv4.hyper_connection_elements(4) == 22.0
    assert dsv4.hyper_connection_elements(1) == 7.0


def _row_candidates(gpu="gb300"):
    from autoparallel import measured_runs, resources
    rows = measured_runs.load_runs([resources.data_file("training_runs_dsv4.csv")], moe=True)
    return next(r for r in rows if f"-{gpu}-" in r.id).built


def test_mhc_is_one_kernel_pair_of_the_moe_layer(monkeypatch):
    """The MoE layer's compute holds mHC's forward and backward HBM passes exactly once (on GB300 the fused
    cuTile kernels' 18 and 55 elements per token and block); its stored activations the streams each
    block keeps."""
    import numpy as np
    from autoparallel.costmodel import layer_time
    x = _row_candidates()
    with_mhc = layer_time.moe_layer(x)
    forward, backward = dsv4.hyper_connection_time(x)
    assert np.all(forward > 0) and np.allclose(backward, forward * 55.0 / 18.0)
    assert dsv4.fused_hyper_connection_elements(4) == (18.0, 55.0)
    monkeypatch.setattr(dsv4, "hyper_connection_time", lambda x: (0.0 * forward, 0.0 * forward))
    monkeypatch.setattr(dsv4, "hyper_connection_saved_bytes", lambda x: 0.0)
    without = layer_time.moe_layer(x)
    assert np.allclose(with_mhc["compute"] - without["compute"], forward + backward, rtol=1e-9)
    stored = 2.0 * 4 * x.tokens / x.t * 4096 * 2.0
    assert np.allclose(with_mhc["working"] - without["working"], stored, rtol=1e-9)


def test_mhc_off_blackwell_is_the_unfused_module():
    """Without the cuTile kernels (no Blackwell) the unfused module's 22 elements forward, twice backward."""
    import dataclasses as dc
    import numpy as np
    x = _row_candidates()
    hopper = dc.replace(x, hw=dc.replace(x.hw, mxfp8=False))
    forward, backward = dsv4.hyper_connection_time(hopper)
    fused_forward, _ = dsv4.hyper_connection_time(x)
    assert np.allclose(backward, 2 * forward) and np.allclose(forward / fused_forward, 22.0 / 18.0)


def test_dsv4_attention_kernels_are_in_the_moe_layer_once(monkeypatch):
    """The indexer's top-k and sparse loss, the BF16 grouped output, the compressors' pooling, the
    compressor / indexer GEMMs as run and FlashMLA's padded key slots each add time, and the MoE layer's
    compute holds their forward and backward exactly once."""
    import numpy as np
    from autoparallel.costmodel import layer_time
    x = _row_candidates()
    kernels = layer_time.dsv4_attention_kernels(x)
    assert len(kernels) == 6 and all(np.all(f > 0) for f, _ in kernels)
    total = sum(f + b for f, b in kernels)
    with_kernels = layer_time.moe_layer(x)
    monkeypatch.setattr(layer_time, "dsv4_attention_kernels", lambda x: ())
    without = layer_time.moe_layer(x)
    assert np.allclose(with_kernels["compute"] - without["compute"], total, rtol=1e-9)


def test_indexer_loss_flops_count_the_selected_keys(flash):
    """Per ratio-4 token: 64 heads x 512 QK^T over k (1 - 4k / 2s) = 384 keys, and three indexer GEMMs of
    64 x 128 over them; 21 of the 43 decoder layers."""
    target, indexer, exponentials = flops.dsa_indexer_loss_flops(flash, 1, 4096)
    assert target == pytest.approx(4096 * 384 * 2 * 64 * 512 * 21 / 43)
    assert indexer == pytest.approx(4096 * 384 * 3 * 2 * 64 * 128 * 21 / 43)
    assert exponentials == pytest.approx(4096 * 384 * 64 * 21 / 43)


def test_compressor_bytes_follow_its_passes():
    """Ratio 4 (overlapping, coff 2) at head_dim 512: bias 6 x 1024, overlap 36 x 512, softmax, product and
    sum 22 x 1024 bytes; ratio 128 (coff 1): 6 x 512 + 22 x 512."""
    assert dsv4.compressor_bytes_per_token(4, 512) == 6 * 1024 + 36 * 512 + 22 * 1024
    assert dsv4.compressor_bytes_per_token(128, 512) == 28 * 512
    assert dsv4.compressor_bytes_per_token(4, 128) == dsv4.compressor_bytes_per_token(4, 512) / 4


def test_grouped_output_is_priced_at_the_bf16_peak():
    """wo_a runs as a torch.einsum: under MXFP8 its extra time is its BF16 time less its FP8 time."""
    import numpy as np
    from autoparallel.costmodel import gemm, layer_time
    x = _row_candidates()
    params = 64 * 512 * 1024
    forward, backward = layer_time.dsv4_output_groups_bf16_time(x)
    bf16 = layer_time.linear_time(x, params, gemms=1.0, peak=gemm.bf16_peak(x.hw))
    assert np.allclose(forward, bf16 - layer_time.linear_time(x, params, gemms=1.0))
    assert np.all(forward > 0) and np.allclose(backward, 2 * forward)


def test_hash_routed_layers_run_no_router():
    """3 of the 43 MoE layers route by table: the mean layer's router is 40/43 of a scored one's."""
    import numpy as np
    from autoparallel.costmodel import layer_time
    x = _row_candidates()
    scored, hashed = layer_time.router_time(x), layer_time.hash_routed_router_time(x)
    for s, h in zip(scored, hashed):
        assert np.allclose(h, s * 40 / 43, rtol=1e-12) and np.all(s > 0)


def test_serving_refuses_deepseek_v4(flash):
    from autoparallel.costmodel import inference
    from autoparallel.errors import UnpricedModelError
    with pytest.raises(UnpricedModelError, match="DeepSeek-V4"):
        inference.refuse_unpriced(flash)


def test_activations_hold_deepseek_v4s_tensors(flash):
    """Per token and layer (TP 1, BF16 tensors): the queries of 64 heads x 512, one K and one V head
    of 512, the attention output and the o_groups projection's input; mla_up_proj recompute spares
    the queries and wq_b's input copy, never K and V (wkv makes them directly)."""
    from autoparallel.costmodel import memory
    per_h = memory.sharded_bytes_per_token_hidden(flash, 0.0, moe=True, attention_output=2.0)
    attention = (2.0 * (64 * 512 + 2 * 512) + 2.0 * 64 * 512 + 2.0 * 8 * 1024) / 4096
    shared = memory._per_ffn_unit(flash, 2.0) * 2048 / 4096
    assert per_h == pytest.approx(attention + shared)
    spared = memory.recomputed_bytes(flash, 1, 4096, 1, False, 0.0, False, 1, 1.0, True, False, False)
    assert spared == pytest.approx(4096 * (2.0 * 64 * 512 + 2.0 * 1024))


def test_deepseek_v4_takes_its_own_tie_band():
    """The shipped prediction_error.yaml holds DeepSeek-V4's held-out band, and a DeepSeek-V4 search reads
    it rather than the MoE band (the other kinds' bands unchanged)."""
    from autoparallel.report.tables import prediction_error
    bands = prediction_error()
    assert bands.dsv4_step_time_relative_error and bands.dsv4_step_time_relative_error > bands.moe_step_time_relative_error
    gb300 = io.load_hardware("gb300")
    assert bands.for_hardware(gb300, moe=True, dsv4=True).step_time_relative_error == bands.by_family["b200"]["dsv4-newer"]
    assert bands.for_hardware(gb300, moe=True).step_time_relative_error == bands.by_family["b200"]["moe"]
    assert bands.for_hardware(None, moe=True, dsv4=True).step_time_relative_error == bands.dsv4_step_time_relative_error


def test_every_ranked_table_takes_the_band_from_the_model():
    """The ranked tables read the band from the model itself (``for_model``): the ranked.md that
    search --profile / --resume rewrites had been given MoE / LoRA / hybrid flags and no DeepSeek-V4 one."""
    from autoparallel.report.tables import prediction_error
    bands, gb300 = prediction_error(), io.load_hardware("gb300")
    flash, nano = io.load_model("deepseek-v4-flash"), io.load_model("nemotron-3-nano")
    assert bands.for_model(gb300, flash) == bands.for_hardware(gb300, moe=True, dsv4=True)
    assert bands.for_model(gb300, nano) == bands.for_hardware(gb300, moe=True, hybrid=True)
    assert bands.for_model(gb300, io.load_model("175b")) == bands.for_hardware(gb300)
    assert bands.for_model(gb300) == bands.for_hardware(gb300)


def test_export_of_a_deepseek_v4_search_exits_2_with_the_reason(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "autoparallel", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=env)
    out = cli("search", "--model", "deepseek-v4-flash", "--gpus", "128", "--gpu", "gb200", "--precision", "mxfp8",
              "--tp", "1", "--pp", "1", "--ep", "64", "--mbs", "1")
    assert out.returncode == 0, out.stderr
    run_dir = next((tmp_path / "results").iterdir())
    for fmt in ("megatron", "nemo2"):
        out = cli("export", str(run_dir), "--rank", "1", "--format", fmt)
        assert out.returncode == 2 and "Traceback" not in out.stderr and "dsv4_hybrid" in out.stderr, out.stderr
        assert "mxfp8;" not in out.stderr
