"""FLOP counts of one transformer layer, counted per GEMM so GQA, SwiGLU and MoE come out right.

Sources: Narayanan et al. SC'21 (arXiv 2104.04473) §5.1 for the GPT count
96·B·s·l·h²·(1 + s/6h + V/16lh) with full recompute (72·… without), and NeMo's "model TFLOP/s"
convention of 6·N + 12·l·h·s FLOPs per token (N: parameters incl. embeddings). All functions
are vectorised: ``b`` (micro-batch) and ``s`` (sequence) may be numpy arrays.
"""

from __future__ import annotations

import numpy as np

from autoparallel.specs.model import ModelSpec


def linear_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one layer's Linear GEMMs per token (the part FP8 accelerates)."""
    return 2.0 * model.active_layer_params


def attention_core_flops(model: ModelSpec, b, s, causal: bool | np.ndarray = False):
    """Forward FLOPs of QK^T and attention·V for a micro-batch of ``b`` sequences of ``s``.

    Narayanan counts the full s×s matrix; a causal flash kernel skips the upper half.
    """
    full = 4.0 * b * s * s * model.num_attention_heads * model.head_dim
    return np.where(causal, 0.5 * full, full)


def logits_flops(model: ModelSpec, b, s):
    """Forward FLOPs of the output layer (on the last pipeline stage)."""
    return 2.0 * b * s * model.hidden_size * model.vocab_size


def model_flops_per_token(model: ModelSpec) -> float:
    """FLOPs per trained token as NeMo counts "model TFLOP/s": 6·N_active + 12·l·h·s (no recompute)."""
    attention = 12.0 * model.num_layers * model.num_attention_heads * model.head_dim * model.seq_length
    return 6.0 * model.num_active_parameters + attention


def narayanan_flops_per_step(model: ModelSpec, gbs: float, full_recompute: bool) -> float:
    """Narayanan et al. eq. (3): hardware FLOPs per iteration of a GPT model (4 passes with
    full recompute, 3 without); used to compare with their Table 1."""
    l, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    coefficient = 96.0 if full_recompute else 72.0
    return coefficient * gbs * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
