"""Published training runs as the cost model sees them: each row's architecture, the layout it
states, the candidates consistent with it, and the prediction of the metric its source reports.

Below both ``validate`` (which reports the errors, in-sample and held out) and
``costmodel.calibrate`` (which fits the constants to them), so that neither imports the other.
What a row leaves unstated is taken from what its source documents: the recipe it ran
(``data/recipe_settings.yaml``), else the source's defaults (``search_spaces/validation.yaml``).
Only what no source documents (Narayanan's micro-batch size) is searched, the fastest layout that
fits taken, as the authors tuned their runs. Each prediction names the variant it priced.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import io, mlperf_corrections, ranges, resources, safefile
from autoparallel.costmodel import flops
from autoparallel.costmodel.candidates import (CP_COMM_TYPE_COLUMN, CUDNN_FRONTEND_COLUMN, CUTLASS_DSL_COLUMN,
                                               DP_BUCKET_SIZE_COLUMN, DP_MAX_CTAS_COLUMN, Candidates, candidates,
                                               fp8_cp_attention, on_hardware)
from autoparallel.costmodel.estimate import estimate_candidates, estimate_columns
from autoparallel.errors import UserError
from autoparallel.space import SPLIT_COLUMNS, SearchSpace, generate
from autoparallel.specs.finetune import DEFAULT_LORA_RANK, LORA_TARGETS, Finetune
from autoparallel.specs.hardware import Efficiency, HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import FP8_PRECISIONS, Plan

TRAINING_RUNS = ("training_runs.csv", "training_runs_more.csv", "training_runs_papers.csv")
# Runs that validate predicts but calibration never fits (nor validate's refits): MLPerf's record
# submissions, tuned far beyond the published recipes the constants describe, stay a held-out test;
# NVIDIA's runs newer than the fit (Megatron-Bridge's 26.02-26.08 summaries, Megatron-LM's
# DeepSeek-V3 GB200 guide) are the runs the fit did not see; NeMo's fine-tuning table
# (nemo_finetune_runs.csv) and Megatron-Bridge's newer SFT / LoRA tables (finetune_runs_newer.csv) are
# predicted only too: no fit has fine-tuning rows. The Nemotron 3 hybrid Mamba-Transformer runs of the
# same summaries (training_runs_hybrid.csv) are a held-out group of their own (kind hybrid-newer), and so are
# the DeepSeek-V4 runs of the 26.08 summary (training_runs_dsv4.csv, kind dsv4-newer). MLPerf's LoRA rows on
# AMD Instinct GPUs (mlperf_training_lora_amd.csv), priced with an NVIDIA family's constants, are a group of
# their own too (kind lora-amd: ``PreparedRow.kind``).
VALIDATION_ONLY_RUNS = ("mlperf_training_gpt3.csv", "mlperf_training_lora_hopper.csv", "training_runs_newer.csv",
                        "nemo_finetune_runs.csv", "finetune_runs_newer.csv", "training_runs_hybrid.csv",
                        "training_runs_dsv4.csv", "mlperf_training_lora_blackwell.csv", "mlperf_training_llama31.csv",
                        "mlperf_training_lora_amd.csv")
VALIDATION_ONLY_SOURCES = ("mlperf", "mlperflora", "bridge", "megatron", "nemoft", "mlperfllama")
NEWER_SOURCES = ("bridge", "megatron")
LOAD_BALANCE_RUNS = "moe_load_balance.csv"
RECIPES = "recipe_settings.yaml"
ASSUMPTIONS = io.SEARCH_SPACES / "validation.yaml"
MEASURED = {"hw_tflops": "measured_hw_tflops_per_gpu", "iteration_time": "measured_iteration_time_s",
            "tokens_per_s_per_gpu": "measured_tokens_per_s_per_gpu",
            "model_tflops": "measured_model_tflops_per_gpu"}
DEFAULT_RELEASE = "24.07"  # the NeMo rows of training_runs.csv


def default_runs() -> tuple[Path, ...]:
    """The published runs calibration fits."""
    return tuple(resources.data_file(name) for name in TRAINING_RUNS)


def validation_runs() -> tuple[Path, ...]:
    """The published runs validate predicts: the calibration set and the validation-only runs."""
    return default_runs() + tuple(resources.data_file(name) for name in VALIDATION_ONLY_RUNS)


def assumptions_key(run_id: str) -> str:
    """The block of validation.yaml a row's source uses: narayanan21, korthikanti22, nemo, bridge,
    megatron, ... or log (rows ``autoparallel runs import`` read from training logs)."""
    return run_id.split("-")[0]


def _given(row: pd.Series, key: str) -> bool:
    v = row.get(key)
    return not (v is None or (isinstance(v, float) and math.isnan(v)) or v == "")


def source_of(row: pd.Series) -> str:
    """Who published the row: the paper, or the NeMo release ("nemo 25.11"; "bridge 26.06" for the
    newer summaries no fit sees)."""
    key = assumptions_key(row["id"])
    if key not in ("nemo", "bridge"):
        return key
    return f"{key} {row['release'] if _given(row, 'release') else DEFAULT_RELEASE}"


def software_of(row: pd.Series) -> str:
    """The software a row ran: the paper's Megatron-LM, or the (first listed) NeMo release (the
    Megatron-Bridge summaries' rows ran the NeMo container they name)."""
    key = assumptions_key(row["id"])
    if key not in ("nemo", "bridge"):
        return key
    release = str(row["release"]).split(",")[0] if _given(row, "release") else DEFAULT_RELEASE
    return f"nemo {release}"


def software_date(software: str) -> float:
    """Sortable release date: "nemo 25.02" -> 2025.02, "korthikanti22" -> 2022; the user's own
    runs (``runs import``: "log") come after every release: their cluster is the one the
    constants should describe, older releases get speed factors relative to it."""
    if software.startswith("nemo "):
        return 2000 + float(software.split()[1])
    if not software[-2:].isdigit():
        return math.inf
    return 2000 + float(software[-2:])


def model_group(row: pd.Series) -> str:
    """The architecture a row trains, so that the same network published by two sources (GPT-3
    175B by Korthikanti and by NeMo) is left out as one model."""
    return f"L{int(row['num_layers'])}-h{int(row['hidden_size'])}-a{int(row['num_attention_heads'])}"


def is_moe_row(row: pd.Series) -> bool:
    return _given(row, "num_experts") and float(row["num_experts"]) > 1


