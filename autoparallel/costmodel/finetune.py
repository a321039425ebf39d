"""Fine-tuning's shapes: LoRA adapters beside frozen Linears, and packed sequences' attention.

LoRA (``specs.finetune``) leaves the base model frozen: its Linears still run forward and pass
activation gradients back (dgrad), but compute no weight gradients (no wgrad GEMMs), and hold no
gradients or optimizer states. Each target Linear gets an adapter ``B·A`` of rank r, in BF16,
as Megatron-Bridge's ``ParallelLinearAdapter`` splits it under TP: beside a column-parallel
Linear (linear_qkv, linear_fc1) A (in x r) is whole on every TP rank and B (r x out) split;
beside a row-parallel one (linear_proj, linear_fc2) A is split and B whole. Adapters train as any
weight does: forward, dgrad and wgrad (3x the forward), gradients reduced over DP, Adam states.

Under an FP8 recipe the frozen base is kept in FP8 only (one byte a weight, as MLPerf's LoRA
submissions keep it; the transpose the dgrad GEMM reads is made per layer and freed), under BF16
in BF16.

Packed sequences (``packed_sequence``) hold documents of ``document_tokens`` tokens on average
(assumption: all of that length) each attending causally to itself only (THD layout,
cu_seqlens): a sequence of s tokens costs (s/d)·d²/2 = s·d/2 score entries, d/s of one causal
s x s mask. All functions are pure and vectorised over the plan arrays.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import memory
from autoparallel.specs.model import ModelSpec

ADAPTER_BYTES = 2.0  # BF16 adapter weights (Megatron-Bridge's lora_dtype: the model's)
FROZEN_FP8_WEIGHT_BYTES = 1.0
# Which side of each target Linear TP splits: column-parallel (output) or row-parallel (input).
COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")


def is_lora(model: ModelSpec) -> bool:
    """A LoRA run: the base weights are frozen (no wgrad GEMMs, no main gradients, no Adam states)."""
    return model.finetune is not None and model.finetune.lora


def target_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA target Linear of a dense layer (Megatron's fused QKV and
    gated FC1)."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    qkv_out = (model.num_attention_heads + 2 * model.query_groups) * model.head_dim
    return {"linear_qkv": (h, qkv_out), "linear_proj": (model.num_attention_heads * model.head_dim, h),
            "linear_fc1": (h, ffn * (2 if model.gated_mlp else 1)), "linear_fc2": (ffn, h)}


def linear_passes(model: ModelSpec) -> float:
    """GEMM passes of a base Linear per micro-batch: forward, dgrad and wgrad, or only the first
    two for a frozen (LoRA) base."""
    return 2.0 if is_lora(model) else 3.0


def adapter_params_gpu(model: ModelSpec, t):
    """One layer's adapter weights on one GPU of a TP group of ``t`` (0 unless LoRA)."""
    if not is_lora(model):
        return np.zeros_like(np.asarray(t, dtype=float))
    r, total = model.finetune.lora_rank, 0.0
    for name in model.finetune.lora_targets:
        fan_in, fan_out = target_shapes(model)[name]
        total = total + (r * (fan_in + fan_out / t) if name in COLUMN_PARALLEL else r * (fan_in / t + fan_out))
    return total


def adapter_gemms(model: ModelSpec) -> int:
    """GEMMs of one layer's adapters in one forward: A then B per target."""
    return 2 * len(model.finetune.lora_targets) if is_lora(model) else 0


def base_weight_bytes(model: ModelSpec, is_fp8):
    """Bytes a frozen base weight takes: FP8 only under an FP8 recipe, else BF16."""
    return np.where(is_fp8, FROZEN_FP8_WEIGHT_BYTES, 2.0)


def attention_share(model: ModelSpec) -> float:
    """The share of a causal s x s mask's score entries that packed documents' per-document
    causal masks compute (1 when not packed or one document per sequence)."""
    ft = model.finetune
    if ft is None or not ft.packed_sequence or ft.document_tokens is None:
        return 1.0
    return ft.document_tokens / model.seq_length


def frozen_activation_bytes(model: ModelSpec, b, s, t, sp, fp8_fraction=0.0,
                            quantized_bytes=memory.FP8_GEMM_INPUT_BYTES, attention_output=None,
                            fused_saves_output=True):
    """What a LoRA layer keeps beyond (negative: short of) ``memory.layer_activation_bytes``'s
    count of the Linears' inputs: a frozen Linear keeps no input for a weight gradient (QKV's and
    FC1's norm outputs, FC2's activation output); a target's adapter keeps its BF16 input instead
    (assumption: sharded as the base input was, Megatron-Bridge's ``LORA_A2A``/regather paths).
    The projection's input is the attention output (counted ``attention_output`` bytes per
    element, else as a GEMM input): a fused attention keeps it in BF16 for itself, which a
    target's adapter shares (the adapter keeps it in BF16 either way); the frozen projection keeps
    no copy of its own."""
    if not is_lora(model):
        return 0.0
    gemm_in = memory.gemm_input_bytes(fp8_fraction, quantized_bytes)
    counted_output = gemm_in if attention_output is None else attention_output
    targets = model.finetune.lora_targets
    kept = lambda name: np.where(name in targets, memory.GEMM_INPUT_BYTES, 0.0) - gemm_in  # noqa: E731
    replicated = (kept("linear_qkv") + kept("linear_fc1")) * model.hidden_size
    output = np.where(fused_saves_output | ("linear_proj" in targets), memory.GEMM_INPUT_BYTES, counted_output)
    sharded = (kept("linear_fc2") * model.ffn_hidden_size
               + (output - counted_output) * model.num_attention_heads * model.head_dim)
    return b * s * (np.where(sp, replicated / t, replicated) + sharded / t)
