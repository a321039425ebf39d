"""A plan as Megatron-LM runs it: the command-line flags, the environment, the TransformerEngine
recipe, and best.yaml's document (NeMo's two config shapes live in ``report.nemo``, the launch
script in ``report.launch``, the constants they share in ``report.shared``).

The flags define the model completely (a flag Megatron-LM defaults differently from the preset is
always written) and the run exactly as the cost model priced it: precision and gradient
reduction, the overlaps, ring (p2p) context parallelism, FP8 parameter all-gathers
(``--fp8-param-gather``), BF16 Adam moments, CUDA graphs, uneven pipeline stages and FSDP when the
plan uses them. Flag names are
those of megatron/training/arguments.py; ``benchmarks/bench_megatron_args.py`` runs Megatron-LM's
own parse_args / validate_args / TransformerConfig on them.
"""

from __future__ import annotations

from autoparallel.costmodel import pipeline
from autoparallel.errors import UserError
from autoparallel.report import hybrid_export, moe_export
from autoparallel.report.nemo import nemo1_config, nemo2_recipe
from autoparallel.report.shared import (AMAX_COMPUTE_ALGO, AMAX_HISTORY_LEN, BRIDGE_PRECISION_RECIPES,
                                        CUDA_GRAPHS, FP4_FORMAT, FP4_RECIPE, FP4_TE_CLASS, FP8_RECIPES,
                                        megatron_unsupported, nemo_unsupported,
                                        MAKE_VOCAB_SIZE_DIVISIBLE_BY, NORMALIZATION, TOKENIZER_FILES,
                                        cp_comm_type, hierarchical_cp_sizes, hybrid_unsupported,
                                        recompute_layers)
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


def model_flags(model: ModelSpec, plan: Plan | None = None) -> list[str]:
    """The architecture: every flag whose Megatron-LM default differs from the preset (a hybrid
    model's pattern with the ``plan``'s pipeline stages marked, ``report.hybrid_export``)."""
    a = [f"--num-layers {model.num_layers}", f"--hidden-size {model.hidden_size}",
         f"--ffn-hidden-size {model.ffn_hidden_size}", f"--num-attention-heads {model.num_attention_heads}"]
    if model.query_groups != model.num_attention_heads:
        a += ["--group-query-attention", f"--num-query-groups {model.query_groups}"]
    if model.kv_channels:
        a.append(f"--kv-channels {model.kv_channels}")
    a += [f"--seq-length {model.seq_length}", f"--max-position-embeddings {model.context_length}",
          f"--position-embedding-type {model.position_embedding_type}"]
    if model.position_embedding_type == "rope":
        a.append(f"--rotary-base {model.rotary_base}")
        if model.rotary_percent != 1.0:
            a.append(f"--rotary-percent {model.rotary_percent}")
        if model.rope_scaling_factor:
            a += ["--use-rope-scaling", f"--rope-scaling-factor {model.rope_scaling_factor}"]
    if not model.add_bias_linear:
        a.append("--disable-bias-linear")
    a += [f"--normalization {NORMALIZATION[model.normalization]}", f"--norm-epsilon {model.norm_epsilon}"]
    if model.layernorm_zero_centered_gamma:
        a.append("--apply-layernorm-1p")
    if model.activation == "swiglu":
        a.append("--swiglu")
    elif model.activation == "squared_relu":
        a.append("--squared-relu")
        if model.add_bias_linear:  # TransformerConfig: "When bias_activation_fusion is True, activation
            a.append("--no-bias-gelu-fusion")  # function should be either gelu, swiglu, or quick_geglu"
    if not model.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += [f"--hidden-dropout {model.hidden_dropout}", f"--attention-dropout {model.attention_dropout}"]
    return a + moe_export.model_flags(model) + hybrid_export.model_flags(model, plan)


def tokenizer_flags(model: ModelSpec) -> list[str]:
    a = [f"--tokenizer-type {model.tokenizer_type}"]
    if model.tokenizer_type == "HuggingFaceTokenizer":
        a.append(f"--tokenizer-model {model.tokenizer_model}")
    elif model.tokenizer_type == "NullTokenizer":
        # NullTokenizer adds the end-of-document token to --vocab-size.
        a.append(f"--vocab-size {model.vocab_size - 1}")
    a += [f'{flag} "${variable}"' for flag, variable in TOKENIZER_FILES.get(model.tokenizer_type, {}).items()]
    return a + [f"--make-vocab-size-divisible-by {MAKE_VOCAB_SIZE_DIVISIBLE_BY}"]


