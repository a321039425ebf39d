"""Pipeline stages, one micro-batch each: the stage step of the cost model.

A stage is its layers (``layer_time.Layers``) plus what only it does: the point-to-point sends
of activations and gradients to its neighbours (``pp_comm_time``), the output layer and loss on
the last stage (``logits_time``) with the multi-token-prediction layers after it
(``mtp_time``), activation offloading on the first (``offload_time``). Three positions are
priced (first, first middle, last; ``candidates``), and their parameters, which the
data-parallel, optimizer and memory steps read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel.costmodel import comm, finetune, flops, gemm, pipeline
from autoparallel.costmodel.candidates import TE_VERSION_COLUMN, Candidates, te_at_least
from autoparallel.costmodel.layer_time import Layers, linear_time

LOSS_PASSES = 4  # softmax cross-entropy reads/writes the FP32 logits about four times


def logits_time(x: Candidates):
    """The output layer's GEMM forward and backward (BF16, vocab-parallel over TP; a frozen one
    computes no weight gradient) and the loss's passes over the FP32 logits."""
    model, hw = x.model, x.hw
    logit_flops = flops.logits_flops(model, x.b, x.s_local) / x.t
    gemms = finetune.linear_passes(model) * logit_flops / (gemm.bf16_peak(hw) * gemm.efficiency(hw, logit_flops))
    return gemms + LOSS_PASSES * 4.0 * x.tokens * model.vocab_size / x.t / x.hbm


def mtp_layer(layers: Layers, model) -> dict:
    """The transformer layer of a multi-token-prediction module: the decoder's (MoE) layer, a
    hybrid model's attention and MoE block (``Layers.mtp``)."""
    return layers.mtp(model)


def mtp_projection_params(model) -> float:
    """Each MTP module's projection of [embedding; hidden] (2h -> h)."""
    return 2.0 * model.hidden_size ** 2


def mtp_time(x: Candidates, layers: Layers, logits):
    """Multi-token prediction (--mtp-num-layers) on the last stage: per module the projection,
    one transformer layer and one more pass through the (shared) output layer and loss."""
    projection = 3.0 * linear_time(x, mtp_projection_params(x.model))
    return x.model.mtp_num_layers * (projection + mtp_layer(layers, x.model)["time"] + logits)


def pp_comm_time(x: Candidates):
    """Per micro-batch, each of a rank's vp chunks receives activations and sends gradients (BF16,
    SP-sharded); with interleaving Megatron overlaps a share of them with compute; a published
    row's DualPipe all of them (``pipeline.DUALPIPE_HIDDEN_SHARE``)."""
    nbytes = 2.0 * x.tokens * x.model.hidden_size / x.t
    same_domain = x.t * x.c * x.dp * x.p <= x.hw.nvlink_domain
    exposed_share = np.where(x.v > 1, 1.0 - x.hw.efficiency.pp_overlap, 1.0)
    exposed_share = np.where(x.dualpipe, 1.0 - pipeline.DUALPIPE_HIDDEN_SHARE, exposed_share)
    return np.where(x.p > 1, 2.0 * x.v * exposed_share * comm.p2p_time(x.hw, nbytes, same_domain), 0.0)


# The last TransformerEngine release whose stack (NeMo and Megatron-LM 24.09-alpha.rc0 beside TE 1.10:
# ``candidates.LORA_VIRTUAL_PIPELINE_TE``) leaves the tensors ``offload_left_bytes`` names on the GPU.
OFFLOAD_MARKS_BEFORE = (1, 11)


