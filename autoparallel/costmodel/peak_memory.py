"""Peak memory of one GPU: the memory step of the cost model.

Each priced stage (first, first middle, last; ``candidates``) holds model states
(``model_states``: weights, gradients and FSDP's unsharded buffers, Adam states, FP8 weight
copies) and activations (``activation_bytes``: what each micro-batch in flight keeps, the layer
computing, the embedding's inputs on the first stage and the logits on the last). The fullest
stage is the plan's peak; with the fixed reserve it must fit in ``memory_fraction`` of the GPU.
The byte counts per tensor are in ``memory``.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import finetune, memory, pipeline
from autoparallel.costmodel.candidates import Candidates
from autoparallel.costmodel.layer_time import Layers
from autoparallel.costmodel.memory import GIB
from autoparallel.costmodel.stages import mtp_layer, offload_left_bytes, present, stage_params

MEMORY_KEYS = ("weights_gib", "grads_gib", "optimizer_gib", "fp8_weights_gib",
               "activations_gib", "logits_gib", "reserve_gib")


def model_states(x: Candidates, layers: Layers, params, stage_layers, stage_moe, kinds=None):
    """(weights, gradients with FSDP's buffers, Adam states, FP8 weight copies) in bytes on one
    GPU of a stage holding ``params`` = (replicated, experts) and these layers."""
    replicated, experts = params
    weight_shards = np.where(x.fsdp, x.dp_group, 1.0)
    expert_weight_shards = np.where(x.fsdp, x.edp_group, 1.0)
    optimizer_shards, expert_optimizer_shards = x.optimizer_shards()
    layer_weights = layers.on("params", stage_layers, stage_moe, kinds) / weight_shards + experts / expert_weight_shards
    bf16_replaced = memory.WEIGHT_BYTES * layer_weights * x.fp8_param_share  # --fp8-param-gather keeps no BF16 copy
    weights = memory.WEIGHT_BYTES * (replicated / weight_shards + experts / expert_weight_shards) - bf16_replaced
    grads = x.grad_bytes * (replicated / weight_shards + experts / expert_weight_shards)
    optimizer = ((x.master_bytes + 2 * x.moment_bytes)
                 * (replicated / optimizer_shards + experts / expert_optimizer_shards))
    fp8_weights = x.quantized_weight_bytes * layer_weights * x.quantized_fraction
    has_moe = x.first_moe + x.middle_moe + x.last_moe > 0
    largest_layer = np.maximum(layers.dense["params"],
                               np.where(has_moe, layers.moe["params"] + layers.moe["expert_params"], 0.0))
    buffers = np.where(x.fsdp, memory.fsdp_buffer_bytes(largest_layer, x.grad_bytes, x.gather_bytes), 0.0)
    return weights, grads + buffers, optimizer, fp8_weights


def lora_model_states(x: Candidates, layers: Layers, params, stage_layers, stage_moe, kinds=None):
    """``model_states`` under LoRA: the frozen base's layer weights in BF16 or their quantized
    copies (``finetune.base_weight_bytes``), its embedding and output layer in BF16, and only the
    adapters with gradients and Adam states (no FSDP buffers: the space keeps LoRA off FSDP)."""
    replicated, _ = params
    optimizer_shards, _ = x.optimizer_shards()
    layer_weights = layers.on("params", stage_layers, stage_moe, kinds)
    adapters = layers.on("adapter_params", stage_layers, stage_moe, kinds)
    weights = (finetune.base_weight_bytes(x.model, x.quantized_fraction > 0, x.quantized_weight_bytes) * layer_weights
               + memory.WEIGHT_BYTES * (replicated - layer_weights) + finetune.ADAPTER_BYTES * adapters)
    grads = x.grad_bytes * adapters
    optimizer = (memory.MASTER_WEIGHT_BYTES + 2 * x.moment_bytes) * adapters / optimizer_shards
    return weights, grads, optimizer, np.zeros_like(weights)


def _in_flight(x: Candidates, layers: Layers, held, stage_layers, stage_moe, edge_bytes=0.0, kept=1.0, graphs=None,
               left=0.0):
    """Saved activations the schedule holds on a stage at its peak, the working set of the layer
    computing and the CUDA graphs' static buffers; and the edge chunk's micro-batches held then (None
    where ``edge_bytes`` is nothing and several states may be the peak).
    ``held``: (dense layer-, MoE layer-, edge chunk) micro-batches of each state that may be the
    peak (``pipeline.held_at_peak``), the fullest of which is priced, its edge chunk's micro-batches
    keeping ``edge_bytes`` each; ``kept``: the share of the layers' activations left on the GPU
    (offloading), ``left`` what an offloaded layer leaves on it (``stages.offload_left_bytes``);
    ``graphs``: (``graph_layer_input_bytes``, ``graph_data_bytes``), computed
    once for the three stages. A published row's DualPipe holds ``pipeline.dualpipe_inflight`` micro-batches of
    the stage's layers (its end ranks are ``dualpipe_end_rank``)."""
    dense, moe, edge = held
    graph_layer, graph_data = graphs or (graph_layer_input_bytes(x), graph_data_bytes(x))
    per_layer = kept * graph_layer
    states = dense * (kept * stored_bytes(layers, 1.0, 0.0, stage_moe) + (1.0 - kept) * left + per_layer)
    if np.any(moe):
        states = states + moe * (kept * stored_bytes(layers, 1.0, 1.0, stage_moe) + per_layer)
    if np.any(edge_bytes):
        states = states + edge * edge_bytes
    edge = np.broadcast_to(edge, states.shape)
    if len(states) == 1:
        peak, edge = states[0], edge[0]
    elif not np.any(edge_bytes):  # the edge chunk's count is read only where it holds something
        peak, edge = states.max(axis=0), None
    else:
        fullest = np.argmax(states, axis=0)[None]
        peak, edge = (np.take_along_axis(a, fullest, axis=0)[0] for a in (states, edge))
    peak = peak + graph_data
    if x.dualpipe.any():
        dual = pipeline.dualpipe_inflight(x.p)
        peak = np.where(x.dualpipe, dual * stored_bytes(layers, stage_layers, stage_moe)
                        + cuda_graph_bytes(x, dual, stage_layers), peak)
    return peak + _working(layers, stage_moe), edge


def stored_bytes(layers: Layers, stage_layers, stage_moe, gpu_moe=None):
    """What ``stage_layers`` layers (``stage_moe`` of them MoE) keep, summed over the micro-batches in
    flight. A step waits for the busiest EP rank of each MoE layer (``moe.load_imbalance``), but a
    GPU's memory holds the routed tokens of all its MoE layers (``gpu_moe`` of them, the stage's
    own where not given): each layer's router picks its experts apart, so the busiest rank of one
    layer is not that of the next, and the largest sum over the ep ranks of n layers' loads exceeds
    n even shares by 1/sqrt(n) of one layer's excess (the expected maximum of ep normal draws
    scales with their spread; micro-batches of one step are not averaged, as the same experts may
    stay popular across them)."""
    gpu_moe = stage_moe if gpu_moe is None else gpu_moe
    excess = layers.moe["stored_imbalance"] * (1.0 - 1.0 / np.sqrt(np.maximum(gpu_moe, 1.0)))
    return layers.on("stored", stage_layers, stage_moe) - stage_moe * excess


def _working(layers: Layers, stage_moe):
    """The working set of the layer computing (a MoE layer's where the stage has one)."""
    return np.where(stage_moe > 0, layers.moe["working"], layers.dense["working"])


def _beyond_working(logits, layers: Layers, stage_moe):
    """What the head (the loss's logits, the head's inputs) adds to a stage's peak beyond the
    working set of a layer: the two never coexist, as the head's forward starts after the last
    layer's and its backward (which frees the logits and their gradient) ends before that layer's
    backward begins."""
    return np.maximum(logits - _working(layers, stage_moe), 0.0)


def cuda_graph_bytes(x: Candidates, held, stage_layers):
    """What CUDA graphs keep beyond eager's allocations (whose sizes the graph's pool replays):
    per-layer graphs (TransformerEngine's make_graphed_callables, one graph per layer and
    micro-batch) copy each layer's input into a static buffer that is reused only after that
    micro-batch's backward, so one BF16 layer input per layer and micro-batch in flight; a
    full-iteration graph keeps the token ids, labels and loss mask of every micro-batch of the
    step."""
    return held * stage_layers * graph_layer_input_bytes(x) + graph_data_bytes(x)


def graph_data_bytes(x: Candidates):
    """A full-iteration graph's static token ids, labels and loss masks (``cuda_graph_bytes``)."""
    return np.where(x.knob_is("cuda_graph", "full_iteration"), x.m * x.tokens * memory.GRAPH_DATA_BYTES_PER_TOKEN, 0.0)


def graph_layer_input_bytes(x: Candidates):
    """Per-layer CUDA graphs' static input buffer, per layer and micro-batch in flight
    (``cuda_graph_bytes``)."""
    return np.where(x.knob_is("cuda_graph", "layer"), memory.layer_input_bytes(x.model, x.b, x.s_local, x.t, x.sp), 0.0)


def logits_bytes(x: Candidates):
    """The loss's FP32 softmax and BF16 logits (the BF16 logits only under TransformerEngine's
    fused loss), and the head's inputs, on the last stage."""
    model = x.model
    return (memory.logits_bytes(model, x.b, x.s_local, x.t, x.flag("cross_entropy_loss_fusion"))
            + memory.head_input_bytes(model, x.b, x.s_local, x.t, x.sp))


def activation_bytes(x: Candidates, layers: Layers) -> tuple[list, list]:
    """Activations of the first, middle and last stage (the head's logits included, where they
    exceed a layer's working set: ``_beyond_working``) and that share of the logits alone.
    Offloading N of the L layers keeps L - N layers' activations on the GPU at the end of the
    forward, never fewer than two (the layer computing and the one being copied or reloaded):
    TransformerEngine's AsyncDoubleBufferGroupOffloadHandler frees offloaded group i once layer
    (L // N)(i + 1) - 1 has run (``layer_window_map``, transformer_engine/pytorch/cpu_offload.py,
    v2.9), so the last group is off the GPU when the last layer's forward ends, and the backward
    reloads each group only when the layers after it are freed."""
    logits = logits_bytes(x)
    offloaded = x.offloaded
    kept_layers = np.maximum(x.first_layers - offloaded, np.minimum(2.0, x.first_layers))
    kept = np.where(offloaded > 0, kept_layers / x.first_layers, 1.0)
    graphs = graph_layer_input_bytes(x), graph_data_bytes(x)
    first, _ = _in_flight(x, layers, x.held[0], x.first_layers * kept, x.first_moe * kept,
                          memory.embedding_activation_bytes(x.model, x.b, x.s_local), kept, graphs,
                          np.where(offloaded > 0, offload_left_bytes(x), 0.0))
    first_head = np.where(x.single, _beyond_working(logits, layers, x.first_moe), 0.0)
    first = first + first_head
    middle, _ = _in_flight(x, layers, x.held[1], x.middle_layers, x.middle_moe, graphs=graphs)
    # The last chunk's micro-batches hold the head's logits and the MTP layers (its one micro-batch
    # without pipeline or interleaving; interleaved, the fullest state may hold none).
    last_head = _beyond_working(logits, layers, x.last_moe)
    mtp = mtp_bytes(x, layers, 1.0) if x.model.mtp_num_layers else 0.0
    last, last_edge = _in_flight(x, layers, x.held[2], x.last_layers, x.last_moe, last_head + mtp, graphs=graphs)
    first = first + np.where(x.single, mtp, 0.0)
    last_head = last_head if last_edge is None else last_edge * last_head  # None: no head beyond the working set
    if x.dualpipe.any():
        end, end_head = dualpipe_end_rank(x, layers, logits)
        first, last = np.where(x.dualpipe, end, first), np.where(x.dualpipe, end, last)
        first_head, last_head = np.where(x.dualpipe, end_head, first_head), np.where(x.dualpipe, end_head, last_head)
    return [first, middle, last], [first_head, 0.0, last_head]


def dualpipe_stage_moe(x: Candidates):
    """MoE layers of DualPipe's first and last stage. Its stages are contiguous slices of the
    model (deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py: ``full_modules`` split in
    PP stages, rank r keeping ``full_modules[pp_rank]`` and ``full_modules[pp_size - 1 - pp_rank]``),
    not the interleaved chunks of the priced ranks: the first stage holds the model's first
    ``first_layers`` layers (DeepSeek-V3's three dense ones among them), the last its last
    ``last_layers``; each as many layers as the priced rank, so the step time's split stands.
    Elsewhere the priced ranks' counts."""
    if not x.model.is_moe or not x.dualpipe.any():
        return x.first_moe, x.last_moe
    moe = np.concatenate([[0.0], np.cumsum(x.model.moe_layer_pattern, dtype=float)])
    n = len(moe) - 1
    first = moe[x.first_layers.astype(int)]
    last = moe[n] - moe[n - x.last_layers.astype(int)]
    return np.where(x.dualpipe, first, x.first_moe), np.where(x.dualpipe, last, x.last_moe)


def dualpipe_end_rank(x: Candidates, layers: Layers, logits):
    """Activations of a DualPipe end rank (a published row's schedule), which holds the first
    stage and the last one (``pipeline.DUALPIPE``): at its peak PP micro-batches of the first
    stage's layers and embedding inputs and one of the last stage's layers and MTP modules
    (``pipeline.dualpipe_chunks``), the working set of a layer of either, and the head's logits
    where they exceed it; and that share of the logits alone. The stages hold as many layers as the
    priced layout's first and last pipeline ranks, as the step time prices them, but contiguous
    ones (``dualpipe_stage_moe``)."""
    own, other = pipeline.dualpipe_chunks(x.p, 0)
    first_moe, last_moe = dualpipe_stage_moe(x)
    first = (stored_bytes(layers, x.first_layers, first_moe)
             + memory.embedding_activation_bytes(x.model, x.b, x.s_local))
    last = stored_bytes(layers, x.last_layers, last_moe)
    both_moe = first_moe + last_moe
    graphs = cuda_graph_bytes(x, 1.0, own * x.first_layers + other * x.last_layers)
    mtp = mtp_bytes(x, layers, other) if x.model.mtp_num_layers else 0.0
    head = _beyond_working(logits, layers, both_moe)
    return own * first + other * last + _working(layers, both_moe) + graphs + mtp + head, head


def mtp_bytes(x: Candidates, layers: Layers, held):
    """Multi-token prediction on the last stage: each module's layer activations per micro-batch
    in flight, and what its loss keeps for backward (``memory.kept_logits_bytes``) with its head's
    inputs. Megatron computes the MTP losses before the main one (Megatron-LM d98e8a64dd
    megatron/core/models/gpt/gpt_model.py ``_postprocess`` lines 746-761 call
    ``multi_token_prediction.process_mtp_loss``, which returns before the output layer computes the
    main logits), so an MTP loss's transient BF16 logits are freed before the main head's
    (``logits_bytes``, counted beside the layers' working set) exist."""
    model = x.model
    kept = (memory.kept_logits_bytes(model, x.b, x.s_local, x.t, x.flag("cross_entropy_loss_fusion"))
            + memory.head_input_bytes(model, x.b, x.s_local, x.t, x.sp))
    return model.mtp_num_layers * (held * mtp_layer(layers, model)["stored"] + kept)


def peak_memory(x: Candidates, layers: Layers, params: list, memory_fraction: float) -> dict:
    """The fullest stage's peak, whether it fits, and its memory by kind (``MEMORY_KEYS``). A
    DualPipe rank holds two stages' model states (``pipeline.DUALPIPE_PARAMETER_COPIES``): a
    middle rank two like the fullest middle stage, an end rank the first stage's and the last's
    (the embedding, the output head and the MTP module once: ``pipeline.DUALPIPE``)."""
    stage_layers = x.stage_layer_counts
    priced = lora_model_states if finetune.is_lora(x.model) else model_states
    first, middle, last = (priced(x, layers, p, n, n_moe, kinds) for p, (n, n_moe, kinds) in zip(params, stage_layers))
    copies = np.where(x.dualpipe, pipeline.DUALPIPE_PARAMETER_COPIES, 1.0)
    dual_first, dual_last = first, last
    if x.dualpipe.any():  # the end rank's two stages, contiguous (dualpipe_stage_moe)
        first_moe, last_moe = dualpipe_stage_moe(x)
        dual = stage_params(x, layers, (first_moe, last_moe))
        dual_first = priced(x, layers, dual[0], x.first_layers, first_moe)
        dual_last = priced(x, layers, dual[2], x.last_layers, last_moe)
    both = [f + l for f, l in zip(dual_first, dual_last)]
    states = [[np.where(x.dualpipe, b, f) for b, f in zip(both, first)], [copies * st for st in middle],
              [np.where(x.dualpipe, b, l) for b, l in zip(both, last)]]
    acts, logits = activation_bytes(x, layers)
    peaks = [sum(st) + a for st, a in zip(states, acts)]
    fullest = np.argmax(np.stack([np.where(ok, pk, -np.inf) for ok, pk in zip(present(x), peaks)]), axis=0)
    choose = lambda values: np.choose(fullest, values)  # noqa: E731  (it broadcasts; broadcast views made it 2x slower)
    weights, grads, optimizer, fp8_weights = (choose([st[i] for st in states]) for i in range(4))
    logits_shown = choose(logits)
    peak = choose(peaks) + x.hw.reserve_gib * GIB
    return {
        "fits": peak <= memory_fraction * x.hw.memory_gib * GIB,
        "peak_memory_gib": peak / GIB,
        "weights_gib": weights / GIB,
        "grads_gib": grads / GIB,
        "optimizer_gib": optimizer / GIB,
        "fp8_weights_gib": fp8_weights / GIB,
        "activations_gib": (choose(acts) - logits_shown) / GIB,
        "logits_gib": logits_shown / GIB,
        "reserve_gib": np.full_like(peak, x.hw.reserve_gib),
    }