def parallel_flags(model: ModelSpec, plan: Plan) -> list[str]:
    a = [f"--tensor-model-parallel-size {plan.tp}", f"--pipeline-model-parallel-size {plan.pp}",
         f"--context-parallel-size {plan.cp}"]
    if plan.pipeline_model_parallel_layout:  # sets vp too; Megatron refuses it with the vp flags
        a.append(f"--pipeline-model-parallel-layout '{plan.pipeline_model_parallel_layout}'")
    elif plan.vp > 1:  # the only VP flag Megatron accepts together with uneven stages
        a.append(f"--num-virtual-stages-per-pipeline-rank {plan.vp}")
    microbatches = plan.gbs // (plan.mbs * plan.dp)
    if plan.vp > 1 and microbatches % plan.pp:  # Megatron's default group (pp) would not divide them
        group = pipeline.microbatch_group_size(microbatches, plan.pp)
        a.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}")
    if plan.num_layers_in_first_pipeline_stage:
        a.append(f"--decoder-first-pipeline-num-layers {plan.num_layers_in_first_pipeline_stage}")
    if plan.num_layers_in_last_pipeline_stage:
        a.append(f"--decoder-last-pipeline-num-layers {plan.num_layers_in_last_pipeline_stage}")
    if plan.account_for_embedding_in_pipeline_split:
        a.append("--account-for-embedding-in-pipeline-split")
    if plan.account_for_loss_in_pipeline_split:
        a.append("--account-for-loss-in-pipeline-split")
    if plan.cp > 1:
        a.append(f"--cp-comm-type {cp_comm_type(model, plan)}")
        if sizes := hierarchical_cp_sizes(model, plan):
            a.append(f"--hierarchical-context-parallel-sizes {' '.join(map(str, sizes))}")
    a += moe_export.parallel_flags(model, plan)
    if plan.sp and plan.tp > 1:
        a.append("--sequence-parallel")
    if model.is_hybrid:  # the | marks of --hybrid-layer-pattern state the stages
        a = hybrid_export.without_pipe_stated(a)
    a += [f"--micro-batch-size {plan.mbs}", f"--global-batch-size {plan.gbs}"]
    if plan.recompute == "selective":
        a.append("--recompute-granularity selective")
    elif plan.recompute == "full":
        a += ["--recompute-granularity full", "--recompute-method block",
              f"--recompute-num-layers {recompute_layers(model, plan)}"]
    if plan.distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if plan.fsdp:  # Megatron-FSDP: weights, gradients and optimizer states sharded over dp*cp
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
              "--ckpt-format fsdp_dtensor"]
    if plan.cpu_offloading_num_layers:  # activations only (weights stay on the GPU)
        a.append(f"--cpu-offloading-num-layers {plan.cpu_offloading_num_layers}")  # sets --cpu-offloading
    if plan.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if plan.overlap_param_gather:
        a.append("--overlap-param-gather")
    if plan.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    a += cuda_graph_flags(plan)
    a.append(f"--attention-backend {'auto' if plan.flash_attention else 'unfused'}")
    return a + ["--transformer-impl transformer_engine"]


def cuda_graph_flags(plan: Plan) -> list[str]:
    """Megatron-LM's CUDA-graph flags: TransformerEngine's per-layer graphs of whole layers (the
    default scope: the whole layer), or one graph of the forward-backward, which needs the NaN
    check that syncs with the host off."""
    if plan.cuda_graph == "none":
        return []
    keys = CUDA_GRAPHS[plan.cuda_graph]
    a = [f"--cuda-graph-impl {keys['cuda_graph_impl']}"]
    if plan.cuda_graph == "full_iteration":
        a += [f"--cuda-graph-scope {keys['cuda_graph_scope']}", "--no-check-for-nan-in-loss-and-grad"]
    return a


