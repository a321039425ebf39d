"""Exports (issue 13): the Megatron-LM flags define the preset's model and the priced run, the
NeMo blocks and the TE recipe say the same, train.sh launches it. Megatron-LM itself checks the
flags in benchmarks/bench_megatron_args.py; these tests pin what must be in them."""

import dataclasses
import subprocess

import pytest

from autoparallel import io
from autoparallel.errors import UserError
from autoparallel.report.export import FP8_RECIPES, megatron_args, megatron_env, te_recipe
from autoparallel.report.launch import node_layout, train_script
from autoparallel.report.shared import hybrid_unsupported, node_layout_text
from autoparallel.report.nemo import nemo1_config, nemo2_recipe
from autoparallel.specs.plan import Plan

CP2 = Plan(tp=4, pp=4, vp=5, cp=2, dp=2, gbs=128, sp=True, precision="fp8-delayed")


def test_llama3_export_builds_the_llama_model():
    args = megatron_args(io.load_model("llama3-70b"), CP2)
    for flag in ("--position-embedding-type rope", "--rotary-base 500000", "--disable-bias-linear",
                 "--hidden-dropout 0.0", "--attention-dropout 0.0", "--normalization RMSNorm", "--swiglu",
                 "--untie-embeddings-and-output-weights", "--group-query-attention", "--num-query-groups 8",
                 "--tokenizer-type HuggingFaceTokenizer", "--tokenizer-model meta-llama/Meta-Llama-3-70B",
                 "--cp-comm-type p2p", "--num-virtual-stages-per-pipeline-rank 5"):
        assert flag in args, flag
    assert not any(a.startswith("--fp8-param-gather") for a in args)  # priced: BF16 gathers


def test_softmax_sinks_export_the_all_to_all_cp_they_are_priced_with():
    """TE runs attention with sinks under CP only as the all-to-all CP (cp_comm_type a2a; p2p disables
    its fused attention and the unfused one takes no CP): GPT-OSS exports it (Megatron-LM flags, the NeMo 2 recipe), as
    Megatron-Bridge's gpt_oss recipes set it; a model without sinks keeps the ring (p2p)."""
    oss = io.load_model("gpt-oss-120b")
    plan = Plan(tp=2, pp=4, cp=2, dp=8, ep=8, gbs=128, sp=True, precision="bf16")
    args = megatron_args(oss, plan)
    assert "--cp-comm-type a2a" in args and "--cp-comm-type p2p" not in args
    assert "--softmax-type learnable" in args
    assert nemo2_recipe(oss, plan)["model"]["config"]["cp_comm_type"] == "a2a"
    assert not any(a.startswith("--cp-comm-type") for a in megatron_args(oss, dataclasses.replace(plan, cp=1, dp=16)))


def test_gpt3_export_is_gpt3_in_every_block():
    model = io.load_model("gpt3-175b")
    args = megatron_args(model, CP2)
    assert "--position-embedding-type learned_absolute" in args and "--rotary-base" not in " ".join(args)
    assert "--disable-bias-linear" not in args and "--apply-layernorm-1p" not in args
    assert '--vocab-file "$VOCAB_FILE"' in args and '--merge-file "$MERGE_FILE"' in args
    tied = "--untie-embeddings-and-output-weights" not in args
    assert tied == model.tie_embeddings
    assert nemo1_config(model, CP2)["model"]["share_embeddings_and_output_weights"] == tied
    assert nemo2_recipe(model, CP2)["model"]["config"]["share_embeddings_and_output_weights"] == tied


@pytest.mark.parametrize("name", sorted(io.preset_files("models")))
def test_every_preset_exports_its_architecture(name):
    model = io.load_model(name)
    if hybrid_unsupported(model):  # a hybrid MTP model without its MTP pattern is refused, not half-written
        with pytest.raises(UserError, match="not in Megatron-LM" if model.is_dsv4 else "mtp_layer_pattern"):
            megatron_args(model, Plan(tp=1, pp=1, dp=8, gbs=64))
        return
    args = megatron_args(model, Plan(tp=1, pp=1, dp=8, gbs=64))
    assert f"--position-embedding-type {model.position_embedding_type}" in args
    assert ("--disable-bias-linear" in args) == (not model.add_bias_linear)
    assert ("--apply-layernorm-1p" in args) == model.layernorm_zero_centered_gamma
    assert f"--hidden-dropout {model.hidden_dropout}" in args and f"--tokenizer-type {model.tokenizer_type}" in args
    assert nemo2_recipe(model, Plan(tp=1, pp=1, dp=8, gbs=64))["model"]["config"]["rotary_base"] == model.rotary_base


