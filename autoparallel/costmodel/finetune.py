"""Fine-tuning's shapes: LoRA adapters beside frozen Linears, and packed sequences' attention.

LoRA (``specs.finetune``) leaves the base model frozen: its Linears still run forward and pass
activation gradients back (dgrad), but compute no weight gradients (no wgrad GEMMs), and hold no
gradients or optimizer states. Each target Linear gets an adapter ``B·A`` of rank r, in BF16,
as Megatron-Bridge's ``ParallelLinearAdapter`` splits it under TP (``adapter_params_gpu``: both
halves split). Adapters train as any weight does: forward, dgrad and wgrad, gradients reduced over
DP, Adam states; their thin GEMMs and eager ops take the time of the bytes they stream
(``adapter_stream_elements``) and their own TP collectives (``adapter_collectives``).

Under an FP8 recipe the frozen base is kept in FP8 only: one byte a weight where the run makes the
transpose the dgrad GEMM reads in every micro-batch and frees it (MLPerf's LoRA submissions,
TransformerEngine 1.x: ``Finetune.fp8_transpose_per_microbatch``, ``frozen_transpose_bytes``), else
both layouts kept, as TE 2.x keeps them (``base_weight_bytes``); under BF16 in BF16.

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
FP8_TRANSPOSE_BYTES = 2.0  # a one-byte FP8 weight read and its one-byte transpose written
# Which side of each target Linear TP splits: column-parallel (output) or row-parallel (input).
COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
# PyTorch's dropout in BF16 elements: forward reads the input and writes the output and a one-byte
# mask (2.5), backward reads the gradient and the mask and writes the input gradient (2.5).
DROPOUT_PASSES = 5.0
# The mask PyTorch's dropout keeps for its backward, one byte per element: ``_fused_dropout`` returns
# (output, mask) and its derivative reads result1, the mask (pytorch/pytorch@0002cecdb2e6
# tools/autograd/derivatives.yaml, ``_fused_dropout``; today's ``native_dropout`` entry reads result1
# alike), which the CUDA kernel allocates as uint8 (pytorch/pytorch@b1765068ac33
# aten/src/ATen/native/cuda/Dropout.cu ``fused_dropout_cuda``: ``dtype(kByte)``; a bool tensor since).
DROPOUT_MASK_BYTES = 1.0


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
    """One layer's adapter weights on one GPU of a TP group of ``t`` (0 unless LoRA): both halves
    split, whatever the side of the base (Megatron-Bridge 067f987, ``peft/utils.py``
    ``ParallelLinearAdapter``: beside a column-parallel Linear A is a ``ColumnParallelLinear`` over
    the rank, beside a row-parallel one a ``RowParallelLinear`` over its input; B is a
    ``ColumnParallelLinear`` over the output in both)."""
    if not is_lora(model):
        return np.zeros_like(np.asarray(t, dtype=float))
    r = model.finetune.lora_rank
    return sum(r * sum(target_shapes(model)[name]) for name in model.finetune.lora_targets) / np.asarray(t, dtype=float)


def adapter_gemms(model: ModelSpec) -> int:
    """GEMMs of one layer's adapters in one forward: A then B per target."""
    return 2 * len(model.finetune.lora_targets) if is_lora(model) else 0


def adapter_stream_elements(model: ModelSpec, t, sp):
    """Activation elements one layer's adapters move through HBM per token of the sequence a GPU
    computes (0 unless LoRA), at the widths one TP rank holds.

    An adapter's GEMMs are thin (one side is the rank: a few FLOPs per byte, far below any GPU's
    FLOP:byte ridge), so they take the time of the wide operand each streams: forward, A reads the
    target's input and B writes its output; backward, B's dgrad and wgrad each read the output
    gradient, A's dgrad writes the input gradient and A's wgrad reads the input again (3 passes
    over each side). The rest runs as eager elementwise ops (``LoRALinear.forward``,
    ``ParallelLinearAdapter.forward``): the output scaled by alpha/r (read, write) and added to the
    base output (two reads, one write), the scaling's backward (read, write), and autograd's sum of
    the adapter's input gradient into the base's (two reads, one write). A column-parallel target's
    input is the whole sequence gathered (under SP) and its output split; a row-parallel one's
    input is split and its output, gathered whole, is scattered back over the sequence under SP.
    With ``lora_dropout`` the input goes through dropout first, as the base input is laid out
    (``DROPOUT_PASSES``)."""
    if not is_lora(model):
        return np.zeros_like(np.asarray(t, dtype=float))
    shard = np.where(sp, t, 1.0)
    dropout = DROPOUT_PASSES if model.finetune.lora_dropout > 0 else 0.0
    total = 0.0
    for name in model.finetune.lora_targets:
        fan_in, fan_out = target_shapes(model)[name]
        if name in COLUMN_PARALLEL:
            total = total + 3.0 * (fan_in + fan_out / t) + 7.0 * fan_out / t + (3.0 + dropout) * fan_in / shard
        else:
            total = total + 3.0 * (fan_in + fan_out) / t + 7.0 * fan_out / shard + (3.0 + dropout) * fan_in / t
    return total


