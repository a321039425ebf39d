"""Per-GPU memory: model states, activations in flight, logits, FP8 copies and a fixed reserve.

Activation bytes follow Korthikanti et al. (arXiv 2205.05198) §4, generalised per tensor so
GQA and SwiGLU come out right. For GPT (MHA, ffn = 4h) the per-layer count reproduces their
s·b·h·(10 + 24/t + 5·a·s/(h·t)) without sequence parallel and s·b·h/t·(34 + 5·a·s/h) with it:
10 bytes per token·hidden are replicated across TP ranks unless SP shards them. The dropout
masks are counted only when the model has dropout (``hidden_dropout`` / ``attention_dropout`` >
0): Llama and Nemotron train without, and their layers save 8 and 2 bytes per score instead.

Model states follow Megatron-LM's distributed-optimizer documentation: BF16 weights 2 B/param,
main gradients 4 B/param (2 with --grad-reduce-in-bf16), Adam (FP32 master + m + v) 12 B/param,
the 12 sharded over the DP×CP group by the distributed optimizer.
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.model import ModelSpec

GIB = float(2**30)
NORM_AND_GEMM_INPUT_BYTES = 8.0  # LN inputs 4, QKV input 2, FC1 input 2
HIDDEN_DROPOUT_MASK_BYTES = 2.0  # one byte per mask, after attention and after the MLP
SOFTMAX_OUTPUT_BYTES = 2.0  # per attention score
ATTENTION_DROPOUT_BYTES = 3.0  # per attention score: dropout mask 1, dropout output 2
OPTIMIZER_BYTES = 12.0
WEIGHT_BYTES = 2.0
FP8_WEIGHT_COPY_BYTES = 2.0  # FP8 weight plus its transpose, cached across micro-batches


def replicated_bytes_per_token_hidden(model: ModelSpec) -> float:
    """Activation bytes per token and hidden unit that only sequence parallel shards (10 for GPT)."""
    return NORM_AND_GEMM_INPUT_BYTES + (HIDDEN_DROPOUT_MASK_BYTES if model.hidden_dropout else 0.0)


def bytes_per_attention_score(model: ModelSpec) -> float:
    """Bytes saved per s×s attention score when they are stored (5 with attention dropout)."""
    return SOFTMAX_OUTPUT_BYTES + (ATTENTION_DROPOUT_BYTES if model.attention_dropout else 0.0)


def sharded_bytes_per_token_hidden(model: ModelSpec) -> float:
    """Activation bytes per token and hidden unit that tensor parallel shards (24 for GPT)."""
    h = model.hidden_size
    kv = model.query_groups / model.num_attention_heads
    attention = 2.0 + 4.0 * kv + 2.0  # Q, K and V, then the attention output (projection input)
    ffn = model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    routed = model.moe_router_topk if model.is_moe else 1
    per_expert = (6.0 if model.gated_mlp else 4.0) * ffn / h  # activation input, FC2 input
    shared = (6.0 if model.gated_mlp else 4.0) * model.moe_shared_expert_ffn / h
    return attention + routed * per_expert + shared


def layer_activation_bytes(model: ModelSpec, b, s, t, sp, keep_scores):
    """Bytes one layer saves for backward for one micro-batch of ``b`` sequences of ``s`` tokens.

    ``keep_scores``: the s×s attention probabilities are stored (no flash attention and no
    selective recompute).
    """
    sbh = b * s * model.hidden_size
    replicated_bytes = replicated_bytes_per_token_hidden(model)
    replicated = np.where(sp, replicated_bytes / t, replicated_bytes)
    per_token = replicated + sharded_bytes_per_token_hidden(model) / t
    scores = bytes_per_attention_score(model) * model.num_attention_heads * s * s * b / t
    return sbh * per_token + np.where(keep_scores, scores, 0.0)


def layer_input_bytes(model: ModelSpec, b, s, t, sp):
    """Bytes a fully recomputed layer keeps: its BF16 input, sharded by SP."""
    return 2.0 * b * s * model.hidden_size / np.where(sp, t, 1)


def head_input_bytes(model: ModelSpec, b, s, t, sp):
    """The final norm's and the output layer's BF16 inputs on the last stage (SP shards both)."""
    return 2.0 * layer_input_bytes(model, b, s, t, sp)


def logits_bytes(model: ModelSpec, b, s, t):
    """FP32 logits and their gradient for the loss on the last stage (vocab-parallel)."""
    return 2 * 4.0 * b * s * model.vocab_size / t
