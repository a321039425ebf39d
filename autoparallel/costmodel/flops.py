"""FLOP counts of one transformer layer, counted per GEMM so GQA, SwiGLU and MoE come out right.

Sources: Narayanan et al. SC'21 (arXiv 2104.04473) §5.1 and appendix for the GPT count
96·B·s·l·h²·(1 + s/6h + V/16lh) with full recompute (72·… without), and Megatron-LM's own
``num_floating_point_operations`` (``megatron/training/training.py``), which is what Megatron
prints as "throughput per GPU (TFLOP/s/GPU)" and what ``model_tflops_per_gpu`` and ``mfu``
report here: every Linear GEMM three times (forward, dgrad, wgrad), causal attention (half the
s×s scores), the output layer over the padded vocabulary, no input embedding, no recompute.
All functions are vectorised: ``b`` (micro-batch), ``s`` (sequence) and ``tp`` may be arrays.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import finetune
from autoparallel.specs.model import ModelSpec


def linear_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one layer's Linear GEMMs per token (the part FP8 accelerates), averaged
    over the layers (a MoE layer counts its top-k experts)."""
    return 2.0 * model.active_layer_params


def attention_core_flops(model: ModelSpec, b, s, causal: bool | np.ndarray = False):
    """Forward FLOPs of QK^T and attention·V for a micro-batch of ``b`` sequences of ``s``
    (multi-latent attention: queries and keys of qk_head_dim + qk_pos_emb_head_dim, values of
    v_head_dim per head).

    Narayanan counts the full s×s matrix; a causal flash kernel skips the upper half.
    """
    full = 2.0 * b * s * s * model.num_attention_heads * (model.qk_dim + model.v_dim)
    return np.where(causal, 0.5 * full, full)


def logits_flops(model: ModelSpec, b, s):
    """Forward FLOPs of the output layer (on the last pipeline stage)."""
    return 2.0 * b * s * model.hidden_size * model.vocab_size


MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM's default --make-vocab-size-divisible-by


def padded_vocab_size(model: ModelSpec, tp=1):
    """The vocabulary Megatron-LM builds: a multiple of 128·tp (``_vocab_size_with_padding``)."""
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * np.asarray(tp, dtype=float)
    return np.ceil(model.vocab_size / multiple) * multiple


def model_flops_per_token(model: ModelSpec, tp=1):
    """Training FLOPs per token as Megatron-LM's ``num_floating_point_operations`` counts them:
    6 per active Linear parameter (forward, dgrad, wgrad: the dense layers' MLP, the top-k and
    shared experts of the MoE layers, attention or MLA's projections; not the router),
    3·s·heads·(qk + v head dims) per layer for causal attention, 6·h·V for the output layer
    (V padded for ``tp``), no input embedding and no multi-token prediction. Fine-tuning: packed
    documents' attention (``finetune.attention_share``); under LoRA the frozen weights count 4
    (no wgrad) and the adapters 6 per parameter."""
    layers = (model.num_dense_layers * model.dense_layer_params
              + model.num_moe_layers * (model.active_moe_layer_params - model.router_params))
    attention = (3.0 * model.num_layers * model.seq_length * model.num_attention_heads
                 * (model.qk_dim + model.v_dim)) * finetune.attention_share(model)
    per_weight = 2.0 * finetune.linear_passes(model)
    logits = per_weight * model.hidden_size * padded_vocab_size(model, tp)
    adapters = 6.0 * model.num_layers * finetune.adapter_params_gpu(model, 1)
    return per_weight * layers + attention + logits + adapters


def narayanan_flops_per_step(model: ModelSpec, gbs: float, full_recompute: bool) -> float:
    """Narayanan et al. eq. (3): hardware FLOPs per iteration of a GPT model (4 passes with
    full recompute, 3 without); used to compare with their Table 1."""
    l, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    coefficient = 96.0 if full_recompute else 72.0
    return coefficient * gbs * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