def adapter_collectives(model: ModelSpec, t, sp, ub=False, regather=False) -> list[tuple[float, float]]:
    """The TP collectives one layer's adapters run per micro-batch beyond the base's, as (elements
    per token, collectives of that size, each priced as an all-gather): beside a column-parallel
    Linear under SP, none where the base gathers its input by NCCL (no userbuffers, ``ub``
    False): TransformerEngine's LayerNormLinear returns the norm output it gathered
    (``return_layernorm_output_gathered``) and the adapter takes it as is, its A's input-gradient
    reduce switched off (Megatron-Bridge 067f987 ``peft/utils.py`` ``get_adapter_attributes_from_linear``:
    ``disable_sequence_parallel_comm`` when the Linear has no ``ub_overlap_ag``; A built with
    ``disable_grad_reduce`` under SP; NeMo 1's ``mcore_mixins.py`` alike); where userbuffers
    gather it (``ub``), the adapter gathers the input over the sequence itself
    (``gather_from_sequence_parallel_region``, reduce-scattered back in the backward: two); without
    SP, A's ``ColumnParallelLinear`` all-reduces its input gradient (two); beside a row-parallel one, B's output
    gathered whole (``gather_output``) and, under SP, the gradient of its sequence scatter gathered
    in the backward (Megatron-Bridge's default path); with ``lora_a2a`` under SP, B's split output
    goes to its sequence shard by one all-to-all each way (``all2all_hp2sp``: each rank sends
    (t-1)/t of its T x out/t, priced as an all-gather of that buffer). With ``regather`` under SP
    (``Plan.lora_input_regather``) the adapter beside a column-parallel Linear runs three, userbuffers
    or not: TE returns the norm output's sequence shard, and A's ``ColumnParallelLinear`` with
    ``sequence_parallel`` gathers it in the forward, gathers it again in the backward for its weight
    gradient and reduce-scatters its input gradient (Megatron-Bridge 067f987 ``peft/utils.py``
    ``get_adapter_attributes_from_linear``: ``return_layernorm_output_gathered = not
    sequence_parallel_input_regather``; ``ParallelLinearAdapter.forward``; Megatron-Core's
    ``LinearWithGradAccumulationAndAsyncCommunication``: the backward gather overlaps A's dgrad GEMM
    and the reduce-scatter its wgrad GEMM, both rank-thin, so they are priced exposed). The
    rank-wide tensors between A and B are neglected. On the compute stream: exposed."""
    if not is_lora(model):
        return []
    out = []
    for name in model.finetune.lora_targets:
        fan_in, fan_out = target_shapes(model)[name]
        if name in COLUMN_PARALLEL:
            sp_on = np.asarray(sp, dtype=bool)
            out.append((fan_in, np.where(sp_on & np.asarray(regather, dtype=bool), 3.0,
                                         np.where(sp_on & ~np.asarray(ub, dtype=bool), 0.0, 2.0))))
        elif model.finetune.lora_a2a:
            out.append((np.where(sp, fan_out / t, fan_out), np.where(sp, 2.0, 1.0)))
        else:
            out.append((fan_out, np.where(sp, 2.0, 1.0)))
    return out


def base_weight_bytes(model: ModelSpec, is_fp8, quantized_weight_bytes=FROZEN_FP8_WEIGHT_BYTES):
    """Bytes a frozen base weight takes: BF16, or under a quantized recipe its quantized copies
    only (no BF16 weight: FP8 primary weights): one layout where the run transposes it for each
    micro-batch's dgrad instead of keeping the transpose (``frozen_transpose_bytes``: MLPerf's TE 1.x
    runs), else the layouts the recipe keeps of any quantized weight, ``quantized_weight_bytes``
    (TE 2.x creates an FP8 parameter with its column-wise copy, ``module/base.py``
    ``reset_parameters``: ``quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())``,
    and ``get_weight_workspace`` never drops it; a frozen weight's is never invalidated)."""
    transposed = is_lora(model) and model.finetune.fp8_transpose_per_microbatch
    kept = FROZEN_FP8_WEIGHT_BYTES if transposed else quantized_weight_bytes
    return np.where(is_fp8, kept, 2.0)