def model_from_row(row: pd.Series, force_balanced: bool = False) -> ModelSpec:
    """The row's architecture (Megatron-LM's names); tied embeddings and dropout (saved masks)
    where the row states them (a training log does); else a dense row's dropout is its model
    preset's where one is named (search_spaces/models: NVIDIA's Llama and Nemotron recipes train
    without dropout, GPT-3 with 0.1), else ModelSpec's defaults; the published MoE rows train
    without dropout as their models' presets do, with their presets' expert biases
    (``add_bias_linear``), clamped quick-GEGLU, router precision and RoPE scale
    (``rope_concentration``). ``force_balanced``: the source
    forced the router to balance."""
    def opt_int(key):
        return int(row[key]) if _given(row, key) else None
    stated = {}
    if is_moe_row(row):
        mla = _given(row, "kv_lora_rank")
        freq = str(row["moe_layer_freq"]) if _given(row, "moe_layer_freq") else 1
        stated = dict(num_experts=int(row["num_experts"]), moe_router_topk=int(row["moe_router_topk"]),
                      moe_ffn_hidden_size=opt_int("moe_ffn_hidden_size"),
                      moe_shared_expert_intermediate_size=opt_int("moe_shared_expert_intermediate_size"),
                      moe_layer_freq=int(freq) if str(freq).isdigit() else freq,
                      moe_router_force_load_balancing=force_balanced, hidden_dropout=0.0, attention_dropout=0.0,
                      multi_latent_attention=mla)
        if _given(row, "moe_router_num_groups"):
            stated.update(moe_router_num_groups=int(row["moe_router_num_groups"]),
                          moe_router_group_topk=int(row["moe_router_group_topk"]))
        if mla:
            stated.update(q_lora_rank=opt_int("q_lora_rank"), kv_lora_rank=int(row["kv_lora_rank"]),
                          qk_head_dim=int(row["qk_head_dim"]), qk_pos_emb_head_dim=int(row["qk_pos_emb_head_dim"]),
                          v_head_dim=int(row["v_head_dim"]))
    if is_moe_row(row) and (preset := _preset(str(row["model"]))) is not None:
        # What the CSV's columns do not state and the cost model prices: the expert biases
        # (layer_time.expert_bias_time), a quick-GEGLU's clamp (layer_time.glu_clamp_time), the
        # router's precision and YaRN's RoPE scale (layer_time.unfused_rope_time); GPT-OSS has the first two,
        # a BF16 router and the scale, the other published MoE models none of them.
        stated.update(add_bias_linear=preset.add_bias_linear, quick_geglu=preset.quick_geglu,
                      activation_func_clamp_value=preset.activation_func_clamp_value,
                      moe_router_dtype=preset.moe_router_dtype, rope_concentration=preset.rope_concentration)
    if not is_moe_row(row) and (preset := _preset(str(row["model"]))) is not None:
        stated.update(hidden_dropout=preset.hidden_dropout, attention_dropout=preset.attention_dropout)
    stated.update({k: float(row[k]) for k in ("hidden_dropout", "attention_dropout") if _given(row, k)})
    if _given(row, "mtp_num_layers"):  # MTP models use rotary positions (Megatron refuses others)
        stated.update(mtp_num_layers=int(row["mtp_num_layers"]), position_embedding_type="rope")
    if _given(row, "hybrid_layer_pattern"):
        stated.update(_hybrid_fields(row))
    if is_moe_row(row) and (preset := _preset(str(row["model"]))) is not None and preset.is_dsv4:
        stated.update(_dsv4_fields(preset))
    if _given(row, "tie_embeddings"):
        stated["tie_embeddings"] = bool(int(row["tie_embeddings"]))
    if _given(row, "finetune"):
        lora = str(row["finetune"]) == "lora"
        stated["finetune"] = Finetune(str(row["finetune"]), int(row["lora_rank"]) if lora else DEFAULT_LORA_RANK,
                                      tuple(str(row["lora_targets"]).split()) if lora else LORA_TARGETS,
                                      bool(int(row["packed_sequence"])), opt_int("document_tokens"),
                                      float(row["lora_dropout"]) if _given(row, "lora_dropout") else 0.0,
                                      bool(int(row["lora_a2a"])) if _given(row, "lora_a2a") else False,
                                      bool(int(row["fp8_transpose_per_microbatch"]))
                                      if _given(row, "fp8_transpose_per_microbatch") else False)
    groups = None if stated.get("multi_latent_attention") else opt_int("num_query_groups")
    stated.setdefault("normalization", "rmsnorm" if row["activation"] == "swiglu" else "layernorm")
    return ModelSpec(
        name=str(row["model"]), num_layers=int(row["num_layers"]), hidden_size=int(row["hidden_size"]),
        ffn_hidden_size=int(row["ffn_hidden_size"]), num_attention_heads=int(row["num_attention_heads"]),
        num_query_groups=groups, kv_channels=opt_int("kv_channels"),
        vocab_size=int(row["vocab_size"]), seq_length=int(row["seq_length"]), activation=str(row["activation"]),
        **stated)


# A hybrid Mamba-Transformer row's columns beyond a transformer's (training_runs_hybrid.csv): its
# layer pattern, Mamba-2 mixer, LatentMoE width, routing groups, and the norm and position
# embedding, which the activation does not imply there (squared ReLU with RMSNorm, no positions).
HYBRID_INT_COLUMNS = ("mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
                      "mamba_conv_kernel", "moe_latent_size", "moe_router_num_groups", "moe_router_group_topk")


def _hybrid_fields(row: pd.Series) -> dict:
    """The ModelSpec fields a hybrid row states (a column left empty keeps ModelSpec's default)."""
    out = {"hybrid_layer_pattern": str(row["hybrid_layer_pattern"])}
    out.update({k: int(row[k]) for k in HYBRID_INT_COLUMNS if _given(row, k)})
    out.update({k: str(row[k]) for k in ("normalization", "position_embedding_type") if _given(row, k)})
    return out


# DeepSeek-V4's structure beyond the CSV's columns (training_runs_dsv4.csv): taken from the row's preset
# (search_spaces/models/deepseek-v4-flash.yaml, each field with its source), as the published table names the
# model and states no architecture.
DSV4_FIELDS = ("csa_compress_ratios", "csa_window_size", "dsa_indexer_n_heads", "dsa_indexer_head_dim",
               "dsa_indexer_topk", "o_groups", "o_lora_rank", "hc_mult", "mhc_sinkhorn_iterations",
               "moe_n_hash_layers", "moe_router_score_function", "moe_router_enable_expert_bias",
               "moe_router_topk_scaling_factor", "qk_layernorm", "normalization", "norm_epsilon")


def _dsv4_fields(preset: ModelSpec) -> dict:
    """The DeepSeek-V4 fields of the row's preset (``DSV4_FIELDS``)."""
    return {k: getattr(preset, k) for k in DSV4_FIELDS}


def _preset(name: str) -> ModelSpec | None:
    """The model preset of that name (search_spaces/models), if there is one."""
    try:
        return io.load_model(name)
    except UserError:
        return None


def _pins(row: pd.Series) -> dict:
    """The search-space knobs the row states (a training log states them all)."""
    pins = {k: int(row[k]) for k in ("tp", "pp", "cp", "vp", "ep", "etp", "mbs") if _given(row, k)}
    if _given(row, "sp"):
        pins["sp"] = bool(int(row["sp"]))
    else:
        pins["sp"] = pins.get("tp", 1) > 1
    if _given(row, "recompute"):
        pins["recompute"] = str(row["recompute"])
    pins["precision"] = str(row["precision"])
    pins["fp8_bf16_edge_layers"] = int(row["fp8_bf16_edge_layers"]) if _given(row, "fp8_bf16_edge_layers") else 0
    # The published FSDP size is dp*cp (64 on 64 GPUs at TP1 PP1); a few rows say only "1" (on).
    pins["fsdp"] = _given(row, "fsdp") and int(row["fsdp"]) >= 1
    for knob in ("distributed_optimizer", "tp_comm_overlap", "grad_reduce_in_fp32", "flash_attention",
                 "fp8_param_gather", "precision_aware_optimizer", "fp8_attention", "tp_only_amax_red",
                 "param_remainders", "cross_entropy_loss_fusion", "activation_func_fp8_input_store",
                 "tp_overlap_rs_pipeline"):
        if _given(row, knob):
            pins[knob] = bool(int(row[knob]))
    if _given(row, "overlap_grad_reduce"):
        pins["overlap_dp_comm"] = bool(int(row["overlap_grad_reduce"]))
    pins["cpu_offloading_num_layers"] = _optional_int(row, "cpu_offloading_num_layers")
    if _given(row, "cuda_graph"):
        pins["cuda_graph"] = str(row["cuda_graph"])
    for split in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if _given(row, split):  # candidates are split so (126 layers + embedding + loss on pp16 vp8)
            pins[split] = bool(int(row[split]))
    return pins


# Plan fields a row may state that the search space has no knob for: set on the candidates.
EXACT_COLUMNS = ("overlap_grad_reduce", "overlap_param_gather", *SPLIT_COLUMNS)
# A published system's own way of running, which no search offers, or a knob the row states that
# replaces its candidates' (Plan.cp_comm_type: MLPerf's Blackwell LoRA rows state TE's all-to-all CP,
# their CP_COMM_TYPE; a row that states none keeps the validation space's p2p): DeepSeek's DualPipe schedule
# (``pipeline.DUALPIPE``), its FP8 token dispatch (``dispatch.FP8_DISPATCH_BYTES``), its FP8 cache
# of the recomputed SwiGLU's inputs (``candidates.routed_act_input_bytes``) and its E5M6 cache of
# the attention output (``candidates.ATTENTION_OUTPUT_CACHE_COLUMN``); a config's cap on the DP communicators'
# CTAs (``candidates.DP_MAX_CTAS_COLUMN``: MLPerf's Llama 3.1 rows, ``MLPERF_DP_MAX_CTAS``).
ROW_ONLY_COLUMNS = ("pipeline_schedule", "moe_dispatch_precision", "moe_act_cache_precision",
                    "attention_output_cache_precision", CP_COMM_TYPE_COLUMN, DP_MAX_CTAS_COLUMN, DP_BUCKET_SIZE_COLUMN,
                    CUDNN_FRONTEND_COLUMN, CUTLASS_DSL_COLUMN)
