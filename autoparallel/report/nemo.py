"""A plan as NeMo takes it: the 1.x YAML (megatron_gpt_config.yaml keys) and the 2.x ``llm``
recipe fields (``recipe.trainer.strategy``, ``recipe.trainer.plugins``, ``recipe.model.config``,
``recipe.data``, the comm-overlap callback).

Both blocks say the same run as the Megatron-LM flags of ``report.export``: TransformerEngine on,
the full architecture (activation, normalization, biases, positions, dropout, embedding tying),
the overlaps, and the FP8 format and recipe of ``shared.FP8_RECIPES``. NeMo's FP8 recipes gather
FP8 weights (``fp8_param_gather=True``); it is written as the plan has it (the cost model prices
either: FP8 weights kept without a BF16 copy, gathered at 1 B per parameter).
"""

from __future__ import annotations

from autoparallel.costmodel import tensor_parallel
from autoparallel.report import moe_export
from autoparallel.report.shared import (AMAX_COMPUTE_ALGO, AMAX_HISTORY_LEN, CUDA_GRAPHS, FP8_RECIPES,
                                        MAKE_VOCAB_SIZE_DIVISIBLE_BY, NORMALIZATION, cp_comm_type,
                                        hierarchical_cp_sizes, node_layout, recompute_layers)
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

NEMO1_ACTIVATION = {"gelu": "gelu", "swiglu": "fast-swiglu", "squared_relu": "squared-relu"}
NEMO2_ACTIVATION = {"gelu": "gelu", "swiglu": "silu", "squared_relu": "squared_relu"}  # with gated_linear_unit
NEMO1_TOKENIZER = {"HuggingFaceTokenizer": "huggingface", "GPT2BPETokenizer": "megatron",
                   "GPTSentencePieceTokenizer": "sentencepiece", "NullTokenizer": "null"}


def _recompute(model: ModelSpec, plan: Plan) -> tuple[str | None, str | None, int | None]:
    if plan.recompute == "none":
        return None, None, None
    if plan.recompute == "selective":
        return "selective", None, None
    return "full", "block", recompute_layers(model, plan)


def _shape(model: ModelSpec) -> dict:
    """The layer shapes, under the same names in NeMo 1.x and 2.x."""
    return {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
            "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
            "num_query_groups": model.query_groups, "kv_channels": model.kv_channels}


def _p2p(plan: Plan) -> dict:
    """Pipeline send/receive as Megatron-LM runs it: overlapped when interleaved, else batched."""
    return {"overlap_p2p_comm": plan.vp > 1, "batch_p2p_comm": plan.pp > 1 and plan.vp == 1}


def _fp8(plan: Plan) -> dict:
    """FP8 keys shared by NeMo 1.x (model.*) and 2.x (MegatronMixedPrecision)."""
    if not plan.is_fp8:
        return {"fp8": None}
    fp8 = FP8_RECIPES[plan.precision]
    out = {"fp8": fp8.fp8_format, "fp8_recipe": fp8.megatron_recipe, "fp8_margin": 0,
           "fp8_amax_history_len": AMAX_HISTORY_LEN, "fp8_amax_compute_algo": AMAX_COMPUTE_ALGO,
           "fp8_param_gather": plan.fp8_param_gather}
    if plan.fp8_bf16_edge_layers:
        out.update(first_last_layers_bf16=True, num_layers_at_start_in_bf16=plan.fp8_bf16_edge_layers,
                   num_layers_at_end_in_bf16=plan.fp8_bf16_edge_layers)
    return out


def _optimizer_dtypes(plan: Plan) -> dict:
    """Megatron-Core OptimizerConfig keys of the precision-aware optimizer (BF16 Adam moments)."""
    if not plan.precision_aware_optimizer:
        return {}
    return {"use_precision_aware_optimizer": True, "exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16"}


def _trainer(plan: Plan, gpus_per_node: int, precision: str) -> dict:
    nodes, per_node = node_layout(plan.num_gpus, gpus_per_node)
    return {"devices": per_node, "num_nodes": nodes, "precision": precision}


