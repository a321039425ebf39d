"""A hybrid row's per-module quantization (``costmodel/gemm_precision.py``): Megatron-Bridge's
Nemotron 3 Super NVFP4 recipe (te_quant.cfg, 14 BF16 end layers) priced per GEMM class, each
against a hand computation (FLOPs over the peak of the precision the recipe names)."""

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import gemm, gemm_precision, mamba
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import plan_columns
from autoparallel.specs.plan import Plan

SUPER_PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
REL = 1e-12


@pytest.fixture(scope="module")
def hw():
    return io.load_hardware("gb300")


@pytest.fixture(scope="module")
def super_model():
    """Nemotron 3 Super: hidden 4096, LatentMoE 1024, Mamba 128 heads of 64, 88 layers."""
    return io.load_model("nemotron-3-super")


def _cands(model, hw, recipe=None, end=None, **knobs):
    base = dict(tp=1, pp=1, dp=64, ep=64, mbs=1, gbs=512, sp=False, precision="nvfp4")
    cols = plan_columns([Plan(**{**base, **knobs})])
    if recipe is not None:
        cols["quant_recipe"] = np.array([recipe], dtype=object)
    if end is not None:
        cols["num_layers_at_end_in_bf16"] = np.array([end], dtype=object)
    return candidates(model, hw, cols)


def test_quantized_share_counts_each_kind_in_the_bf16_end_layers():
    """"MEM*EME" (M at 0, 2, 5; E at 1, 4, 6): the last 3 layers hold E, M, E."""
    assert gemm_precision.quantized_share("MEM*EME", "E", 0, 3) == pytest.approx(1 / 3)
    assert gemm_precision.quantized_share("MEM*EME", "M", 0, 3) == pytest.approx(2 / 3)
    assert gemm_precision.quantized_share("MEM*EME", "M", 1, 3) == pytest.approx(1 / 3)
    assert gemm_precision.quantized_share("MEM*EME", "*", 0, 3) == 1.0
    # Super's last 14 layers "EMEM*EMEMEMEME": 7 of 40 E, 6 of 40 M, 1 of 8 attention
    assert gemm_precision.quantized_share(SUPER_PATTERN, "E", 0, 14) == pytest.approx(33 / 40)
    assert gemm_precision.quantized_share(SUPER_PATTERN, "M", 0, 14) == pytest.approx(34 / 40)


def test_class_peaks_bf16_and_mxfp8_under_nvfp4(hw, super_model):
    x = _cands(super_model, hw, "nemotronh-te-quant", 14)
    speed = gemm.tensor_speed(hw)
    bf16 = hw.bf16_tflops * 1e12 * speed
    fp8 = hw.fp8_tflops * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    assert gemm_precision.class_peak(x, "latent_projection")[0] == pytest.approx(bf16, rel=REL)
    assert gemm_precision.class_peak(x, "mamba_out_proj")[0] == pytest.approx(fp8, rel=REL)  # all layers quantized
    m = lt.kind_candidates(x, gemm_precision.kind_fraction(x, "M"))
    q = 34 / 40
    assert gemm_precision.class_peak(m, "mamba_out_proj")[0] == pytest.approx(1 / (q / fp8 + (1 - q) / bf16), rel=REL)
    assert gemm_precision.kind_fraction(x, "*")[0] == 0.0  # linear_qkv / linear_proj BF16


def test_mamba_in_and_out_proj_each_at_its_precision(hw, super_model):
    """in_proj (4096 -> 2·8192 + 2·8·128 + 128) at the NVFP4 peak, out_proj (8192 -> 4096) at the
    MXFP8 peak, each on the GEMM curve at its own size; the rest of the forward unchanged."""
    plain, quant = _cands(super_model, hw), _cands(super_model, hw, "nemotronh-te-quant")
    speed = gemm.tensor_speed(hw)
    fp4 = gemm.fp4_tflops(hw) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    fp8 = hw.fp8_tflops * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    tokens = 8192
    p_in = 4096 * (2 * 8192 + 2 * 8 * 128 + 128)
    p_out = 8192 * 4096
    assert p_in + p_out == mamba.linear_params(super_model)
    eff = lambda f: hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (f / 1e9))  # noqa: E731
    f_in, f_out = 2 * tokens * p_in, 2 * tokens * p_out
    split = f_in / (fp4 * eff(f_in)) + f_out / (fp8 * eff(f_out))
    joint = (f_in + f_out) / (fp4 * eff((f_in + f_out) / 2))
    got = lt.mamba_layer(quant)["forward"][0] - lt.mamba_layer(plain)["forward"][0]
    assert got == pytest.approx(split - joint, rel=1e-9)