def offload_left_bytes(x: Candidates):
    """What an offloaded dense layer leaves on the GPU per micro-batch on TE 1.10's stack or an older
    one. TE's offload handler moves a saved tensor only where it carries ``activation_offloading``
    (transformer_engine/pytorch/cpu_offload.py v1.10 L475-483, ``tensor_need_offloading_checker_*``;
    every saved tensor only from 2.10's refactor, c52576053 #1762), and on that stack these carry none:

    - the activation's input, saved by Megatron's fused SwiGLU (Megatron-LM 24.09-alpha.rc0
      megatron/core/fusions/fused_bias_swiglu.py L45, L63; marked from 0bbcbb1157, 2025-06-13);
    - the attention's saved Q, K, V and output where TE 1.10 marks only tensors it does not save:
      under FP8 attention (``FusedAttnFunc`` marks the BF16 ones and saves the FP8 ones,
      transformer_engine/pytorch/attention.py v1.10 L5460-5480; 454e38950 #1131, first in v1.11, marks
      them) and under context parallelism (``AttnFuncWithCPAndKVP2P`` marks none, L2073-2086), one
      byte each under FP8 attention, else two (the softmax statistics, 4 B a head and token, left out);
    - a LoRA adapter's saved input and dropout state: NeMo 24.09's adapters run Megatron's non-TE
      Linears (``LinearWithGradAccumulationAndAsyncCommunication`` saves the input, Megatron-LM
      24.09-alpha.rc0 megatron/core/tensor_parallel/layers.py L391) and PyTorch's dropout.

    Zero where the run's release is later or not given (a current TE offloads every saved tensor)."""
    model = x.model
    old = ~te_at_least(x.knobs.get(TE_VERSION_COLUMN, ""), *OFFLOAD_MARKS_BEFORE)
    if not np.any(old):
        return 0.0
    tokens = x.b * x.s_local
    act = (2.0 if model.gated_mlp else 1.0) * x.act_input_bytes * model.ffn_hidden_size / x.t
    fp8_attention = x.flag("fp8_attention") & (x.quantized_fraction > 0)
    qkvo = (2 * model.num_attention_heads + 2 * model.query_groups) * model.head_dim / x.t
    attention = np.where(fp8_attention | (x.c > 1), np.where(fp8_attention, 1.0, 2.0) * qkvo, 0.0)
    adapters = (finetune.adapter_input_bytes(model, x.b, x.s_local, x.t)
                + finetune.dropout_saved_bytes(model, x.b, x.s_local, x.t, x.sp))
    return np.where(old, tokens * (act + attention) + adapters, 0.0)


def offload_time(x: Candidates, layers: Layers):
    """Activation offloading (pp = 1 only): the offloaded layers' saved activations go to the host
    behind the forward pass and come back behind the backward pass; what the passes cannot
    hide is exposed. Where FSDP's inter-node traffic shares the host link, it takes its share.

    How much of a pass hides them depends on TransformerEngine's offload handler. Since 1.10 ("Load
    balanced offloading algorithm", TransformerEngine c8c05f38b, #1057) the offloads of the N groups
    are spread over windows of L/N layers (``layer_window_map``, cpu_offload.py v1.11), so the whole
    pass hides them. Before (v1.6-1.9 ``AsyncDoubleBufferGroupOffloadHandler``) each offloaded layer's
    tensors are first copied into a GPU double buffer (``tensor_push``: ``tensor_buf.copy_``), sent
    while the next layer computes, and ``synchronize_on_group_commit_forward`` calls
    ``torch.cuda.synchronize()`` at that layer's end; the backward prefetches one group ahead
    (``num_prefetch_group=1``): each layer's transfer hides behind one layer's pass only
    (``Candidates.windowed_offload`` off)."""
    first = x.kinds_on_stages[0]
    mean = lambda key: layers.on(key, x.first_layers, x.first_moe, first) / np.maximum(x.first_layers, 1.0)  # noqa: E731
    stored = np.maximum(mean("stored") - offload_left_bytes(x), 0.0)  # what the handler moves
    forward, compute = mean("forward"), mean("compute")
    host_link = x.hw.host_link_gbps * 1e9
    if x.hw.network_shares_host_link:
        per_param = 2.0 * x.gather_bytes + x.grad_bytes
        fsdp_network = np.where(
            x.fsdp, comm.internode_bytes(mean("params") * per_param, x.dp_group, x.dp_per_node)
            + comm.internode_bytes(mean("expert_params") * per_param, x.edp_group, x.edp_per_node), 0.0)
        host_link = np.maximum(host_link - fsdp_network / compute, 0.1 * host_link)
    def exposed(transfer, forward, compute):  # each way's transfer beyond the pass that hides it
        return np.maximum(transfer - forward, 0.0) + np.maximum(transfer - (compute - forward), 0.0)

    windowed = exposed(x.offloaded * stored / host_link, x.first_layers * forward, x.first_layers * compute)
    # Before TE 1.10: per offloaded layer, its transfer against one layer's forward and backward, and
    # the copy into the double buffer (read and write on the GPU).
    per_layer = x.offloaded * (exposed(stored / host_link, forward, compute) + 2.0 * stored / x.hbm)
    return np.where(x.windowed_offload, windowed, per_layer)


