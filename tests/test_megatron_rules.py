"""Every combination Megatron-LM or TransformerEngine refuses, as a rule of the search space.

Each row names the file and the message the rule mirrors (Megatron-LM megatron/training/
arguments.py and megatron/core/transformer/transformer_config.py of the snapshot in
benchmarks/RESULTS.md, TransformerEngine transformer_engine/pytorch/module/base.py), a layout
that breaks it, and the same layout changed just enough to pass. A rule that stops firing, or
fires on its neighbour, fails here.
"""

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import pipeline
from autoparallel.space import SearchSpace, generate

ARGS = "megatron/training/arguments.py validate_args"
CONFIG = "megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__"
TE_UB = "transformer_engine/pytorch/module/base.py fill_userbuffers_buffer_for_all_gather"
OPTIM = "megatron/core/optimizer/__init__.py get_megatron_optimizer"
TE_CP = ("transformer_engine/pytorch/attention.py v1.6 AttnFuncWithCP / get_attention_backend "
         "(no FP8 under CP before TransformerEngine 311b6b6, #1114, v1.10)")
TE_RECIPE = ("transformer_engine/common/recipe/__init__.py at each tag: v1.10 DelayedScaling only; "
             "MXFP8BlockScaling v2.0, Float8CurrentScaling v2.2, Float8BlockScaling v2.3, NVFP4BlockScaling v2.8")