@pytest.mark.parametrize("precision, fp32, flag", [("fp16", True, "--accumulate-allreduce-grads-in-fp32"),
                                                    ("bf16", True, "--accumulate-allreduce-grads-in-fp32"),
                                                    ("bf16", False, "--grad-reduce-in-bf16")])
def test_gradient_reduction_as_priced(precision, fp32, flag):
    args = megatron_args(io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=64, precision=precision,
                                                          grad_reduce_in_fp32=fp32))
    assert flag in args and ("--fp16" in args) == (precision == "fp16")


@pytest.mark.parametrize("precision", sorted(FP8_RECIPES))
def test_one_fp8_format_per_recipe_in_every_block(precision):
    model, plan = io.load_model("llama3-8b"), Plan(tp=2, pp=1, dp=4, gbs=64, sp=True, precision=precision)
    fmt = FP8_RECIPES[precision].fp8_format
    assert f"--fp8-format {fmt}" in megatron_args(model, plan)
    assert te_recipe(plan)["args"]["fp8_format"] == fmt.upper() and f"Format.{fmt.upper()}" in te_recipe(plan)["python"]
    assert nemo2_recipe(model, plan)["trainer"]["plugins"]["fp8"] == fmt
    nemo1 = nemo1_config(model, plan)["model"]
    assert nemo1["fp8_hybrid"] == (fmt == "hybrid") and nemo1["fp8_e4m3"] == (fmt == "e4m3")
    assert nemo1["transformer_engine"] is True and nemo1["fp8_param_gather"] is False