# The cuDNN frontend and CUTLASS DSL a NeMo container's CuTe-DSL kernels come from (``CUDNN_FRONTEND_COLUMN``,
# ``CUTLASS_DSL_COLUMN``; ``layer_time.dglu_dbias_regression_time``), for the containers whose MXFP8 MoE recipes
# run TransformerEngine's fused grouped MLP (Megatron-Bridge v0.5.0+): the tag's docker/common/fw_pyproject.toml
# (nvidia-cudnn-frontend==) and docker/Dockerfile.ci (pip install nvidia-cutlass-dsl[cu13]==). v0.5.0 (fcbb603110,
# 26.06) 1.23.0 / 4.4.1; v0.5.1 (5cb3444c43, 26.06.01) 1.24.0 / 4.5.0, from ca4d0ffdb "build: bump
# nvidia-cutlass-dsl to 4.5.0 and nvidia-cudnn-frontend to 1.24.0 (4466)" cherry-picked into r0.5.0; v0.6.0
# (51885cf132, 26.08) 1.26.0 / 4.5.0. The 26.06.01 summary footnotes its GPT-OSS rows "Performance regression
# in GPT-OSS 120B pre-training is a known issue (cudnn-frontend issue 256)" (docs/performance-summary-archive.md).
BRIDGE_CUTEDSL_STACK = {"nemo 26.06": ("1.23.0", "4.4.1"), "nemo 26.06.01": ("1.24.0", "4.5.0"),
                        "nemo 26.08": ("1.26.0", "4.5.0")}


def container_columns(row: pd.Series) -> dict:
    """The row-only columns a row's container states where the row does not (``BRIDGE_CUTEDSL_STACK``)."""
    if assumptions_key(str(row["id"])) != "bridge" or software_of(row) not in BRIDGE_CUTEDSL_STACK:
        return {}
    stack = dict(zip((CUDNN_FRONTEND_COLUMN, CUTLASS_DSL_COLUMN), BRIDGE_CUTEDSL_STACK[software_of(row)]))
    return {k: v for k, v in stack.items() if not _given(row, k)}


def _exact(row: pd.Series) -> dict:
    def value(k):
        if k == "pipeline_model_parallel_layout":
            return str(row[k])
        return bool(int(row[k])) if k.startswith(("overlap", "account")) else int(row[k])
    return {k: value(k) for k in EXACT_COLUMNS if _given(row, k)}


def _optional_int(row: pd.Series, key: str) -> int | None:
    return int(row[key]) if _given(row, key) else None


def recipe_settings() -> dict:
    """``{"releases": {release: settings}, "rows": {row id: settings}}``: what the recipe a
    published row ran sets where it departs from its source's defaults (``data/recipe_settings.yaml``;
    each entry's ``source`` names the recipe file and commit). A release's settings hold for its
    rows of the precisions the entry names (``precisions``), its ``every_precision`` settings for all
    its rows and its ``by_precision`` ones for the rows of that precision."""
    settings = io.read_yaml(resources.data_file(RECIPES)) or {}
    return {"releases": settings.get("releases") or {}, "rows": settings.get("rows") or {}}


def recipe_for(row: pd.Series, recipes: dict | None) -> dict:
    """The recipe settings of one row: its release's for every precision (``every_precision``),
    for its precision (the release's own keys for those it lists in ``precisions``; ``by_precision``),
    then its own entry's."""
    recipes = recipes or {}
    release = (recipes.get("releases") or {}).get(software_of(row), {})
    precision = str(row["precision"])
    out = dict(release.get("every_precision") or {})
    if precision in release.get("precisions", ()):
        out.update(release)
    out.update((release.get("by_precision") or {}).get(precision) or {})
    out.update((recipes.get("rows") or {}).get(str(row["id"]), {}))
    return {k: v for k, v in out.items()
            if k not in ("source", "precisions", "note", "every_precision", "by_precision", TABLE_CORRECTIONS)}


# A row entry's ``table_corrections``: columns the published table states that its recipe and the
# neighbouring releases' tables contradict (``column: old -> new``), priced as the recipe ran.
TABLE_CORRECTIONS = "table_corrections"


def corrected_row(row: pd.Series, recipes: dict | None) -> tuple[pd.Series, tuple[str, ...]]:
    """``row`` with its entry's ``table_corrections`` applied, and the columns they set. The old
    value must be the CSV's, so that an entry outlives no mended table silently."""
    entry = ((recipes or {}).get("rows") or {}).get(str(row["id"]), {})
    changes = entry.get(TABLE_CORRECTIONS) or {}
    if not changes:
        return row, ()
    row = row.copy()
    for column, change in changes.items():
        old, new = (part.strip() for part in str(change).split("->"))
        if not _given(row, column) or str(int(row[column])) != old:
            raise UserError(f"{RECIPES}: {row['id']} expects {column} {old}, the table states {row.get(column)}")
        row[column] = int(new)
    return row, tuple(changes)


# The knobs a published row's variant is made of, as ``variant`` names them.
VARIANT_KNOBS = {"mbs": "mbs", "recompute": "recompute", "recompute_num_layers": "recompute_layers",
                 "recompute_modules": "recompute_modules", "cpu_offloading_num_layers": "offload",
                 "tp_comm_overlap": "tp_overlap", "fp8_param_gather": "fp8_param_gather",
                 "precision_aware_optimizer": "precision_aware", "param_remainders": "remainders",
                 "cross_entropy_loss_fusion": "ce_fusion",
                 "cuda_graph": "cuda_graph",
                 "fp8_attention": "fp8_attention",
                 "cutedsl_fused_grouped_mlp": "fused_mlp",
                 "moe_token_dispatcher_type": "dispatcher", "overlap_moe_expert_parallel_comm": "a2a_overlap"}
MOE_VARIANT_KNOBS = ("moe_token_dispatcher_type", "overlap_moe_expert_parallel_comm")
# The search-space knob whose values a variant knob is chosen from.
_SPACE_KNOB = {"recompute_num_layers": "full_recompute_fractions", "cpu_offloading_num_layers": "cpu_offload_fractions"}


def _origins(row: pd.Series, recipe: dict, space: SearchSpace) -> dict[str, str]:
    """Where each variant knob's value comes from: the row itself, its recipe, the source's one
    default (validation.yaml), or searched (the source block offers several values)."""
    def origin(knob):
        if _given(row, knob):
            return "row"
        if knob in recipe:
            return "recipe"
        values = getattr(space, _SPACE_KNOB.get(knob, knob), ())
        return "searched" if isinstance(values, tuple) and len(values) > 1 else "default"
    return {knob: origin(knob) for knob in VARIANT_KNOBS}


def variant_text(plan: pd.Series, origins: dict[str, str], moe: bool) -> str:
    """The variant a row was priced in, each knob with where its value came from:
    ``mbs=2[searched] recompute=full[recipe] recompute_layers=5[recipe] offload=0[default] ...``."""
    def shown(knob):
        if knob in MOE_VARIANT_KNOBS:
            return moe
        if knob == "recompute_num_layers":
            return plan["recompute"] == "full"
        if knob == "fp8_param_gather":
            return plan["precision"] in FP8_PRECISIONS
        if knob in ("fp8_attention", "cutedsl_fused_grouped_mlp"):  # shown where on (the newer MXFP8 MoE recipes)
            return bool(plan[knob])
        return knob != "recompute_modules" or plan["recompute"] == "selective"
    def value(knob):
        v = plan[knob]
        if isinstance(v, (bool, np.bool_)):
            return "on" if v else "off"
        return "all" if knob == "recompute_num_layers" and v == 0 else str(v)  # 0: the whole chunk
    return " ".join(f"{name}={value(knob)}[{origins.get(knob, 'searched')}]"
                    for knob, name in VARIANT_KNOBS.items() if shown(knob))