def ub_rs_pipeline_cfg() -> dict:
    """The userbuffers settings (TE initialize_ub's ub_cfgs; NeMo 1's ub_tp_comm_overlap_cfg) of
    the pipelined forward reduce-scatters, as NVIDIA's MLPerf LoRA TP4 configs write them
    (``conf/tp_overlap/h100tp4mbs1.yaml``); the other Linears keep TE's / NeMo's defaults."""
    return {name: {"method": "pipeline", "num_sm": linear["num_sm"], "cga_size": 2,
                   "num_splits": tensor_parallel.PIPELINE_RS_SPLITS, "set_sm_margin": 1, "atomic_gemm": 1,
                   "fp8_buf": linear["fp8_buf"]}
            for name, linear in tensor_parallel.PIPELINE_RS_LINEARS.items()}


def nemo1_config(model: ModelSpec, plan: Plan, gpus_per_node: int = 8) -> dict:
    """NeMo 1.x trainer/model block (the keys of megatron_gpt_config.yaml)."""
    granularity, method, layers = _recompute(model, plan)
    fp8 = _fp8(plan)
    m: dict = {
        "mcore_gpt": True,
        "transformer_engine": True,
        "micro_batch_size": plan.mbs,
        "global_batch_size": plan.gbs,
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
        "pipeline_model_parallel_layout": plan.pipeline_model_parallel_layout or None,
        "context_parallel_size": plan.cp,
        # TransformerConfig fields, read from the model block as tp_only_amax_red is (below)
        **({"cp_comm_type": cp_comm_type(model, plan)} if plan.cp > 1 else {}),
        **({"hierarchical_context_parallel_sizes": hierarchical_cp_sizes(model, plan)}
           if hierarchical_cp_sizes(model, plan) else {}),
        "expert_model_parallel_size": plan.ep,
        "sequence_parallel": plan.sp,
        "encoder_seq_length": model.seq_length,
        "max_position_embeddings": model.context_length,
        **_shape(model),
        "activation": NEMO1_ACTIVATION[model.activation],
        "normalization": "layernorm1p" if model.layernorm_zero_centered_gamma else model.normalization,
        "layernorm_epsilon": model.norm_epsilon,
        "bias": model.add_bias_linear,
        "position_embedding_type": model.position_embedding_type,
        "rotary_base": model.rotary_base,
        "rotary_percentage": model.rotary_percent,
        "hidden_dropout": model.hidden_dropout,
        "attention_dropout": model.attention_dropout,
        "ffn_dropout": 0.0,
        "share_embeddings_and_output_weights": model.tie_embeddings,
        "make_vocab_size_divisible_by": MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        "tokenizer": {"library": NEMO1_TOKENIZER[model.tokenizer_type], "type": model.tokenizer_model or None},
        "activations_checkpoint_granularity": granularity,
        "activations_checkpoint_method": method,
        "activations_checkpoint_num_layers": layers,
        "ub_tp_comm_overlap": plan.tp_comm_overlap,
        **({"ub_tp_comm_overlap_cfg": ub_rs_pipeline_cfg()}
           if plan.tp_comm_overlap and plan.tp_overlap_rs_pipeline else {}),
        **_p2p(plan),
        "use_flash_attention": plan.flash_attention,
        "megatron_amp_O2": True,
        "fp8": plan.is_fp8,
        **moe_export.config_keys(model, plan),
        "optim": {
            "name": "distributed_fused_adam" if plan.distributed_optimizer else "fused_adam",
            "overlap_grad_sync": plan.overlap_grad_reduce,
            "overlap_param_sync": plan.overlap_param_gather,
            "grad_sync_dtype": "fp32" if plan.grad_reduce_in_fp32 else "bf16",
        },
    }
    if plan.is_fp8:
        m.update({"fp8_e4m3": fp8["fp8"] == "e4m3", "fp8_hybrid": fp8["fp8"] == "hybrid",
                  **{k: v for k, v in fp8.items() if k != "fp8"}})
    for name in ("tp_only_amax_red", "activation_func_fp8_input_store"):
        if getattr(plan, name):  # megatron_base_model reads it into TransformerConfig
            m[name] = True
    return {"trainer": _trainer(plan, gpus_per_node, "16-mixed" if plan.precision == "fp16" else "bf16-mixed"),
            "model": m}


