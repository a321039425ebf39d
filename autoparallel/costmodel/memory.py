"""Per-GPU memory: model states, activations in flight, logits, FP8 copies and a fixed reserve.

Activation bytes follow Korthikanti et al. (arXiv 2205.05198) §4, generalised per tensor so
GQA and SwiGLU come out right. For GPT (MHA, ffn = 4h) the per-layer count reproduces their
s·b·h·(10 + 24/t + 5·a·s/(h·t)) without sequence parallel and s·b·h/t·(34 + 5·a·s/h) with it:
10 bytes per token·hidden are replicated across TP ranks unless SP shards them. The dropout
masks are counted only when the model has dropout (``hidden_dropout`` / ``attention_dropout`` >
0): Llama and Nemotron train without, and their layers save 8 and 2 bytes per score instead.

Under an FP8 recipe TransformerEngine keeps, of each Linear's input, only the FP8 copy the
weight-gradient GEMM reads (1 B per element instead of 2; under NVFP4 its column-wise NVFP4 copy,
0.5625 B): the QKV, FC1 and FC2 inputs; the norms' inputs, Q/K/V for attention and the activation's
input stay BF16 (the SwiGLU's input is kept as an E4M3 copy, 1 B, where
TransformerConfig.activation_func_fp8_input_store is set: Megatron's fused ``bias_swiglu`` /
``weighted_bias_swiglu`` save ``input.to(torch.float8_e4m3fn)``). The attention output is kept by
the fused attention itself in BF16, beside the projection's FP8 copy under delayed scaling
(``attention_output_bytes``).

The loss keeps the FP32 softmax of the logits (4 B per token and vocabulary entry, Megatron's
``_VocabParallelCrossEntropy``), and while it is computed the BF16 logits exist beside it (2 B);
TransformerEngine's fused loss keeps the BF16 logits only.

Model states follow Megatron-LM's distributed-optimizer documentation: BF16 weights 2 B/param,
main gradients 4 B/param (2 with --grad-reduce-in-bf16), Adam (FP32 master + m + v) 12 B/param,
the 12 sharded over the DP×CP group by the distributed optimizer (6 with the precision-aware
optimizer: BF16 moments, and only the 16-bit remainder of each FP32 master weight beside the BF16
weight, Megatron-Core's default store_param_remainders; 8 where FP8 parameters turn that off; 10 with
Apex DistributedFusedAdam's remainders, NeMo 1's default); under an FP8 recipe each layer weight also
has its FP8 copy and its transpose (2 B; one layout, 1 B, for per-tensor FP8 on Blackwell), and with
--fp8-param-gather those FP8 tensors are the parameters: the BF16 weight of an FP8 layer is not kept
at all; FSDP (Megatron-FSDP optim_grads_params, FSDP2) shards weights and gradients too, and holds two layers' full BF16
weights (the one computing and the one prefetched) and one layer's full gradient unsharded.

A MoE layer (``routed_expert_bytes``) keeps, per routed token copy on the GPU that computes it,
the FC1 input gathered over expert TP, the FFN tensors and the routing probability, on the busiest
GPU ``imbalance`` times the even share: Megatron-Core (since 0.13) multiplies the probabilities in
the experts' activation function (``weighted_bias_swiglu``), so the unpermutation, a scatter-add,
keeps nothing; selective recompute of
Megatron's modules spares parts of a layer (``recomputed_bytes``).

``tests/test_memory_megatron.py`` compares these counts with the formulas of Megatron-LM's
``theoretical_memory_usage.py`` and states each difference.
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.model import ModelSpec

GIB = float(2**30)
NORM_INPUT_BYTES = 4.0  # the two norms' BF16 inputs
GEMM_INPUT_BYTES = 2.0  # a BF16 Linear input; TE keeps 1 B (its FP8 copy) under an FP8 recipe
FP8_GEMM_INPUT_BYTES = 1.0
HIDDEN_DROPOUT_MASK_BYTES = 2.0  # one byte per mask, after attention and after the MLP
SOFTMAX_OUTPUT_BYTES = 2.0  # per attention score
ATTENTION_DROPOUT_BYTES = 3.0  # per attention score: dropout mask 1, dropout output 2
MASTER_WEIGHT_BYTES = 4.0  # the distributed optimizer's FP32 copy of each weight
# Under the precision-aware optimizer with BF16 weights Megatron-Core keeps only the low 16 bits of
# each FP32 master weight (OptimizerConfig.store_param_remainders, default True; the high 16 are the
# BF16 weight itself): megatron/core/optimizer/distrib_optimizer.py allocates master_param as int16.
MASTER_REMAINDER_BYTES = 2.0
ADAM_MOMENT_BYTES = 4.0  # each of Adam's two moments, FP32
BF16_MOMENT_BYTES = 2.0  # each moment under the precision-aware optimizer's --exp-avg(-sq)-dtype bf16
OPTIMIZER_BYTES = MASTER_WEIGHT_BYTES + 2 * ADAM_MOMENT_BYTES  # 12
WEIGHT_BYTES = 2.0
FP8_WEIGHT_BYTES = 1.0  # a weight kept (and all-gathered) in FP8 only: --fp8-param-gather
# What a full-iteration CUDA graph keeps of every micro-batch of the step as static inputs: int64
# token ids and labels and the FP32 loss mask per token.
GRAPH_DATA_BYTES_PER_TOKEN = 8.0 + 8.0 + 4.0
SOFTMAX_BYTES = 4.0  # the FP32 softmax the cross-entropy keeps for backward
# TransformerEngine's fused loss (transformer_engine/pytorch/cross_entropy.py CrossEntropyFunction,
# v2.9) writes the gradient into the BF16 logits in its forward and saves only them.
FUSED_LOGITS_BYTES = 2.0
LOGITS_TRANSIENT_BYTES = 2.0  # the BF16 logits beside it while the loss is computed
EMBEDDING_INPUT_BYTES = 8.0  # int64 token ids per token, per micro-batch in flight
ROUTER_INPUT_BYTES = 2.0  # the MoE router's BF16 input
ACT_INPUT_BYTES = 2.0  # per element of the activation's input: BF16 ...
FP8_ACT_INPUT_BYTES = 1.0  # ... or its E4M3 copy (TransformerConfig.activation_func_fp8_input_store, SwiGLU only)


def gemm_input_bytes(fp8_fraction, quantized_bytes=FP8_GEMM_INPUT_BYTES):
    """Bytes kept per element of a Linear input, a share ``fp8_fraction`` of layers quantized
    (keeping ``quantized_bytes``: 1 under FP8, 0.5625 under NVFP4: E2M1 and its 1x16 block scale)."""
    return GEMM_INPUT_BYTES - (GEMM_INPUT_BYTES - quantized_bytes) * fp8_fraction


def replicated_bytes_per_token_hidden(model: ModelSpec, fp8_fraction=0.0, moe: bool = False,
                                      quantized_bytes=FP8_GEMM_INPUT_BYTES, attention: bool = True,
                                      ffn: bool = True):
    """Activation bytes per token and hidden unit that only sequence parallel shards (10 for GPT):
    the norms' inputs, the QKV and FC1 inputs, the hidden dropout masks. A MoE layer keeps the
    router's BF16 input instead of FC1's (and the shared experts' FC1 input); multi-latent
    attention also keeps its latents (each norm's input and its up projection's input).
    ``attention`` / ``ffn`` False: a hybrid model's layer of one block (``hybrid``), which keeps
    one norm's input, that block's first GEMM input and one dropout mask."""
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    if moe:
        mlp_input = ROUTER_INPUT_BYTES + (gemm_in if model.shared_expert_ffn_hidden_size else 0.0)
    else:
        mlp_input = gemm_in
    latents = 0.0
    if model.is_dsv4:  # DeepSeek-V4: the query latent only (wkv makes the one KV head directly)
        latents = (2.0 + gemm_in) * model.q_lora_rank / model.hidden_size
    elif model.multi_latent_attention:
        latents = ((2.0 + gemm_in) * ((model.q_lora_rank or 0) + model.kv_lora_rank)
                   + 2.0 * model.qk_pos_emb_head_dim) / model.hidden_size
    mask = HIDDEN_DROPOUT_MASK_BYTES if model.hidden_dropout else 0.0
    if not (attention and ffn):  # one block: one norm, one mask
        return ((NORM_INPUT_BYTES + mask) / 2.0 + (gemm_in + latents if attention else 0.0)
                + (mlp_input if ffn else 0.0))
    return (NORM_INPUT_BYTES + gemm_in + mlp_input + latents + mask)


def bytes_per_attention_score(model: ModelSpec) -> float:
    """Bytes saved per s×s attention score when they are stored (5 with attention dropout)."""
    return SOFTMAX_OUTPUT_BYTES + (ATTENTION_DROPOUT_BYTES if model.attention_dropout else 0.0)


def _per_ffn_unit(model: ModelSpec, gemm_in, act_in=ACT_INPUT_BYTES):
    """Bytes per token and FFN unit: the activation's input (two tensors for a gated MLP, ``act_in``
    bytes per element) and the FC2 input."""
    return (2.0 if model.gated_mlp else 1.0) * act_in + gemm_in


def attention_output_bytes(fp8_fraction, quantized_bytes, fused_saves_output, proj_keeps_copy):
    """Bytes kept per element of the attention output (the projection's input). A fused attention
    kernel (flash, cuDNN; not recomputed) saves its BF16 output for its backward (TransformerEngine
    FusedAttnFunc saves q, k, v and out). Under an FP8/FP4 recipe the projection keeps its own
    quantized copy beside it (``proj_keeps_copy``: TE's Linear saves the quantized input), except
    where Megatron has it save the original BF16 input instead, shared with the attention's:
    every recipe but delayed scaling since Megatron-LM 781e765818 (attention.py
    set_save_original_input(self.linear_proj), TE >= 2.6)."""
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    with_copy = np.where(fused_saves_output, GEMM_INPUT_BYTES + fp8_fraction * quantized_bytes, gemm_in)
    return np.where(proj_keeps_copy, with_copy, GEMM_INPUT_BYTES)


def sharded_bytes_per_token_hidden(model: ModelSpec, fp8_fraction=0.0, moe: bool = False,
                                   quantized_bytes=FP8_GEMM_INPUT_BYTES, act_in=ACT_INPUT_BYTES,
                                   attention_output=None, attention_kept: bool = True, ffn: bool = True):
    """Activation bytes per token and hidden unit that tensor parallel shards (24 for GPT):
    Q, K and V, the attention output (the projection's input; ``attention_output`` bytes per
    element, see ``attention_output_bytes``, else the projection's GEMM input), the activation's
    input (two tensors for a gated MLP) and the FC2 input; in a MoE layer, of the shared experts
    only (the routed experts' share is ``routed_expert_bytes``)."""
    h, heads = model.hidden_size, model.num_attention_heads
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    out = gemm_in if attention_output is None else attention_output
    if model.is_dsv4:  # heads' queries, one K and one V head, the output and the o_groups projection's input
        attention = (2.0 * (heads * model.qk_dim + 2 * model.v_dim) + out * heads * model.v_dim
                     + gemm_in * model.o_groups * model.o_lora_rank) / h
    elif model.multi_latent_attention:
        attention = (2.0 * heads * (2 * model.qk_dim + model.v_dim) + out * heads * model.v_dim) / h
    else:
        kv = model.query_groups / heads
        attention = (2.0 + 4.0 * kv + out) * heads * model.head_dim / h
    width = model.shared_expert_ffn_hidden_size if moe else model.ffn_hidden_size
    if not (attention_kept and ffn):  # a hybrid model's layer of one block
        return ((attention if attention_kept else 0.0)
                + (_per_ffn_unit(model, gemm_in, act_in) * width / h if ffn else 0.0))
    return attention + _per_ffn_unit(model, gemm_in, act_in) * width / h


def routed_expert_bytes(model: ModelSpec, tokens, etp, imbalance, fp8_fraction=0.0,
                        quantized_bytes=FP8_GEMM_INPUT_BYTES, act_in=ACT_INPUT_BYTES):
    """What one MoE layer's routed experts save on one GPU for ``tokens`` tokens dispatched from
    it: per token copy (k per token, ``imbalance`` times the even share on the busiest GPU) the
    FC1 input gathered over ETP, the FFN tensors (split by ETP over etp times the tokens) and the
    FP32 probability (the weighted activation's second input)."""
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    h, ffn = model.moe_latent_size or model.hidden_size, model.expert_ffn_hidden_size
    per_copy = etp * gemm_in * h + _per_ffn_unit(model, gemm_in, act_in) * ffn + 4.0
    return tokens * model.moe_router_topk * imbalance * per_copy


def norm_output_bytes(model: ModelSpec, b, s, t, sp, fp8_fraction, moe: bool, moe_layer,
                      quantized_bytes=FP8_GEMM_INPUT_BYTES):
    """What ``--recompute-modules layernorm`` spares: the two norms' outputs, which Megatron
    discards after the forward and recomputes from the kept norm inputs. Under FP8/FP4 the
    Linears that read them keep the original input (TransformerEngine's ``save_original_input``,
    set by ``set_for_recompute_input_layernorm`` / ``set_for_recompute_pre_mlp_layernorm``), so
    their quantized copies go too: the attention's first Linear input, and FC1's (a MoE layer:
    the router's BF16 input and the shared experts' FC1 input, already spared by ``moe_layer``)."""
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    if moe:
        shared = model.shared_expert_ffn_hidden_size
        mlp_input = ROUTER_INPUT_BYTES + np.where(moe_layer, 0.0, gemm_in if shared else 0.0)
    else:
        mlp_input = gemm_in
    return (gemm_in + mlp_input) * b * s * model.hidden_size / np.where(sp, t, 1)


def recomputed_bytes(model: ModelSpec, b, s, t, sp, fp8_fraction, moe: bool, etp, imbalance,
                     mla_up_proj, moe_act, moe_layer, quantized_bytes=FP8_GEMM_INPUT_BYTES, layernorm=False,
                     act_in=ACT_INPUT_BYTES, routed_act_in=None):
    """What selective recompute of these Megatron modules spares a layer from keeping:
    ``mla_up_proj`` Q, K and V of multi-latent attention and the up projections' quantized input
    copies (Megatron-LM d98e8a64dd megatron/core/transformer/multi_latent_attention.py lines 983-990:
    ``CheckpointWithoutOutput`` runs the up projections and RoPE without autograd and keeps only its
    inputs, the latents; with TransformerEngine the latents' norms are fused into the up projections,
    gpt_layer_specs.py lines 246-255 and 277-278: q_layernorm / kv_layernorm IdentityOp, so those
    inputs are the BF16 latents the layer keeps anyway); ``moe_act`` the routed experts' FC2
    inputs (the activation's output); ``moe_layer`` everything the MoE block keeps but its input
    (routed and shared experts, the routed experts' activation input at ``routed_act_in`` bytes,
    ``act_in`` where not given: ``routed_expert_bytes``); ``layernorm`` the norms' outputs
    (``norm_output_bytes``)."""
    tokens = b * s / t
    gemm_in = gemm_input_bytes(fp8_fraction, quantized_bytes)
    out = np.where(layernorm, norm_output_bytes(model, b, s, t, sp, fp8_fraction, moe, moe_layer,
                                                quantized_bytes), 0.0)
    if model.is_dsv4:  # DeepSeek-V4's mla_up_proj: the queries (wq_b and RoPE) and wq_b's input copy
        latent_copies = gemm_in * model.q_lora_rank * b * s / np.where(sp, t, 1)
        queries = tokens * 2.0 * model.num_attention_heads * model.qk_dim
        out = out + np.where(mla_up_proj, queries + latent_copies, 0.0)
    elif model.multi_latent_attention:
        heads = model.num_attention_heads
        latent_copies = gemm_in * ((model.q_lora_rank or 0) + model.kv_lora_rank) * b * s / np.where(sp, t, 1)
        out = out + np.where(mla_up_proj, tokens * 2.0 * heads * (2 * model.qk_dim + model.v_dim) + latent_copies, 0.0)
    if moe:
        routed = routed_expert_bytes(model, tokens, etp, imbalance, fp8_fraction, quantized_bytes,
                                     act_in if routed_act_in is None else routed_act_in)
        act = tokens * model.moe_router_topk * imbalance * gemm_in * model.expert_ffn_hidden_size
        shared_ffn = model.shared_expert_ffn_hidden_size
        shared_input = np.where(sp, gemm_in * b * s * model.hidden_size / t, gemm_in * b * s * model.hidden_size)
        shared = (shared_input + tokens * _per_ffn_unit(model, gemm_in, act_in) * shared_ffn) if shared_ffn else 0.0
        out = out + np.where(moe_layer, routed + shared, np.where(moe_act, act, 0.0))
    return out


def layer_activation_bytes(model: ModelSpec, b, s, t, sp, keep_scores, fp8_fraction=0.0,
                           moe: bool = False, etp=1, imbalance=1.0, quantized_bytes=FP8_GEMM_INPUT_BYTES,
                           act_in=ACT_INPUT_BYTES, attention_output=None, routed_act_in=None,
                           attention: bool = True, ffn: bool = True):
    """Bytes one layer saves for backward for one micro-batch of ``b`` sequences of ``s`` tokens.

    ``keep_scores``: the s×s attention probabilities are stored (no flash attention and no
    selective recompute). ``fp8_fraction``: share of layers whose Linears run an FP8 recipe.
    ``moe``: a MoE layer (its routed experts over ``etp``, the busiest GPU's ``imbalance``).
    ``act_in``: bytes kept per element of the activation's input (``FP8_ACT_INPUT_BYTES`` when
    Megatron keeps it in FP8); ``routed_act_in``: the routed experts' own, where it differs
    (``--recompute-modules moe_act`` keeps their BF16 FC1 output, ``candidates``). ``attention`` /
    ``ffn`` False: a hybrid model's attention-only or FFN-only layer (``hybrid``).
    """
    sbh = b * s * model.hidden_size
    replicated_bytes = replicated_bytes_per_token_hidden(model, fp8_fraction, moe, quantized_bytes, attention, ffn)
    replicated = np.where(sp, replicated_bytes / t, replicated_bytes)
    per_token = replicated + sharded_bytes_per_token_hidden(model, fp8_fraction, moe, quantized_bytes, act_in,
                                                            attention_output, attention, ffn) / t
    scores = bytes_per_attention_score(model) * model.num_attention_heads * s * s * b / t
    routed_act_in = act_in if routed_act_in is None else routed_act_in
    routed = (routed_expert_bytes(model, b * s / t, etp, imbalance, fp8_fraction, quantized_bytes, routed_act_in)
              if moe and ffn else 0.0)
    return sbh * per_token + (np.where(keep_scores, scores, 0.0) if attention else 0.0) + routed


def layer_input_bytes(model: ModelSpec, b, s, t, sp):
    """Bytes a fully recomputed layer keeps: its BF16 input, sharded by SP."""
    return 2.0 * b * s * model.hidden_size / np.where(sp, t, 1)


def head_input_bytes(model: ModelSpec, b, s, t, sp):
    """The final norm's and the output layer's BF16 inputs on the last stage (SP shards both)."""
    return 2.0 * layer_input_bytes(model, b, s, t, sp)


def logits_bytes(model: ModelSpec, b, s, t, fused=False):
    """The loss's FP32 softmax and the BF16 logits beside it on the last stage (vocab-parallel);
    ``fused``: TransformerEngine's fused loss keeps the BF16 logits only."""
    per_logit = np.where(fused, FUSED_LOGITS_BYTES, SOFTMAX_BYTES + LOGITS_TRANSIENT_BYTES)
    return per_logit * b * s * model.vocab_size / t


def kept_logits_bytes(model: ModelSpec, b, s, t, fused=False):
    """What a loss keeps for its backward once it has been computed: the FP32 softmax (Megatron's
    ``_VocabParallelCrossEntropy``), or the BF16 logits under TransformerEngine's fused loss; the
    BF16 logits beside the softmax are gone by then."""
    return np.where(fused, FUSED_LOGITS_BYTES, SOFTMAX_BYTES) * b * s * model.vocab_size / t


def embedding_activation_bytes(model: ModelSpec, b, s):
    """What the embedding keeps per micro-batch in flight on the first stage: the token ids and,
    with hidden dropout, its dropout mask."""
    mask = b * s * model.hidden_size if model.hidden_dropout else 0.0
    return EMBEDDING_INPUT_BYTES * b * s + mask


def fsdp_buffer_bytes(layer_params_gpu, grad_bytes, weight_bytes=WEIGHT_BYTES):
    """Unsharded FSDP buffers: two layers' gathered weights (computing, prefetched; BF16, or FP8
    with --fp8-param-gather), one layer's gradients before its reduce-scatter."""
    return layer_params_gpu * (2.0 * weight_bytes + grad_bytes)
