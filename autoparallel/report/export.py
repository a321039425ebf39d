"""A plan as the settings other tools take: Megatron-LM flags, a NeMo YAML block, and the
TransformerEngine FP8 recipe.

Flag names are those of megatron/training/arguments.py; NeMo keys are those of the NeMo
(1.x YAML / 2.x recipe) model config. Keeping all three in one module means a knob added to
Plan shows up in one place when it must be exported.
"""

from __future__ import annotations

from autoparallel.report import moe_export
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

TE_RECIPES = {
    "fp8-delayed": ("DelayedScaling", "delayed"),
    "fp8-current": ("Float8CurrentScaling", "tensorwise"),
    "fp8-blockwise": ("Float8BlockScaling", "blockwise"),
    "mxfp8": ("MXFP8BlockScaling", "mxfp8"),
}


def megatron_args(model: ModelSpec, plan: Plan) -> list[str]:
    """Megatron-LM command-line arguments for the model and the plan."""
    a = [
        f"--num-layers {model.num_layers}",
        f"--hidden-size {model.hidden_size}",
        f"--ffn-hidden-size {model.ffn_hidden_size}",
        f"--num-attention-heads {model.num_attention_heads}",
        f"--seq-length {model.seq_length}",
        f"--max-position-embeddings {model.seq_length}",
    ]
    if model.query_groups != model.num_attention_heads:
        a += ["--group-query-attention", f"--num-query-groups {model.query_groups}"]
    if model.activation == "swiglu":
        a.append("--swiglu")
    elif model.activation == "squared_relu":
        a.append("--squared-relu")
    if model.normalization == "rmsnorm":
        a.append("--normalization RMSNorm")
    if not model.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += [
        f"--tensor-model-parallel-size {plan.tp}",
        f"--pipeline-model-parallel-size {plan.pp}",
        f"--context-parallel-size {plan.cp}",
    ]
    if plan.pipeline_model_parallel_layout:  # sets vp too; Megatron refuses it with the vp flags
        a.append(f"--pipeline-model-parallel-layout '{plan.pipeline_model_parallel_layout}'")
    elif plan.vp > 1:
        a.append(f"--num-layers-per-virtual-pipeline-stage {model.num_layers // (plan.pp * plan.vp)}")
    a += moe_export.megatron_flags(model, plan)
    if plan.sp:
        a.append("--sequence-parallel")
    a += [f"--micro-batch-size {plan.mbs}", f"--global-batch-size {plan.gbs}"]
    if plan.recompute == "selective":
        a.append("--recompute-granularity selective")
    elif plan.recompute == "full":
        layers = plan.recompute_num_layers or model.num_layers // (plan.pp * plan.vp)
        a += ["--recompute-granularity full", "--recompute-method block", f"--recompute-num-layers {layers}"]
    if plan.distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if plan.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if plan.overlap_param_gather:
        a.append("--overlap-param-gather")
    if plan.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    a.append("--fp16" if plan.precision == "fp16" else "--bf16")
    if not plan.grad_reduce_in_fp32 and plan.precision != "fp16":
        a.append("--grad-reduce-in-bf16")
    if plan.is_fp8:
        a += ["--fp8-format hybrid", f"--fp8-recipe {TE_RECIPES[plan.precision][1]}"]
        if plan.precision == "fp8-delayed":
            a += ["--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max"]
        if plan.fp8_bf16_edge_layers:
            n = plan.fp8_bf16_edge_layers
            a += ["--first-last-layers-bf16", f"--num-layers-at-start-in-bf16 {n}",
                  f"--num-layers-at-end-in-bf16 {n}"]
    if plan.flash_attention:
        a.append("--attention-backend flash")
    return a


def nemo_config(model: ModelSpec, plan: Plan, gpus_per_node: int = 8) -> dict:
    """NeMo-style trainer/model block (the keys of NeMo's megatron_gpt_config.yaml)."""
    gpus = plan.num_gpus
    nodes = max(1, gpus // gpus_per_node)
    m: dict = {
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
        "pipeline_model_parallel_layout": plan.pipeline_model_parallel_layout or None,
        "context_parallel_size": plan.cp,
        "expert_model_parallel_size": plan.ep,
        "sequence_parallel": plan.sp,
        "micro_batch_size": plan.mbs,
        "global_batch_size": plan.gbs,
        "encoder_seq_length": model.seq_length,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.query_groups,
        "activations_checkpoint_granularity": None if plan.recompute == "none" else plan.recompute,
        "activations_checkpoint_method": "block" if plan.recompute == "full" else None,
        "activations_checkpoint_num_layers": (plan.recompute_num_layers
                                              or model.num_layers // (plan.pp * plan.vp))
        if plan.recompute == "full" else None,
        "ub_tp_comm_overlap": plan.tp_comm_overlap,
        "use_flash_attention": plan.flash_attention,
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
        m.update({"fp8_e4m3": False, "fp8_hybrid": True, "fp8_margin": 0,
                  "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                  "fp8_recipe": TE_RECIPES[plan.precision][1]})
        if plan.fp8_bf16_edge_layers:
            m["first_last_layers_bf16"] = True
            m["num_layers_at_start_in_bf16"] = plan.fp8_bf16_edge_layers
            m["num_layers_at_end_in_bf16"] = plan.fp8_bf16_edge_layers
    return {
        "trainer": {"devices": min(gpus, gpus_per_node), "num_nodes": nodes,
                    "precision": "16-mixed" if plan.precision == "fp16" else "bf16-mixed"},
        "model": m,
    }


def te_recipe(plan: Plan) -> dict | None:
    """The TransformerEngine recipe object (class and arguments), or None for BF16/FP16."""
    if not plan.is_fp8:
        return None
    cls = TE_RECIPES[plan.precision][0]
    if plan.precision == "fp8-delayed":
        args = {"fp8_format": "HYBRID", "margin": 0, "amax_history_len": 1024, "amax_compute_algo": "max"}
    elif plan.precision == "mxfp8":
        args = {"fp8_format": "E4M3"}
    elif plan.precision == "fp8-blockwise":
        args = {"fp8_format": "E4M3"}
    else:
        args = {"fp8_format": "HYBRID"}
    return {"class": f"transformer_engine.common.recipe.{cls}", "args": args,
            "python": f"{cls}(" + ", ".join(f"{k}={v!r}" if isinstance(v, (int, float)) or k != "fp8_format"
                                          else f"{k}=Format.{v}" for k, v in args.items()) + ")"}


def export_document(model: ModelSpec, plan: Plan, metrics: dict) -> dict:
    """Everything best.yaml holds for one ranked plan."""
    return {
        "model": model.name,
        "plan": plan.as_dict(),
        "predicted": metrics,
        "megatron_args": " ".join(megatron_args(model, plan)),
        "nemo": nemo_config(model, plan),
        "transformer_engine_recipe": te_recipe(plan),
    }
