"""What a fine-tuning run changes about a model's training: which weights learn, and what the
sequences hold.

A run is pre-training unless the model carries a ``Finetune`` (``ModelSpec.finetune``). Full
supervised fine-tuning (``full``) trains every weight, as pre-training does; LoRA (``lora``)
freezes the base model and trains a rank-``lora_rank`` adapter beside each ``lora_targets``
Linear, named as Megatron-Bridge's ``LoRA.target_modules`` names them (its defaults: all four
Linears, dim 32; src/megatron/bridge/peft/lora.py). Fine-tuning datasets are packed
(``packed_sequence``: several documents per sequence of ``seq_length`` tokens, Megatron-Bridge's
offline packing), each document attending only to itself; ``document_tokens`` is their mean
length (None: one document fills the sequence, as MLPerf's GovReport samples of 8,192 tokens
nearly do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinetuneMode = Literal["full", "lora"]
FINETUNE_MODES = ("full", "lora")
# Megatron-Bridge's LoRA target_modules, in a layer's order: the fused QKV and the attention's
# output projection (attention), FC1 (gate and up fused) and FC2 (MLP).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
DEFAULT_LORA_RANK = 32  # Megatron-Bridge's LoRA.dim
# A fine-tuning run's global batch when none is given: NeMo 2's default_finetune_recipe (NVIDIA/NeMo
# 8cfedd7, nemo/collections/llm/recipes/finetune_default.py) takes 8 packed sequences, or 128
# unpacked ones; Megatron-Bridge's SFT and PEFT recipes (llama/h100/llama3.py, 067f987) take 8 with
# offline packing, "else 128". MLPerf's Llama-2-70B LoRA runs 8 up to 64 GPUs.
PACKED_GLOBAL_BATCH, UNPACKED_GLOBAL_BATCH = 8, 128


@dataclass(frozen=True)
class Finetune:
    mode: FinetuneMode = "full"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: tuple[str, ...] = LORA_TARGETS
    packed_sequence: bool = False
    document_tokens: int | None = None  # mean document length in a packed sequence; None: the whole sequence
    # Dropout on each adapter's input (Megatron-Bridge's LoRA.dropout, position "pre": default 0.0;
    # MLPerf's Llama-2-70B LoRA runs 0.1).
    lora_dropout: float = 0.0
    # Megatron-Bridge's LoRA.a2a_experimental (default False): beside a row-parallel Linear under SP,
    # B's output goes back over the sequence by an all-to-all instead of a gather and a scatter.
    lora_a2a: bool = False
    # The frozen FP8 base's transposes made again in every micro-batch's backward, as MLPerf's LoRA
    # runs make them (FP8 primary weights under TransformerEngine 1.x, no transpose kept on the
    # parameter: ``costmodel.finetune.frozen_transpose_bytes``); False: TE keeps the transpose it
    # makes, as TE 2.x's Float8Tensor does (Megatron-Bridge), and none is made per micro-batch.
    fp8_transpose_per_microbatch: bool = False

    def __post_init__(self) -> None:
        if self.mode not in FINETUNE_MODES:
            raise ValueError(f"finetune mode must be one of {', '.join(FINETUNE_MODES)}, got {self.mode!r}")
        if self.lora_rank < 1:
            raise ValueError(f"lora_rank must be a positive integer, got {self.lora_rank}")
        if not _valid_targets(self.lora_targets):
            raise ValueError(f"lora_targets must be distinct names among {', '.join(LORA_TARGETS)}, "
                             f"got {', '.join(self.lora_targets) or 'none'}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.document_tokens is not None and (self.document_tokens < 1 or not self.packed_sequence):
            raise ValueError(f"document_tokens ({self.document_tokens}) is the mean document length of packed "
                             "sequences: a positive integer, with packed_sequence")

    @property
    def lora(self) -> bool:
        return self.mode == "lora"

    @property
    def default_global_batch(self) -> int:
        """The recipes' global batch (sequences) for this run, when none is given."""
        return PACKED_GLOBAL_BATCH if self.packed_sequence else UNPACKED_GLOBAL_BATCH


def parse_targets(text: str) -> tuple[str, ...]:
    """``--lora-targets linear_qkv,linear_proj`` as a tuple; ``ValueError`` names a bad name."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    if not _valid_targets(targets):
        raise ValueError(f"expected distinct comma-separated names among {', '.join(LORA_TARGETS)}, got {text!r}")
    return targets


def _valid_targets(targets: tuple[str, ...]) -> bool:
    """At least one target, each a known name, none twice."""
    return bool(targets) and set(targets) <= set(LORA_TARGETS) and len(set(targets)) == len(targets)