def nemo2_recipe(model: ModelSpec, plan: Plan, gpus_per_node: int = 8) -> dict:
    """NeMo 2.x ``llm`` recipe fields: set each dotted path on a pretrain recipe
    (``recipe.trainer.strategy.tensor_model_parallel_size = ...``) or pass it as a NeMo-Run
    override on the command line. One helper per block of the recipe it fills (the strategy, the
    precision plugin, the comm-overlap callback, the model config), in the recipe's key order."""
    dtype = "torch.float16" if plan.precision == "fp16" else "torch.bfloat16"
    strategy = _nemo2_strategy(plan, dtype)
    plugins = _nemo2_plugins(plan, dtype)
    overlap = _nemo2_overlap(plan)
    config = _nemo2_model_config(model, plan)
    trainer = _trainer(plan, gpus_per_node, plugins.pop("precision"))
    return {
        "trainer": {"num_nodes": trainer["num_nodes"], "devices": trainer["devices"], "strategy": strategy,
                    "plugins": {"precision": trainer["precision"], **plugins},
                    "callbacks": {"MegatronCommOverlapCallback": overlap}},
        "model": {"config": config},
        "data": {"seq_length": model.seq_length, "micro_batch_size": plan.mbs, "global_batch_size": plan.gbs},
        "optim": {"config": {"use_distributed_optimizer": plan.distributed_optimizer, **_optimizer_dtypes(plan)}},
        **_finetune(model),
    }


def _nemo2_strategy(plan: Plan, dtype: str) -> dict:
    """``recipe.trainer.strategy`` (MegatronStrategy): the parallel sizes, the uneven pipeline
    split, FSDP and the DDP config, where NeMo 2 takes the layout itself."""
    return {
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
        "context_parallel_size": plan.cp,
        "sequence_parallel": plan.sp,
        "expert_model_parallel_size": plan.ep,
        "expert_tensor_parallel_size": plan.etp,
        "pipeline_dtype": dtype,
        "num_layers_in_first_pipeline_stage": plan.num_layers_in_first_pipeline_stage or None,
        "num_layers_in_last_pipeline_stage": plan.num_layers_in_last_pipeline_stage or None,
        "account_for_embedding_in_pipeline_split": plan.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": plan.account_for_loss_in_pipeline_split,
        "fsdp": "megatron" if plan.fsdp else None,
        "ddp": {
            "use_distributed_optimizer": plan.distributed_optimizer,
            "grad_reduce_in_fp32": plan.grad_reduce_in_fp32,
            "overlap_grad_reduce": plan.overlap_grad_reduce,
            "overlap_param_gather": plan.overlap_param_gather,
            "data_parallel_sharding_strategy": "optim_grads_params" if plan.fsdp else "no_shard",
        },
    }


def _nemo2_plugins(plan: Plan, dtype: str) -> dict:
    """``recipe.trainer.plugins`` (MegatronMixedPrecision): the 16-bit type and the FP8 recipe;
    its ``precision`` key is popped by ``nemo2_recipe`` for ``_trainer``."""
    return {"precision": "16-mixed" if plan.precision == "fp16" else "bf16-mixed",
            "params_dtype": dtype, "pipeline_dtype": dtype,
            "grad_reduce_in_fp32": plan.grad_reduce_in_fp32, **_fp8(plan)}


def _nemo2_overlap(plan: Plan) -> dict:
    """The MegatronCommOverlapCallback's arguments: NeMo 2 sets the TP, pipeline and DP overlaps
    there rather than in the model config."""
    return {"tp_comm_overlap": plan.tp_comm_overlap,
            **_p2p(plan),
            "overlap_grad_reduce": plan.overlap_grad_reduce,
            "overlap_param_gather": plan.overlap_param_gather}


