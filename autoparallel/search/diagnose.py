"""Why no layout is valid or fits, naming first the pinned knob or the input that rules them out.

The candidates frame keeps every rejected layout with the first rule it broke (``reason``),
which hides the rules it would have broken later: counting reasons names the rules that reject
the most layouts, usually knobs the user never touched. What the user needs is the rule that
rejects the layouts that came *closest*: the rule checked last that any of them reached. Rules
come in three groups, as ``autoparallel.space`` checks them: on the structure alone (tp, pp, vp
and the split, cp, ep, mbs), on the features alone (SP, recompute, precision, FSDP, ...), and
on a structure with its features (the crossed layouts; memory comes last). Each rule knows the
knobs it involves, so the message leads with a knob the user pinned, or with the input (GPU
count, global batch, model, hardware) that makes it impossible.

The rule patterns follow the messages of ``autoparallel.space`` in the order it checks them; a
reason no pattern matches counts as a crossed layout's and, if nothing else explains the search,
the most common reasons are listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from autoparallel.space import FEATURE_KNOBS, STRUCTURE_KNOBS, SearchSpace, feature_combinations
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec


@dataclass(frozen=True)
class Rule:
    pattern: str  # matches the reason ``autoparallel.space`` writes
    knobs: tuple[str, ...]  # the knobs the rule involves (named first when pinned)


GBS_RULE = Rule(r"^gbs \d+ not divisible by mbs\*dp", ("mbs",))  # explained in numbers (``_gbs_message``)
DIVIDE_RULE = Rule(r"does not divide \d+ GPUs", ("tp", "pp", "cp"))  # the values that would are listed
STRUCTURE_RULES = (
    DIVIDE_RULE,
    Rule(r"attention heads not divisible by tp", ("tp",)),
    Rule(r"query groups not divisible by tp", ("tp",)),
    Rule(r"crosses the \d+-GPU \S+ domain", ("tp",)),
    Rule(r"interleaving \(vp>1\) needs pp>=2", ("vp", "pp")),
    Rule(r"not divisible by pp\*vp", ("pp", "vp")),
    Rule(r"an uneven pipeline split needs pp > 1", ("pp",)),
    Rule(r"cannot be set at the same time with account_for", ("pp",)),
    Rule(r"must be divisible by (?:virtual pipeline|the middle pipeline)|first \+ last stage layers", ("pp", "vp")),
    Rule(r"not divisible by 2\*cp", ("cp",)),
    Rule(r"softmax sinks run the all-to-all CP", ("cp", "tp")),
    Rule(r"ep>1 or etp>1 needs a MoE model", ("ep", "etp")),
    Rule(r"must divide num_experts and dp\*cp", ("ep",)),
    Rule(r"ep=\d+ does not divide num_experts", ("ep",)),
    Rule(r"ep\*etp=\d+ does not divide the \d+ GPUs of a pipeline stage", ("ep", "etp", "tp", "cp")),
    Rule(r"moe_ffn_hidden_size=\d+ not divisible by etp", ("etp",)),
    Rule(r"Bias in Moe is only supported when ETP==1", ("etp",)),
    GBS_RULE,
    Rule(r"interleaving needs at least pp=", ("vp", "pp", "mbs")),
)
FEATURE_RULES = (
    Rule(r"TP comm overlap needs sequence parallel", ("tp_comm_overlap", "sp")),
    Rule(r"has no FP8 tensor cores", ("precision",)),
    Rule(r"mxfp8 needs Blackwell", ("precision",)),
    Rule(r"nvfp4 needs Blackwell", ("precision",)),
    Rule(r"BF16 edge layers only apply to FP8", ("fp8_bf16_edge_layers", "precision")),
    Rule(r"delayed scaling cannot keep", ("precision", "fp8_bf16_edge_layers")),
    Rule(r"BF16 edge layers cover the whole model", ("fp8_bf16_edge_layers",)),
    Rule(r"param-gather overlap needs the distributed optimizer", ("overlap_dp_comm", "distributed_optimizer")),
    Rule(r"FSDP needs the distributed optimizer", ("fsdp", "distributed_optimizer")),
    Rule(r"cannot carry (?:fp8-blockwise|nvfp4)", ("tp_comm_overlap", "precision")),
    Rule(r"--fp8-param-gather only supported with distributed optimizer", ("fp8_param_gather", "distributed_optimizer")),
    Rule(r"--use-precision-aware-optimizer only supported", ("precision_aware_optimizer", "distributed_optimizer")),
    Rule(r"recompute_granularity must not be full when CUDA Graphs", ("cuda_graph", "recompute")),
    Rule(r"whole-layer CUDA graphs need static shapes", ("cuda_graph",)),
    Rule(r"a token dispatcher applies to MoE models", ("moe_token_dispatcher_type",)),
    Rule(r"supported with alltoall/flex token dispatcher", ("overlap_moe_expert_parallel_comm",
                                                          "moe_token_dispatcher_type")),
    Rule(r"master-weight remainders are state of the distributed optimizer",
         ("param_remainders", "distributed_optimizer")),
    Rule(r"LoRA's frozen base is priced unsharded", ("fsdp",)),
    Rule(r"input re-gather \(--lora-input-regather\) falls back.* or does not exist",  # space.REGATHER_FALLBACK
         ("lora_input_regather", "sp", "recompute", "cuda_graph", "transformer_engine_version")),
    Rule(r"FP8 attention \(--fp8-dot-product-attention\) needs", ("fp8_attention", "precision")),
    Rule(r"FP8 attention runs in TransformerEngine's fused attention", ("fp8_attention", "flash_attention")),
    Rule(r"FP8 attention with softmax sinks has no TransformerEngine backend", ("fp8_attention",)),
    Rule(r"FP8 attention with packed documents \(THD", ("fp8_attention",)),  # space.FP8_THD_ATTENTION_REASON
    Rule(r"pipelined forward reduce-scatter", ("tp_overlap_rs_pipeline", "tp_comm_overlap")),
    Rule(r"TP-only amax reduction", ("tp_only_amax_red", "precision")),
    Rule(r"activation_func_fp8_input_store\) only for SwiGLU", ("activation_func_fp8_input_store",)),
    Rule(r"CuTe-DSL fused grouped MLP", ("cutedsl_fused_grouped_mlp", "precision")),
    Rule(r"expert parallel models train in BF16, not FP16", ("precision",)),
    Rule(r"^--cp-comm-type \S+: ", ("cp_comm_type", "transformer_engine_version")),  # cp_kinds.model_refusal
)
LAYOUT_RULES = (
    Rule(r"disable moe_shared_expert_overlap when enabling", ("moe_shared_expert_overlap",
                                                              "overlap_moe_expert_parallel_comm")),
    Rule(r"num_layers_at_start_in_bf16 .* per pipeline stage", ("fp8_bf16_edge_layers", "pp")),
    Rule(r"Userbuffers requires MXFP8 tensor dims", ("tp_comm_overlap", "precision", "mbs", "tp", "cp")),
    Rule(r"^CPU offloading", ("cpu_offloading_num_layers", "pp", "recompute")),
    Rule(r"Delayed scaling does not support moe_act and layernorm recompute", ("precision", "recompute")),
    Rule(r"^fp8-check:", ("precision", "fp8_bf16_edge_layers")),
    Rule(r"CUDA graphs not supported with CPU offloading", ("cuda_graph", "cpu_offloading_num_layers")),
    Rule(r"dropout is not supported with graphed", ("cuda_graph", "recompute", "recompute_modules")),
    Rule(r"FP8 attention under context parallelism needs TransformerEngine", ("fp8_attention", "cp",
                                                                               "transformer_engine_version")),
    Rule(r"needs TransformerEngine >= \S+, the first release with its recipe", ("precision",
                                                                               "transformer_engine_version")),
    Rule(r"^LoRA on a virtual pipeline", ("vp", "transformer_engine_version")),
    Rule(r"input re-gather \(--lora-input-regather\) falls back.* under CPU activation offloading",
         ("lora_input_regather", "cpu_offloading_num_layers")),
    Rule(r"^--cp-comm-type \S+ at cp=", ("cp_comm_type", "tp", "cp")),  # cp_kinds.heads_refusal
    Rule(r"FP8 attention through --cp-comm-type allgather", ("fp8_attention", "cp_comm_type",
                                                              "transformer_engine_version")),
)
# Knobs that set the memory of a layout, for a search where valid layouts exist but none fits, and
# the value that needs the least memory (None: no such value): a knob pinned there is not the cause.
MEMORY_KNOBS = {"tp": None, "pp": None, "cp": None, "vp": None, "mbs": 1, "recompute": "full",
                "precision": None, "sp": True, "distributed_optimizer": True, "fsdp": True}


@dataclass(frozen=True)
class MoreGpus:
    """The fewest GPUs, doubling from the count asked, at which the same search finds a layout that
    fits (``run.fewest_gpus_that_fit``), and the least memory need at half of them (None: that count
    has no valid layout)."""
    gpus: int
    half_need_gib: float | None


def out_of_memory(frame: pd.DataFrame) -> pd.DataFrame:
    """The candidates ``explain`` blames on memory: valid layouts whose only fault is that they do
    not fit (empty where a rule rejects every layout first)."""
    reasons = frame["reason"].astype(str)
    crossed = frame[~_matches(reasons, STRUCTURE_RULES) & ~_matches(reasons, FEATURE_RULES)]
    return crossed[crossed["reason"].astype(str).str.startswith("out of memory")]


def explain(frame: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int,
            space: SearchSpace, pinned: dict | None = None, more: MoreGpus | None = None) -> str:
    """One line: why none of ``frame``'s candidates is a valid layout that fits.

    ``pinned``: the knobs the user pinned (the command line's); by default every knob with a
    single value in the space counts as pinned. ``more``: where none fits in memory, the GPU count
    at which one does (it said "try more GPUs" without a number); without it, what the least-memory
    layout spends its memory on.
    """
    fixed = _fixed(space) if pinned is None else {k: v for k, v in pinned.items() if v is not None}
    head = f"no valid layout of {model.name} for {gpus} GPUs and gbs {gbs}: "
    reasons = frame["reason"].astype(str)
    structure, feature = _matches(reasons, STRUCTURE_RULES), _matches(reasons, FEATURE_RULES)
    crossed = frame[~structure & ~feature]
    memory = out_of_memory(frame)
    if not memory.empty:
        return _memory_message(memory, model, hw, gpus, space, fixed, more)
    if not crossed.empty:  # valid structures met valid features; a rule on the pair refused them
        return head + _group_message(crossed, LAYOUT_RULES, fixed, gpus, gbs)
    if feature.sum() >= len(feature_combinations(model, space)):
        return head + _group_message(frame[feature], FEATURE_RULES, fixed, gpus, gbs)  # every feature set
    if structure.any():
        return head + _group_message(frame[structure], STRUCTURE_RULES, fixed, gpus, gbs)
    return head + (f"{_pinned_lead(('pp',), fixed)}{model.num_layers} layers cannot be split into pp "
                   f"{' or '.join(map(str, space.pp))} pipeline stages")


def _memory_message(memory: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, gpus: int, space: SearchSpace,
                    fixed: dict, more: MoreGpus | None) -> str:
    """None fits: the least need against the limit, what that layout spends it on, and the GPU
    count at which a layout fits (``more``) or, unknown, that more GPUs must shard the state."""
    least = memory.loc[memory["peak_memory_gib"].idxmin()]
    limit = space.memory_fraction * hw.memory_gib
    causes = tuple(k for k, value in MEMORY_KNOBS.items() if k in fixed and fixed[k] != value)
    state = sum(float(least.get(k, 0.0)) for k in ("weights_gib", "grads_gib", "optimizer_gib", "fp8_weights_gib"))
    layout = f"TP{least['tp']} PP{least['pp']} CP{least['cp']} DP{least['dp']}"
    activations = float(least.get("activations_gib", 0.0))
    text = (f"no layout of {model.name} fits on {gpus} x {hw.name}: {_pinned_lead(causes, fixed)}the smallest "
            f"memory need is {least['peak_memory_gib']:.1f} GiB against a limit of {limit:.1f} GiB ({layout}: "
            f"{state:.1f} GiB of weights, gradients and optimizer state, {activations:.1f} of activations)")
    unpin = f", or unpin {', '.join(f'--{k.replace(chr(95), chr(45))}' for k in causes)}" if causes else ""
    if more is None and activations > state:  # more GPUs shard the state; a sequence's activations stay
        return text + f"; the activations of {model.seq_length:,}-token sequences are most of it: a shorter --seq-length{unpin}"
    if more is None:
        return text + f"; more GPUs shard that state further: try a multiple of {gpus}{unpin}"
    return text + f"; {fits_on(more, 'layouts fit', 'search')}{unpin}"


def fits_on(more: MoreGpus, subject: str, command: str) -> str:
    """Where ``subject`` ("layouts fit", "this layout fits") does and the command that goes there:
    "layouts fit on 64 GPUs (32 still need 86.3 GiB): search --gpus 64", as search's, estimate's
    and a sampler search's memory messages say it."""
    half = "" if more.half_need_gib is None else f" ({more.gpus // 2} still need {more.half_need_gib:.1f} GiB)"
    return f"{subject} on {more.gpus} GPUs{half}: {command} --gpus {more.gpus}"


def _matches(reasons: pd.Series, rules: tuple[Rule, ...]) -> pd.Series:
    return reasons.str.contains("|".join(f"(?:{r.pattern})" for r in rules), regex=True)


def _group_message(frame: pd.DataFrame, rules: tuple[Rule, ...], fixed: dict, gpus: int, gbs: int) -> str:
    reasons = frame["reason"].astype(str)
    for rule in reversed(rules):  # the last rule in checking order that any layout reached
        hit = reasons.str.contains(rule.pattern, regex=True)
        if not hit.any():
            continue
        if rule is GBS_RULE:
            return _gbs_message(frame[hit], gpus, gbs, fixed)
        message = _pinned_lead(rule.knobs, fixed) + reasons[hit].iloc[0]
        return message + (f"; tp*pp*cp can be {divisors_listed(gpus)}" if rule is DIVIDE_RULE else "")
    counts = reasons[reasons != ""].value_counts()  # reasons no pattern knows: the most common
    if counts.sum() == 1:  # estimate's one layout: "1 x" read as a multiplier of the reason
        return counts.index[0]
    return "; ".join(f"{n} x {reason}" for reason, n in counts.head(3).items())


def _gbs_message(rows: pd.DataFrame, gpus: int, gbs: int, fixed: dict) -> str:
    """gbs not divisible by mbs*dp: too many GPUs, a pinned micro-batch, or a GPU count whose
    data-parallel share never divides the batch."""
    dp = rows["dp"].astype(int)
    product = int((rows["mbs"].astype(int) * dp).min())
    smallest_dp = int(dp.min())
    if smallest_dp > gbs:
        return (f"{gpus} GPUs leave at least {smallest_dp} data-parallel replicas (tp*pp*cp at most "
                f"{gpus // smallest_dp} in this space), more than the {gbs} sequences of a global "
                f"batch: use at most {gbs * (gpus // smallest_dp)} GPUs or a larger --gbs")
    if "mbs" in fixed and gbs % smallest_dp == 0:
        return (f"with mbs pinned to {fixed['mbs']}: gbs {gbs} is not divisible by mbs*dp in any layout "
                f"(the smallest mbs*dp is {product}); lower --mbs or make --gbs a multiple of {product}")
    return (f"gbs {gbs} is not divisible by mbs*dp in any layout of {gpus} GPUs (the smallest mbs*dp "
            f"is {product}): choose a --gbs divisible by {product} or another GPU count")


def divisors_listed(n: int, shown: int = 12) -> str:
    """The divisors of ``n`` in order, the first ``shown`` of them, for an error naming the values
    a GPU count allows ("1, 2, 4, 8")."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    every = sorted({*small, *(n // d for d in small)})
    return ", ".join(map(str, every[:shown])) + (", ..." if len(every) > shown else "")


def _fixed(space: SearchSpace) -> dict:
    """Knobs with one value in the space: pinned on the command line or by the space file."""
    out = {}
    for name in STRUCTURE_KNOBS + FEATURE_KNOBS:
        values = getattr(space, name)
        if not isinstance(values, str) and len(values) == 1:
            out[name] = values[0]
    return out


def _pinned_lead(knobs: tuple[str, ...], fixed: dict) -> str:
    named = [f"{k} pinned to {_show(fixed[k])}" for k in knobs if k in fixed]
    return ("with " + " and ".join(named) + ": ") if named else ""


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