@dataclass(frozen=True)
class PreparedRow:
    """One published run with its candidate layouts generated once (calibration reprices them)."""

    row: pd.Series
    model: ModelSpec
    hardware: HardwareSpec
    metric: str
    memory_fraction: float
    candidates: pd.DataFrame
    cols: dict  # the candidates as the columns estimate_columns takes
    origins: dict = dataclasses.field(default_factory=dict)  # variant knob -> row/recipe/default/searched

    @functools.cached_property
    def built(self) -> Candidates:
        """The candidates as ``candidates`` makes them, built once: ``priced`` reprices them on each
        trial's constants (``on_hardware``) instead of building them anew (``replace`` builds again)."""
        return candidates(self.model, self.hardware, self.cols)

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def source(self) -> str:
        return source_of(self.row)

    @property
    def model_group(self) -> str:
        return model_group(self.row)

    @property
    def software(self) -> str:
        return software_of(self.row)

    @property
    def validation_only(self) -> bool:
        """A row validate predicts but no fit uses (``VALIDATION_ONLY_SOURCES``)."""
        return assumptions_key(self.id) in VALIDATION_ONLY_SOURCES

    @property
    def kind(self) -> str:
        """dense, moe, mlperf (the validation-only MLPerf GPT-3 rows), mlperf-llama3.1-405b and
        mlperf-llama3.1-8b (MLPerf's Llama 3.1 pre-training rows), lora or sft (fine-tuning
        rows: MLPerf's LoRA, NeMo's table), dense-newer, moe-newer, sft-newer and lora-newer
        (NVIDIA's runs newer than the fit), hybrid-newer (the Nemotron 3 hybrid Mamba-Transformer
        runs of training_runs_hybrid.csv), dsv4-newer (DeepSeek-V4, training_runs_dsv4.csv), lora-blackwell
        (MLPerf's LoRA rows on B200 / B300 / GB200 / GB300, mlperf_training_lora_blackwell.csv), each reported
        apart; a fine-tuning row on a GPU not made by NVIDIA takes its vendor as a suffix (lora-amd: MLPerf's
        LoRA rows on AMD Instinct, mlperf_training_lora_amd.csv), its constants borrowed across vendors."""
        newer = assumptions_key(self.id) in NEWER_SOURCES
        if assumptions_key(self.id) == MLPERF_LLAMA_SOURCE:  # MLPerf's Llama 3.1 pre-training, per model
            return f"mlperf-{self.row['model']}"
        if self.model.is_dsv4:  # DeepSeek-V4 (training_runs_dsv4.csv), before MoE
            return "dsv4-newer" if newer else "dsv4"
        if self.model.is_hybrid:  # before MoE: every Nemotron 3 model is both
            return "hybrid-newer" if newer else "hybrid"
        if self.model.is_moe:
            return "moe-newer" if newer else "moe"
        if self.model.finetune is not None:
            kind = ("lora" if self.model.finetune.lora else "sft") + ("-newer" if newer else "")
            if self.hardware.vendor != "nvidia":
                return f"{kind}-{self.hardware.vendor}"
            if assumptions_key(self.id) == "mlperflora" and self.family == BLACKWELL_FAMILY:
                return "lora-blackwell"
            return kind
        if newer:
            return "dense-newer"
        return "mlperf" if self.validation_only else "dense"

    @property
    def family(self) -> str:
        """The hardware preset whose fitted constants this row's GPU uses."""
        return self.hardware.efficiency_from or self.hardware.name


def prepare_row(row: pd.Series, assumptions: dict, recipes: dict | None = None) -> PreparedRow:
    """The row's candidates: its stated layout, its recipe's settings (``recipes``: see
    ``recipe_settings``) where the row is silent, the source's defaults where both are."""
    source = assumptions[assumptions_key(row["id"])]
    row, corrected = corrected_row(row, recipes)
    recipe = recipe_for(row, recipes)
    balanced = software_of(row) in source.get("moe_force_balanced_releases", [])
    model = model_from_row(row, force_balanced=balanced)
    if source["metric"] == "model_tflops" and model.mtp_num_layers:
        raise ValueError("model TFLOP/s of a run with MTP layers: Megatron-LM counts their FLOPs, "
                         "flops.model_flops_per_token does not")
    hw = io.load_hardware(str(row["gpu"]))
    settings = {"tp_within_nvlink_domain": False, "full_recompute_fractions": [1.0], **source["space"]}
    if is_moe_row(row):
        settings.update(source.get("moe_space", {}))
    space = io.from_dict(SearchSpace, settings, str(ASSUMPTIONS))
    origins = {**_origins(row, recipe, space), **{k: "recipe" for k in corrected if k in VARIANT_KNOBS}}
    pins = _pins(row)
    pins.update({k: v for k, v in recipe.items() if pins.get(k) is None and k != "recompute_num_layers"})
    if not pins["sp"]:  # the recipes overlap TP communication only with TP > 1 (which brings SP)
        pins.setdefault("tp_comm_overlap", False)
    layers = _optional_int(row, "recompute_num_layers") or recipe.get("recompute_num_layers")
    space = space.pinned(**pins)
    generated = generate(model, hw, int(row["num_gpus"]), int(row["gbs"]), space, layers)
    candidates = generated[generated["reason"] == ""].reset_index(drop=True)
    if candidates.empty:
        raise UserError(f"{row['id']}: the stated layout breaks a rule: {generated['reason'].iloc[0]}")
    candidates = candidates.assign(**_exact(row)).drop_duplicates(ignore_index=True)
    cols = {name: candidates[name].to_numpy() for name in Plan.field_names()}
    stated = {**container_columns(row), **{name: row[name] for name in ROW_ONLY_COLUMNS if _given(row, name)}}
    for name, value in stated.items():  # what the published system ran that Megatron does not
        cols[name] = np.full(len(candidates), str(value), dtype=object)
    for name, value in space.quantization_settings().items():  # a recipe's per-module quantization
        cols[name] = np.full(len(candidates), value, dtype=object)
    return PreparedRow(row, model, hw, source["metric"], space.memory_fraction, candidates, cols, origins)


def best_candidate(out: dict) -> int:
    """Of the candidates ``estimate_columns`` priced, the fastest that fits; if none fits, the
    one that needs least memory (the row's authors tuned their run). The candidates differ only
    in the knobs no source documents (``PreparedRow.origins``: searched)."""
    fits = out["fits"]
    if fits.any():
        return int(np.argmax(np.where(fits, out["tokens_per_s_per_gpu"], -np.inf)))
    return int(np.argmin(out["peak_memory_gib"]))


def priced(prepared: PreparedRow, hw: HardwareSpec | None = None) -> tuple[dict, int]:
    """``estimate_columns`` of a row's candidates on ``hw`` (default: the row's GPU) and the index
    of the one ``best_candidate`` takes: the candidate ``predict_row`` reports."""
    out = estimate_candidates(on_hardware(prepared.built, hw or prepared.hardware), prepared.memory_fraction)
    return out, best_candidate(out)


def chosen(prepared: PreparedRow, i: int) -> Candidates:
    """The cost model's inputs of a row's candidate ``i`` alone (for scripts that read its terms)."""
    return candidates(prepared.model, prepared.hardware, {k: v[i:i + 1] for k, v in prepared.cols.items()})