# (source, message it mirrors, model, gpus, gbs, broken layout, passing change, our reason)
RULES = [
    (ARGS, "world size ({args.world_size}) is not divisible by total_model_size",
     "llama3-8b", 12, 120, dict(tp=8, pp=1), dict(tp=4), "does not divide 12 GPUs"),
    (CONFIG, "num_attention_heads ({...}) must be a multiple of tensor_model_parallel_size",
     "gpt3-20b", 64, 256, dict(tp=32, pp=1), dict(tp=8), "attention heads not divisible by tp=32"),
    (CONFIG, "num_query_groups ({...}) must be a multiple of tensor_model_parallel_size",
     "llama3-70b", 64, 128, dict(tp=16, pp=1), dict(tp=8), "query groups not divisible by tp=16"),
    (ARGS, "Number of layers should be divisible by the pipeline-model-parallel size",
     "gpt3-20b", 48, 240, dict(tp=1, pp=3, sp=False, uneven_pipeline_split=False), dict(pp=4),
     "44 layers not divisible by pp*vp=3"),
    (CONFIG, "number of layers at first stage: {...} must be divisible by virtual pipeline parallel degree",
     "gpt3-20b", 64, 256, dict(tp=4, pp=4, vp=3), dict(vp=11),
     "44 layers not divisible by pp*vp=12 and no uneven split of Megatron-LM fits"),
    (ARGS, "seq-length should be a multiple of 2 * context-parallel-size",
     "llama3-8b", 48, 48, dict(tp=1, pp=1, cp=3, sp=False), dict(cp=2), "not divisible by 2*cp=6"),
    (ARGS, "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled",
     "llama3-8b", 8, 128, dict(tp=8, pp=1, sp=False, tp_comm_overlap=True), dict(sp=True),
     "TP comm overlap needs sequence parallel"),
    # TE initialize_ub: a Linear's ub method (here proj_fprop / fc2_fprop "pipeline") only with userbuffers.
    ("transformer_engine/pytorch/module/base.py initialize_ub (ub_cfgs per Linear)",
     "userbuffers methods apply only under ub_tp_comm_overlap",
     "llama3-8b", 8, 128, dict(tp=4, pp=1, sp=True, tp_overlap_rs_pipeline=True), dict(tp_comm_overlap=True),
     "pipelined forward reduce-scatter"),
    (ARGS, "--overlap-param-gather only supported with distributed optimizer or megatron fsdp",
     "llama3-8b", 8, 128, dict(tp=8, pp=1, distributed_optimizer=False), dict(overlap_dp_comm=False),
     "param-gather overlap needs the distributed optimizer"),
    (CONFIG, "Delayed scaling does not support first / last layer in BF16.",
     "llama3-8b", 8, 128, dict(tp=8, pp=1, precision="fp8-delayed", fp8_bf16_edge_layers=1),
     dict(precision="fp8-current"), "delayed scaling cannot keep first/last layers in BF16"),
    (CONFIG, "num_layers_at_start_in_bf16 ({...}) must be between 0 and number of layers per pipeline stage",
     "llama3-8b", 64, 128, dict(tp=8, pp=8, precision="fp8-current", fp8_bf16_edge_layers=5),
     dict(fp8_bf16_edge_layers=4), "must be between 0 and number of layers per pipeline stage (4)"),
    (TE_UB, "Unsupported quantizer for Userbuffers",
     "llama3-8b", 8, 128, dict(tp=8, pp=1, sp=True, tp_comm_overlap=True, precision="fp8-blockwise"),
     dict(precision="fp8-current"), "Unsupported quantizer for Userbuffers"),
    (TE_UB, "Userbuffers requires MXFP8 tensor dims that are divisible by 128",
     "llama3-8b", 128, 128, dict(tp=8, pp=1, cp=16, sp=True, tp_comm_overlap=True, precision="mxfp8"),
     dict(cp=8), "Userbuffers requires MXFP8 tensor dims that are divisible by 128"),
    # MoE (issue 22): Mixtral's top FP8 layouts, GPT-OSS's biased experts.
    (CONFIG, "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
     "mixtral-8x7b", 8, 128, dict(tp=1, pp=1, ep=8, precision="fp8-delayed", recompute="selective",
                                  recompute_modules="moe_act"),
     dict(precision="fp8-current"), "Delayed scaling does not support moe_act and layernorm recompute for fp8"),
    (CONFIG, "Bias in Moe is only supported when ETP==1",
     "gpt-oss-120b", 16, 128, dict(tp=2, pp=1, ep=8, etp=2), dict(etp=1), "Bias in Moe is only supported when ETP==1"),
    # Issue 23: NVFP4 (Blackwell only, no Userbuffers, BF16 edge layers as FP8's).
    (TE_UB, "Unsupported quantizer for Userbuffers (NVFP4Quantizer)",
     "llama3-8b", 8, 128, dict(tp=2, pp=1, precision="nvfp4", tp_comm_overlap=True), dict(tp_comm_overlap=False),
     "TP comm overlap (Userbuffers) cannot carry nvfp4 tensors"),
    (CONFIG, "first_last_layers_bf16 applies to fp8 and fp4 (get_fp4_context: nullcontext for them)",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, precision="bf16", fp8_bf16_edge_layers=2), dict(precision="nvfp4"),
     "BF16 edge layers only apply to FP8 and FP4 precisions"),
    # Issue 23: the memory knobs of NVIDIA's recipes.
    (ARGS, "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, precision="fp8-current", fp8_param_gather=True,
                               distributed_optimizer=False, overlap_dp_comm=False),
     dict(distributed_optimizer=True), "--fp8-param-gather only supported with distributed optimizer"),
    (OPTIM, "--use-precision-aware-optimizer only supported with distributed optimizer",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, precision_aware_optimizer=True, distributed_optimizer=False,
                               overlap_dp_comm=False), dict(distributed_optimizer=True),
     "--use-precision-aware-optimizer only supported with distributed optimizer"),
    (ARGS, "recompute_granularity must not be full when CUDA Graphs are enabled.",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, recompute="full", cuda_graph="full_iteration"),
     dict(recompute="selective"), "recompute_granularity must not be full when CUDA Graphs are enabled"),
    (CONFIG, "CUDA graphs not supported with CPU offloading.",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, cuda_graph="layer", cpu_offloading_num_layers=4),
     dict(cuda_graph="none"), "CUDA graphs not supported with CPU offloading"),
    # Megatron-Core 0.16+ (2b343d739f): a graphed recompute draws no random numbers. GPT-3 keeps GPT-2's
    # dropouts (0.1); Llama 3 trains without, so there the same graphed recompute is accepted.
    (CONFIG, "attention dropout is not supported with graphed attention recomputation.",
     "gpt3-20b", 8, 128, dict(tp=8, pp=1, cuda_graph="layer", recompute="selective", recompute_modules="core_attn"),
     dict(cuda_graph="none"), "attention dropout is not supported with graphed attention recomputation"),
    (TE_CP, "context-parallel attention takes no FP8 (fused attention under CP: F16 backend only)",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, cp=2, precision="fp8-delayed", fp8_attention=True,
                               transformer_engine_version="1.6"),
     dict(transformer_engine_version="1.10"), "FP8 attention under context parallelism needs TransformerEngine >= 1.10"),
    (TE_RECIPE, "no Float8CurrentScaling recipe in TE 1.x (MLPerf v4.1's NeMo 24.09: TE 1.10)",
     "llama3-8b", 8, 128, dict(tp=1, pp=1, precision="fp8-current", transformer_engine_version="1.10"),
     dict(transformer_engine_version="2.2"), "fp8-current needs TransformerEngine >= 2.2"),
]

