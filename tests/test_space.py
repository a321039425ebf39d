import pytest

from autoparallel import io
from autoparallel.costmodel import pipeline
from autoparallel.space import SPLIT_COLUMNS, SearchSpace, generate, load_space, row_to_plan


@pytest.fixture(scope="module")
def candidates(gpt175b, h100):
    return generate(gpt175b, h100, 1024, 2048, load_space())


def test_valid_candidates_obey_megatron_rules(candidates, gpt175b):
    valid = candidates[candidates.reason == ""]
    assert len(valid) > 10_000
    assert (valid.tp * valid.pp * valid.cp * valid.dp == 1024).all()
    assert (gpt175b.num_attention_heads % valid.tp == 0).all()
    layouts = valid[["pp", "vp", *SPLIT_COLUMNS]].drop_duplicates()
    for row in layouts.itertuples(index=False):
        split = (int(row[2]), int(row[3]), bool(row[4]), bool(row[5]), row[6])
        assert split in pipeline.splits(gpt175b.num_layers, int(row.pp), int(row.vp)), row
    assert (2048 % (valid.mbs * valid.dp) == 0).all()
    interleaved = valid[valid.vp > 1]
    assert ((2048 // (interleaved.mbs * interleaved.dp)) % interleaved.pp == 0).all()
    assert (valid.tp <= 8).all()
    assert not (valid.sp & (valid.tp == 1)).any()
    assert not (valid.tp_comm_overlap & ~valid.sp).any()
    assert not ((valid.precision == "fp8-delayed") & (valid.fp8_bf16_edge_layers > 0)).any()
    assert not (valid.precision == "mxfp8").any()  # H100 has no MXFP8


def test_rejections_name_the_rule(candidates, gpt175b, h100):
    reasons = set(candidates.reason)
    assert "tp=16 crosses the 8-GPU NVLink domain" in reasons
    assert "mxfp8 needs Blackwell; h100-sxm lacks it" in reasons
    listed = generate(gpt175b, h100, 1024, 2048, load_space().pinned(tp=8, pp=8, vp=5))
    assert "96 layers not divisible by pp*vp=40 and no uneven split of Megatron-LM fits" in set(listed.reason)
    assert (listed.reason != "").all()


def test_vp_auto_offers_every_size_megatron_can_split(gpt175b, h100):
    space = load_space().pinned(tp=8, pp=8, cp=1, mbs=1)
    valid = generate(gpt175b, h100, 1024, 2048, space).query("reason == ''")
    # 96 layers on 8 stages: 12 each, so vp in the divisors of 12; 7 via first/last stage sizes
    # (14 in the middle, 6 + 6 at the ends) is Megatron's too.
    assert {1, 2, 3, 4, 6, 12} <= set(valid.vp)
    assert set(valid.vp) == {vp for vp in range(1, 13) if pipeline.splits(96, 8, vp)}


def test_dense_models_get_no_expert_parallel_candidates(gpt175b, h100):
    assert set(generate(gpt175b, h100, 512, 2048, load_space()).ep.dropna()) == {1}
    pinned = generate(gpt175b, h100, 512, 2048, load_space().pinned(ep=2))
    assert "ep>1 or etp>1 needs a MoE model" in set(pinned.reason) and (pinned.reason != "").all()


def test_blackwell_admits_mxfp8(gpt175b):
    out = generate(gpt175b, io.load_hardware("b200"), 64, 256, SearchSpace(precision=("mxfp8",)))
    assert (out.reason == "").any()


def test_pins_fix_knobs(gpt175b, h100):
    space = load_space().pinned(tp=4, pp=8, precision="fp8-delayed")
    valid = generate(gpt175b, h100, 512, 2048, space).query("reason == ''")
    assert set(valid.tp) == {4} and set(valid.pp) == {8} and set(valid.precision) == {"fp8-delayed"}


def test_full_recompute_layer_counts_follow_the_chunk(gpt175b, h100):
    space = SearchSpace(tp=(4,), pp=(8,), vp=(2,), mbs=(1,), recompute=("full",),
                        full_recompute_fractions=(1.0, 0.5, 0.25))
    valid = generate(gpt175b, h100, 512, 2048, space).query("reason == ''")
    # 96 layers / (8 stages * 2 chunks) = 6 per chunk: all (0), 3 and 2 layers.
    assert sorted(valid.recompute_num_layers.unique()) == [0, 2, 3]


def test_row_round_trips_to_a_plan(candidates):
    row = candidates[candidates.reason == ""].iloc[0]
    plan = row_to_plan(row)
    assert plan.num_gpus == 1024 and plan.tp == row.tp


def test_bad_space_values_are_rejected():
    with pytest.raises(ValueError, match="precision \\['fp6'\\] is not one of"):
        SearchSpace(precision=("fp6",))


def test_the_fused_grouped_mlp_is_refused_off_mxfp8_and_offered_where_pinned():
    """TE's ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 (v2.16): MXFP8 MoE experts with a GLU only."""
    b200, mixtral = io.load_hardware("b200"), io.load_model("mixtral-8x7b")
    pins = dict(tp=1, pp=1, cp=1, mbs=1, ep=8, etp=1, cutedsl_fused_grouped_mlp=True)
    bf16 = generate(mixtral, b200, 8, 64, load_space().pinned(precision="bf16", **pins))
    assert (bf16.reason != "").all() and bf16.reason.str.contains("MXFP8 MoE experts").any()
    mxfp8 = generate(mixtral, b200, 8, 64, load_space().pinned(precision="mxfp8", **pins))
    valid = mxfp8[mxfp8.reason == ""]
    assert len(valid) and valid.cutedsl_fused_grouped_mlp.all()


def test_an_fp8_kept_activation_input_is_refused_off_swiglu(gpt175b, h100):
    """TransformerConfig.__post_init__: "Storing activation input in FP8 is supported only for
    SwiGLU" (GPT-3's MLP is GELU); a SwiGLU model is offered it where pinned."""
    space = load_space().pinned(tp=8, pp=8, cp=1, mbs=1, activation_func_fp8_input_store=True)
    gelu = generate(gpt175b, h100, 1024, 2048, space)
    assert (gelu.reason != "").all() and gelu.reason.str.contains("only for SwiGLU").any()
    llama = io.load_model("llama3-70b")
    swiglu = generate(llama, h100, 64, 128, load_space().pinned(tp=8, pp=8, cp=1, mbs=1,
                                                                  activation_func_fp8_input_store=True))
    valid = swiglu[swiglu.reason == ""]
    assert len(valid) and valid.activation_func_fp8_input_store.all()
