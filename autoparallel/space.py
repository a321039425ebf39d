"""Search space -> candidate plans, each valid or rejected with the rule it broke.

Candidates are generated as columns (a pandas DataFrame), never as a list of Plan objects, so
that a space of 10^5 layouts is built and checked in a fraction of a second. Generation runs in
two stages: the *structure* (tp, pp, vp and the pipeline split, cp, ep, mbs) is crossed and
checked first, and only valid structures are crossed with the *features* (SP, recompute,
precision, FSDP, overlaps), so an impossible structure appears once in the results instead of
once per feature combination.

The virtual pipeline size is not a fixed list: by default (``vp: auto``) every vp for which
Megatron-LM can place the layers is a candidate, with an even split where one exists and
otherwise each uneven split Megatron offers (``costmodel.pipeline.splits``).

Validity rules are Megatron-LM's own (DESIGN.md §4) plus the heuristic that TP stays inside
the NVLink domain. Memory is checked later, by the cost model.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import typing
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import pandas as pd

from autoparallel.argtypes import RELEASE_PATTERN
from autoparallel.costmodel import cp_kinds, gemm_precision, pipeline
from autoparallel.costmodel.candidates import RECOMPUTE_MODULES  # the modules the cost model prices
from autoparallel.costmodel.candidates import (RECIPE_FIRST_RELEASE, TE_VERSION_COLUMN, fp8_cp_attention,
                                                 knob_in, knob_test, lora_virtual_pipeline, recipe_in_release,
                                                 release_at_least)
from autoparallel.costmodel.finetune import attention_share
from autoparallel.costmodel.finetune import is_lora as lora
from autoparallel.errors import UserError
from autoparallel.io import from_dict, read_yaml, resolve_preset
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import (CP_COMM_TYPE_CHOICES, CUDA_GRAPH_CHOICES, DISPATCHER_CHOICES, FP8_PRECISIONS,
                                     PRECISION_CHOICES, QUANTIZED_PRECISIONS, RECOMPUTE_CHOICES, Plan)

# The recipes under which TransformerEngine's fused attention runs in FP8 (MLPerf's FP8_DPA;
# Megatron-Bridge's fp8_dot_product_attention): per-tensor delayed or current scaling, and MXFP8 on
# Blackwell (TransformerEngine d0067d0d transformer_engine/pytorch/attention/dot_product_attention/
# dot_product_attention.py: an MXFP8 autocast runs MXFP8 attention; utils.py keeps FusedAttention for
# MXFP8 on sm100 and later with cuDNN 9.21+, which the mxfp8 precision's Blackwell requirement covers),
# and under NVFP4 GEMMs the FP8 attention the same file's recipe table configures for it: delayed scaling
# (NVTE_DPA_FP8_RECIPE="DelayedScaling", as MLPerf Training v5.1's LoRA FP4 runs set it: config_common_fp4.sh
# with FP8_DPA=1) or current scaling for QKV, O, dO, dQKV ("Float8CurrentScaling", as its Llama 3.1 8B FP4
# configs run it: config_common_fp4.sh with config_common_fp8attn.sh's FP8_DPA=True); priced alike.
FP8_ATTENTION_RECIPES = ("fp8-delayed", "fp8-current", "mxfp8", "nvfp4")
FP8_CP_ATTENTION_REASON = ("FP8 attention under context parallelism needs TransformerEngine >= 1.10 "
                           "(an older TE runs it in BF16)")
# Packed documents (``Finetune.document_tokens`` below the sequence: per-document attention through
# cu_seqlens, TE's THD format) run no FP8 attention in any TransformerEngine release read: cuDNN's FP8
# fused-attention backend takes bshd / sbhd only (``nvte_get_fused_attn_backend``, TE v1.10-v2.14 and
# d0067d0da common/fused_attn/fused_attn.cpp; v1.10's one T3HD case needs head dim 64 and sequences
# <= 512), FP8 disables FlashAttention and the unfused kernel, and v1.10's DotProductAttention then
# raises "No dot product attention support for the provided inputs!" (pytorch/attention.py L6985).
FP8_THD_ATTENTION_REASON = ("FP8 attention with packed documents (THD, cu_seqlens) has no TransformerEngine "
                            "backend: cuDNN's FP8 attention takes bshd / sbhd only")
# Megatron-Bridge's LoRA.sequence_parallel_input_regather (v0.6.0+, 33655ef84 PR #4581;
# src/megatron/bridge/peft/utils.py ``ParallelLinearAdapter._sequence_parallel_input_regather_eligibility``
# at 067f987df) runs only under TP with SP, for trainable non-expert column-parallel adapters with an identity
# activation (LoRA's), and falls back to the default path with the all-to-all adapters (a2a_experimental),
# CPU activation offloading, CUDA graphs and full-layer recompute: such candidates would run the plain path,
# which the candidate without the knob prices.
REGATHER_FALLBACK = "LoRA's sequence-parallel input re-gather (--lora-input-regather) falls back to the default path"
STRUCTURE_KNOBS = ("tp", "pp", "vp", "cp", "ep", "etp", "mbs")
SPLIT_COLUMNS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "pipeline_model_parallel_layout")
FEATURE_KNOBS = ("sp", "recompute", "distributed_optimizer", "overlap_dp_comm", "tp_comm_overlap",
                 "grad_reduce_in_fp32", "precision", "fp8_bf16_edge_layers", "flash_attention", "fsdp",
                 "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type", "fp8_param_gather",
                 "precision_aware_optimizer", "cuda_graph", "moe_shared_expert_overlap", "fp8_attention",
                 "tp_only_amax_red", "activation_func_fp8_input_store", "param_remainders",
                 "cross_entropy_loss_fusion", "cutedsl_fused_grouped_mlp", "tp_overlap_rs_pipeline", "cp_comm_type",
                 "lora_input_regather")


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    vp: tuple[int, ...] | Literal["auto"] = "auto"  # auto: every vp the layers can be split into
    cp: tuple[int, ...] = (1,)
    # Context parallelism's kinds (Plan.cp_comm_type), searched where cp > 1; empty: the model's own
    # (``cp_kinds.default_kind``: p2p, a2a with softmax sinks, allgather with DSA), as before the knob.
    cp_comm_type: tuple[str, ...] = ()
    ep: tuple[int, ...] = (1,)
    etp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1, 2, 4)
    sp: tuple[bool, ...] = (True, False)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    full_recompute_fractions: tuple[float, ...] = (1.0,)
    # Module sets selective recompute may cover (Megatron's --recompute-modules); a model is
    # offered the sets that apply to it (MLA's and MoE's only to such models).
    recompute_modules: tuple[str, ...] = ("core_attn",)
    distributed_optimizer: tuple[bool, ...] = (True,)
    overlap_dp_comm: tuple[bool, ...] = (True,)
    tp_comm_overlap: tuple[bool, ...] = (False,)
    grad_reduce_in_fp32: tuple[bool, ...] = (True,)
    precision: tuple[str, ...] = ("bf16",)
    fp8_bf16_edge_layers: tuple[int, ...] = (0,)
    flash_attention: tuple[bool, ...] = (True,)
    fp8_attention: tuple[bool, ...] = (False,)
    tp_only_amax_red: tuple[bool, ...] = (False,)
    tp_overlap_rs_pipeline: tuple[bool, ...] = (False,)
    lora_input_regather: tuple[bool, ...] = (False,)
    activation_func_fp8_input_store: tuple[bool, ...] = (False,)
    cutedsl_fused_grouped_mlp: tuple[bool, ...] = (False,)
    fsdp: tuple[bool, ...] = (False,)
    overlap_moe_expert_parallel_comm: tuple[bool, ...] = (False,)
    moe_token_dispatcher_type: tuple[str, ...] = ("alltoall",)
    moe_shared_expert_overlap: tuple[bool, ...] = (False,)
    fp8_param_gather: tuple[bool, ...] = (False,)
    precision_aware_optimizer: tuple[bool, ...] = (False,)
    param_remainders: tuple[bool, ...] = (False,)
    cross_entropy_loss_fusion: tuple[bool, ...] = (False,)
    cuda_graph: tuple[str, ...] = ("none",)
    # Shares of the layers whose activations are offloaded to host memory (Megatron-LM's
    # --cpu-offloading-num-layers; only without pipeline parallelism and recompute).
    cpu_offload_fractions: tuple[float, ...] = (0.0,)
    cpu_offloading_num_layers: int | None = None  # pinned exact count instead of the fractions
    memory_fraction: float = 1.0  # the hardware's reserve_gib is the runtime's headroom
    tp_within_nvlink_domain: bool = True
    # The TransformerEngine release the run uses ("1.6", "1.10", "2.9"; "" for a current one), for
    # what an older TE cannot run: FP8 dot-product attention under context parallelism needs 1.10
    # (``candidates.fp8_cp_attention``). TE 1.6, which MLPerf v4.0's LoRA images pin
    # (``measured_runs.MLPERF_TE_RELEASE``), takes its FusedAttention's CP path
    # (attn_forward_func_with_cp, no FP8) before the FP8 one and admits only the F16 backend under CP
    # (transformer_engine/pytorch/attention.py v1.6): fp8_dot_product_attention at CP > 1 runs BF16
    # attention, which the candidate without FP8 attention already prices, so the FP8 one is refused
    # (the MLPerf rows of such a round are priced the same way: ``measured_runs.from_mlperf``).
    # A precision whose recipe the release lacks is refused (``candidates.RECIPE_FIRST_RELEASE``:
    # TE 1.x has delayed scaling only, as MLPerf v4.1's NeMo 24.09 with TE 1.10 ran).
    transformer_engine_version: str = ""
    # A hybrid model's per-module quantization as its recipe runs it (``costmodel/gemm_precision.py``):
    # a recipe of ``QUANT_RECIPES`` (Megatron-Bridge's Nemotron-H te_quant.cfg, "nemotronh-te-quant"),
    # and the pattern's first / last layers kept in BF16 (Megatron's num_layers_at_start_in_bf16 /
    # num_layers_at_end_in_bf16, each side on its own; fp8_bf16_edge_layers is both sides alike).
    quant_recipe: str = ""
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    # Where num_layers is not divisible by pp*vp, also try Megatron's uneven splits.
    uneven_pipeline_split: bool = True
    # MoE models where no other split fits: Megatron's flexible --pipeline-model-parallel-layout,
    # up to this vp (NVIDIA's DeepSeek-V3 layouts use vp <= 4; every vp would multiply the search).
    pipeline_layout_max_vp: int = 4
    # A pinned --pipeline-model-parallel-layout (Megatron's E/t/m/L string): the only split, on
    # every pp that divides its virtual stages.
    pipeline_layout: str = ""
    # A pinned uneven split (--decoder-first/last-pipeline-num-layers, --account-for-embedding/
    # loss-in-pipeline-split): given ones take their value, the others none; the only split.
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool | None = None
    account_for_loss_in_pipeline_split: bool | None = None
    # Heuristic, as Megatron's MoE guide advises: where the space holds both, the alltoall
    # dispatcher for EP groups inside one node and flex (DeepEP / HybridEP) for those across
    # nodes, instead of both everywhere (which doubles a MoE search).
    dispatcher_by_ep_span: bool = True

    def __post_init__(self) -> None:
        for name in STRUCTURE_KNOBS:
            values = getattr(self, name)
            if values == "auto":
                continue
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        for name, choices in (("recompute", RECOMPUTE_CHOICES), ("moe_token_dispatcher_type", DISPATCHER_CHOICES),
                              ("cuda_graph", CUDA_GRAPH_CHOICES), ("precision", PRECISION_CHOICES),
                              ("cp_comm_type", CP_COMM_TYPE_CHOICES)):
            bad = set(getattr(self, name)) - set(choices)
            if bad:
                raise ValueError(f"{name} {sorted(bad)} is not one of {', '.join(choices)}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if any(not 0 < f <= 1 for f in self.full_recompute_fractions):
            raise ValueError(f"full_recompute_fractions must be in (0, 1], got {list(self.full_recompute_fractions)}")
        if not self.cpu_offload_fractions or any(not 0 <= f < 1 for f in self.cpu_offload_fractions):
            raise ValueError(f"cpu_offload_fractions must be in [0, 1), got {list(self.cpu_offload_fractions)}")
        if self.quant_recipe and self.quant_recipe not in gemm_precision.QUANT_RECIPES:
            raise ValueError(f"quant_recipe {self.quant_recipe!r} is not one of {', '.join(gemm_precision.QUANT_RECIPES)}")
        if min(self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16) < 0:
            raise ValueError("num_layers_at_start_in_bf16 and num_layers_at_end_in_bf16 must be >= 0")
        release = self.transformer_engine_version
        if release and not re.fullmatch(RELEASE_PATTERN, release):
            raise ValueError("transformer_engine_version must be a release such as 1.6 or 2.9 (or empty for a "
                             f"current one), got {self.transformer_engine_version!r}")

    def cost_settings(self) -> dict:
        """The run-level facts the cost model prices (columns every candidate shares): the TE
        release where one is given; a hybrid model's per-module quantization where one is set
        (``quantization_settings``)."""
        out = {TE_VERSION_COLUMN: self.transformer_engine_version} if self.transformer_engine_version else {}
        return {**out, **self.quantization_settings()}

    def quantization_settings(self) -> dict:
        """``gemm_precision.COLUMNS`` the space sets (none at their defaults)."""
        values = (self.quant_recipe, self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16)
        return {name: value for name, value in zip(gemm_precision.COLUMNS, values) if value}

    @property
    def fp8_attention_with_cp(self) -> bool:
        """Whether the run's TE runs FP8 attention under context parallelism (1.10 and later)."""
        return fp8_cp_attention(self.transformer_engine_version)

    def pinned(self, **pins: Any) -> SearchSpace:
        """This space with each given knob fixed to one value (None leaves it searched)."""
        updates = {}
        for name, value in pins.items():
            if value is None:
                continue
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise KeyError(name)
            updates[name] = value if name in SETTINGS else (value,)
        return dataclasses.replace(self, **updates)