BASE = dict(vp=1, cp=1, ep=1, mbs=1, sp=True, recompute="none", precision="bf16", fp8_bf16_edge_layers=0,
            tp_comm_overlap=False, distributed_optimizer=True, overlap_dp_comm=True, grad_reduce_in_fp32=True,
            flash_attention=True, memory_fraction=0.95, tp_within_nvlink_domain=False)


def _reason(model_name: str, gpus: int, gbs: int, pins: dict, gpu: str = "b200") -> str:
    model = io.load_model(model_name)
    hw = io.load_hardware(gpu)  # b200: FP8, MXFP8, NVFP4 and an 8-GPU domain (checked off above)
    space = SearchSpace().pinned(**{**BASE, **pins})
    frame = generate(model, hw, gpus, gbs, space)
    assert len(frame) == 1, frame
    return frame.reason.iloc[0]


@pytest.mark.parametrize("source, message, model, gpus, gbs, broken, change, reason", RULES,
                         ids=[r[1][:40] for r in RULES])
def test_rule_rejects_what_megatron_or_te_refuses(source, message, model, gpus, gbs, broken, change, reason):
    assert source and message
    assert reason in _reason(model, gpus, gbs, broken)
    assert _reason(model, gpus, gbs, {**broken, **change}) == ""


def test_fp8_param_gather_is_off_where_the_precision_is_not_fp8():
    """As SP at tp 1: the space keeps FP8 param gather on for FP8 recipes only (a pinned
    --fp8-param-gather with another precision is refused on the command line: test_bad_inputs)."""
    model, hw = io.load_model("llama3-8b"), io.load_hardware("b200")
    space = SearchSpace().pinned(**{**BASE, "tp": 1, "pp": 1, "fp8_param_gather": True})
    space = dataclasses.replace(space, precision=("bf16", "mxfp8", "nvfp4"))
    frame = generate(model, hw, 8, 128, space)
    ok = frame[frame.reason == ""].set_index("precision").fp8_param_gather
    assert ok.to_dict() == {"bf16": False, "mxfp8": True, "nvfp4": False}


def test_nvfp4_needs_blackwell():
    """TransformerConfig: fp4_recipe 'nvfp4' "uses NVFP4BlockScaling recipe for Blackwell+
    architecture": FP4 tensor cores, which the Hopper and Ada presets lack."""
    pins = dict(tp=1, pp=1, precision="nvfp4")
    for gpu in ("h100-sxm", "h200-nvl", "l40s"):
        assert "nvfp4 needs Blackwell FP4 tensor cores" in _reason("llama3-8b", 8, 128, pins, gpu)
    for gpu in ("b200", "b300", "gb300"):
        assert _reason("llama3-8b", 8, 128, pins, gpu) == ""


def test_rejected_rows_have_every_knob_filled_with_its_type(gpt175b, h100):
    frame = generate(gpt175b, h100, 1024, 2048, dataclasses.replace(SearchSpace(), tp=(4, 16), pp=(8, 7)))
    rejected = frame[frame.reason != ""]
    assert len(rejected) > 0 and not rejected.isna().any().any()
    assert frame.tp.dtype.kind == "i" and frame.recompute_num_layers.dtype.kind == "i" and frame.sp.dtype == bool


def test_sequence_parallel_is_turned_off_at_tp1_as_megatron_does():
    """arguments.py validate_args: "Disable sequence parallelism when tp=1" (args.sequence_parallel =
    False) rather than ModelParallelConfig's error: a tp=1 layout is kept, without SP or TP overlap."""
    model, hw = io.load_model("llama3-8b"), io.load_hardware("b200")
    frame = generate(model, hw, 8, 128, SearchSpace().pinned(**{**BASE, "tp": 1, "pp": 1, "sp": True,
                                                                "tp_comm_overlap": True}))
    assert len(frame) == 1 and frame.reason.iloc[0] == ""
    assert not frame.sp.iloc[0] and not frame.tp_comm_overlap.iloc[0]


def test_delayed_scaling_keeps_the_moe_layer_recompute_megatron_accepts():
    pins = dict(tp=1, pp=1, ep=8, precision="fp8-delayed", recompute="selective", recompute_modules="moe")
    assert _reason("mixtral-8x7b", 8, 128, pins) == ""


