"""One training layout: every knob the search turns, named as Megatron-LM names it.

A Plan is the unit that the cost model estimates, profiling runs, and export writes out.
The search itself works on columns of many plans at once (``autoparallel.space``); a Plan is
one row of those columns made into an object for the code that handles one layout at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal

Recompute = Literal["none", "selective", "full"]
Dispatcher = Literal["alltoall", "allgather", "flex"]
FlexBackend = Literal["deepep", "hybridep"]
Precision = Literal["bf16", "fp16", "fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4"]

RECOMPUTE_CHOICES: tuple[str, ...] = ("none", "selective", "full")
PRECISION_CHOICES: tuple[str, ...] = ("bf16", "fp16", "fp8-delayed", "fp8-current",
                                      "fp8-blockwise", "mxfp8", "nvfp4")
FP8_PRECISIONS: tuple[str, ...] = ("fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8")
# NVFP4 (TransformerEngine's NVFP4BlockScaling, Megatron-LM --fp4-format e2m1 --fp4-recipe nvfp4):
# E2M1 values with an E4M3 scale per 16 and an FP32 scale per tensor; Blackwell only.
FP4_PRECISIONS: tuple[str, ...] = ("nvfp4",)
QUANTIZED_PRECISIONS: tuple[str, ...] = FP8_PRECISIONS + FP4_PRECISIONS
DISPATCHER_CHOICES: tuple[str, ...] = ("alltoall", "allgather", "flex")
CudaGraph = Literal["none", "layer", "full_iteration"]
CUDA_GRAPH_CHOICES: tuple[str, ...] = ("none", "layer", "full_iteration")
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
# TransformerEngine's context-parallel attention kinds (Megatron-LM --cp-comm-type; TE
# attention/dot_product_attention/context_parallel.py): p2p, a ring of K/V chunks behind the attention
# (AttnFuncWithCPAndKVP2P); a2a, DeepSpeed-Ulysses all-to-alls of Q, K, V and O (AttnFuncWithCPAndQKVOA2A);
# allgather, K/V all-gathered before the attention, exposed (AttnFuncWithCPAndKVAllGather; TE spells it
# "all_gather", ``report.shared.cp_comm_type``); a2a+p2p, all-to-alls inside groups of
# ``--hierarchical-context-parallel-sizes``' first size and a p2p ring across them.
CP_COMM_TYPE_CHOICES: tuple[str, ...] = ("p2p", "a2a", "allgather", "a2a+p2p")


@dataclass(frozen=True)
class Plan:
    tp: int
    pp: int
    dp: int
    gbs: int
    mbs: int = 1
    vp: int = 1
    cp: int = 1
    # How the CP ranks exchange the attention's inputs (CP_COMM_TYPE_CHOICES; cp > 1 only).
    cp_comm_type: CpCommType = "p2p"
    ep: int = 1
    # Expert tensor parallel (Megatron-LM's MoE parallel folding, --expert-tensor-parallel-size):
    # the expert layers fold the same tp*cp*dp GPUs of a stage into etp x ep x expert-data-parallel
    # groups, so each expert's FFN is split over etp GPUs and its gradients and Adam states are
    # reduced and sharded over dp*cp*tp / (ep*etp) GPUs. Megatron's default is etp = tp.
    etp: int = 1
    # --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute): the EP all-to-alls of one
    # micro-batch run behind the computation of another (1F1B all-to-all overlap; interleaved
    # pipeline only when pp > 1).
    overlap_moe_expert_parallel_comm: bool = False
    # The shared experts' GEMMs on a side stream beside the dispatch and combine all-to-alls
    # (--moe-shared-expert-overlap; models with shared experts, alltoall / flex dispatcher).
    moe_shared_expert_overlap: bool = False
    # How tokens reach their experts (--moe-token-dispatcher-type; MoE only): alltoall, one NCCL
    # all-to-all sending every token copy on its own; allgather, every GPU of the EP x ETP group
    # gathers all its tokens; flex, DeepEP / HybridEP kernels that send a token once to each
    # remote node its experts are on and forward it over NVLink there
    # (--moe-flex-dispatcher-backend: HybridEP where the EP group spans a multi-node NVLink
    # domain, which DeepEP cannot, else DeepEP).
    moe_token_dispatcher_type: Dispatcher = "alltoall"
    moe_flex_dispatcher_backend: FlexBackend = "deepep"
    # Uneven pipeline stages, as Megatron-LM splits them when num_layers is not divisible by
    # pp*vp: explicit layer counts of the first / last stage (--decoder-first-pipeline-num-layers,
    # --decoder-last-pipeline-num-layers; 0 = an even share), or the embedding / the loss counted
    # as one layer of the first / last virtual stage (--account-for-embedding-in-pipeline-split,
    # --account-for-loss-in-pipeline-split).
    num_layers_in_first_pipeline_stage: int = 0
    num_layers_in_last_pipeline_stage: int = 0
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Megatron-LM's flexible layout (--pipeline-model-parallel-layout): each virtual stage's
    # layers, "E" embedding, "t" decoder layer, "L" loss, "|" between stages ("" = not used).
    pipeline_model_parallel_layout: str = ""
    # Fully sharded data parallel: weights, gradients and optimizer states sharded over dp*cp,
    # parameters all-gathered layer by layer (Megatron-FSDP optim_grads_params, or FSDP2).
    fsdp: bool = False
    # Layers whose saved activations are offloaded to host memory during the forward pass and
    # brought back for the backward (Megatron-LM --cpu-offloading --cpu-offloading-num-layers N;
    # no pipeline parallelism). Cheap over a Grace superchip's NVLink-C2C, slow over PCIe.
    cpu_offloading_num_layers: int = 0
    sp: bool = False
    recompute: Recompute = "none"
    # Layers of each pipeline chunk that full recompute covers (Megatron's block method);
    # 0 means all of them.
    recompute_num_layers: int = 0
    # What selective recompute recomputes (Megatron-LM's --recompute-modules, space-separated):
    # core_attn (the attention core, Megatron's default), mla_up_proj (MLA's up projections, so
    # Q, K and V are not kept), moe_act (the experts' activation), moe (the whole MoE layer),
    # layernorm (the two norms: their outputs are not kept).
    recompute_modules: str = "core_attn"
    distributed_optimizer: bool = True
    # Megatron-LM reduces BF16 gradients in FP32 (main grads, 4 B/param); --grad-reduce-in-bf16
    # (NeMo's default with its distributed Adam) halves both the buffer and the DP traffic.
    grad_reduce_in_fp32: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    precision: Precision = "bf16"
    # Layers at the start and at the end kept in BF16 under an FP8 recipe.
    fp8_bf16_edge_layers: int = 0
    flash_attention: bool = True
    # --fp8-dot-product-attention: TransformerEngine's fused attention computes QK^T and P·V in FP8
    # (MLPerf's FP8_DPA; under the fp8-delayed and fp8-current recipes).
    fp8_attention: bool = False
    # --tp-only-amax-red: the delayed-scaling recipe reduces its amaxes over the TP (x CP) group
    # only; by default (Megatron, TransformerEngine) over TP x DP x CP, a blocking all-reduce at
    # every model chunk's forward and backward (``layer_time.amax_reduction_time``).
    tp_only_amax_red: bool = False
    # --tp-overlap-rs-pipeline: with userbuffers, the forward reduce-scatters (proj_fprop, fc2_fprop)
    # run TransformerEngine's ``pipeline`` method (4 splits, an atomic GEMM on the SMs the
    # collective leaves: NVIDIA's MLPerf LoRA TP4 configs) instead of the ring exchange (the default,
    # NeMo's / Megatron-Bridge's FP8 userbuffers configs).
    tp_overlap_rs_pipeline: bool = False
    # LoRA under TP with SP: the adapters beside QKV and FC1 keep the sequence shard of their input
    # (the norm output) and gather it again in the backward for A's weight gradient, instead of
    # keeping the whole gathered sequence (Megatron-Bridge v0.6.0+ ``LoRA.sequence_parallel_input_regather``,
    # off by default: 33655ef84, PR #4581; ``costmodel.finetune.adapter_input_bytes``).
    lora_input_regather: bool = False
    # TransformerConfig.activation_func_fp8_input_store: the SwiGLU's input (gate and up, of the
    # MLP and of every expert) is kept for the backward pass as an FP8 (E4M3) copy, 1 B per
    # element instead of 2 (Megatron's fused bias_swiglu / weighted_bias_swiglu; no Megatron-LM flag).
    activation_func_fp8_input_store: bool = False
    # Megatron-Bridge's cutedsl_fused_grouped_mlp (scripts/performance/utils/overrides.py, v0.5.0+):
    # TransformerConfig.use_transformer_engine_op_fuser with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, so
    # TransformerEngine runs a MoE layer's experts as one fused MXFP8 CuTe-DSL grouped MLP (FC1 +
    # GLU + FC2 over all local experts, SM100) instead of a cuBLAS GEMM per expert
    # (``layer_time.fused_grouped_mlp_calls``). MXFP8 MoE models with a GLU only.
    cutedsl_fused_grouped_mlp: bool = False
    # --fp8-param-gather: the FP8 weights are the parameters (no BF16 copy is kept) and the
    # distributed optimizer all-gathers them in FP8, 1 B per parameter instead of 2.
    fp8_param_gather: bool = False
    # --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: Adam's two
    # moments in BF16 beside the FP32 master weights, 8 B per parameter instead of 12.
    precision_aware_optimizer: bool = False
    # The distributed optimizer keeps 16 bits per master weight beside the 16-bit weight instead of
    # an FP32 copy: Apex DistributedFusedAdam's store_param_remainders (the low 16 bits of the FP32
    # master; NeMo 1's megatron_base_model sets it for FP32 state with BF16 weights, NeMo 24.07's
    # distributed_fused_adam), or Apex with BF16 state (optim.dtype bf16) keeping BF16 master copies
    # of FP8 parameters. Megatron-LM does the first only under the precision-aware optimizer without
    # FP8 parameters (store_param_remainders), which prices it without this knob.
    param_remainders: bool = False
    # --cross-entropy-loss-fusion --cross-entropy-fusion-impl te: TransformerEngine's fused loss
    # writes the logits' gradient into the BF16 logits and keeps only them (2 B per logit), where
    # Megatron's unfused loss keeps an FP32 softmax beside them (``memory.logits_bytes``).
    cross_entropy_loss_fusion: bool = False
    # CUDA graphs: "layer" = per-layer graphs of whole transformer layers (TransformerEngine's
    # make_graphed_callables, --cuda-graph-impl transformer_engine; MLPerf's LAYER_CUDA_GRAPH);
    # "full_iteration" = the forward-backward of the step as one graph (--cuda-graph-impl
    # full_iteration). Each graph keeps static input buffers (``peak_memory.cuda_graph_bytes``).
    cuda_graph: CudaGraph = "none"
    # the counts that must be >= 1 (not fields: no annotation); ``io.from_dict`` quotes 1..MAX_COUNT for them
    POSITIVE_KEYS = ("tp", "pp", "dp", "gbs", "mbs", "vp", "cp", "ep")

    def __post_init__(self) -> None:
        for key in self.POSITIVE_KEYS:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)}")
        if self.cuda_graph not in CUDA_GRAPH_CHOICES:
            raise ValueError(f"cuda_graph must be one of {', '.join(CUDA_GRAPH_CHOICES)}, got {self.cuda_graph!r}")
        for key in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                    "cpu_offloading_num_layers", "recompute_num_layers", "fp8_bf16_edge_layers"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be an integer >= 0, got {getattr(self, key)}")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def expert_data_parallel(self) -> int:
        """GPUs that hold the same experts of a stage (Megatron's expert-data-parallel size)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def is_fp8(self) -> bool:
        return self.precision in FP8_PRECISIONS

    @property
    def is_fp4(self) -> bool:
        return self.precision in FP4_PRECISIONS

    @property
    def is_quantized(self) -> bool:
        """The Linear GEMMs run a low-precision recipe (FP8 or FP4): BF16 edge layers apply."""
        return self.precision in QUANTIZED_PRECISIONS

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