def _predicted(prepared: PreparedRow, efficiency: Efficiency | None) -> tuple[dict, int, float]:
    """``priced`` on the row's GPU with ``efficiency`` (None: its own constants), and the predicted
    figure of the metric the row's source reports."""
    row, model = prepared.row, prepared.model
    hw = prepared.hardware if efficiency is None else dataclasses.replace(prepared.hardware, efficiency=efficiency)
    out, i = priced(prepared, hw)
    # The constants describe the newest release they were fitted on; an older one runs slower.
    speed = hw.efficiency.release_speed.get(prepared.software, 1.0)
    gpus, gbs, step = int(row["num_gpus"]), int(row["gbs"]), float(out["step_time_s"][i]) / speed
    if prepared.metric == "model_tflops":
        # Megatron-LM's "throughput per GPU (TFLOP/s/GPU)": flops.model_flops_per_token is its
        # num_floating_point_operations (eb0783b6d3) to 3e-6 on DeepSeek-V3 without MTP (prepare_row
        # refuses MTP rows: Megatron counts their FLOPs, model_flops_per_token does not).
        predicted = float(out["tokens_per_s_per_gpu"][i]) * speed * flops.model_flops_per_token(model) / 1e12
    elif prepared.metric == "hw_tflops":
        full = prepared.cols["recompute"][i] == "full"  # the column of prepared.candidates, as an array
        predicted = flops.narayanan_flops_per_step(model, gbs, full) / (step * gpus) / 1e12
    elif prepared.metric == "iteration_time":
        predicted = step
    else:
        predicted = float(out["tokens_per_s_per_gpu"][i]) * speed
    return out, i, float(predicted)


def log_error(prepared: PreparedRow, efficiency: Efficiency | None = None) -> float:
    """log(predicted / measured) of ``predict_row`` (a fit's residual), without the rest of its record."""
    return float(np.log(_predicted(prepared, efficiency)[2] / float(prepared.row[MEASURED[prepared.metric]])))


def predict_row(prepared: PreparedRow, efficiency: Efficiency | None = None) -> dict:
    """The best predicted layout consistent with the row, and the metric its source reports;
    ``efficiency`` replaces the constants of the row's GPU (calibration tries many)."""
    row, model = prepared.row, prepared.model
    out, i, predicted = _predicted(prepared, efficiency)
    fits = out["fits"]
    best = prepared.candidates.iloc[i]
    measured = float(row[MEASURED[prepared.metric]])
    return {
        "id": prepared.id, "kind": prepared.kind, "source": prepared.source,
        "gpu": row["gpu"], "model": prepared.model_group,
        "metric": prepared.metric, "measured": measured, "predicted": float(predicted),
        "error_pct": 100.0 * (predicted - measured) / measured,
        "fits": bool(fits[i]), "peak_memory_gib": float(out["peak_memory_gib"][i]),
        "mbs": int(best["mbs"]), "recompute": best["recompute"],
        "recompute_num_layers": int(best["recompute_num_layers"]),
        "tp_comm_overlap": bool(best["tp_comm_overlap"]),
        "variant": variant_text(best, prepared.origins, model.is_moe),
    }


RUN_COLUMNS = ("id", "model", "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
               "vocab_size", "activation", "seq_length", "gpu", "num_gpus", "gbs", "precision")


# MLPerf Training's GPT-3 rows (mlperf_training_gpt3.csv) are the paper's architecture run by NeMo
# with dropout 0 (the submissions' conf/custom.yaml) and tied embeddings; the ~50k SentencePiece
# vocabulary is taken as the gpt3-175b preset's padded 50304.
# MLPerf's Llama-2-70B LoRA rows (mlperf_training_lora_hopper.csv) fine-tune Llama 2 70B (its model
# card) with LoRA of the stated rank on the fused QKV and the output projection (the reference's
# --lora_target_modules "qkv_proj,o_proj", mlcommons/training llama2_70b_lora/run_llama_70B_scrolls_r16.sh)
# on GovReport packed to 8,192 tokens, every sample taken as one document, with dropout 0.1 on the
# adapters' inputs (NVIDIA's implementation, conf/megatron_gpt_peft_tuning_config.yaml
# lora_tuning.adapter_dropout LORA_DROPOUT default 0.1, dropout_position "pre", mlcommons/training_results_v4.1)
# and the all-to-all path beside the projection as each row's LORA_A2A states it (a2a_experimental:
# LORA_A2A=1 in configs/config_common.sh, set in every round v4.0-v5.1 and 0 in none; the rows whose
# other_knobs left it out get it from mlperf_corrections.yaml); its frozen base in FP8 only (fp8_params: ${FP8} in that
# YAML) with disable_parameter_transpose_cache: True, so TransformerEngine 1.x transposes each FP8 weight
# for its dgrad in every micro-batch (finetune.frozen_transpose_bytes).
MLPERF_MODEL = {"gpt3-175b": dict(num_layers=96, hidden_size=12288, num_attention_heads=96, ffn_hidden_size=49152,
                                  vocab_size=50304, activation="gelu", tie_embeddings=1, hidden_dropout=0.0,
                                  attention_dropout=0.0),
                "llama2-70b-lora": dict(num_layers=80, hidden_size=8192, num_attention_heads=64, ffn_hidden_size=28672,
                                        num_query_groups=8, vocab_size=32000, activation="swiglu", tie_embeddings=0,
                                        hidden_dropout=0.0, attention_dropout=0.0, finetune="lora",
                                        lora_targets="linear_qkv linear_proj", packed_sequence=1,
                                        lora_dropout=0.1, fp8_transpose_per_microbatch=1)}
# Every LoRA submission runs TransformerEngine's FP8 recipe: the implementations set FP8=True in the
# config_common.sh that each system's config sources, which the CSV's precision column did not read
# (its 5 "bf16" rows: two state FP8_DPA=1, which TE runs only under FP8, and NVIDIA's H200 TP1 row
# could not hold the 70B base in BF16 on one 141 GB GPU).
LORA_PRECISION = "fp8-delayed"
# The TransformerEngine release of the MLPerf rounds whose LoRA images built an older one than the cost
# model's current TE: every v4.0 implementation's Dockerfile pins TE 1.6 (TE_REVISION v1.6rc2,
# release_v1.6, or 090e724, tagged v1.6rc2; training_results_v4.0), whose AttnFuncWithCP takes no FP8
# and whose backend filter keeps fused attention under CP to the F16 backend
# (transformer_engine/pytorch/attention.py v1.6). The FP8 attention (FP8_DPA) of a row whose round's TE
# runs none under CP (``candidates.fp8_cp_attention``) is priced off at CP > 1.
MLPERF_TE_RELEASE = {"v4.0": "1.6"}
# The rounds whose NVIDIA NeMo LoRA configs (every submitter's base) run the forward reduce-scatters
# of TP >= 4 with TE's pipeline method (``tp_overlap_rs_pipeline``): the config picks
# conf/tp_overlap/${GPU_ARCH,h}100tp${TP}[cp${CP}]mbs${MBS}.yaml (conf/megatron_gpt_peft_tuning_config.yaml
# ``optional tp_overlap@model.ub_tp_comm_overlap_cfg``), and every h100tp4mbs1.yaml / h100tp4cp2mbs1.yaml
# of these rounds sets proj_fprop / fc2_fprop method: pipeline, num_splits 4, num_sm 32 / 16,
# set_sm_margin 1, atomic_gemm 1 (v4.0: mlcommons/training_results_v4.0@6fe95437 NVIDIA/benchmarks/
# llama2_70b_lora/implementations/nemo/conf/tp_overlap/h100tp4mbs1.yaml L21-35; v4.1: @b87b9e39
# NVIDIA/.../eos_ngc24.09_nemo/conf/tp_overlap/h100tp4mbs1.yaml; v5.0: training_results_v5.0@0fdc28f0, each
# TP4 row's own submission: HPE .../nemo/conf/tp_overlap/h100tp4mbs1.yaml L35-51, Lenovo conf/tp_overlap/
# h100tp4mbs1.yaml L21-37 with GPU_ARCH=h, Oracle 1x/64xBM.GPU.H200.8, SCITIX scitix_n8_ngc24.09_nemo;
# v5.1: training_results_v5.1@441d65f4, Cisco .../nemo and Krai .../Cray-XD670-H200-SXM5-141GB_nX_v5.0).
# Every TP2 file the rows ran is a ring exchange (v4.0 NVIDIA's own h100tp2mbs1.yaml L33-46, the one
# TP2 row of v4.0; v4.1-v5.1 every copy); only v4.0's GigaComputing and Oracle copies, which no TP2 row
# ran, say pipeline with 2 splits.
MLPERF_LORA_RS_PIPELINE_ROUNDS = ("v4.0", "v4.1", "v5.0", "v5.1")
# MLPerf's LoRA submissions on Blackwell (mlperf_training_lora_blackwell.csv, written by
# scripts/mlperf_lora_rows.py from MLPerf Training v5.0 / v5.1) share the hopper rows' source
# ("mlperflora", validation.yaml's block) and are told apart by the GPU family whose constants they use:
# kind lora-blackwell, a held-out group of its own (validate.HELD_APART_KINDS), so that their errors
# neither move the H100 / H200 LoRA figures nor the per-GPU groups of the fitted rows.
BLACKWELL_FAMILY = "b200"
# MLPerf Training's Llama 3.1 pre-training (mlperf_training_llama31.csv, v5.0-v5.1) runs NeMo's Llama31Config405B /
# Llama31Config8B (the submissions' pretrain.py get_model_with_precision; 126 / 32 layers: conf/custom.yaml
# OVERWRITTEN_NUM_LAYERS default 126, config_common_8b.sh 32), untied embeddings and no dropout as the
# llama3.1-405b / llama3.1-8b presets state (Llama 3.1 config.json tie_word_embeddings false; NeMo's Llama
# configs set no dropout), at 8,192 tokens (the logs' max_sequence_length). The vocabularies are the
# benchmarks' own tokenizers, not Llama 3.1's for the 405B: "the Mixtral 8x22B tokenizer", vocab size 32,000
# (mlcommons/training@002b43ed large_language_model_pretraining/nemo/README.md, "Model details"; a multiple of
# NeMo's 128, so unpadded), and the Llama 3.1 8B tokenizer for the 8B (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/README.md: "llama-3-1-8b-tokenizer"), 128,256 as its preset.
MLPERF_LLAMA31 = {"llama3.1-405b": dict(num_layers=126, hidden_size=16384, num_attention_heads=128,
                                        ffn_hidden_size=53248, num_query_groups=8, vocab_size=32000,
                                        activation="swiglu", tie_embeddings=0, hidden_dropout=0.0,
                                        attention_dropout=0.0),
                  "llama3.1-8b": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=14336,
                                      num_query_groups=8, vocab_size=128256, activation="swiglu", tie_embeddings=0,
                                      hidden_dropout=0.0, attention_dropout=0.0)}