def test_all_to_all_overlap_is_off_with_more_than_one_mtp_layer():
    # transformer_config.py: "MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm"
    model, hw = io.load_model("deepseek-v3"), io.load_hardware("b200")
    space = SearchSpace().pinned(**{**BASE, "tp": 1, "pp": 1, "ep": 8, "overlap_moe_expert_parallel_comm": True})
    one = generate(model, hw, 64, 512, space)
    two = generate(dataclasses.replace(model, mtp_num_layers=2), hw, 64, 512, space)
    assert one.overlap_moe_expert_parallel_comm.all() and (one.reason == "").all()
    assert not two.overlap_moe_expert_parallel_comm.any() and (two.reason == "").all()


def test_all_to_all_overlap_is_off_where_selective_recompute_covers_the_moe_layer():
    # transformer_config.py (d98e8a6): "disable moe in recompute_modules when enabling
    # overlap_moe_expert_parallel_comm"; moe_act (the activation only) keeps it.
    model, hw = io.load_model("qwen3-30b-a3b"), io.load_hardware("h100-sxm")
    out = {}
    for modules in ("moe", "moe_act"):
        space = SearchSpace().pinned(**{**BASE, "tp": 1, "pp": 1, "ep": 8, "recompute": "selective",
                                        "recompute_modules": modules, "overlap_moe_expert_parallel_comm": True})
        out[modules] = generate(model, hw, 16, 512, space)
        assert len(out[modules]) and (out[modules].reason == "").all()
    assert not out["moe"].overlap_moe_expert_parallel_comm.any()
    assert out["moe_act"].overlap_moe_expert_parallel_comm.all()


@pytest.mark.parametrize("mtp", [0, 1, 2])
def test_flexible_layouts_place_every_mtp_layer_in_the_last_stage_with_the_loss(mtp):
    # pipeline_parallel_layer_layout.py validate_layer_layout: "Number of mtp layers in layout must
    # match mtp_num_layers", "MTP layers must be in the last stage together with Loss stage"
    model = dataclasses.replace(io.load_model("deepseek-v3"), mtp_num_layers=mtp)
    space = SearchSpace().pinned(**{**BASE, "tp": 1, "pp": 8, "vp": 4, "ep": 8})
    frame = generate(model, io.load_hardware("b200"), 64, 512, space)
    layouts = set(frame[frame.reason == ""].pipeline_model_parallel_layout)
    assert layouts == {pipeline.rank_balanced_layout(61, 8, 4, mtp)}
    (layout,) = layouts
    stages = pipeline.layout_stages(layout)
    assert stages[-1] == "m" * mtp + "L" and "m" not in "".join(stages[:-1])
    # NVIDIA's H100 recipe layout "Et|(tt|)*30mL" leaves rank 7 with 6 layers + MTP + loss (9 layers'
    # work against 8 elsewhere): the offered layout moves one to the first stage; the recipe's stays
    # pinnable (--pipeline-layout).
    assert layout == ("Et|(t*2|)*30L" if mtp == 0 else "Et*2|(t*2|)*22t|(t*2|)*7" + "m" * mtp + "L")


def test_shared_expert_overlap_takes_the_place_of_the_all_to_all_overlap_where_that_cannot_run():
    """TransformerConfig: "disable moe_shared_expert_overlap when enabling
    overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap only works with alltoall or flex
    token dispatcher". The default space asks for both: each layout gets the 1F1B overlap where
    Megatron runs it (pp 1, or vp > 1) and the shared-expert overlap elsewhere; never both."""
    model, hw = io.load_model("deepseek-v3"), io.load_hardware("b200")
    space = SearchSpace().pinned(**{**BASE, "tp": 1, "ep": 8, "overlap_moe_expert_parallel_comm": True,
                                    "moe_shared_expert_overlap": True, "pp": None, "vp": None})
    space = dataclasses.replace(space, pp=(1, 2), vp=(1, 2), moe_token_dispatcher_type=("alltoall", "allgather"))
    frame = generate(model, hw, 64, 512, space)
    ok = frame[frame.reason == ""]
    a2a_possible = (ok.pp == 1) | (ok.vp > 1)
    assert len(ok) and not (ok.overlap_moe_expert_parallel_comm & ok.moe_shared_expert_overlap).any()
    assert (ok.overlap_moe_expert_parallel_comm == (a2a_possible & (ok.moe_token_dispatcher_type != "allgather"))).all()
    expected = ~a2a_possible & (ok.moe_token_dispatcher_type == "alltoall")
    assert (ok.moe_shared_expert_overlap == expected).all() and expected.any()
    mixtral = generate(io.load_model("mixtral-8x7b"), hw, 64, 512, space)
    assert not mixtral[mixtral.reason == ""].moe_shared_expert_overlap.any()  # no shared experts: nothing to overlap