def frozen_transpose_bytes(model: ModelSpec, quantized_weight_bytes, non_tn_fp8_gemm: bool):
    """HBM bytes per frozen base weight element that one micro-batch's backward moves to lay the
    FP8 weight out for its data-gradient GEMM (0 unless LoRA under a quantized recipe on a GPU whose
    FP8 GEMMs take one operand layout, TN, where the weight's quantized copies are two layouts:
    ``quantized_weight_bytes`` above ``FROZEN_FP8_WEIGHT_BYTES``): the kept FP8 weight read and its
    transpose written, ``FP8_TRANSPOSE_BYTES``.

    The frozen base is kept in FP8 only (``base_weight_bytes``), as MLPerf's LoRA runs keep it:
    FP8 primary weights (NeMo's ``fp8_params``) with ``disable_parameter_transpose_cache``
    (NVIDIA's MLPerf v4.0 ``megatron_gpt_peft_tuning_config.yaml``; NeMo 8cfedd7
    ``scripts/performance/llm/mlperf_lora_llama2_70b.py``), under which Megatron passes TE no
    ``is_first_microbatch`` (Megatron-LM d98e8a64dd ``megatron/core/extensions/transformer_engine.py``).
    TransformerEngine 1.x's backward then calls ``weight_fp8.transpose_2d()`` for the dgrad GEMM
    (``module/linear.py``, ``layernorm_linear.py``, ``layernorm_mlp.py``), and a ``Float8Tensor``
    with no cached ``_transpose`` computes a fresh one that it does not keep (``fill_cache``
    False: ``tensor/float8_tensor.py`` ``transpose_2d``, v1.9-v1.11): once per Linear, micro-batch
    and backward. A weight that learns would refill a cache once per step after the optimizer; a
    frozen one never does. Per weight on the GPU, whatever the layout, so a layout that holds more
    weights per GPU (less TP or PP) and runs more micro-batches per GPU (more CP) pays more.
    Priced only where the run makes them so (``Finetune.fp8_transpose_per_microbatch``, set on
    MLPerf's rows). TransformerEngine 2.x's ``Float8TensorStorage.update_usage`` keeps the transpose
    it makes on the parameter (v2.9 ``tensor/storage/float8_tensor_storage.py``; ``module/base.py``
    ``get_weight_workspace``: "do not destroy unnecessary usages"): no per-micro-batch pass, 1 B more
    per weight (``base_weight_bytes``). Blackwell's FP8 GEMMs take either layout
    (``non_tn_fp8_gemm``): no transpose."""
    if not is_lora(model) or not model.finetune.fp8_transpose_per_microbatch or non_tn_fp8_gemm:
        return np.zeros_like(np.asarray(quantized_weight_bytes, dtype=float))
    return np.where(np.asarray(quantized_weight_bytes) > FROZEN_FP8_WEIGHT_BYTES, FP8_TRANSPOSE_BYTES, 0.0)


def frozen_column_copy_elements(model: ModelSpec, input_elements, row_parallel_output_elements):
    """Elements per token (at a TP rank's widths times its TP size, as ``fp8_cast_time`` counts the
    casts) whose column-wise (transposed) FP8 copy a frozen base's casts do not write, one
    ``quantized_input_bytes`` each (0 unless LoRA): the column-wise copies exist for the
    weight-gradient GEMM only, but TransformerEngine drops them per module, not per tensor.

    - Every Linear's input (``input_elements``): TE 2.x asks for the input's column-wise copy
      only when the weight learns (``linear.py`` ``backward_needs_input = is_grad_enabled and
      weight.requires_grad``; ``layernorm_linear.py`` alike; TransformerEngine d0067d0).
    - The output gradient of a row-parallel ``Linear`` only (the projection's and FC2's,
      ``row_parallel_output_elements``): ``linear.py``'s backward drops its column-wise usage when
      the weight needs no gradient and has no bias (``grad_output_quantizer.set_usage(columnwise=False)``),
      while ``layernorm_linear.py`` (Megatron-Core's QKV and FC1, ``TELayerNormColumnParallelLinear``)
      sets ``grad_output_quantizer.set_usage(rowwise=True, columnwise=True)`` whatever the weight
      (d0067d0): the frozen QKV and FC1 still cast their output gradients in both layouts.

    TransformerEngine 1.x (v1.10, ``module/base.py`` ``grad_output_preprocess``) casts every output
    gradient with ``fp8_cast_transpose_fused`` whatever the weight, and for a learning weight
    transposes the LayerNormLinear's saved FP8 norm output in the backward (``tex.fp8_transpose``:
    1 B read and 1 B written per element) and writes the Linear's column-wise input in the forward
    cast (``fp8_cast_transpose_fused``, 1 B): per token 2 x 2h + (attention output + FFN) bytes,
    the same as TE 2.x's (h + attention output + h + FFN) + 2h, since QKV's and FC1's inputs and
    the projection's and FC2's outputs are all h wide: one count serves both releases."""
    if not is_lora(model):
        return 0.0
    return input_elements + row_parallel_output_elements