MLPERF_MODEL.update(MLPERF_LLAMA31)
# The CTAs the Llama 3.1 implementations allow their data-parallel communicators (``dataparallel.cta_capped``):
# every v5.0 / v5.1 submission's config_common.sh sets NCCL_CFG_PATH=/workspace/llm/conf/nccl/
# custom_communicator_cta.yaml and every copy of that file sets dp and dp_cp max_ctas 8 (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/conf/nccl/custom_communicator_cta.yaml and the 8B copies of
# Cisco, Dell, HPE, Lambda, Lenovo, Nebius, Supermicro and University-of-Florida, Oracle's and Verda's
# config_common.sh the same path in NVIDIA's image; the 405B implementations of v5.0@0fdc28f0 and v5.1 alike).
# The LoRA and GPT-3 rows' configs give other caps or none: unstated, NCCL's default.
MLPERF_DP_MAX_CTAS = {"llama3.1-405b": 8, "llama3.1-8b": 8}
# The 8B implementation's gradient bucket (``dataparallel.bucket_params``), parameters, by GPU: conf/custom.yaml
# bucket_size ${oc.env:BUCKET_SIZE,134217728}, which the GB200 / GB300 configs override (config_GB200_* and
# config_GB300_* source config_common_8b.sh: BUCKET_SIZE=768000000) (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/; the other submitters' copies are assumed the same). The
# 405B implementations' defaults differ between rounds: left to Megatron's default.
MLPERF_DP_BUCKET_SIZE = {"llama3.1-8b": {"gb200": 768000000, "gb300": 768000000}}
MLPERF_DP_BUCKET_SIZE_DEFAULT = {"llama3.1-8b": 134217728}
MLPERF_LLAMA_SOURCE = "mlperfllama"
# The Llama 3.1 ids name the model size too: NVIDIA's v5.1 systems submitted both (mlperfllama-405b-v5.1-NVIDIA-...).
MLPERF_ID_PREFIX = {"gpt3-175b": "mlperf-", "llama2-70b-lora": "mlperflora-",
                    **{m: f"{MLPERF_LLAMA_SOURCE}-{m.removeprefix('llama3.1-')}-" for m in MLPERF_LLAMA31}}
# What scripts/mlperf_pretrain_rows.py writes into other_knobs for a result whose config it could not
# settle (several configs fit its system and log but differ, or none does): such a row is kept in the
# CSV and skipped by validate with this reason.
MLPERF_UNSETTLED = {"AMBIGUOUS_CONFIG": "several of the submission's configs fit its system and log and differ in "
                                        "layout or precision", "NO_CONFIG": "no config of the submission fits its "
                                        "system and log (GBS, MINIBS / MBS, LR, warm-up)"}
MLPERF_COLUMNS = ("round", "submitter", "system", "step_time_s", "other_knobs")


def is_mlperf_table(frame: pd.DataFrame) -> bool:
    return all(c in frame.columns for c in MLPERF_COLUMNS)


def _knob_set(other_knobs: str, name: str) -> bool:
    """Whether ``other_knobs`` ("LAYER_CUDA_GRAPH=1; FP8_PARAMS=True; ...") sets ``name`` on (1 or
    True, as the config's shell variable reads)."""
    return any(part.strip() in (f"{name}=1", f"{name}=True") for part in str(other_knobs).split(";"))


def _tp_only_amax(other_knobs: str) -> bool:
    """Whether the config reduces FP8 amaxes over TP only: TransformerEngine < 1.6's
    NVTE_DP_AMAX_REDUCE_INTERVAL=0 (MLPerf v3.1-v4.0 config_common.sh) or NeMo's
    tp_only_amax_red (v4.1 conf/custom.yaml: TP_ONLY_AMAX_RED, default True). Unstated: TE's
    default, over TP x DP (the v3.0 configs set neither)."""
    stated = [part.strip() for part in str(other_knobs).split(";")]
    return "NVTE_DP_AMAX_REDUCE_INTERVAL=0" in stated or _knob_set(other_knobs, "TP_ONLY_AMAX_RED")


def _knob_value(other_knobs: str, name: str) -> str | float:
    """The value ``other_knobs`` gives ``name`` ("CP_COMM_TYPE=a2a" -> "a2a"); NaN where it gives none."""
    match = re.search(rf"(?:^|;)\s*{name}=([^;\s]+)", str(other_knobs))
    return match.group(1) if match else math.nan


def _cuda_graph(other_knobs: str) -> str:
    """The CUDA graphs a row's config captures: the whole forward-backward (NeMo's full_cuda_graph: the
    Llama 3.1 configs' FULL_CUDA_GRAPH, conf/custom.yaml; or Megatron's MCORE_CUDA_GRAPH with the
    cuda_graph_scope full_iteration that MLPerf v5.1's LoRA conf/megatron_gpt_peft_tuning_config.yaml
    defaults to, as other_knobs states it), else per layer (MCORE_CUDA_GRAPH: enable_cuda_graph, scope
    'full' of each layer; LAYER_CUDA_GRAPH: NVIDIA's graphed callables, NeMo's external_cuda_graph), else none."""
    if _knob_set(other_knobs, "FULL_CUDA_GRAPH") or (
            _knob_set(other_knobs, "MCORE_CUDA_GRAPH") and _knob_value(other_knobs, "CUDA_GRAPH_SCOPE") == "full_iteration"):
        return "full_iteration"
    return "layer" if _knob_set(other_knobs, "LAYER_CUDA_GRAPH") or _knob_set(other_knobs, "MCORE_CUDA_GRAPH") else "none"


def _block_recompute_layers(other_knobs: str) -> float:
    """The layers NeMo's full recompute covers where ``other_knobs`` states them by the block method
    (the AMD LoRA configs' ``ACG=full; ACM=block; ACL=21``: activations_checkpoint_granularity /
    _method / _num_layers); NaN if not."""
    layers = str(_knob_value(other_knobs, "ACL"))
    if _knob_value(other_knobs, "ACG") != "full" or _knob_value(other_knobs, "ACM") != "block" or not layers.isdigit():
        return math.nan
    return float(layers)