def test_an_older_transformer_engine_refuses_fp8_attention_only_under_context_parallelism():
    """TE < 1.10 runs FP8 attention without CP: cp 1 passes, and BF16 attention at cp 2 passes (what
    TE 1.6 runs when FP8_DPA=1 meets CP); a current TE (no version given) and 2.9 run it under CP."""
    older = dict(tp=1, pp=1, cp=2, precision="fp8-delayed", fp8_attention=True, transformer_engine_version="1.6")
    assert _reason("llama3-8b", 8, 128, {**older, "cp": 1}) == ""
    assert _reason("llama3-8b", 8, 128, {**older, "fp8_attention": False}) == ""
    assert _reason("llama3-8b", 8, 128, {**older, "transformer_engine_version": "1.9"}) != ""
    for current in ("", "2.9", "1.10.0"):
        assert _reason("llama3-8b", 8, 128, {**older, "transformer_engine_version": current}) == ""


@pytest.mark.parametrize("precision, first", [("fp8-delayed", None), ("mxfp8", "2.0"), ("fp8-current", "2.2"),
                                              ("fp8-blockwise", "2.3"), ("nvfp4", "2.8")])
def test_a_transformer_engine_version_offers_only_the_recipes_it_has(precision, first):
    """Each recipe from the first TE release that defines it (delayed scaling in every one); a current TE
    (no version given) has them all."""
    pins = dict(tp=1, pp=1, precision=precision)
    for release in ("", "2.9"):
        assert _reason("llama3-8b", 8, 128, {**pins, "transformer_engine_version": release}) == ""
    if first is None:
        assert _reason("llama3-8b", 8, 128, {**pins, "transformer_engine_version": "1.6"}) == ""
        return
    major, minor = (int(p) for p in first.split("."))
    older = f"{major}.{minor - 1}" if minor else "1.13"
    assert _reason("llama3-8b", 8, 128, {**pins, "transformer_engine_version": first}) == ""
    assert f"needs TransformerEngine >= {first}" in _reason("llama3-8b", 8, 128,
                                                            {**pins, "transformer_engine_version": older})


@pytest.mark.parametrize("version", ["1", "v1.6", "1.6rc2", "latest"])
def test_a_transformer_engine_version_is_a_release_number(version):
    with pytest.raises(ValueError, match="transformer_engine_version must be a release such as 1.6"):
        SearchSpace(transformer_engine_version=version)


def test_graphed_recompute_is_accepted_for_a_model_without_dropout():
    """The dropout rules fire on the model's dropout, not on the graph and recompute alone."""
    pins = dict(tp=8, pp=1, cuda_graph="layer", recompute="selective", recompute_modules="core_attn")
    assert _reason("llama3-8b", 8, 128, pins) == ""


def test_a_graphed_moe_recompute_is_refused_with_hidden_dropout():
    """TransformerConfig.__post_init__ (Megatron-Core 0.16+): "hidden dropout is not supported with
    graphed MLP/MoE recomputation" (no shipped MoE preset has dropout: Mixtral given some here)."""
    mixtral = io.load_model("mixtral-8x7b")
    pins = dict(tp=1, pp=1, ep=8, cuda_graph="full_iteration", recompute="selective", recompute_modules="moe")
    space = SearchSpace().pinned(**{**BASE, **pins})
    hw = io.load_hardware("b200")
    for dropout, refused in ((0.1, True), (0.0, False)):
        model = dataclasses.replace(mixtral, hidden_dropout=dropout)
        reason = generate(model, hw, 8, 128, space).reason.iloc[0]
        assert ("hidden dropout is not supported with graphed MLP/MoE recomputation" in reason) == refused, reason