def attention_share(model: ModelSpec) -> float:
    """The share of a causal s x s mask's score entries that packed documents' per-document
    causal masks compute (1 when not packed or one document per sequence)."""
    ft = model.finetune
    if ft is None or not ft.packed_sequence or ft.document_tokens is None:
        return 1.0
    return ft.document_tokens / model.seq_length


def dropout_saved_bytes(model: ModelSpec, b, s, t, sp):
    """What LoRA's dropout makes its adapters keep for backward. ``ParallelLinearAdapter`` drops each
    target's input before A (``dropout_position`` "pre", MLPerf's configs; NeMo 24.09-alpha.rc0
    nemo/collections/nlp/modules/common/megatron/adapters/parallel_adapters.py L238, L290, L301), so
    (1) the dropout keeps its mask, ``DROPOUT_MASK_BYTES`` per element of the input as the base
    splits it: beside QKV and FC1 the SP shard of the norm output (a lower bound where the adapter
    gets it gathered), beside the projection and FC2 their TP-split inputs; (2) beside the
    projection A saves the dropped BF16 copy, no longer the attention output it shares without
    dropout (``frozen_activation_bytes``; beside the other targets their own copy is counted
    there). None without dropout."""
    if not is_lora(model) or model.finetune.lora_dropout <= 0:
        return 0.0
    targets = model.finetune.lora_targets
    proj = model.num_attention_heads * model.head_dim * ("linear_proj" in targets)
    column = model.hidden_size * sum(name in targets for name in COLUMN_PARALLEL)
    row = proj + model.ffn_hidden_size * ("linear_fc2" in targets)
    mask = DROPOUT_MASK_BYTES * (np.where(sp, column / t, column) + row / t)
    return b * s * (mask + memory.GEMM_INPUT_BYTES * proj / t)


def adapter_input_bytes(model: ModelSpec, b, s, t, regather=False):
    """The BF16 inputs the adapters beside QKV, FC1 (the whole sequence) and FC2 (TP-split) save for
    A's weight gradient (``frozen_activation_bytes``' adapter share; the projection's adapter shares
    the attention output, or keeps a dropped copy: ``dropout_saved_bytes``). With ``regather``
    (``Plan.lora_input_regather``, which the space offers under SP only) the QKV and FC1 adapters keep
    the sequence shard instead, 1/t of it: A's ``ColumnParallelLinear`` with ``sequence_parallel``
    saves its input before the gather (Megatron-Core ``LinearWithGradAccumulationAndAsyncCommunication``)."""
    if not is_lora(model):
        return 0.0
    targets = model.finetune.lora_targets
    column = model.hidden_size * sum(name in targets for name in COLUMN_PARALLEL)
    column = np.where(np.asarray(regather, dtype=bool), column / np.asarray(t, dtype=float), column)
    return memory.GEMM_INPUT_BYTES * b * s * (column + model.ffn_hidden_size * ("linear_fc2" in targets) / t)


def frozen_activation_bytes(model: ModelSpec, b, s, t, sp, fp8_fraction=0.0,
                            quantized_bytes=memory.FP8_GEMM_INPUT_BYTES, attention_output=None,
                            fused_saves_output=True, regather=False):
    """What a LoRA layer keeps beyond (negative: short of) ``memory.layer_activation_bytes``'s
    count of the Linears' inputs: a frozen Linear keeps no input for a weight gradient (QKV's and
    FC1's norm outputs, FC2's activation output); a target's adapter keeps its BF16 input instead:
    beside QKV and FC1 the whole sequence even under SP, the norm output gathered for it (by the
    adapter, or by TE where it returns it gathered), which A's ColumnParallelLinear saves for its
    weight gradient (Megatron-Bridge 067f987 ``peft/utils.py`` ``ParallelLinearAdapter.forward``;
    its opt-in ``sequence_parallel_input_regather``, off by default, would keep the shard: Bridge
    PR #4581), beside FC2 the input the base splits by TP. The projection's input is the attention output (counted ``attention_output`` bytes per
    element, else as a GEMM input): a fused attention keeps it in BF16 for itself, which a
    target's adapter shares (the adapter keeps it in BF16 either way); the frozen projection keeps
    no copy of its own."""
    if not is_lora(model):
        return 0.0
    gemm_in = memory.gemm_input_bytes(fp8_fraction, quantized_bytes)
    counted_output = gemm_in if attention_output is None else attention_output
    replicated = -2.0 * gemm_in * model.hidden_size  # QKV's and FC1's own inputs, not kept
    output = np.where(fused_saves_output | ("linear_proj" in model.finetune.lora_targets),
                      memory.GEMM_INPUT_BYTES, counted_output)
    sharded = -gemm_in * model.ffn_hidden_size + (output - counted_output) * model.num_attention_heads * model.head_dim
    return (adapter_input_bytes(model, b, s, t, regather)
            + b * s * (np.where(sp, replicated / t, replicated) + sharded / t))