def optimizer_flags(plan: Plan) -> list[str]:
    """FP8 weights gathered in FP8; Adam's moments in BF16 (the precision-aware optimizer)."""
    a = ["--fp8-param-gather"] if plan.fp8_param_gather else []
    if plan.precision_aware_optimizer:
        a += ["--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
    return a


def precision_flags(plan: Plan) -> list[str]:
    a = ["--fp16" if plan.precision == "fp16" else "--bf16"]
    if plan.grad_reduce_in_fp32:  # FP32 main grads, reduced in FP32 (fp16 needs it said)
        a.append("--accumulate-allreduce-grads-in-fp32")
    elif plan.precision != "fp16":
        a.append("--grad-reduce-in-bf16")
    if plan.is_fp8:
        fp8 = FP8_RECIPES[plan.precision]
        a += [f"--fp8-format {fp8.fp8_format}", f"--fp8-recipe {fp8.megatron_recipe}"]
        if plan.precision == "fp8-delayed":
            a += ["--fp8-margin 0", f"--fp8-amax-history-len {AMAX_HISTORY_LEN}",
                  f"--fp8-amax-compute-algo {AMAX_COMPUTE_ALGO}"]
    if plan.is_fp4:
        a += [f"--fp4-format {FP4_FORMAT}", f"--fp4-recipe {FP4_RECIPE}"]
    if plan.is_quantized and plan.fp8_bf16_edge_layers:  # Megatron keeps them in BF16 under FP8 and FP4
        n = plan.fp8_bf16_edge_layers
        a += ["--first-last-layers-bf16", f"--num-layers-at-start-in-bf16 {n}", f"--num-layers-at-end-in-bf16 {n}"]
    return a + optimizer_flags(plan)


def megatron_arg_groups(model: ModelSpec, plan: Plan) -> dict[str, list[str]]:
    """The flags in the groups train.sh writes them in, one flag (with its value) per entry; a
    UserError when Megatron-LM has no flag for part of the plan (``shared.megatron_unsupported``)."""
    if why := megatron_unsupported(plan) or hybrid_unsupported(model):
        raise UserError(f"Megatron-LM cannot run this plan as priced: {why}")
    return {"MODEL_ARGS": model_flags(model, plan), "TOKENIZER_ARGS": tokenizer_flags(model),
            "PARALLEL_ARGS": parallel_flags(model, plan), "PRECISION_ARGS": precision_flags(plan)}


def megatron_args(model: ModelSpec, plan: Plan) -> list[str]:
    """Megatron-LM command-line arguments for the model and the plan, one flag per entry."""
    return [flag for group in megatron_arg_groups(model, plan).values() for flag in group]


def megatron_env(plan: Plan) -> dict[str, str]:
    """Environment variables Megatron-LM's validate_args demands of this plan, and those
    TransformerEngine reads to run what the plan prices."""
    env = {}
    # "Using tensor model parallelism or context parallelism require setting the environment
    # variable CUDA_DEVICE_MAX_CONNECTIONS to 1" (before Blackwell, harmless after); Megatron-FSDP
    # asserts the opposite ("FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one").
    if (plan.tp > 1 or plan.cp > 1) and not plan.fsdp:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    # TE v2.16 ops/fused/forward_grouped_mlp.py is_supported: the fused grouped MLP is registered only
    # under this variable (Megatron-Bridge v0.5.0 scripts/performance/perf_plugins.py sets it where
    # cutedsl_fused_grouped_mlp is on); the flags set --use-transformer-engine-op-fuser.
    if plan.cutedsl_fused_grouped_mlp:
        env["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] = "1"
    return env


def te_recipe(plan: Plan) -> dict | None:
    """The TransformerEngine recipe object (class and arguments), or None for BF16/FP16."""
    if plan.is_fp4:  # Megatron's get_fp4_recipe: the defaults (RHT, stochastic rounding, 2D weights on)
        return {"class": f"transformer_engine.common.recipe.{FP4_TE_CLASS}", "args": {},
                "python": f"{FP4_TE_CLASS}()"}
    if not plan.is_fp8:
        return None
    fp8 = FP8_RECIPES[plan.precision]
    args = {"fp8_format": fp8.fp8_format.upper()}
    if plan.precision == "fp8-delayed":
        args.update(margin=0, amax_history_len=AMAX_HISTORY_LEN, amax_compute_algo=AMAX_COMPUTE_ALGO)
    python = ", ".join(f"{k}=Format.{v}" if k == "fp8_format" else f"{k}={v!r}" for k, v in args.items())
    return {"class": f"transformer_engine.common.recipe.{fp8.te_class}", "args": args,
            "python": f"{fp8.te_class}({python})"}


def bridge_precision(plan: Plan) -> dict:
    """Megatron-Bridge's mixed-precision recipe for the plan's precision and the fields the plan
    sets on it (its recipes default some of them otherwise, e.g. FP8 param gather on)."""
    fields = {"grad_reduce_in_fp32": plan.grad_reduce_in_fp32}
    if plan.is_fp8:
        fields["fp8_param_gather"] = plan.fp8_param_gather
    if plan.is_quantized:
        n = plan.fp8_bf16_edge_layers
        fields.update(first_last_layers_bf16=bool(n), num_layers_at_start_in_bf16=n, num_layers_at_end_in_bf16=n)
    return {"recipe": BRIDGE_PRECISION_RECIPES[plan.precision], "fields": fields}


def bridge_peft(model: ModelSpec, plan: Plan) -> dict:
    """Megatron-Bridge's ``LoRA`` (``cfg.peft``) for a LoRA run: its class and the fields to set
    (067f987df src/megatron/bridge/peft/lora.py: dim, target_modules, dropout, a2a_experimental,
    sequence_parallel_input_regather)."""
    ft = model.finetune
    return {"class": "megatron.bridge.peft.lora.LoRA",
            "fields": {"dim": ft.lora_rank, "target_modules": list(ft.lora_targets), "dropout": ft.lora_dropout,
                       "a2a_experimental": ft.lora_a2a, "sequence_parallel_input_regather": plan.lora_input_regather}}


# TransformerConfig fields with no Megatron-LM flag (arguments.py leaves them out of the flags it
# generates from TransformerConfig, d98e8a6); NeMo 1/2 and Megatron-Bridge set them on the config.
UNFLAGGED_FIELDS = ("tp_only_amax_red", "activation_func_fp8_input_store")
MEGATRON_LM_UNFLAGGED = {
    **{name: f"TransformerConfig.{name}=True has no Megatron-LM flag: the nemo / nemo2 configs here set it, "
             "Megatron-Bridge on its model provider" for name in UNFLAGGED_FIELDS},
    # Megatron-Core keeps master remainders only under --use-precision-aware-optimizer
    # without FP8 parameters (OptimizerConfig.store_param_remainders).
    "param_remainders": "16-bit master-weight remainders without the precision-aware optimizer "
                        "are Apex DistributedFusedAdam's (the nemo config's distributed_fused_adam); "
                        "Megatron-LM keeps FP32 master weights there",
    # Megatron-LM 168cb15d70 (2026-06-03, "Disable TE cross entropy loss fusion")
    # asserts against --cross-entropy-loss-fusion with --cross-entropy-fusion-impl te.
    "cross_entropy_loss_fusion": "TransformerEngine's fused cross-entropy: Megatron-LM refuses "
                                 "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te since "
                                 "168cb15d70; Megatron-Bridge and NeMo 2 set "
                                 "cross_entropy_fusion_impl='te' on the model config",
    # Megatron-LM's --tp-comm-overlap-cfg takes a YAML file's path (TE initialize_ub's ub_cfgs);
    # NeMo 2's MegatronCommOverlapCallback a TransformerLayerTPOverlapCfg whose proj_fprop / fc2_fprop
    # would be PipelineOverlapCfg (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py).
    "tp_overlap_rs_pipeline": "the pipelined forward reduce-scatters are a userbuffers config, not a flag: "
                              "give Megatron-LM --tp-comm-overlap-cfg a YAML file holding nemo.model."
                              "ub_tp_comm_overlap_cfg (NeMo 1 sets it as is); the nemo2 recipe does not "
                              "state it (MegatronCommOverlapCallback's tp_comm_overlap_cfg would take "
                              "PipelineOverlapCfg for proj_fprop and fc2_fprop)"}


def megatron_lm_unflagged(plan: Plan) -> dict:
    """The plan's settings the Megatron-LM flags cannot state, each with what does state it."""
    unflagged = {**{name: getattr(plan, name) for name in UNFLAGGED_FIELDS},
                 "param_remainders": plan.param_remainders and not (plan.precision_aware_optimizer
                                                                    and not plan.fp8_param_gather),
                 "cross_entropy_loss_fusion": plan.cross_entropy_loss_fusion,
                 "tp_overlap_rs_pipeline": plan.tp_overlap_rs_pipeline and plan.tp_comm_overlap}
    return {k: MEGATRON_LM_UNFLAGGED[k] for k, on in unflagged.items() if on}


def export_document(model: ModelSpec, plan: Plan, metrics: dict, gpus_per_node: int = 8) -> dict:
    """Everything best.yaml holds for one ranked plan; where Megatron-LM's flags cannot state the
    model or the plan (FP8 attention), why, in place of the flags (best.yaml was not written: a
    saved search whose rank 1 ran FP8 attention failed after pricing)."""
    unflagged = hybrid_unsupported(model) or megatron_unsupported(plan)
    return {
        "model": model.name,
        "plan": plan.as_dict(),
        "predicted": metrics,
        "environment": megatron_env(plan),
        "megatron_args": {"unsupported": unflagged} if unflagged else megatron_args(model, plan),
        **({"megatron_entry_script": hybrid_export.entry_script(model),
            "megatron_bridge_model": hybrid_export.bridge_provider(model, plan)} if model.is_hybrid else {}),
        "nemo": ({"unsupported": why} if (why := nemo_unsupported(plan, model))
                 else nemo1_config(model, plan, gpus_per_node)),
        "nemo2": {"unsupported": why} if why else nemo2_recipe(model, plan, gpus_per_node),
        "megatron_bridge_mixed_precision": bridge_precision(plan),
        **({"megatron_bridge_peft": bridge_peft(model, plan)} if model.finetune is not None and model.finetune.lora
           else {}),
        "transformer_engine_recipe": te_recipe(plan),
        **({"megatron_lm_unflagged": unflagged} if (unflagged := megatron_lm_unflagged(plan)) else {}),
    }