def test_lora_on_a_virtual_pipeline_is_refused_on_nemo_24_09s_stack_only():
    """NeMo 24.09's NLPAdapterModelMixin adds LoRA adapters to the first virtual chunk only (NeMo
    4068955b nlp_adapter_mixins.py L96-101, L198; every chunk from 2.1.0, 2c42fc3961 #11128): with
    TE 1.10 (that stack, ``candidates.LORA_VIRTUAL_PIPELINE_TE``) or 1.6, vp > 1 is refused for LoRA;
    vp 1, a full fine-tune, TE 1.11 and a current TE (no version) pass."""
    from autoparallel.specs.finetune import Finetune

    lora = dataclasses.replace(io.load_model("llama2-70b"), finetune=Finetune("lora"))
    full = dataclasses.replace(lora, finetune=Finetune("full"))

    def reason(model, **pins):
        space = SearchSpace().pinned(**{**BASE, "tp": 4, "pp": 2, "vp": 2, "transformer_engine_version": "1.10",
                                        **pins})
        frame = generate(model, io.load_hardware("h100-sxm"), 16, 64, space)
        assert len(frame) == 1, frame
        return frame.reason.iloc[0]

    for release in ("1.10", "1.6"):
        why = reason(lora, transformer_engine_version=release)
        assert "LoRA on a virtual pipeline (vp > 1) needs NeMo >= 2.1.0" in why and release in why
    assert reason(lora, vp=1) == ""
    assert reason(full) == ""
    for release in ("1.11", "2.9", ""):
        assert reason(lora, transformer_engine_version=release) == ""


def test_lora_input_regather_is_offered_where_megatron_bridge_runs_it():
    """Megatron-Bridge's LoRA.sequence_parallel_input_regather (v0.6.0+, 33655ef84 #4581) runs under TP
    with SP for LoRA's QKV / FC1 adapters and falls back to the default path with a2a_experimental,
    full recompute, CUDA graphs and CPU activation offloading (067f987df peft/utils.py
    ``_sequence_parallel_input_regather_eligibility``); it is Bridge's, so a TE 1.x stack (NeMo 24.09)
    has none, and a pre-training run no LoRA. Each refused; at tp 1 (no SP) it is turned off, as SP is."""
    from autoparallel.space import REGATHER_FALLBACK
    from autoparallel.specs.finetune import Finetune

    lora = dataclasses.replace(io.load_model("llama2-70b"), finetune=Finetune("lora"))

    def frame(model, **pins):
        space = SearchSpace().pinned(**{**BASE, "tp": 4, "pp": 1, "lora_input_regather": True, **pins})
        return generate(model, io.load_hardware("h100-sxm"), 8, 8, space)

    def reason(model, **pins):
        out = frame(model, **pins)
        assert len(out) == 1, out
        return out.reason.iloc[0]

    assert reason(lora) == ""
    assert reason(lora, tp_comm_overlap=True, recompute="selective") == ""
    refused = [reason(dataclasses.replace(lora, finetune=Finetune("lora", lora_a2a=True))),
               reason(lora, recompute="full"), reason(lora, cuda_graph="layer"), reason(lora, sp=False),
               reason(lora, transformer_engine_version="1.10"), reason(io.load_model("llama2-70b"))]
    assert all(why.startswith(REGATHER_FALLBACK) for why in refused), refused
    offloaded = reason(lora, cpu_offloading_num_layers=20)
    assert offloaded.startswith(REGATHER_FALLBACK) and "offloading" in offloaded
    assert not frame(lora, tp=1).lora_input_regather.astype(bool).any()  # no SP at tp 1: off, as SP is


def test_the_default_space_searches_lora_input_regather_for_lora_only():
    """The training space offers the re-gather both ways to LoRA's SP candidates and not at all to a
    pre-training run (no candidate with it, none refused for it)."""
    from autoparallel.space import load_space
    from autoparallel.specs.finetune import Finetune

    space = dataclasses.replace(load_space("training"), tp=(1, 4), pp=(1,), cp=(1,), mbs=(1,),
                                precision=("fp8-delayed",), recompute=("none", "full"))
    base = io.load_model("llama2-70b")
    hw = io.load_hardware("h100-sxm")
    pretraining = generate(base, hw, 8, 8, space)
    assert not pretraining.lora_input_regather.astype(bool).any()
    lora = generate(dataclasses.replace(base, finetune=Finetune("lora")), hw, 8, 8, space)
    offered = lora[lora.lora_input_regather.astype(bool) & (lora.reason == "")]
    assert len(offered) and (offered.tp == 4).all() and (offered.recompute != "full").all()
    assert ((lora.tp == 4) & ~lora.lora_input_regather.astype(bool) & (lora.reason == "")).any()  # and without it