def test_environment_follows_validate_args():
    assert megatron_env(CP2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_env(Plan(tp=1, pp=8, dp=8, gbs=64)) == {}
    assert megatron_env(dataclasses.replace(CP2, fsdp=True)) == {}  # Megatron-FSDP asserts != 1


def test_uneven_stages_and_fsdp_are_emitted_only_when_set():
    model = io.load_model("llama3.1-405b")
    plain = megatron_args(model, CP2)
    assert not any("pipeline-num-layers" in a or "in-pipeline-split" in a or "fsdp" in a for a in plain)
    uneven = dataclasses.replace(CP2, num_layers_in_first_pipeline_stage=30, num_layers_in_last_pipeline_stage=31,
                                 account_for_loss_in_pipeline_split=True, fsdp=True)
    args = megatron_args(model, uneven)
    for flag in ("--decoder-first-pipeline-num-layers 30", "--decoder-last-pipeline-num-layers 31",
                 "--account-for-loss-in-pipeline-split", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy optim_grads_params", "--ckpt-format fsdp_dtensor"):
        assert flag in args
    strategy = nemo2_recipe(model, uneven)["trainer"]["strategy"]
    assert strategy["num_layers_in_first_pipeline_stage"] == 30 and strategy["fsdp"] == "megatron"
    assert strategy["account_for_loss_in_pipeline_split"] is True


def test_nvfp4_is_written_as_megatron_and_megatron_bridge_take_it():
    """Megatron-LM flags, TE's NVFP4BlockScaling with its defaults (RHT, stochastic rounding, 2D
    weight scaling: the priced recipe), Megatron-Bridge's recipe name; NeMo 1.x / 2 cannot run it."""
    from autoparallel.report.export import export_document
    model = io.load_model("llama3.1-8b")
    plan = Plan(tp=1, pp=1, dp=8, gbs=128, precision="nvfp4", fp8_bf16_edge_layers=2)
    args = megatron_args(model, plan)
    for flag in ("--fp4-format e2m1", "--fp4-recipe nvfp4", "--first-last-layers-bf16",
                 "--num-layers-at-start-in-bf16 2", "--num-layers-at-end-in-bf16 2", "--bf16"):
        assert flag in args, flag
    assert not any(a.startswith("--fp8") for a in args)
    assert te_recipe(plan) == {"class": "transformer_engine.common.recipe.NVFP4BlockScaling", "args": {},
                               "python": "NVFP4BlockScaling()"}
    doc = export_document(model, plan, {})
    assert doc["megatron_bridge_mixed_precision"] == {
        "recipe": "bf16_with_nvfp4_mixed", "fields": {"grad_reduce_in_fp32": True, "first_last_layers_bf16": True,
                                                      "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 2}}
    assert "no NeMo 1.x / NeMo 2 form" in doc["nemo"]["unsupported"] and "unsupported" in doc["nemo2"]
    fp8 = export_document(model, dataclasses.replace(plan, precision="mxfp8", fp8_bf16_edge_layers=0), {})
    assert fp8["megatron_bridge_mixed_precision"]["recipe"] == "bf16_with_mxfp8_mixed" and "trainer" in fp8["nemo2"]


def test_memory_knobs_are_written_as_priced_in_every_block():
    """Issue 23: FP8 param gather, BF16 Adam moments and CUDA graphs, in the flags and in NeMo 2's
    fields (Megatron-Core names); none of them when the plan has them off."""
    model = io.load_model("gpt3-175b")
    plan = dataclasses.replace(CP2, fp8_param_gather=True, precision_aware_optimizer=True, cuda_graph="layer")
    args = megatron_args(model, plan)
    for flag in ("--fp8-param-gather", "--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                 "--exp-avg-sq-dtype bf16", "--cuda-graph-impl transformer_engine"):
        assert flag in args, flag
    plain = " ".join(megatron_args(model, CP2))
    assert "--fp8-param-gather" not in plain and "precision-aware" not in plain and "cuda-graph" not in plain
    full = megatron_args(model, dataclasses.replace(CP2, cuda_graph="full_iteration"))
    assert {"--cuda-graph-impl local", "--cuda-graph-scope full_iteration", "--no-check-for-nan-in-loss-and-grad"} <= set(full)
    nemo2 = nemo2_recipe(model, plan)
    assert nemo2["trainer"]["plugins"]["fp8_param_gather"] is True
    assert nemo2["optim"]["config"] == {"use_distributed_optimizer": True, "use_precision_aware_optimizer": True,
                                        "exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16"}
    assert nemo2["model"]["config"]["cuda_graph_impl"] == "transformer_engine"
    assert nemo2["model"]["config"]["cuda_graph_scope"] == "full"
    assert nemo2_recipe(model, CP2)["model"]["config"]["cuda_graph_impl"] == "none"


@pytest.mark.parametrize("gpus, per_node, expect", [(64, 8, (8, 8)), (4, 8, (1, 4)), (12, 8, (2, 6)),
                                                    (64, 4, (16, 4)), (72, 4, (18, 4))])
def test_nodes_never_change_the_gpu_count(gpus, per_node, expect):
    assert node_layout(gpus, per_node) == expect
    plan = Plan(tp=1, pp=1, dp=gpus, gbs=gpus)
    trainer = nemo1_config(io.load_model("llama3-8b"), plan, per_node)["trainer"]
    assert trainer["devices"] * trainer["num_nodes"] == gpus


@pytest.mark.parametrize("gpus, per_node, words", [(8, 8, "1 node x 8 GPUs"), (16, 8, "2 nodes x 8 GPUs"),
                                                   (1, 8, "1 node x 1 GPU"), (3, 1, "3 nodes x 1 GPU")])
def test_node_layout_reads_as_english(gpus, per_node, words):
    assert node_layout_text(gpus, per_node) == words
    hw = dataclasses.replace(io.load_hardware("h100-sxm"), gpus_per_node=per_node)
    script = train_script(io.load_model("gpt3-5b"), Plan(tp=1, pp=1, dp=gpus, gbs=gpus), hw, "t")
    assert f"# {words}. Generated by autoparallel" in script and "(s)" not in script


@pytest.mark.parametrize("gpus, hardware", [(8, "h100-sxm"), (64, "gb200")])
def test_train_script_runs_the_exported_flags(gpus, hardware, tmp_path):
    model, hw = io.load_model("gpt3-5b"), io.load_hardware(hardware)
    plan = Plan(tp=2, pp=1, dp=gpus // 2, gbs=gpus * 4, sp=True, precision="fp8-current")
    script = train_script(model, plan, hw, "test")
    (tmp_path / "train.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.sh")]).returncode == 0
    nodes, per_node = node_layout(gpus, hw.gpus_per_node)
    assert ("#SBATCH --nodes=" in script) == (nodes > 1) and f"--nproc-per-node {per_node}" in script
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    printer = script.split("\ntorchrun ")[0].split("\nMASTER_ADDR=")[0] + '\nprintf "%s\\n" "${MODEL_ARGS[@]}" ' \
        '"${TOKENIZER_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${PRECISION_ARGS[@]}"\n'
    env = {"PATH": "/usr/bin:/bin", "MEGATRON_LM": "/m", "DATA_PATH": "/d", "CHECKPOINT_DIR": "/c",
           "VOCAB_FILE": "/v.json", "MERGE_FILE": "/m.txt"}
    out = subprocess.run(["bash", "-c", printer], capture_output=True, text=True, env=env, check=True).stdout
    expanded = [a.replace('"$VOCAB_FILE"', "/v.json").replace('"$MERGE_FILE"', "/m.txt")
                for a in megatron_args(model, plan)]
    assert out.split("\n")[:-1] == [token for a in expanded for token in a.split(" ")]
    missing = subprocess.run(["bash", "-c", printer], capture_output=True, text=True,
                             env={k: v for k, v in env.items() if k != "DATA_PATH"})
    assert missing.returncode != 0 and "set DATA_PATH" in missing.stderr


def _report_imports() -> dict[str, set[str]]:
    """Which autoparallel.report modules each one imports, at the top or inside a function."""
    import ast
    from pathlib import Path

    import autoparallel.report as package
    graph = {}
    for path in Path(package.__file__).parent.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autoparallel.report"):
                found |= ({node.module.split(".")[2]} if node.module.count(".") >= 2
                          else {alias.name for alias in node.names})
        graph[path.stem] = found - {path.stem}
    return graph


def test_the_exports_import_no_circle():
    graph = _report_imports()
    assert graph["shared"] <= set() and "export" not in graph["nemo"] and "launch" not in graph["nemo"]

    def reach(start: str, seen: set[str]) -> set[str]:
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen
    assert not [m for m in graph if m in reach(m, set())], graph


@pytest.mark.parametrize("module", ["shared", "export", "nemo", "launch", "moe_export"])
def test_each_export_module_imports_alone(module):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", f"import autoparallel.report.{module}"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


def test_fp8_attention_is_refused_by_megatron_lm_exports_and_written_for_nemo():
    """Issue 27: Megatron-LM's pretrain_gpt.py has no flag for TransformerConfig.fp8_dot_product_attention
    (benchmarks/bench_megatron_args.py shows its parser refusing --fp8-dot-product-attention), so a
    plan priced with FP8 attention has no Megatron-LM flags or train.sh; NeMo's configs carry it."""
    from autoparallel.errors import UserError
    model, plan = io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=128, precision="fp8-current", fp8_attention=True)
    with pytest.raises(UserError, match="FP8 dot-product attention has no Megatron-LM flag"):
        megatron_args(model, plan)
    with pytest.raises(UserError, match="FP8 dot-product attention has no Megatron-LM flag"):
        train_script(model, plan, io.load_hardware("h100-sxm"), "")
    assert "fp8-dot-product" not in " ".join(megatron_args(model, dataclasses.replace(plan, fp8_attention=False)))
    assert nemo2_recipe(model, plan)["model"]["config"]["fp8_dot_product_attention"] is True


def test_an_fp8_kept_swiglu_input_is_written_where_a_config_takes_it():
    """TransformerConfig.activation_func_fp8_input_store has no Megatron-LM flag (arguments.py,
    d98e8a6, lists it among the fields without one): best.yaml says so, NeMo's configs set it."""
    from autoparallel.report.export import export_document
    model = io.load_model("llama3-70b")
    plan = dataclasses.replace(CP2, activation_func_fp8_input_store=True)
    doc = export_document(model, plan, {})
    assert set(doc["megatron_lm_unflagged"]) == {"activation_func_fp8_input_store"}
    assert "fp8-input-store" not in " ".join(megatron_args(model, plan))
    assert nemo2_recipe(model, plan)["model"]["config"]["activation_func_fp8_input_store"] is True
    assert nemo1_config(model, plan)["model"]["activation_func_fp8_input_store"] is True
    assert "megatron_lm_unflagged" not in export_document(model, CP2, {})
    assert "activation_func_fp8_input_store" not in nemo2_recipe(model, CP2)["model"]["config"]


def test_settings_megatron_lm_cannot_state_are_named_not_flagged():
    """TE's fused loss (refused by Megatron-LM since 168cb15d70) and Apex's master remainders are
    written off for Megatron-LM and set in the NeMo 2 config where it has the key."""
    from autoparallel.report.export import megatron_lm_unflagged
    model = io.load_model("llama3-8b")
    plan = Plan(tp=1, pp=1, dp=8, gbs=128, mbs=1, cross_entropy_loss_fusion=True, param_remainders=True)
    assert set(megatron_lm_unflagged(plan)) == {"cross_entropy_loss_fusion", "param_remainders"}
    assert not any("cross-entropy" in a for a in megatron_args(model, plan))
    config = nemo2_recipe(model, plan)
    assert "'cross_entropy_fusion_impl': 'te'" in str(config)
    # Megatron keeps remainders itself under the precision-aware optimizer without FP8 parameters.
    megatron_kept = dataclasses.replace(plan, cross_entropy_loss_fusion=False, precision_aware_optimizer=True)
    assert megatron_lm_unflagged(megatron_kept) == {}


def test_a_pipelined_forward_rs_is_written_as_nemo_1_takes_it_and_named_for_megatron_lm():
    """NeMo 1's ub_tp_comm_overlap_cfg (TE initialize_ub's ub_cfgs) as NVIDIA's MLPerf LoRA TP4
    conf/tp_overlap/h100tp4mbs1.yaml writes proj_fprop / fc2_fprop; Megatron-LM takes it only as a
    --tp-comm-overlap-cfg YAML file, NeMo 2 as a callback dataclass: both named, not flagged."""
    from autoparallel.report.export import export_document, megatron_lm_unflagged
    model = io.load_model("llama2-70b")
    ub = Plan(tp=4, pp=1, dp=2, gbs=8, sp=True, precision="fp8-delayed", tp_comm_overlap=True)
    plan = dataclasses.replace(ub, tp_overlap_rs_pipeline=True)
    cfg = nemo1_config(model, plan)["model"]["ub_tp_comm_overlap_cfg"]
    assert cfg == {"proj_fprop": {"method": "pipeline", "num_sm": 32, "cga_size": 2, "num_splits": 4,
                                  "set_sm_margin": 1, "atomic_gemm": 1, "fp8_buf": 1},
                   "fc2_fprop": {"method": "pipeline", "num_sm": 16, "cga_size": 2, "num_splits": 4,
                                 "set_sm_margin": 1, "atomic_gemm": 1, "fp8_buf": 0}}
    assert set(megatron_lm_unflagged(plan)) == {"tp_overlap_rs_pipeline"}
    assert "tp-comm-overlap-cfg" in export_document(model, plan, {})["megatron_lm_unflagged"]["tp_overlap_rs_pipeline"]
    assert "--tp-comm-overlap" in megatron_args(model, plan)
    # The default (ring exchange) states nothing more.
    assert "ub_tp_comm_overlap_cfg" not in nemo1_config(model, ub)["model"]
    assert megatron_lm_unflagged(ub) == {}


def test_the_fused_grouped_mlp_exports_the_op_fuser_its_glu_interleave_and_tes_environment_switch():
    """Megatron-Bridge's cutedsl_fused_grouped_mlp (v0.5.0 scripts/performance/utils/overrides.py,
    perf_plugins.py): use_transformer_engine_op_fuser, moe_mlp_glu_interleave_size 32 and
    NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; Megatron-LM generates the two flags from TransformerConfig."""
    model = io.load_model("mixtral-8x7b")
    base = Plan(tp=1, pp=1, dp=8, ep=8, gbs=64, sp=False, precision="mxfp8", moe_token_dispatcher_type="alltoall")
    fused = dataclasses.replace(base, cutedsl_fused_grouped_mlp=True)
    args = " ".join(megatron_args(model, fused))
    assert "--use-transformer-engine-op-fuser" in args and "--moe-mlp-glu-interleave-size 32" in args
    assert megatron_env(fused) == {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"}
    config = nemo2_recipe(model, fused)["model"]["config"]
    assert config["use_transformer_engine_op_fuser"] is True and config["moe_mlp_glu_interleave_size"] == 32
    assert "--use-transformer-engine-op-fuser" not in " ".join(megatron_args(model, base))
    assert megatron_env(base) == {} and "use_transformer_engine_op_fuser" not in nemo2_recipe(model, base)["model"]["config"]