@dataclass
class StageTimes:
    """One micro-batch's time on each priced stage, and the per-stage terms that went into them
    (``logits``: the last stage's head, the output layer and loss and any MTP modules)."""

    first: np.ndarray
    middle: np.ndarray
    last: np.ndarray
    logits: np.ndarray
    pp_comm: np.ndarray
    offload: np.ndarray


def stage_times(x: Candidates, layers: Layers) -> StageTimes:
    """The first stage adds offloading (and the head when it is the only one), the last the
    head; every stage its point-to-point traffic."""
    t_logits, stage_pp, t_offload = logits_time(x), pp_comm_time(x), offload_time(x, layers)
    if x.model.mtp_num_layers:
        t_logits = t_logits + mtp_time(x, layers, t_logits)
    (n_first, moe_first, kinds_first), (n_middle, moe_middle, kinds_middle), (n_last, moe_last, kinds_last) = (
        x.stage_layer_counts)
    first = (layers.on("time", n_first, moe_first, kinds_first) + stage_pp + np.where(x.single, t_logits, 0.0)
             + t_offload)
    middle = layers.on("time", n_middle, moe_middle, kinds_middle) + stage_pp
    last = layers.on("time", n_last, moe_last, kinds_last) + stage_pp + t_logits
    return StageTimes(first, middle, last, t_logits, stage_pp, t_offload)


def stage_params(x: Candidates, layers: Layers, moe=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Parameters on one GPU of the first, middle and last stage: (those replicated over dp*cp,
    the experts replicated over the expert-data group). The first holds the embedding, the last
    the output layer (a copy when tied). ``moe``: (first, last) stage's MoE layers where not the
    priced ranks' (DualPipe's contiguous stages, ``peak_memory.dualpipe_stage_moe``)."""
    model = x.model
    first_moe, last_moe = (x.first_moe, x.last_moe) if moe is None else moe
    kinds = x.kinds_on_stages if moe is None else [None] * 3  # a hybrid stage's own kinds
    embedding_gpu = model.embedding_params / x.t
    output_gpu = 0.0 if model.tie_embeddings else model.embedding_params / x.t
    experts = layers.moe["expert_params"]
    first = (layers.on("params", x.first_layers, first_moe, kinds[0]) + embedding_gpu + np.where(x.single, output_gpu, 0.0),
             first_moe * experts)
    last = (layers.on("params", x.last_layers, last_moe, kinds[2]) + embedding_gpu,  # the output layer (a copy if tied)
            last_moe * experts)
    if model.mtp_num_layers:  # on the last stage (the only one when pp = 1)
        n = model.mtp_num_layers
        mtp = mtp_layer(layers, model)
        head = (n * (mtp["params"] + mtp_projection_params(model) / x.t), n * mtp["expert_params"])
        last = (last[0] + head[0], last[1] + head[1])
        first = (first[0] + np.where(x.single, head[0], 0.0), first[1] + np.where(x.single, head[1], 0.0))
    return [first, (layers.on("params", x.middle_layers, x.middle_moe, kinds[1]), x.middle_moe * experts), last]


def trainable_params(x: Candidates, layers: Layers, params: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """The parameters of ``stage_params`` that take gradients and optimizer states: all of them,
    or under LoRA (a frozen base, embedding and output layer included) the stage's adapters."""
    if not finetune.is_lora(x.model):
        return params
    return [(layers.on("adapter_params", n, n_moe, kinds), np.zeros_like(x.t)) for n, n_moe, kinds in x.stage_layer_counts]


def present(x: Candidates) -> list[np.ndarray]:
    """Which of the three priced stages exist: the first always, a middle one from pp = 3, a last
    one distinct from the first from pp = 2."""
    return [np.full_like(x.t, True, dtype=bool), x.has_middle, ~x.single]