PINNED_SPLIT = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
SETTINGS = ("memory_fraction", "tp_within_nvlink_domain", "transformer_engine_version", "quant_recipe",
            "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "uneven_pipeline_split",
            "cpu_offloading_num_layers", "pipeline_layout_max_vp", "pipeline_layout", "dispatcher_by_ep_span",
            *PINNED_SPLIT)


def load_space(name_or_path: str = "training") -> SearchSpace:
    from autoparallel.io import check_space_kind
    path = resolve_preset("spaces", name_or_path)
    data = read_yaml(path)
    check_space_kind(data, name_or_path, SearchSpace, "search")
    return from_dict(SearchSpace, data, str(path))


def with_cp_kinds(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """``space`` with its CP kinds stated: the model's own where it lists none (``SearchSpace.cp_comm_type``)."""
    if space.cp_comm_type:
        return space
    return dataclasses.replace(space, cp_comm_type=(cp_kinds.default_kind(model),))


def _cp_refusal(model: ModelSpec, space: SearchSpace, kind: str) -> str:
    """Why ``model`` cannot run the CP ``kind`` under the space's TE release ('' if it can)."""
    return cp_kinds.model_refusal(model, kind, space.transformer_engine_version, _packed(model))


def _product(names: tuple[str, ...], space: SearchSpace) -> pd.DataFrame:
    values = [getattr(space, n) for n in names]
    return pd.DataFrame(list(itertools.product(*values)), columns=list(names))


def _filled(n: int, value: str) -> np.ndarray:
    """``np.full(n, value, dtype=object)``, each element the one ``value``: np.full casts the value
    to a NumPy string and back into a new Python string per element, 20x slower on millions of rows."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def _first_reason(df: pd.DataFrame, rules: list[tuple[np.ndarray, Any]]) -> np.ndarray:
    """For each row, the message of the first rule it breaks ('' if none)."""
    reason = _filled(len(df), "")
    free = np.ones(len(df), dtype=bool)  # no rule broken yet (every message is a non-empty string)
    for broken, message in rules:
        broken = np.asarray(broken, dtype=bool) & free
        if broken.any():
            text = message(df[broken]) if callable(message) else _filled(int(broken.sum()), message)
            reason[broken] = np.asarray(text, dtype=object)
            free &= ~broken
        if not free.any():
            break
    return reason


# A hybrid model's pipeline stages are | marks in its --hybrid-layer-pattern (report.hybrid_export
# writes every even, explicit or accounted split that way); Megatron-LM's validate_args refuses the
# flexible layout beside it.
HYBRID_LAYOUT_REFUSED = ("a hybrid model takes no pipeline layout: \"--pipeline-model-parallel-layout should not "
                         "be used with --hybrid-layer-pattern. Pipeline stage layout is defined by | separators "
                         "in the pattern.\" (Megatron-LM)")


def _pipeline_layouts(model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """Every (pp, vp, split) of the space: one row per split Megatron accepts, or one row with
    the reason no split exists for a vp the space lists."""
    if space.pipeline_layout:
        return _pinned_layout(model, space)
    if any(getattr(space, name) for name in PINNED_SPLIT):  # a size, or an accounting turned on
        return _pinned_split(model, space)
    # Accounting pinned off: every other split still, as Megatron's default (no flag) would run.
    no_embedding = space.account_for_embedding_in_pipeline_split is False
    no_loss = space.account_for_loss_in_pipeline_split is False
    rows = []
    for pp in space.pp:
        listed = space.vp != "auto"
        for vp in (space.vp if listed else range(1, model.num_layers // pp + 1)):
            options = pipeline.splits(model.num_layers, pp, vp, space.uneven_pipeline_split,
                                      layouts=(model.is_moe and not model.is_hybrid
                                               and vp <= space.pipeline_layout_max_vp),
                                      mtp=model.mtp_num_layers)
            options = [(first, last, embedding, loss, layout) for first, last, embedding, loss, layout in options
                       if not (no_embedding and embedding) and not (no_loss and loss)]
            if options:
                rows += [(pp, vp, *split, "") for split in options]
            elif listed and pp * vp > 1:
                why = ("interleaving (vp>1) needs pp>=2" if pp == 1 else
                       f"{model.num_layers} layers not divisible by pp*vp={pp * vp}"
                       + ("" if not space.uneven_pipeline_split else " and no uneven split of Megatron-LM fits"))
                rows.append((pp, vp, 0, 0, False, False, "", why))
    return pd.DataFrame(rows, columns=["pp", "vp", *SPLIT_COLUMNS, "layout_reason"])


def _pinned_split(model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """The pinned uneven split on every (pp, vp) of the space Megatron accepts it on; where none
    does, one row per pp with the reason (vp 1, or each listed vp)."""
    split = (space.num_layers_in_first_pipeline_stage or 0, space.num_layers_in_last_pipeline_stage or 0,
             bool(space.account_for_embedding_in_pipeline_split), bool(space.account_for_loss_in_pipeline_split), "")
    rows, rejected = [], []
    for pp in space.pp:
        listed = space.vp != "auto"
        for vp in (space.vp if listed else range(1, model.num_layers // pp + 1)):
            why = pipeline.split_error(model.num_layers, pp, vp, split)
            if pp == 1 and vp > 1:
                why = "interleaving (vp>1) needs pp>=2"
            if not why or listed or vp == 1:
                (rows if not why else rejected).append((pp, vp, *split, why))
    return pd.DataFrame(rows + rejected, columns=["pp", "vp", *SPLIT_COLUMNS, "layout_reason"])


def _pinned_layout(model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """The pinned layout on each pp of the space that divides its virtual stages (vp = stages/pp),
    or the reason a pp cannot take it."""
    layout = space.pipeline_layout
    error = pipeline.layout_error(layout, model.num_layers, model.mtp_num_layers)
    if error:
        raise UserError(error)
    stages = len(pipeline.layout_stages(layout))
    sizes = pipeline.layout_stage_sizes(layout)
    rows = []
    for pp in space.pp:
        vp = stages // pp
        if stages % pp:
            why = f"pipeline layout has {stages} virtual stages, not divisible by pp={pp}"
        elif space.vp != "auto" and vp not in space.vp:
            why = f"pipeline layout has {stages} virtual stages: vp={vp} on pp={pp}, not in vp {list(space.vp)}"
        elif pp == 1 and vp > 1:
            why = "interleaving (vp>1) needs pp>=2"
        elif model.is_hybrid:  # Megatron-LM validate_args
            why = HYBRID_LAYOUT_REFUSED
        elif not sum(sizes[0::pp]):  # Megatron accepts it; priced, every row was NaN and still "feasible"
            why = (f"pipeline layout puts no decoder layer (t) on pipeline rank 0 at pp={pp}: a rank the cost "
                   f"model cannot price yet; give its stages at least one t")
        else:
            why = ""
        rows.append((pp, max(vp, 1), 0, 0, False, False, layout, why))
    return pd.DataFrame(rows, columns=["pp", "vp", *SPLIT_COLUMNS, "layout_reason"])


def _structures(model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """tp x cp x ep x etp x mbs crossed with the pipeline layouts. ep and etp > 1 only for MoE
    models, unless the user asked for them (then they are rejected with the reason)."""
    ep = (1,) if not model.is_moe and 1 in space.ep else space.ep
    etp = (1,) if not model.is_moe and 1 in space.etp else space.etp
    others = (_product(("tp", "cp", "mbs"), space).merge(pd.DataFrame({"ep": ep}), how="cross")
              .merge(pd.DataFrame({"etp": etp}), how="cross"))
    return others.merge(_pipeline_layouts(model, space), how="cross")


def _structure_rules(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int,
                     space: SearchSpace) -> np.ndarray:
    tp, pp, vp, cp, ep, etp, mbs = (df[k].to_numpy() for k in STRUCTURE_KNOBS)
    model_parallel = tp * pp * cp
    dp = np.where(gpus % model_parallel == 0, gpus // model_parallel, 0)
    df["dp"] = dp
    safe_dp = np.maximum(dp, 1)
    m = np.where(gbs % (mbs * safe_dp) == 0, gbs // (mbs * safe_dp), 0)
    experts = model.num_experts or 1
    rules = [
        (dp == 0, lambda d: [f"tp*pp*cp={a * b * c} does not divide {gpus} GPUs"
                             for a, b, c in zip(d.tp, d.pp, d.cp)]),
        (model.num_attention_heads % tp != 0,
         lambda d: [f"{model.num_attention_heads} attention heads not divisible by tp={a}" for a in d.tp]),
        (model.query_groups % tp != 0,
         lambda d: [f"{model.query_groups} query groups not divisible by tp={a}" for a in d.tp]),
        *_mamba_rules(model, tp, cp),
        (space.tp_within_nvlink_domain & (tp > hw.nvlink_domain),
         lambda d: [f"tp={a} crosses the {hw.scale_up_domain}" for a in d.tp]),
        (df["layout_reason"].to_numpy() != "", lambda d: list(d.layout_reason)),
        ((cp > 1) & (model.seq_length % (2 * cp) != 0),
         lambda d: [f"seq_length {model.seq_length} not divisible by 2*cp={2 * a}" for a in d.cp]),
        # Softmax sinks run context parallelism only as TE's all-to-all CP (ModelSpec.softmax_sinks),
        # AttnFuncWithCPAndQKVOA2A: "cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V"
        # (the heads of one TP rank).
        (model.softmax_sinks & (cp > 1) & ((model.num_attention_heads % (tp * cp) != 0)
                                     | (model.query_groups % (tp * cp) != 0)),
         lambda d: [f"cp={c}: softmax sinks run the all-to-all CP (cp_comm_type a2a), which needs the "
                    f"{model.num_attention_heads // t} heads and {model.query_groups // t} query groups of a "
                    f"TP rank divisible by cp (TransformerEngine)" for t, c in zip(d.tp, d.cp)]),
        (((ep > 1) | (etp > 1)) & (experts <= 1), "ep>1 or etp>1 needs a MoE model"),
        ((ep > 1) & (experts % ep != 0),
         lambda d: [f"ep={a} does not divide num_experts={experts}" for a in d.ep]),
        # Megatron-LM's MoE parallel folding: the expert layers regroup a stage's tp*cp*dp GPUs
        # as etp x ep x expert-data-parallel (parallel_state.initialize_model_parallel).
        ((safe_dp * cp * tp) % (ep * etp) != 0,
         lambda d: [f"ep*etp={a * b} does not divide the {c * e * f} GPUs of a pipeline stage (tp*cp*dp)"
                    for a, b, c, e, f in zip(d.ep, d.etp, d.tp, d.cp, d.dp)]),
        (model.expert_ffn_hidden_size % etp != 0,
         lambda d: [f"moe_ffn_hidden_size={model.expert_ffn_hidden_size} not divisible by etp={a}" for a in d.etp]),
        (space.tp_within_nvlink_domain & (etp > hw.nvlink_domain),
         lambda d: [f"etp={a} crosses the {hw.scale_up_domain}" for a in d.etp]),
        # TransformerConfig.__post_init__: "Bias in Moe is only supported when ETP==1".
        (model.is_moe & model.add_bias_linear & (etp > 1),
         lambda d: [f"etp={a}: Bias in Moe is only supported when ETP==1 (Megatron-Core)" for a in d.etp]),
        (m == 0, lambda d: [f"gbs {gbs} not divisible by mbs*dp={a * b}" for a, b in zip(d.mbs, d.dp)]),
        # NeMo 2's FineTuningDataModule and Megatron-Bridge's ConfigContainer.validate: "Micro batch
        # size should be 1 when training with packed sequence" (a packed sequence is the batch).
        (_packed(model) & (mbs > 1),
         lambda d: [f"mbs={a}: packed sequences need mbs 1 (NeMo, Megatron-Bridge)" for a in d.mbs]),
        # schedules.py takes any m >= pp with --microbatch-group-size-per-virtual-pipeline-stage
        # (pipeline.microbatch_group) where m is not a multiple of pp.
        ((vp > 1) & (m < pp),
         lambda d: [f"interleaving needs at least pp={c} micro-batches, got {gbs // (a * b)}"
                    for a, b, c in zip(d.mbs, d.dp, d.pp)]),
    ]
    return _first_reason(df, rules)


def _packed(model: ModelSpec) -> bool:
    return model.finetune is not None and model.finetune.packed_sequence


def _thd(model: ModelSpec) -> bool:
    """Packed sequences of several documents, each attending to itself (TE's THD format: per-document
    masks, ``attention_share`` below 1); packed rows of one document each (MLPerf's LoRA data: no
    cu_seqlens) run bshd / sbhd."""
    return attention_share(model) < 1.0


def _mamba_in_proj_unaligned(model: ModelSpec) -> bool:
    return model.is_hybrid and "M" in model.hybrid_layer_pattern and model.mamba_in_proj_width % 16 != 0


def _swiglu(model: ModelSpec) -> bool:
    return model.activation == "swiglu"


def _fused_mlp(model: ModelSpec) -> bool:
    """TransformerEngine's fused grouped MLP fuses GroupedLinear + scaled SwiGLU (or clamped quick-GEGLU)
    + GroupedLinear: a MoE model with a GLU (``cutedsl_fused_grouped_mlp``)."""
    return model.is_moe and model.activation == "swiglu"  # "swiglu" stands for any GLU (ModelSpec)


def _without_inapplicable(features: pd.DataFrame, space: SearchSpace, model: ModelSpec) -> pd.DataFrame:
    """Drop the combinations a knob cannot apply to (BF16 edge layers without an FP8 recipe, TP
    overlap without SP, a token dispatcher of a dense model) when the space also holds that knob
    off: they would only be rejected. A user who pinned the knob on gets the rule's reason instead."""
    quantized = features.precision.isin(QUANTIZED_PRECISIONS)
    inapplicable = np.zeros(len(features), dtype=bool)
    if "alltoall" in space.moe_token_dispatcher_type and not model.is_moe:
        inapplicable |= features.moe_token_dispatcher_type != "alltoall"
    if 0 in space.fp8_bf16_edge_layers:
        inapplicable |= (features.fp8_bf16_edge_layers > 0) & ~quantized
    if False in space.tp_comm_overlap:
        inapplicable |= features.tp_comm_overlap & ~features.sp
    if False in space.fp8_attention:
        inapplicable |= features.fp8_attention & ~features.precision.isin(FP8_ATTENTION_RECIPES)
    if False in space.tp_overlap_rs_pipeline:
        inapplicable |= features.tp_overlap_rs_pipeline & ~features.tp_comm_overlap
    if False in space.tp_only_amax_red:
        inapplicable |= features.tp_only_amax_red & (features.precision != "fp8-delayed")
    if False in space.activation_func_fp8_input_store and not _swiglu(model):
        inapplicable |= features.activation_func_fp8_input_store
    if False in space.cutedsl_fused_grouped_mlp:
        inapplicable |= features.cutedsl_fused_grouped_mlp & ((features.precision != "mxfp8") | (not _fused_mlp(model)))
    if False in space.fsdp and lora(model):
        inapplicable |= features.fsdp
    if False in space.lora_input_regather:
        inapplicable |= features.lora_input_regather & _regather_refused(features, model, space)
    refused = {k for k in space.cp_comm_type if _cp_refusal(model, space, k)}
    if refused and set(space.cp_comm_type) - refused:  # a kind the model runs is offered: the others go
        inapplicable |= features.cp_comm_type.isin(refused)
    return features[~inapplicable].reset_index(drop=True)


def unsupported_precisions(hw: HardwareSpec) -> dict[str, str]:
    """The precisions ``hw`` has no tensor cores for, each with the reason (also what
    ``search --fp8-check`` leaves unchecked)."""
    out = {p: f"{hw.name} has no FP8 tensor cores" for p in FP8_PRECISIONS if not hw.supports_fp8}
    if not hw.mxfp8:
        out.setdefault("mxfp8", f"mxfp8 needs Blackwell; {hw.name} lacks it")
    if hw.fp4_tflops is None:
        # TE's NVFP4BlockScaling: "for Blackwell+ architecture" (Megatron-Core's fp4 recipe).
        out["nvfp4"] = f"nvfp4 needs Blackwell FP4 tensor cores; {hw.name} lacks them"
    return out


def _mamba_rules(model: ModelSpec, tp: np.ndarray, cp: np.ndarray) -> list:
    """Megatron-Core's refusals of a hybrid model's Mamba-2 mixers (Megatron-LM d98e8a64dd,
    megatron/core/ssm/mamba_mixer.py MambaMixer.__init__ and mamba_context_parallel.py
    MambaContextParallel.__init__, asserted when the layers are built): TP splits the heads and
    the B/C groups; CP (an all-to-all from sequence to heads around the convolution and the scan)
    splits a TP rank's heads, and its groups, or repeats each group over cp / groups ranks."""
    if not model.is_hybrid or "M" not in model.hybrid_layer_pattern:
        return []
    heads, groups = model.mamba_heads, model.mamba_num_groups
    local = np.maximum(groups // tp, 1)
    return [
        (heads % tp != 0, lambda d: [f"{heads} Mamba heads not divisible by tp={a} (MambaMixer: \"nheads must be "
                                     "evenly divisble by tp_size\")" for a in d.tp]),
        (groups % tp != 0, lambda d: [f"{groups} Mamba groups not divisible by tp={a} (MambaMixer: \"ngroups must "
                                      "be evenly divisible by tp_size\")" for a in d.tp]),
        ((cp > 1) & ((heads // tp) % cp != 0),
         lambda d: [f"cp={c}: the {heads // t} Mamba heads of a TP rank not divisible by cp (MambaContextParallel: "
                    "\"nheads must be evenly divisible by tp_size * cp_size\")" for t, c in zip(d.tp, d.cp)]),
        ((cp > 1) & (local < cp) & (cp % local != 0),
         lambda d: [f"cp={c} not a multiple of the {groups // t} Mamba groups of a TP rank (MambaContextParallel: "
                    "\"cp_size must be evenly divisible by ngroups/tp_size\")" for t, c in zip(d.tp, d.cp)]),
        ((cp > 1) & (local >= cp) & (local % cp != 0),
         lambda d: [f"cp={c}: the {groups // t} Mamba groups of a TP rank not divisible by cp (MambaContextParallel: "
                    "\"ngroups must be evenly divisible by tp_size * cp_size\")" for t, c in zip(d.tp, d.cp)]),
    ]


def _regather_refused(df: pd.DataFrame, model: ModelSpec, space: SearchSpace) -> np.ndarray:
    """Feature combinations where Megatron-Bridge's LoRA input re-gather does not run
    (``REGATHER_FALLBACK``): not LoRA, LoRA's all-to-all adapters, a TE 1.x stack (NeMo 24.09's or
    older, before Megatron-Bridge), no SP, full recompute, CUDA graphs."""
    release = space.transformer_engine_version
    if not lora(model) or model.finetune.lora_a2a or (release and not release_at_least(release, 2, 0)):
        return np.ones(len(df), dtype=bool)
    return ~df.sp.to_numpy(dtype=bool) | (df.recompute.to_numpy() == "full") | (df.cuda_graph.to_numpy() != "none")


def _feature_rules(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec,
                   space: SearchSpace | None = None) -> np.ndarray:
    """Rules on the feature knobs alone (no structure needed)."""
    precision = df["precision"].to_numpy()
    kinds = df["cp_comm_type"].to_numpy() if "cp_comm_type" in df else np.full(len(df), "p2p", dtype=object)
    cp_refused = {k: _cp_refusal(model, space or SearchSpace(), k) for k in set(kinds)}
    fp8 = np.isin(precision, FP8_PRECISIONS)
    quantized = np.isin(precision, QUANTIZED_PRECISIONS)
    edge = df["fp8_bf16_edge_layers"].to_numpy()
    rules = [
        (df.tp_comm_overlap.to_numpy() & ~df.sp.to_numpy(), "TP comm overlap needs sequence parallel"),
        *[(precision == name, why) for name, why in unsupported_precisions(hw).items()],
        ((edge > 0) & ~quantized, "BF16 edge layers only apply to FP8 and FP4 precisions"),
        ((edge > 0) & (precision == "fp8-delayed"), "delayed scaling cannot keep first/last layers in BF16"),
        (2 * edge >= model.num_layers, "BF16 edge layers cover the whole model"),
        (df.overlap_param_gather.to_numpy() & ~df.distributed_optimizer.to_numpy(),
         "param-gather overlap needs the distributed optimizer"),
        (df.fsdp.to_numpy() & ~df.distributed_optimizer.to_numpy(), "FSDP needs the distributed optimizer"),
        (df.fsdp.to_numpy() & lora(model), "LoRA's frozen base is priced unsharded: FSDP is not offered with it"),
        (df.lora_input_regather.to_numpy(dtype=bool) & _regather_refused(df, model, space or SearchSpace()),
         f"{REGATHER_FALLBACK} or does not exist: it needs LoRA (without --lora-a2a) on Megatron-Bridge >= v0.6.0 "
         "(TransformerEngine 2.x) with sequence parallelism, and no full recompute or CUDA graphs"),
        (df.fp8_attention.to_numpy() & ~np.isin(precision, FP8_ATTENTION_RECIPES),
         "FP8 attention (--fp8-dot-product-attention) needs the fp8-delayed, fp8-current, mxfp8 or nvfp4 recipe"),
        (df.tp_overlap_rs_pipeline.to_numpy() & ~df.tp_comm_overlap.to_numpy(),
         "the pipelined forward reduce-scatter (--tp-overlap-rs-pipeline) is a userbuffers method: it needs --tp-comm-overlap"),
        (df.tp_only_amax_red.to_numpy() & (precision != "fp8-delayed"),
         "TP-only amax reduction (--tp-only-amax-red) applies to the fp8-delayed recipe's amax history"),
        # TransformerConfig.__post_init__: "Storing activation input in FP8 is supported only for SwiGLU."
        (df.activation_func_fp8_input_store.to_numpy() & (not _swiglu(model)),
         "the activation input is kept in FP8 (activation_func_fp8_input_store) only for SwiGLU"),
        # TE ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 (v2.16 ops/fused/forward_grouped_mlp.py): MXFP8 only,
        # GroupedLinear + ScaledSwiGLU / ScaledClampedQGeGLU + GroupedLinear of a MoE layer's experts.
        (df.cutedsl_fused_grouped_mlp.to_numpy() & ((precision != "mxfp8") | (not _fused_mlp(model))),
         "the CuTe-DSL fused grouped MLP (cutedsl_fused_grouped_mlp) runs MXFP8 MoE experts with a GLU only"),
        (df.fp8_attention.to_numpy() & ~df.flash_attention.to_numpy(),
         "FP8 attention runs in TransformerEngine's fused attention: it needs flash attention"),
        # TE get_attention_backend, "Filter: Softmax type": with FP8 DPA and a softmax offset the unfused
        # attention is off, FlashAttention is off, and cuDNN's fused FP8 attention takes sinks from
        # TE v2.15 on sm100+ with cuDNN >= 9.21 only (none at all before v2.15).
        (df.fp8_attention.to_numpy() & model.softmax_sinks & (not hw.mxfp8),
         f"FP8 attention with softmax sinks has no TransformerEngine backend on {hw.name} (cuDNN's fused "
         "FP8 attention takes sinks on Blackwell only)"),
        # TE module/base.py fill_userbuffers_buffer_for_all_gather: only delayed, current and MXFP8
        # quantizers; anything else is "Unsupported quantizer for Userbuffers".
        (df.tp_comm_overlap.to_numpy() & np.isin(precision, ("fp8-blockwise", "nvfp4")),
         lambda d: [f"TP comm overlap (Userbuffers) cannot carry {p} tensors (TE: Unsupported quantizer "
                    "for Userbuffers)" for p in d.precision]),
        (model.is_moe & (precision == "fp16"), "expert parallel models train in BF16, not FP16 (Megatron-LM)"),
        # MambaMixer.__init__ under config.fp8: "For FP8, the innermost dimension of the Mamba layer
        # input projection output tensor must be a multiple of 16." (z, x, B, C and dt together).
        (fp8 & _mamba_in_proj_unaligned(model),
         f"FP8 needs the Mamba in_proj width ({model.mamba_in_proj_width}) to be a multiple of 16 (MambaMixer: "
         "\"For FP8, the innermost dimension of the Mamba layer input projection output tensor must be a "
         "multiple of 16\")"),
        (df.overlap_moe_expert_parallel_comm.to_numpy() & (df.moe_token_dispatcher_type.to_numpy() == "allgather"),
         "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher (Megatron-LM)"),
        ((not model.is_moe) & (df.moe_token_dispatcher_type.to_numpy() != "alltoall"),
         f"a token dispatcher applies to MoE models; {model.name} is dense"),
        *_memory_knob_rules(df, fp8, model),
        (np.array([bool(cp_refused[k]) for k in kinds], dtype=bool),
         lambda d: [cp_refused[k] for k in d.cp_comm_type]),
    ]
    return _first_reason(df, rules)


def _memory_knob_rules(df: pd.DataFrame, fp8: np.ndarray, model: ModelSpec) -> list:
    """Megatron-LM's rules on FP8 param gather, the precision-aware optimizer and CUDA graphs
    (megatron/training/arguments.py, core/optimizer/__init__.py, TransformerConfig)."""
    dist_opt = df.distributed_optimizer.to_numpy()
    graph = df.cuda_graph.to_numpy()
    return [
        (df.fp8_param_gather.to_numpy() & ~dist_opt,
         "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp (Megatron-LM)"),
        (df.precision_aware_optimizer.to_numpy() & ~dist_opt,
         "--use-precision-aware-optimizer only supported with distributed optimizer (Megatron-LM)"),
        (df.param_remainders.to_numpy() & ~dist_opt,
         "master-weight remainders are state of the distributed optimizer (Apex DistributedFusedAdam "
         "store_param_remainders)"),
        ((graph != "none") & (df.recompute.to_numpy() == "full"),
         "recompute_granularity must not be full when CUDA Graphs are enabled (Megatron-LM 0.15; later "
         "releases allow it with the full-iteration graph only)"),
        ((graph == "layer") & model.is_moe,
         "whole-layer CUDA graphs need static shapes; a dropless MoE layer has none (Megatron graphs "
         "MoE layers only drop-padded or up to the router)"),
    ]


def modules_apply(modules: str, model: ModelSpec) -> str:
    """'' if every module of a --recompute-modules set applies to ``model``, else why not."""
    names = modules.split()
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown or not names:
        return f"recompute_modules {modules!r}: choose from {', '.join(RECOMPUTE_MODULES)}"
    if "mla_up_proj" in names and not model.multi_latent_attention:
        return "mla_up_proj in recompute_modules is only supported with multi_latent_attention"
    if {"moe", "moe_act"} & set(names) and not model.is_moe:
        return f"recompute_modules {modules!r} needs a MoE model"
    if "mhc" in names and model.hc_mult == 1:  # TransformerConfig: "'mhc' ... requires enable_hyper_connections"
        return "mhc in recompute_modules needs Hyper-Connections (hc_mult > 1: DeepSeek-V4)"
    return ""


def _expand_recompute_modules(df: pd.DataFrame, model: ModelSpec, space: SearchSpace) -> tuple[pd.DataFrame, list]:
    """Give selective-recompute rows one row per module set of the space that applies to the
    model (a set pinned for a model it does not apply to stays, with the reason); a set that
    recomputes the whole MoE layer ("moe") runs without the 1F1B all-to-all overlap. The rows'
    ``recompute_modules`` are positions in the module sets returned (``Source``'s codes)."""
    sets = [m for m in space.recompute_modules if not modules_apply(m, model)]
    if model.is_moe and len(sets) > 1:
        # core_attn alone saves nothing under flash attention and costs the attention again; a
        # MoE model's moe_act saves the experts' FC2 inputs for an activation's worth of time.
        sets = [m for m in sets if m != "core_attn"] or sets
    if not sets:
        sets = list(space.recompute_modules)
    selective = df.recompute.to_numpy() == "selective"  # on the values: a str column compares 3x slower
    parts = [(np.flatnonzero(~selective), "core_attn")] + [(np.flatnonzero(selective), m) for m in sets]
    out = _stacked(df, "recompute_modules", [(rows, i) for i, (rows, _) in enumerate(parts)])
    part = out.recompute_modules.to_numpy()
    # TransformerConfig.__post_init__ (Megatron-LM d98e8a6): "disable moe in recompute_modules when
    # enabling overlap_moe_expert_parallel_comm"; the 1F1B overlap is off there, as under full recompute.
    recomputes_moe = np.array([False] + [_covers_any(m, ("moe",)) for m in sets])[part]
    overlap = out.overlap_moe_expert_parallel_comm.to_numpy()
    out.loc[recomputes_moe & overlap, "overlap_moe_expert_parallel_comm"] = False
    reasons = {m: modules_apply(m, model) for m in sets}
    part_reasons = np.array([reasons.get(m, "") for _, m in parts], dtype=object)
    if part_reasons.any():  # a set pinned for a model it does not apply to
        out["reason"] = np.where(out.reason.to_numpy() == "", part_reasons[part], out.reason)
    return out, [m for _, m in parts]


def _stacked(df: pd.DataFrame, column: str, parts: list[tuple[np.ndarray, Any]]) -> pd.DataFrame:
    """``df``'s rows at each part's positions, part after part, with ``column`` set to the
    part's value (one, or one per row): ``pd.concat([df.iloc[rows].assign(column=value), ...],
    ignore_index=True)`` as one take, not a copy per part and another to join them (the
    expansions run on millions of rows)."""
    rows = np.concatenate([rows for rows, _ in parts])
    if not len(rows):
        return pd.concat([df.iloc[rows].assign(**{column: value}) for rows, value in parts], ignore_index=True)
    out = df.take(rows).reset_index(drop=True)
    out[column] = np.concatenate([(_filled(len(rows), value) if isinstance(value, str) else np.full(len(rows), value))
                                  if np.ndim(value) == 0 else np.asarray(value) for rows, value in parts])
    return out


def _layout_rules(df: pd.DataFrame, model: ModelSpec, space: SearchSpace,
                  sources: dict[str, Source] | None = None) -> np.ndarray:
    """Rules on a structure and its features together (Megatron-LM and TE refusals); ``sources``:
    string columns of which ``df`` holds the first rows, read by their codes."""
    labels = source_labels(sources or {}, slice(len(df)))
    def one_of(name: str, *values: str) -> np.ndarray:
        return knob_in(df, labels, name, values)
    per_stage = model.num_layers // df.pp.to_numpy()
    edge = df["fp8_bf16_edge_layers"].to_numpy()
    local_tokens = df.mbs.to_numpy() * model.seq_length // (df.tp.to_numpy() * df.cp.to_numpy())
    graphed = ~one_of("cuda_graph", "none")
    tp, cp = df.tp.to_numpy(), df.cp.to_numpy()
    heads_forbid = np.zeros(len(df), dtype=bool)
    for kind in cp_kinds.A2A_KINDS:
        rows = np.flatnonzero(one_of("cp_comm_type", kind) & (cp > 1))
        if len(rows):  # asked once per (tp, cp) of a small table, then looked up per row
            sizes, ranks = np.meshgrid(np.arange(tp.max() + 1), np.arange(cp.max() + 1), indexing="ij")
            forbids = cp_kinds.a2a_group(model, np.maximum(sizes, 1), np.maximum(ranks, 1), kind) == 0
            heads_forbid[rows] = forbids[tp[rows], cp[rows]]
    fp8_allgather = cp_kinds.fp8_attention_refusal("allgather", space.transformer_engine_version)
    rules = [
        # MoELayer.forward: "performance may degrade if MoE and tensor parallelism are enabled
        # without also enabling sequence parallelism" (a ValueError in training).
        (model.is_moe & (df.tp.to_numpy() > 1) & ~df.sp.to_numpy(),
         "MoE with tensor parallel needs sequence parallel (Megatron-LM MoELayer)"),
        # TransformerConfig.__post_init__: BF16 edge layers are counted per pipeline stage (FP8 only).
        ((edge > per_stage) & ~one_of("precision", "nvfp4"),
         lambda d: [f"num_layers_at_start_in_bf16 ({e}) must be between 0 and number of layers per pipeline "
                    f"stage ({model.num_layers // p})" for e, p in zip(d.fp8_bf16_edge_layers, d.pp)]),
        # TE fill_userbuffers_buffer_for_all_gather: MXFP8 scales come in blocks of 128 rows.
        (df.tp_comm_overlap.to_numpy() & one_of("precision", "mxfp8") & (local_tokens % 128 != 0),
         lambda d: [f"Userbuffers requires MXFP8 tensor dims that are divisible by 128 (mbs*seq/(tp*cp) = "
                    f"{m * model.seq_length // (t * c)})" for m, t, c in zip(d.mbs, d.tp, d.cp)]),
        # TransformerConfig.__post_init__ (selective recompute under FP8).
        (_recomputes_any(df, one_of("precision", "fp8-delayed"), ("moe_act", "layernorm"), labels),
         "Delayed scaling does not support moe_act and layernorm recompute for fp8 (Megatron-Core)"),
        # SearchSpace.transformer_engine_version: TE < 1.10 runs no FP8 attention under CP.
        ((not space.fp8_attention_with_cp) & df.fp8_attention.to_numpy() & (df.cp.to_numpy() > 1),
         FP8_CP_ATTENTION_REASON),
        (_thd(model) & df.fp8_attention.to_numpy(), FP8_THD_ATTENTION_REASON),
        # SearchSpace.transformer_engine_version: a TE release without the precision's recipe
        # (``candidates.RECIPE_FIRST_RELEASE``: TE 1.x has delayed scaling only).
        (one_of("precision", *(p for p in RECIPE_FIRST_RELEASE
                               if not recipe_in_release(p, space.transformer_engine_version))),
         lambda d: [f"{p} needs TransformerEngine >= {'.'.join(map(str, RECIPE_FIRST_RELEASE[p]))}, the "
                    f"first release with its recipe (transformer_engine_version "
                    f"{space.transformer_engine_version})" for p in d.precision]),
        # SearchSpace.transformer_engine_version: LoRA on a virtual pipeline, which NeMo 24.09's stack
        # trains on the first virtual chunk only (``candidates.LORA_VIRTUAL_PIPELINE_TE``).
        (lora(model) & (df.vp.to_numpy() > 1) & (not lora_virtual_pipeline(space.transformer_engine_version)),
         "LoRA on a virtual pipeline (vp > 1) needs NeMo >= 2.1.0, the first release that adds the adapters to "
         "every virtual chunk (NeMo 2c42fc3961, #11128); transformer_engine_version "
         f"{space.transformer_engine_version} is taken as NeMo 24.09's stack or older, which trains the first "
         "chunk's only"),
        # TransformerConfig.__post_init__ (0.15; later releases allow the full-iteration graph).
        (graphed & (df.cpu_offloading_num_layers.to_numpy() > 0),
         "CUDA graphs not supported with CPU offloading (Megatron-Core)"),
        (df.lora_input_regather.to_numpy(dtype=bool) & (df.cpu_offloading_num_layers.to_numpy() > 0),
         f"{REGATHER_FALLBACK} under CPU activation offloading (Megatron-Bridge)"),
        # TransformerConfig.__post_init__ (Megatron-Core 0.16+, 2b343d739f "Refactor cuda_graph_scope"):
        # a graphed recompute draws no random numbers, and the whole-layer and full-iteration graphs
        # cover every module, so a recomputed dropout is refused.
        (_recomputes_any(df, graphed & (model.attention_dropout != 0.0), ("core_attn",), labels),
         "attention dropout is not supported with graphed attention recomputation (Megatron-Core)"),
        (_recomputes_any(df, graphed & (model.hidden_dropout != 0.0), ("moe",), labels),
         "hidden dropout is not supported with graphed MLP/MoE recomputation (Megatron-Core)"),
        # TransformerConfig.__post_init__; after the cross, because the 1F1B overlap is turned off
        # where it cannot apply (``_cross``), and there the shared-expert overlap can take its place.
        (df.moe_shared_expert_overlap.to_numpy() & df.overlap_moe_expert_parallel_comm.to_numpy(),
         "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm (Megatron-LM)"),
        # cp_kinds: TE's all-to-all kinds split a TP rank's heads over the a2a group.
        (heads_forbid, lambda d: [cp_kinds.heads_refusal(model, t, c, k)
                                  for t, c, k in zip(d.tp, d.cp, d.cp_comm_type)]),
        (bool(fp8_allgather) & (cp > 1) & df.fp8_attention.to_numpy() & one_of("cp_comm_type", "allgather"),
         fp8_allgather),
    ]
    return _first_reason(df, rules)


def _recomputes_any(df: pd.DataFrame, rows: np.ndarray, modules: tuple[str, ...], labels: dict) -> np.ndarray:
    """Of the ``rows`` asked about, those whose selective recompute covers any of ``modules``
    (--recompute-modules is a list); each distinct recompute and module set is read once (a space
    has a handful, a search millions of rows), from ``labels`` (``knob_test``)."""
    rows = np.asarray(rows, dtype=bool)
    if not rows.any():
        return np.zeros(len(df), dtype=bool)
    return (rows & knob_in(df, labels, "recompute", ("selective",))
            & knob_test(df, labels, "recompute_modules", lambda names: _covers_any(names, modules)))


def _covers_any(recompute_modules, modules: tuple[str, ...]) -> bool:
    """Whether a --recompute-modules list (space-separated; not a string: none) names any of ``modules``."""
    return isinstance(recompute_modules, str) and bool(set(recompute_modules.split()) & set(modules))


@dataclass
class _Crossed:
    """Structures x feature combinations as positions, not yet as a frame: row i is structure
    ``structure[i]`` (a position in the structures crossed) with ``variants`` row ``variant[i]``
    (the feature combinations, with the knobs that mean nothing for that structure turned off).
    The frame is built once, after the expansions (``_expanded``): each copy of it is millions of
    rows of 40 columns."""

    structure: np.ndarray
    variant: np.ndarray
    variants: pd.DataFrame


def _cross(structures: pd.DataFrame, features: pd.DataFrame, shared_overlap: bool = False) -> _Crossed:
    """Valid structures x valid features. Sequence parallel (and the TP overlap that needs it, with
    its pipelined reduce-scatter, and LoRA's input re-gather) means nothing at tp=1 (Megatron turns it off), FSDP nothing
    without a data-parallel group, the expert all-to-all overlap nothing without expert parallel
    and is refused for a pipeline without virtual stages, the token dispatcher nothing on one GPU:
    such structures get each feature combination with those knobs off (alltoall), once. Where the
    all-to-all overlap is off, the shared-expert overlap (which Megatron refuses beside it) takes
    its place when ``shared_overlap`` (never slower: it only hides the all-to-alls behind the
    shared experts). The CP kind means nothing at cp = 1 (p2p there). Rows go structure by structure, each
    with every combination in order (a cross merge's order)."""
    no_a2a_overlap = (structures.ep == 1) | ((structures.pp > 1) & (structures.vp == 1))
    useless = {"sp": (structures.tp == 1,
                      {"sp": False, "tp_comm_overlap": False, "tp_overlap_rs_pipeline": False,
                       "lora_input_regather": False}),
               "fsdp": (structures.dp * structures.cp == 1, {"fsdp": False}),
               "a2a": (no_a2a_overlap, {"overlap_moe_expert_parallel_comm": False,
                                        **({"moe_shared_expert_overlap": True} if shared_overlap else {})}),
               "dispatch": (structures.ep * structures.etp == 1, {"moe_token_dispatcher_type": "alltoall",
                                                                  "moe_shared_expert_overlap": False})}
    useless["cp"] = (structures.cp == 1, {"cp_comm_type": "p2p"})
    structure, variant, variants = [], [], []
    offset = 0
    for flags in itertools.product((False, True), repeat=len(useless)):
        rows = np.ones(len(structures), dtype=bool)
        off: dict = {}
        for flag, (mask, knobs) in zip(flags, useless.values()):
            rows &= mask.to_numpy() == flag
            off |= knobs if flag else {}
        if not rows.any():  # no structure takes these knobs off together: nothing to offer
            continue
        chosen = features.assign(**off)
        if off.get("moe_shared_expert_overlap"):  # alltoall / flex only (TransformerConfig)
            chosen.loc[chosen.moe_token_dispatcher_type == "allgather", "moe_shared_expert_overlap"] = False
        if off:
            chosen = _drop_duplicates(chosen)
        rows = np.flatnonzero(rows)
        structure.append(np.repeat(rows, len(chosen)))
        variant.append(np.tile(np.arange(offset, offset + len(chosen)), len(rows)))
        variants.append(chosen)
        offset += len(chosen)
    if not variants:
        return _Crossed(np.zeros(0, dtype=int), np.zeros(0, dtype=int), features.iloc[:0].reset_index(drop=True))
    return _Crossed(np.concatenate(structure), np.concatenate(variant), pd.concat(variants, ignore_index=True))


# Below this many rows ``_drop_duplicates`` compares the rows as tuples: pandas' own takes ~2 ms on a frame
# of a few rows (a factorization per column), and ``_cross`` asks it 16 times per validation row.
FEW_ROWS = 1000


def _drop_duplicates(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame.drop_duplicates()`` (the first of equal rows kept, with its index label): for a frame of
    ``FEW_ROWS`` or fewer without NaN by comparing its rows as tuples of Python values, else pandas'."""
    if len(frame) > FEW_ROWS:
        return frame.drop_duplicates()
    columns = [frame[name].tolist() for name in frame.columns]
    if any(v != v for column in columns for v in column if isinstance(v, float)):  # NaN: pandas says equal
        return frame.drop_duplicates()
    seen: set = set()
    keep = np.zeros(len(frame), dtype=bool)
    for i, key in enumerate(zip(*columns)):
        if key not in seen:
            seen.add(key)
            keep[i] = True
    return frame[keep]


def _cross_dispatchers(structures: pd.DataFrame, features: pd.DataFrame, model: ModelSpec, hw: HardwareSpec,
                       space: SearchSpace) -> _Crossed:
    """``_cross`` of each group of structures with the CP kinds it is offered (``_cp_kinds_offered``),
    with ``dispatcher_by_ep_span``: alltoall only for EP groups inside one node, flex only for those
    across nodes."""
    offered = set(space.moe_token_dispatcher_type)
    shared = model.shared_expert_ffn_hidden_size > 0 and True in space.moe_shared_expert_overlap
    parts = []
    for kinds, rows in _cp_kinds_offered(structures, features, model, hw):
        chosen = features[features.cp_comm_type.isin(kinds)] if kinds is not None else features
        if not (model.is_moe and space.dispatcher_by_ep_span and {"alltoall", "flex"} <= offered):
            parts.append((rows, _cross(structures.iloc[rows], chosen, shared)))
            continue
        across = (structures.ep * structures.etp > hw.gpus_per_node).to_numpy()[rows]
        dispatcher = chosen.moe_token_dispatcher_type
        parts.append((rows[~across], _cross(structures.iloc[rows[~across]], chosen[dispatcher != "flex"], shared)))
        parts.append((rows[across], _cross(structures.iloc[rows[across]], chosen[dispatcher != "alltoall"], shared)))
    if len(parts) == 1 and len(parts[0][0]) == len(structures):
        return parts[0][1]
    offsets = np.cumsum([0] + [len(part.variants) for _, part in parts])
    return _Crossed(np.concatenate([rows[part.structure] for rows, part in parts]),
                    np.concatenate([offset + part.variant for (_, part), offset in zip(parts, offsets)]),
                    pd.concat([part.variants for _, part in parts], ignore_index=True))


def _cp_kinds_offered(structures: pd.DataFrame, features: pd.DataFrame, model: ModelSpec,
                      hw: HardwareSpec) -> list[tuple[tuple[str, ...] | None, np.ndarray]]:
    """The structures (positions) grouped by the CP kinds each is offered (None: every kind of
    ``features``, which a structure at cp = 1 or a space of one kind takes as it is). At cp > 1, of
    the kinds the features hold (the model's, ``_without_inapplicable``): those a TP rank's heads let
    run (``cp_kinds.a2a_group``; a2a+p2p only where plain a2a cannot, as Megatron-Bridge's
    hierarchical-context-parallel guide advises: "Prefer pure a2a when you can adjust TP so that
    CP <= num_kv_heads / TP"), less any whose least exposed exchange is above another's most
    (``layer_time.cp_kind_bounds`` between the least and the most attention time the features allow:
    the kind changes that term and its ring's merges alone, so it could not be the faster there). A structure whose heads allow none keeps them all, to be refused with the reason."""
    kinds = tuple(dict.fromkeys(features.cp_comm_type)) if len(features) else ()
    everything = [(None, np.arange(len(structures)))]
    if len(kinds) < 2 or not (structures.cp > 1).any():
        return everything
    from types import SimpleNamespace

    from autoparallel.costmodel.layer_time import attention_time_least, attention_time_most, cp_kind_bounds
    tp, cp = structures.tp.to_numpy(), structures.cp.to_numpy()
    x = SimpleNamespace(model=model, hw=hw, t=tp.astype(float), c=cp.astype(float), b=structures.mbs.to_numpy(float),
                        s_local=model.seq_length / cp)
    fp8_attention = bool(features.fp8_attention.any()) and not model.is_dsv4  # DeepSeek-V4 prices its own kernels
    bounds = cp_kind_bounds(x, kinds, attention_time_least(x, fp8_attention),
                            attention_time_most(x, not bool(features.flash_attention.all())))
    runs = {k: (cp_kinds.a2a_group(model, tp, cp, k) > 0) if k in cp_kinds.A2A_KINDS else np.ones(len(tp), bool)
            for k in kinds}
    if "a2a" in kinds and "a2a+p2p" in kinds:
        runs["a2a+p2p"] = runs["a2a+p2p"] & ~runs["a2a"]
    most = np.min([np.where(runs[k], bounds[k][1], np.inf) for k in kinds], axis=0)
    keep = np.array([runs[k] & (bounds[k][0] <= most) for k in kinds])  # (kinds, structures)
    keep[:, ~keep.any(axis=0)] = True  # none runs: each is refused with its reason
    keep[:, cp == 1] = True
    groups: dict[tuple, list[int]] = {}
    for i, column in enumerate(keep.T):
        groups.setdefault(tuple(k for k, kept in zip(kinds, column) if kept), []).append(i)
    return [(None if len(offered) == len(kinds) else offered, np.array(rows)) for offered, rows in groups.items()]


@functools.cache
def _plan_hints() -> dict:
    """``typing.get_type_hints(Plan)``, resolved once (read, never changed)."""
    return typing.get_type_hints(Plan)


def _fill_rejected(rejected: pd.DataFrame, space: SearchSpace, gpus: int) -> pd.DataFrame:
    """A row rejected on its structure (or features) alone stands for every combination of the
    other knobs; it shows the space's first value of each so that every knob column holds a
    value of its own type (the reason names the knobs that broke the rule)."""
    firsts = {name: getattr(space, name)[0] for name in STRUCTURE_KNOBS + FEATURE_KNOBS if name != "vp"}
    firsts["vp"] = 1 if space.vp == "auto" else space.vp[0]
    firsts["overlap_grad_reduce"] = firsts["overlap_param_gather"] = firsts.pop("overlap_dp_comm")
    firsts.update(dict(zip(SPLIT_COLUMNS, pipeline.EVEN)), recompute_num_layers=0, cpu_offloading_num_layers=0)
    firsts["recompute_modules"] = space.recompute_modules[0]
    firsts["moe_flex_dispatcher_backend"] = "deepep"
    out = rejected.assign(**{k: v for k, v in firsts.items() if k not in rejected})
    if "dp" not in rejected:
        model_parallel = out.tp * out.pp * out.cp
        out["dp"] = np.where(gpus % model_parallel == 0, gpus // model_parallel, 0)
    hints = _plan_hints()
    return out.astype({k: hints[k] for k in out.columns if k in hints and hints[k] in (int, bool)})


def flex_backend(ep_group, hw: HardwareSpec) -> np.ndarray:
    """The flex dispatcher's backend Megatron-LM can run: HybridEP where the EP x ETP group spans
    several nodes of one multi-node NVLink domain (GB200/GB300 NVL72: DeepEP does not do MNNVL),
    DeepEP elsewhere (one node, or nodes joined by RDMA)."""
    ep_group = np.asarray(ep_group)
    mnnvl = (ep_group > hw.gpus_per_node) & (ep_group <= hw.nvlink_domain)
    return np.where(mnnvl, "hybridep", "deepep")


def feature_combinations(model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """The feature knobs' combinations a search offers this model, before the rules."""
    space = with_cp_kinds(space, model)
    features = _without_inapplicable(_product(FEATURE_KNOBS, space), space, model)
    # FP8 param gather keeps FP8 weights: off where the precision is not FP8 (as SP at tp 1; a
    # pinned --fp8-param-gather with another precision is refused by the CLI, cli.combos).
    features.loc[~features.precision.isin(FP8_PRECISIONS), "fp8_param_gather"] = False
    # Megatron refuses the 1F1B all-to-all overlap with full recompute, and with more than one MTP
    # layer ("MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm"): off there.
    refused = (features.recompute == "full") | (model.mtp_num_layers > 1)
    features.loc[refused, "overlap_moe_expert_parallel_comm"] = False
    # The shared-expert overlap means nothing without shared experts (as SP at tp 1); Megatron
    # refuses it beside the 1F1B overlap, which hides more where it runs (``_cross`` offers it
    # where the 1F1B overlap cannot run; a pinned one comes with the 1F1B overlap off, cli.combos).
    if model.shared_expert_ffn_hidden_size == 0:
        features["moe_shared_expert_overlap"] = False
    features.loc[features.overlap_moe_expert_parallel_comm | (features.moe_token_dispatcher_type == "allgather"),
                 "moe_shared_expert_overlap"] = False
    return features.drop_duplicates(ignore_index=True)


def generate(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
             recompute_num_layers: int | None = None) -> pd.DataFrame:
    """Every candidate of ``space`` as a DataFrame of Plan columns plus ``reason`` ('' = valid).

    A structure or a feature combination that breaks a rule on its own appears once, with the
    space's first value of each other knob (see _fill_rejected); everything else is a full layout.
    """
    return generate_with_sources(model, hw, gpus, gbs, space, recompute_num_layers)[0]


def generate_with_sources(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
                          recompute_num_layers: int | None = None) -> tuple[pd.DataFrame, dict[str, Source]]:
    """``generate``'s frame, and the ``Source`` of each of its columns taken from the structures,
    the feature combinations or the module sets (``grid.rank`` gathers those from their short
    columns, and the cost model reads the string ones' codes instead of factorizing the strings)."""
    if gpus < 1:
        raise UserError(f"--gpus must be a positive integer, got {gpus}")
    if gbs < 1:
        raise UserError(f"--gbs must be a positive integer, got {gbs}")
    space = with_cp_kinds(space, model)
    structures = _structures(model, space)
    structures["reason"] = _structure_rules(structures, model, hw, gpus, gbs, space)
    structures = structures.drop(columns="layout_reason")

    features = feature_combinations(model, space)
    features["overlap_grad_reduce"] = features.pop("overlap_dp_comm")
    features["overlap_param_gather"] = features["overlap_grad_reduce"]
    features["reason"] = _feature_rules(features, model, hw, space)

    valid_structures = structures[structures.reason == ""].drop(columns="reason")
    valid_features = features[features.reason == ""].drop(columns="reason")
    crossed = _cross_dispatchers(valid_structures, valid_features, model, hw, space)
    valid_structures["moe_flex_dispatcher_backend"] = flex_backend(valid_structures.ep * valid_structures.etp, hw)
    rejected = [_fill_rejected(part[part.reason != ""], space, gpus) for part in (structures, features)]
    out, sources = _expanded(valid_structures, crossed, rejected, model, space, recompute_num_layers)
    n = len(out) - sum(map(len, rejected))  # the crossed rows come first
    reason = out["reason"].to_numpy()
    out["reason"] = np.concatenate([np.where(reason[:n] == "", _layout_rules(out.iloc[:n], model, space, sources),
                                             reason[:n]),
                                    reason[n:]])
    out["gbs"] = gbs
    return out[list(Plan.field_names()) + ["reason"]], sources


# What the expansions below read and never set (they set overlap_moe_expert_parallel_comm and reason).
EXPANSION_READS = ["pp", "vp", *SPLIT_COLUMNS, "recompute"]


@dataclass(frozen=True)
class Source:
    """A column of millions of rows as the short column it is taken from (the structures', the
    feature combinations' or the module sets') and each row's position there, ``rows`` (one array
    for every column of one short frame): the column is ``short.take(rows)``. ``grid.rank`` gathers
    ``rows`` once per short frame and each column from its short one (a random gather of millions of
    rows per column otherwise, holding the GIL for strings); the cost model reads a string
    column's ``codes`` into its distinct ``values`` instead of factorizing millions of Python strings."""

    short: Any  # a pandas array of few rows
    rows: np.ndarray

    @property
    def is_string(self) -> bool:
        return self.short.dtype.kind == "O"

    @cached_property
    def _factorized(self) -> tuple[Any, np.ndarray]:
        codes, values = pd.factorize(self.short, use_na_sentinel=False)
        return values, codes.take(self.rows)

    @property
    def values(self):
        """The distinct values, a pandas array of the column's dtype."""
        return self._factorized[0]

    @property
    def codes(self) -> np.ndarray:
        """Each row's position in ``values``."""
        return self._factorized[1]

    def column(self):
        return self.short.take(self.rows)


def source_labels(sources: typing.Mapping[str, Source], at) -> dict[str, tuple[np.ndarray, list]]:
    """The string columns of ``sources`` at the rows ``at`` (an index or a slice) as the cost
    model's labels (``Candidates.labels``: codes, distinct values)."""
    return {name: (source.codes[at], list(source.values)) for name, source in sources.items() if source.is_string}


def _expanded(structures: pd.DataFrame, crossed: _Crossed, rejected: list[pd.DataFrame], model: ModelSpec,
              space: SearchSpace, pinned: int | None) -> tuple[pd.DataFrame, dict[str, Source]]:
    """The crossed rows through _expand_recompute_layers, _expand_recompute_modules and
    _expand_offloading, then the ``rejected`` rows (every column their own), as one frame, and the
    ``Source`` of each of its columns that the expansions neither add nor set. The expansions run
    on the columns they read or set plus each row's structure and combination, and every other
    column is taken once at the end from the structures and the combinations, the rejected rows
    appended to those (each expansion's take copied every column of millions of rows, and so did
    building the crossed frame and concatenating the rejected rows to it)."""
    def taken(names: list[str], structures: pd.DataFrame, variants: pd.DataFrame, structure: np.ndarray,
              variant: np.ndarray) -> dict[str, Source]:
        """The columns ``names`` of the rows made of these structures and combinations."""
        return {name: Source(structures[name].array, structure) if name in structures
                else Source(variants[name].array, variant) for name in names}

    def values(columns: dict[str, Source]) -> dict:
        return {name: c.column() for name, c in columns.items()}

    narrow = pd.DataFrame(values(taken(EXPANSION_READS + ["overlap_moe_expert_parallel_comm"], structures,
                                       crossed.variants, crossed.structure, crossed.variant)))
    narrow["reason"] = ""
    narrow["structure"], narrow["variant"] = crossed.structure, crossed.variant
    # The layer counts alone read vp and the split: the later expansions need not copy them.
    narrow = _expand_recompute_layers(narrow, model, space, pinned).drop(columns=["vp", *SPLIT_COLUMNS])
    narrow, module_sets = _expand_recompute_modules(narrow, model, space)
    narrow = _expand_offloading(narrow, model, space)
    structure, variant, modules = (narrow.pop(name).to_numpy()
                                   for name in ("structure", "variant", "recompute_modules"))
    narrow = narrow.drop(columns=["pp", "recompute"])  # the rest of EXPANSION_READS: taken below with the others

    def appended(frame: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([frame, *(part[frame.columns] for part in rejected)], ignore_index=True)

    extra = np.arange(sum(map(len, rejected)))
    structure = np.concatenate([structure, len(structures) + extra])
    variant = np.concatenate([variant, len(crossed.variants) + extra])
    rest = taken([name for name in [*structures, *crossed.variants] if name not in narrow],
                 appended(structures), appended(crossed.variants), structure, variant)
    rest["recompute_modules"] = Source(appended(pd.DataFrame({"recompute_modules": module_sets})).recompute_modules.array,
                                       np.concatenate([modules, len(module_sets) + extra]))
    frame = pd.DataFrame({**values(rest), **appended(narrow)}, copy=False)
    return frame, rest


def _expand_recompute_layers(df: pd.DataFrame, model: ModelSpec, space: SearchSpace,
                             pinned: int | None) -> pd.DataFrame:
    """Give full-recompute rows one row per layer count (fractions of the pipeline chunk; 0 for
    all of it), each count once per row."""
    full = df.recompute.to_numpy() == "full"
    rows = df[full]
    at = np.flatnonzero(full)
    stages = pipeline.stage_layers(model.num_layers, rows.pp, rows.vp, *(rows[c].to_numpy() for c in SPLIT_COLUMNS))
    chunk = np.ceil(np.maximum.reduce(stages) / rows.vp.to_numpy()).astype(int)
    parts = [(np.flatnonzero(~full), 0)]
    if pinned is not None:
        parts.append((at, np.minimum(pinned, chunk)))
        return _stacked(df, "recompute_num_layers", parts)
    seen = []
    for fraction in space.full_recompute_fractions:
        layers = np.maximum(1, np.ceil(fraction * chunk).astype(int))
        layers = np.where(layers >= chunk, 0, layers)
        new = ~np.any([layers == earlier for earlier in seen], axis=0) if seen else np.ones(len(rows), bool)
        parts.append((at[new], layers[new]))
        seen.append(layers)
    return _stacked(df, "recompute_num_layers", parts)


def _expand_offloading(df: pd.DataFrame, model: ModelSpec, space: SearchSpace) -> pd.DataFrame:
    """Give rows that may offload (pp = 1, no recompute) one row per offloaded layer count; a
    pinned count that Megatron-LM refuses for a row is kept with the reason."""
    able = (df.pp == 1) & (df.recompute.to_numpy() == "none")
    pinned = space.cpu_offloading_num_layers
    if pinned is not None:
        out = df.assign(cpu_offloading_num_layers=pinned)
        if pinned > 0:
            broken = np.select([df.pp > 1, df.recompute != "none", pinned >= model.num_layers],
                               ["CPU offloading needs pp=1", "CPU offloading does not work with recompute",
                                f"CPU offloading covers fewer than {model.num_layers} layers"], "")
            out["reason"] = np.where(out.reason == "", broken, out.reason)
        return out
    counts = sorted({int(f * model.num_layers) for f in space.cpu_offload_fractions} - {model.num_layers})
    able = able.to_numpy()
    parts = [(np.flatnonzero(~able), 0)] + [(np.flatnonzero(able), n) for n in counts or [0]]
    return _stacked(df, "cpu_offloading_num_layers", parts)


def row_to_plan(row: Any) -> Plan:
    """One candidates row (a Series or dict, from a DataFrame or a CSV) as a Plan; a knob the
    row lacks (a run folder written before the knob existed) takes the Plan's default."""
    hints = _plan_hints()
    values = {}
    for f in dataclasses.fields(Plan):
        if f.name not in row and f.default is not dataclasses.MISSING:
            continue
        value = row[f.name]
        if hints[f.name] is int:
            value = int(value)
        elif hints[f.name] is bool:
            value = value if isinstance(value, (bool, np.bool_)) else str(value).lower() == "true"
            value = bool(value)
        elif hints[f.name] is str and not isinstance(value, str):  # an empty CSV cell reads as NaN
            value = "" if value is None or pd.isna(value) else str(value)
        values[f.name] = value
    return Plan(**values)