def _lora_rank(other_knobs: str) -> float:
    """The rank ``LORA_FINETUNE(rank=16)`` in ``other_knobs`` states (NaN if none)."""
    match = re.search(r"LORA_FINETUNE\(rank=(\d+)\)", str(other_knobs))
    return float(match.group(1)) if match else math.nan


def from_mlperf(frame: pd.DataFrame) -> pd.DataFrame:
    """MLPerf Training submissions (one row per system, NeMo's config as submitted) as runs rows:
    id ``mlperf-<round>-<submitter>-<system>`` (``mlperflora-`` for the LoRA rows), the
    architecture, every layout knob pinned, the
    mean logged train_step_time as the iteration time. Gradients are reduced in BF16 (the configs'
    distributed Adam: grad_sync_dtype bf16), attention is fused (no stored scores)."""
    # An empty cell stays unknown (searched with validation.yaml's assumptions).
    bool_int = lambda c: frame[c].map(  # noqa: E731
        lambda v: math.nan if pd.isna(v) else int(str(v).lower() in ("true", "1")))
    unknown = sorted(set(frame["model"].astype(str)) - set(MLPERF_MODEL))
    if unknown:
        raise UserError(f"MLPerf rows of model(s) {unknown}: only {sorted(MLPERF_MODEL)} are known")
    arch = pd.DataFrame([MLPERF_MODEL[m] for m in frame["model"].astype(str)], index=frame.index)
    # A LoRA row's "bf16" is FP8 (LORA_PRECISION, above); its other precisions are as stated
    # (the Blackwell rows' nvfp4: config_common_fp4.sh).
    precision = frame["precision"].where((frame["model"] != "llama2-70b-lora") | (frame["precision"] != "bf16"),
                                         LORA_PRECISION)
    out = pd.DataFrame({
        "id": frame["model"].astype(str).map(MLPERF_ID_PREFIX) + frame["round"].astype(str) + "-"
              + frame["submitter"].astype(str) + "-"
              + frame["system"].astype(str),
        "model": frame["model"], "seq_length": frame["seq_length"], "gpu": frame["gpu"],
        "num_gpus": frame["gpus"], "gbs": frame["global_batch_size"], "mbs": frame["micro_batch_size"],
        **{k: frame[k] for k in ("tp", "pp", "vp", "cp", "ep", "recompute")},
        "precision": precision,
        **{k: bool_int(k) for k in ("sp", "tp_comm_overlap", "distributed_optimizer", "fsdp")},
        # NeMo ignores TP overlap without TP (Megatron refuses it without SP): off at TP 1.
        "tp_comm_overlap": bool_int("tp_comm_overlap").where(frame["tp"] > 1, 0),
        # DP overlap as the configs run it: on (NeMo 1's distributed Adam, overlap_grad_sync) unless a row
        # states it off (the v5.x Blackwell LoRA implementations' conf: ddp overlap_grad_reduce and
        # overlap_param_gather ${DDP_OVERLAP_...,False}, which no config sets).
        "grad_reduce_in_fp32": 0, "flash_attention": 1,
        "overlap_grad_reduce": [0 if _knob_value(k, "DDP_OVERLAP_GRAD_REDUCE") == "0" else 1
                                for k in frame["other_knobs"]],
        "overlap_param_gather": [0 if _knob_value(k, "DDP_OVERLAP_PARAM_GATHER") == "0" else math.nan
                                 for k in frame["other_knobs"]],
        "cuda_graph": [_cuda_graph(k) for k in frame["other_knobs"]],
        # FP8_PARAMS (GPT-3's configs) or FP8_PARAM_GATHER (the Llama 3.1 configs' name for it).
        "fp8_param_gather": [int(_knob_set(k, "FP8_PARAMS") or _knob_set(k, "FP8_PARAM_GATHER"))
                             for k in frame["other_knobs"]],
        # NeMo's account_for_embedding / loss_in_pipeline_split (the Llama 3.1 configs' ASYM_PP_EMBED / _LOSS).
        # Unstated: left to the search space (the GPT-3 and LoRA rows state neither).
        "account_for_embedding_in_pipeline_split": [1 if _knob_set(k, "ASYM_PP_EMBED") else math.nan
                                                    for k in frame["other_knobs"]],
        "account_for_loss_in_pipeline_split": [1 if _knob_set(k, "ASYM_PP_LOSS") else math.nan
                                               for k in frame["other_knobs"]],
        "skip_reason": [next((why for mark, why in MLPERF_UNSETTLED.items() if mark in str(k)), "")
                        for k in frame["other_knobs"]],
        # NVTE_DPA_FP8_RECIPE=F16 keeps attention in BF16 whatever FP8_DPA says (TransformerEngine's recipe table).
        "fp8_attention": [int(_knob_set(k, "FP8_DPA") and "NVTE_DPA_FP8_RECIPE=F16" not in str(k)
                              and (cp == 1 or fp8_cp_attention(MLPERF_TE_RELEASE.get(r, ""))))
                          for k, cp, r in zip(frame["other_knobs"], frame["cp"], frame["round"].astype(str))],
        # NeMo's activation_func_fp8_input_store (the LoRA configs' FP8_ACTIVATION).
        "activation_func_fp8_input_store": [int(_knob_set(k, "FP8_ACTIVATION")) for k in frame["other_knobs"]],
        # Only delayed scaling keeps amaxes to reduce (NeMo's tp_only_amax_red default True is moot otherwise).
        "tp_only_amax_red": [int(_tp_only_amax(k) and p == "fp8-delayed") for k, p in zip(frame["other_knobs"], precision)],
        "tp_overlap_rs_pipeline": ((frame["model"] == "llama2-70b-lora") & (frame["tp"] >= 4)
                                   & frame["round"].astype(str).isin(MLPERF_LORA_RS_PIPELINE_ROUNDS)
                                   & (bool_int("tp_comm_overlap") == 1)).astype(int),
        "measured_iteration_time_s": frame["step_time_s"], "source": frame["source"],
        "lora_rank": [_lora_rank(k) for k in frame["other_knobs"]],
        # NeMo's a2a_experimental (the LoRA configs' LORA_A2A): 0 where the row does not state it.
        "lora_a2a": [int(_knob_set(k, "LORA_A2A")) for k in frame["other_knobs"]],
        # TE's CP communication (Megatron's cp_comm_type) where the row states it (CP_COMM_TYPE=a2a: the
        # v5.0 / v5.1 implementations' train.py passes cp_comm_type=${CP_COMM_TYPE:-a2a}); else unstated.
        CP_COMM_TYPE_COLUMN: [_knob_value(k, "CP_COMM_TYPE") for k in frame["other_knobs"]],
        "recompute_num_layers": [_block_recompute_layers(k) for k in frame["other_knobs"]],
        DP_MAX_CTAS_COLUMN: frame["model"].astype(str).map(MLPERF_DP_MAX_CTAS),
        DP_BUCKET_SIZE_COLUMN: [MLPERF_DP_BUCKET_SIZE.get(m, {}).get(g, MLPERF_DP_BUCKET_SIZE_DEFAULT.get(m, math.nan))
                                for m, g in zip(frame["model"].astype(str), frame["gpu"].astype(str))],
    })
    return pd.concat([out, arch], axis=1)


def read_measured_csv(path: Path) -> pd.DataFrame:
    """A CSV of measurements, read whole under its size cap. A last row cut off (the file was
    truncated: a copy that broke off, a disk that filled up) would be read with its missing
    fields empty; it is left out with its reason, or the file refused when it is the only row."""
    data = safefile.read_bytes(path, "runs CSV")
    frame = pd.read_csv(BytesIO(data))
    if len(frame) and not data.endswith(b"\n"):
        fields = len(next(csv.reader([data.rsplit(b"\n", 1)[-1].decode("utf-8", "replace")]), []))
        if fields < len(frame.columns):
            line = data.count(b"\n") + 1
            why = (f"line {line} is cut off after {fields} of {len(frame.columns)} fields "
                   "(the file was truncated)")
            if len(frame) == 1:
                raise UserError(f"runs CSV {path} is damaged: its only row, {why}")
            ranges.warn(f"runs CSV {path}: {why}; that row is skipped")
            frame = frame.iloc[:-1]
    return frame