def _nemo2_model_config(model: ModelSpec, plan: Plan) -> dict:
    """``recipe.model.config`` (GPTConfig, a TransformerConfig): the architecture, then what the
    plan runs (recompute, CP exchange, offloading, CUDA graphs), then the keys written only when
    set, then the MoE keys, in that order (the exported text follows it)."""
    granularity, method, layers = _recompute(model, plan)
    config = {
        **_nemo2_architecture(model),
        "recompute_granularity": granularity,
        "recompute_method": method,
        "recompute_num_layers": layers,
        "cp_comm_type": cp_comm_type(model, plan) if plan.cp > 1 else None,
        "cpu_offloading": plan.cpu_offloading_num_layers > 0,
        "cpu_offloading_num_layers": plan.cpu_offloading_num_layers,
        "cpu_offloading_activations": True,
        "cpu_offloading_weights": False,
        **CUDA_GRAPHS[plan.cuda_graph],
    }
    config.update(_nemo2_optional_keys(model, plan))
    config.update(moe_export.config_keys(model, plan))
    return config


def _nemo2_architecture(model: ModelSpec) -> dict:
    """The model's own fields of the config (what any layout of it writes the same)."""
    return {
        "transformer_impl": "transformer_engine",
        **_shape(model),
        "seq_length": model.seq_length,
        "normalization": NORMALIZATION[model.normalization],
        "layernorm_epsilon": model.norm_epsilon,
        "layernorm_zero_centered_gamma": model.layernorm_zero_centered_gamma,
        "activation_func": NEMO2_ACTIVATION[model.activation],
        "gated_linear_unit": model.gated_mlp,
        "add_bias_linear": model.add_bias_linear,
        "position_embedding_type": model.position_embedding_type,
        "rotary_base": model.rotary_base,
        "rotary_percent": model.rotary_percent,
        "hidden_dropout": model.hidden_dropout,
        "attention_dropout": model.attention_dropout,
        "share_embeddings_and_output_weights": model.tie_embeddings,
        "make_vocab_size_divisible_by": MAKE_VOCAB_SIZE_DIVISIBLE_BY,
    }


def _nemo2_optional_keys(model: ModelSpec, plan: Plan) -> dict:
    """Config keys written only where the plan sets them (a plain run's export stays without them);
    a dict of its own so ``_nemo2_model_config`` reads as the config's parts in order."""
    out = {}
    if plan.pipeline_model_parallel_layout:
        out["pipeline_model_parallel_layout"] = plan.pipeline_model_parallel_layout
    if sizes := hierarchical_cp_sizes(model, plan):  # a2a+p2p: Megatron's groups (ModelParallelConfig)
        out["hierarchical_context_parallel_sizes"] = sizes
    if plan.fp8_attention:
        out["fp8_dot_product_attention"] = True
    for name in ("tp_only_amax_red", "activation_func_fp8_input_store"):
        if getattr(plan, name):
            out[name] = True
    if plan.cross_entropy_loss_fusion:
        out.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    ft = model.finetune
    if plan.is_fp8 and ft is not None and ft.lora and ft.fp8_transpose_per_microbatch:
        # The frozen FP8 base's transpose made in every micro-batch (MLPerf's LoRA runs): Megatron-Core's
        # TransformerConfig.disable_parameter_transpose_cache, under which TE gets no is_first_microbatch
        # (Megatron-LM d98e8a64dd transformer_config.py, extensions/transformer_engine.py); NeMo 2's GPTConfig
        # inherits it, Megatron-Bridge sets it as cfg.model.disable_parameter_transpose_cache.
        out["disable_parameter_transpose_cache"] = True
    return out


def _finetune(model: ModelSpec) -> dict:
    """A fine-tuning run starts from the recipe's ``finetune_recipe`` with these arguments
    (``peft_scheme`` 'lora' or 'none' for full SFT, ``packed_sequence``) and sets its LoRA
    (``recipe.peft``: nemo/collections/llm/peft/lora.py's dim and target_modules, Megatron's
    module names, dropout and a2a_experimental); nothing for pre-training."""
    ft = model.finetune
    if ft is None:
        return {}
    out = {"finetune_recipe": {"peft_scheme": "lora" if ft.lora else "none", "packed_sequence": ft.packed_sequence}}
    if ft.lora:
        out["peft"] = {"dim": ft.lora_rank, "target_modules": list(ft.lora_targets), "dropout": ft.lora_dropout,
                       "a2a_experimental": ft.lora_a2a}
    return out
