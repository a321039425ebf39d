"""The fine-tuning flags of ``search`` and ``estimate``: which weights train (``--finetune full|lora``,
``--lora-rank``, ``--lora-targets``, ``--lora-dropout``, ``--lora-a2a``, ``--fp8-transpose-per-microbatch``)
and packed sequences (``--packed-sequence``, ``--document-tokens``). They make the model a fine-tuning run (``specs.finetune.Finetune``),
which the cost model prices and the exports carry; without ``--finetune`` a run is pre-training.
"""

from __future__ import annotations

import argparse
import dataclasses

from autoparallel.argtypes import dropout, positive
from autoparallel.cli.combos import flag, no_effect
from autoparallel.errors import UserError
from autoparallel.specs.finetune import DEFAULT_LORA_RANK, FINETUNE_MODES, LORA_TARGETS, Finetune, parse_targets

LORA_DESTS = ("lora_rank", "lora_targets", "lora_dropout", "lora_a2a", "fp8_transpose_per_microbatch")
FINETUNE_DESTS = ("finetune", *LORA_DESTS, "packed_sequence", "document_tokens")


def _targets(text: str) -> tuple[str, ...]:
    try:
        return parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fine-tuning (default: pre-training)")
    g.add_argument("--finetune", choices=FINETUNE_MODES,
                   help="full: supervised fine-tuning of every weight; lora: frozen base, LoRA adapters train "
                        "(Megatron-Bridge's peft_scheme)")
    g.add_argument("--lora-rank", type=positive, metavar="R",
                   help=f"LoRA rank (Megatron-Bridge's LoRA.dim; default {DEFAULT_LORA_RANK})")
    g.add_argument("--lora-targets", type=_targets, metavar="NAMES",
                   help=f"comma-separated Linears that get adapters, among {','.join(LORA_TARGETS)} (default: all)")
    g.add_argument("--lora-dropout", type=dropout, metavar="P",
                   help="dropout on each adapter's input (Megatron-Bridge's LoRA.dropout; default 0, MLPerf's "
                        "Llama 2 70B LoRA runs 0.1)")
    g.add_argument("--lora-a2a", action="store_true", default=None,
                   help="beside a row-parallel Linear under sequence parallelism, the adapter's output goes "
                        "back over the sequence by one all-to-all instead of a gather and a scatter "
                        "(Megatron-Bridge's LoRA.a2a_experimental; MLPerf's LoRA runs set it)")
    g.add_argument("--fp8-transpose-per-microbatch", action="store_true", default=None,
                   help="under an FP8 recipe on Hopper, keep the frozen base's FP8 weights in one layout and "
                        "transpose each for its dgrad in every micro-batch, as MLPerf's LoRA runs on "
                        "TransformerEngine 1.x did (FP8 params, disable_parameter_transpose_cache); default: "
                        "both layouts kept, as TransformerEngine 2.x keeps an FP8 parameter's transpose")
    g.add_argument("--packed-sequence", action="store_true", default=None,
                   help="documents packed into each --seq-length sequence, each attending to itself only")
    g.add_argument("--document-tokens", type=positive, metavar="TOKENS",
                   help="mean document length in a packed sequence (default: one document fills it)")


def with_finetune(model, args: argparse.Namespace):
    """``model`` as the fine-tuning run the flags describe (unchanged without ``--finetune``);
    flags that have no effect in the combination given are refused, naming both."""
    given = [d for d in FINETUNE_DESTS[1:] if getattr(args, d, None) is not None]
    mode = getattr(args, "finetune", None)
    if mode is None:
        if given:
            raise UserError(f"{flag(given[0])} has no effect without --finetune: "
                            "give --finetune full or --finetune lora")
        return model
    lora_given = [d for d in LORA_DESTS if d in given]
    if mode != "lora" and lora_given:
        raise no_effect(flag(lora_given[0]), f"--finetune {mode}", "it sets LoRA's adapters; give --finetune lora "
                        "or drop it")
    if args.document_tokens is not None and not args.packed_sequence:
        raise UserError("--document-tokens has no effect without --packed-sequence: it is the mean length of "
                        "the documents packed into a sequence")
    if args.document_tokens is not None and args.document_tokens > model.seq_length:
        raise UserError(f"--document-tokens {args.document_tokens} is longer than the sequence ({model.seq_length} "
                        f"tokens); give at most {model.seq_length} or a longer --seq-length")
    if mode == "lora" and model.is_moe:
        raise UserError(f"--finetune lora is priced for dense models; {model.name} is a mixture of experts "
                        "(use --finetune full)")
    finetune = Finetune(mode, args.lora_rank or DEFAULT_LORA_RANK, args.lora_targets or LORA_TARGETS,
                        bool(args.packed_sequence), args.document_tokens,
                        lora_dropout=args.lora_dropout or 0.0, lora_a2a=bool(args.lora_a2a),
                        fp8_transpose_per_microbatch=bool(getattr(args, "fp8_transpose_per_microbatch", None)))
    return dataclasses.replace(model, finetune=finetune)