# What a training runs CSV is, for a file given to --runs that is not one.
RUNS_CSV = (f"a header of the runs columns ({', '.join(RUN_COLUMNS)}, ...) and a row per run, "
            "as `autoparallel runs import` writes them from training logs")


def unreadable_csv(path: Path, exc: Exception, expected: str = RUNS_CSV) -> UserError:
    """Why a runs CSV could not be read, in words, and what was ``expected``: pandas' own ("Error
    tokenizing data. C error: Expected 2 fields in line 10, saw 6", "'utf-8' codec can't decode
    byte 0xd0") said neither what was wrong with the file for its reader nor what it should be."""
    if isinstance(exc, pd.errors.EmptyDataError):
        return UserError(f"runs CSV {path} is empty; expected {expected}")
    if isinstance(exc, UnicodeDecodeError):  # pandas' offset is into its own buffer: the file's, found again
        data = safefile.read_bytes(path, "runs CSV")
        try:
            data.decode("utf-8")
            at = exc.start
        except UnicodeDecodeError as whole:
            at = whole.start
        line = data.count(b"\n", 0, at) + 1
        why = f"line {line} is not UTF-8 text (byte 0x{data[at:at + 1].hex() or '?'} at offset {at:,})"
    elif isinstance(exc, pd.errors.ParserError):
        fields = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        why = (f"line {fields[2]} has {fields[3]} comma-separated fields, its header {fields[1]}" if fields
               else " ".join(str(exc).split())[:200])
    else:
        return UserError(f"cannot read runs CSV {path}: {' '.join(str(exc).split())[:200]}")
    return UserError(f"runs CSV {path} is not a CSV table: {why}; expected {expected}")


def read_runs_table(path: Path, columns: tuple[str, ...] = (), expected: str = RUNS_CSV) -> pd.DataFrame:
    """A CSV of measured runs with a header, the given columns and at least one row; anything
    else is a UserError naming the file (and, where it is no CSV table, what was ``expected``)."""
    if not os.path.lexists(path):
        raise UserError(f"runs CSV {path} does not exist")
    try:
        frame = read_measured_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise unreadable_csv(path, exc, expected) from None
    if is_mlperf_table(frame):
        frame = from_mlperf(mlperf_corrections.apply(frame))
    missing = [c for c in columns if c not in frame.columns]
    if missing and len(missing) == len(columns):  # a training log given for the CSV it is imported into
        raise UserError(f"runs CSV {path} has none of the runs columns; expected {expected}")
    if missing:
        raise UserError(f"runs CSV {path} lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise UserError(f"runs CSV {path} has a header but no rows")
    return frame


def read_runs(runs: Sequence[Path] | None = None) -> pd.DataFrame:
    """The runs CSVs as one frame (columns a file lacks are empty)."""
    return pd.concat([read_runs_table(path, RUN_COLUMNS) for path in runs or default_runs()],
                     ignore_index=True)


def load_runs(runs: Sequence[Path] | None = None, moe: bool = False) -> list[PreparedRow]:
    """Prepared dense rows (with ``moe``, the mixture-of-experts rows instead); a value that does
    not parse is a UserError naming its row."""
    frame = read_runs(runs)
    assumptions, recipes = io.read_yaml(ASSUMPTIONS), recipe_settings()
    unknown = sorted({assumptions_key(str(i)) for i in frame["id"]} - set(assumptions))
    if unknown:
        raise UserError(f"no assumptions for source(s) {unknown} in {ASSUMPTIONS}")
    measured = ranges.row_problems(frame, [c for c in frame if str(c).startswith("measured_")],
                                   counts=ranges.COUNT_COLUMNS)
    prepared, skipped, left_out = [], [], []
    for i, row in frame.iterrows():
        try:
            if is_moe_row(row) != moe:
                continue
            if measured[i]:
                skipped.append((row["id"], measured[i]))
                continue
            if _given(row, "skip_reason"):  # an MLPerf row whose config could not be settled
                left_out.append((row["id"], str(row["skip_reason"])))
                continue
            ready = prepare_row(row, assumptions, recipes)
            metric = MEASURED[ready.metric]  # the number the row is compared on: it must be there
            if pd.isna(row.get(metric)):
                skipped.append((row["id"], f"{metric} is empty or NaN"))
                continue
            prepared.append(ready)
        except (ValueError, TypeError, KeyError) as exc:
            skipped.append((row["id"], " ".join(str(exc).split())[:200]))
    if (skipped or left_out) and not prepared:  # a bad row is never used, and a command needs one good row
        run_id, reason = (skipped or left_out)[0]
        raise UserError(f"runs CSV row {run_id}: {reason}; no usable row is left")
    for run_id, reason in skipped:
        ranges.warn(f"runs CSV row {run_id} skipped: {reason}")
    if left_out:  # reasons the data states: one warning, by reason, not one a row
        by_reason = {reason: [r for r, why in left_out if why == reason] for _, reason in left_out}
        ranges.warn("runs CSV rows left out, " + "; ".join(f"{why}: {', '.join(ids)}" for why, ids in by_reason.items()))
    return prepared


# --- forced-balance vs dropless pairs (the load-imbalance constant) -------------------------------

@dataclass(frozen=True)
class LoadBalancePair:
    """One layout measured with forced-balanced and with dropless routing, candidates generated
    once: the two models differ only in ``moe_router_force_load_balancing``."""

    id: str
    forced: ModelSpec
    dropless: ModelSpec
    hardware: HardwareSpec
    memory_fraction: float
    cols: dict
    measured_ratio: float  # dropless throughput / forced-balanced throughput


def load_balance_pairs(path: Path | None = None) -> list[LoadBalancePair]:
    """The pairs of ``moe_load_balance.csv``, each layout pinned as published and the unstated
    knobs at NeMo's recipe defaults (``validation.yaml``)."""
    frame = pd.read_csv(path or resources.data_file(LOAD_BALANCE_RUNS))
    source = io.read_yaml(ASSUMPTIONS)["nemo"]
    pairs = []
    for _, row in frame.iterrows():
        base = dataclasses.replace(io.load_model(str(row["model"])), seq_length=int(row["seq_length"]))
        hw = io.load_hardware(str(row["gpu"]))
        settings = {"tp_within_nvlink_domain": False, **source["space"], **source.get("moe_space", {})}
        pins = {k: int(row[k]) for k in ("tp", "pp", "vp", "cp", "ep", "etp", "mbs")}
        space = io.from_dict(SearchSpace, settings, str(ASSUMPTIONS)).pinned(
            **pins, sp=int(row["tp"]) > 1, precision=str(row["precision"]), fp8_bf16_edge_layers=0)
        candidates = generate(base, hw, int(row["num_gpus"]), int(row["gbs"]), space)
        candidates = candidates[candidates["reason"] == ""].reset_index(drop=True)
        if candidates.empty:
            raise UserError(f"{row['id']}: the published layout breaks a rule")
        pairs.append(LoadBalancePair(
            str(row["id"]), dataclasses.replace(base, moe_router_force_load_balancing=True), base, hw,
            space.memory_fraction, {name: candidates[name].to_numpy() for name in Plan.field_names()},
            float(row["measured_dropless_tflops_per_gpu"]) / float(row["measured_forced_tflops_per_gpu"])))
    return pairs


def predict_balance_ratio(pair: LoadBalancePair, values: dict | None = None) -> float:
    """Predicted dropless / forced-balanced throughput of a pair (each at its fastest layout that
    fits), with ``values`` replacing the GPU's efficiency constants of those names."""
    hw = pair.hardware
    if values:
        hw = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **values))
    best = []
    for model in (pair.dropless, pair.forced):
        out = estimate_columns(model, hw, pair.cols, pair.memory_fraction)
        speed = out["tokens_per_s_per_gpu"]
        best.append(speed[out["fits"]].max() if out["fits"].any() else speed[np.argmin(out["peak_memory_gib"])])
    return float(best[0] / best[1])