def test_latent_projections_bf16_shared_experts_nvfp4(hw, super_model):
    """An E layer's latent projections (4096 <-> 1024, two GEMMs) at the BF16 peak, the shared
    experts (4096 -> 5376 -> 4096, squared ReLU) at the NVFP4 peak."""
    plain, quant = _cands(super_model, hw), _cands(super_model, hw, "nemotronh-te-quant")
    speed = gemm.tensor_speed(hw)
    fp4 = gemm.fp4_tflops(hw) * 1e12 * hw.efficiency.fp8_gemm_relative * speed
    bf16 = hw.bf16_tflops * 1e12 * speed
    tokens = 8192
    f_latent, f_shared = 2 * tokens * 2 * 4096 * 1024, 2 * tokens * 2 * 4096 * 5376
    eff = lambda f: hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (f / 1e9))  # noqa: E731
    split = f_shared / (fp4 * eff(f_shared / 2)) + f_latent / (bf16 * eff(f_latent / 2))
    joint = (f_shared + f_latent) / (fp4 * eff((f_shared + f_latent) / 4))
    got = lt.moe_block_layer(quant)["forward"][0] - lt.moe_block_layer(plain)["forward"][0]
    assert got == pytest.approx(split - joint, rel=1e-9)


def test_attention_and_mtp_layers_all_bf16(hw, super_model):
    """Under te_quant.cfg an attention layer and the MTP layer cast nothing and take the BF16
    peak: the same as the layers of a BF16 plan's kinds at quantized fraction 0."""
    x = _cands(super_model, hw, "nemotronh-te-quant", 14)
    layers = lt.layers(x)
    assert layers.kinds["*"]["fp8_cast"][0] == 0.0
    bf16 = lt.kind_candidates(x, np.zeros(1))
    want = lt.attention_block_layer(bf16)["time"][0] + lt.moe_block_layer(bf16)["time"][0]
    assert layers.mtp(super_model)["time"][0] == pytest.approx(want, rel=REL)
    assert layers.mtp(super_model)["time"][0] != pytest.approx(layers.kinds["*"]["time"][0] + layers.kinds["E"]["time"][0])


def test_without_the_settings_nothing_changes(hw, super_model):
    x, y = _cands(super_model, hw), _cands(super_model, hw, "", None)
    assert not gemm_precision.applies(x) and not gemm_precision.applies(y)
    for kind in ("M", "*", "E"):
        assert lt.layers(x).kinds[kind]["time"][0] == lt.layers(y).kinds[kind]["time"][0]


def test_only_the_super_nvfp4_rows_carry_the_recipe():
    """recipe_settings.yaml: te_quant.cfg and the 14 BF16 end layers on the 15 Super NVFP4 rows."""
    from autoparallel import measured_runs, resources
    frame = measured_runs.read_runs([resources.data_file("training_runs_hybrid.csv")])
    recipes = measured_runs.recipe_settings()
    carried = {str(row["id"]) for _, row in frame.iterrows()
               if measured_runs.recipe_for(row, recipes).get("quant_recipe") == "nemotronh-te-quant"
               and measured_runs.recipe_for(row, recipes).get("num_layers_at_end_in_bf16") == 14}
    nvfp4 = {str(i) for i in frame["id"] if "nemotron-3-super" in str(i) and "-nvfp4-" in str(i)}
    assert len(nvfp4) == 15 and carried == nvfp4


def test_search_space_carries_the_recipe_to_estimate(hw, super_model):
    """The run-level settings (``SearchSpace.cost_settings``) price an estimate as the row's columns
    do; unset, they add no column; an unknown recipe is refused."""
    from autoparallel.costmodel.estimate import estimate_plan
    from autoparallel.space import SearchSpace
    space = SearchSpace(quant_recipe="nemotronh-te-quant", num_layers_at_end_in_bf16=14)
    assert space.cost_settings() == {"quant_recipe": "nemotronh-te-quant", "num_layers_at_end_in_bf16": 14}
    assert SearchSpace().cost_settings() == {}
    with pytest.raises(ValueError):
        SearchSpace(quant_recipe="no-such-recipe")
    plan = Plan(tp=1, pp=1, dp=64, ep=64, mbs=1, gbs=512, sp=False, precision="nvfp4")
    with_recipe = estimate_plan(super_model, hw, plan, settings=space.cost_settings())
    plain = estimate_plan(super_model, hw, plan)
    x = _cands(super_model, hw, "nemotronh-te-quant", 14)
    from autoparallel.costmodel.estimate import estimate_candidates
    assert with_recipe["step_time_s"] == pytest.approx(float(estimate_candidates(x)["step_time_s"][0]), rel=REL)
    assert with_recipe["step_time_s"] > plain["step_time_s"]  # BF16 attention, latents, end layers: slower
