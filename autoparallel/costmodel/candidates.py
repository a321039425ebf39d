"""The knobs of many candidate plans as arrays, and the shapes every cost term derives from them.

``estimate_columns`` takes plans as columns (one element per candidate); each cost term reads
the same few derived quantities (tokens per GPU, micro-batches per step, layers per pipeline
stage, the share of layers that recompute or run FP8, the data-parallel groups). They are
computed once, here, so that a term function takes ``Candidates`` and states only its own
formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

import numpy as np

from autoparallel.costmodel import comm, dispatch, gemm, gemm_precision, memory, moe, pipeline
from autoparallel.costmodel.layer_kinds import EDGE, STAGE_KINDS
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import FP4_PRECISIONS, FP8_PRECISIONS

# An NVFP4 element as TransformerEngine stores it: an E2M1 value and its share of the E4M3 scale of
# its 1x16 block (the per-tensor FP32 scale is one number).
NVFP4_ELEMENT_BYTES = 0.5 + 1.0 / 16
# HBM bytes per element of a quantizing cast (read BF16, write both layouts), by recipe. NVFP4: three
# reads of the BF16 tensor (TransformerEngine's NVFP4Quantizer::quantize_impl, pytorch/csrc/quantizer.cpp:
# one nvte_hadamard_transform_amax pass giving both the per-tensor amax and that of the random-Hadamard-
# transformed (RHT, 16-point) column-wise copy the weight-gradient GEMM reads; the row-wise cast,
# nvte_quantize_v2; the column-wise cast fused with the RHT, nvte_hadamard_transform_cast_fusion_columnwise),
# writing the row- and column-wise NVFP4 copies; the gradients' stochastic rounding and the RHT's few MACs
# run inside the cast kernels, hidden under their memory traffic. The weights' 16x16 2D scaling makes one
# copy serve both layouts; they are cast with the same passes (once per step, small).
CAST_BYTES = {"fp8-delayed": 4.0, "fp8-current": 6.0, "fp8-blockwise": 4.5, "mxfp8": 4.0,
              "nvfp4": 2.0 + 2.0 + 2.0 + 2 * NVFP4_ELEMENT_BYTES}
# Bytes per element of what a quantized layer keeps: each Linear input's column-wise copy (for the
# weight gradient) and each weight's two layouts, by recipe family.
QUANTIZED_INPUT_BYTES = {"fp8": 1.0, "fp4": NVFP4_ELEMENT_BYTES}
QUANTIZED_WEIGHT_BYTES = {"fp8": 2.0, "fp4": 2 * (0.5 + 1.0 / 256)}  # NVFP4 weights: 16x16 blocks
# Per-tensor FP8 (delayed and current scaling) on Blackwell keeps one layout of each weight: sm_100's
# FP8 GEMMs take any operand layout, so TransformerEngine (since 2.0) makes no transpose there
# (transformer_engine/pytorch/csrc/quantizer.cpp Float8Quantizer::create_tensor: with_transpose =
# columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported(), true for compute capability 10.x-11.x;
# TransformerEngine d0067d0d / v2.9). Block-scaled copies differ by layout (their scales run along
# rows or columns) and keep both.
PER_TENSOR_FP8 = ("fp8-delayed", "fp8-current")
# Megatron's --recompute-modules that the cost model prices (core_attn alone for dense models; mhc
# for Hyper-Connections, DeepSeek-V4).
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "moe_act", "moe", "layernorm", "mhc")


# A published system's own cache of the recomputed routed experts' activation input, which
# Megatron does not offer (``routed_act_input_bytes``): DeepSeek-V3 caches the SwiGLU inputs in FP8.
MOE_ACT_CACHE_COLUMN = "moe_act_cache_precision"


# A published system's own cache of the attention output (the output projection's input, which
# the attention's backward reads too; ``Candidates.attention_output_bytes``): DeepSeek-V3 keeps it in
# its E5M6 format (report §3.3.3 "Low-Precision Activation" (1): "These activations are also used
# in the backward pass of the attention operator ... We adopt a customized E5M6 data format
# exclusively for these activations"), 12 bits, stored packed: a 16-bit container would be no
# smaller than BF16 and less precise, so the format's only purpose is the 1.5 B. Its 1x128 tiles'
# scales are left out, as for FP8 copies (``QUANTIZED_INPUT_BYTES``).
ATTENTION_OUTPUT_CACHE_COLUMN = "attention_output_cache_precision"
# A published row's CP communication where it states one ("a2a": TransformerEngine's all-to-all CP,
# ``layer_time.cp_comm_time``); the search prices the p2p ring.
CP_COMM_TYPE_COLUMN = "cp_comm_type"
# A published row's cap on the CTAs of its data-parallel communicators where its config sets one
# (Megatron's ``nccl_communicator_config_path``: ``dp`` / ``dp_cp`` ``max_ctas``;
# ``dataparallel.cta_capped``); a search runs NCCL's default.
DP_MAX_CTAS_COLUMN = "dp_max_ctas"
# A published row's gradient bucket size in parameters where its config sets one (Megatron's
# ``--ddp-bucket-size``; ``dataparallel.bucket_params``); a search takes Megatron's default.
DP_BUCKET_SIZE_COLUMN = "ddp_bucket_size"
# A published row's container's cuDNN frontend and CUTLASS DSL releases ("1.24.0", "4.5.0") where
# its source states them (the Megatron-Bridge tag's docker/common/fw_pyproject.toml and
# docker/Dockerfile.ci: ``measured_runs.BRIDGE_CUTEDSL_STACK``): the CuTe-DSL kernels of
# TransformerEngine's fused grouped MLP come from that pair (``layer_time.dglu_dbias_regression_time``);
# a search prices a current one.
CUDNN_FRONTEND_COLUMN = "cudnn_frontend_version"
CUTLASS_DSL_COLUMN = "cutlass_dsl_version"
ATTENTION_OUTPUT_CACHE_BYTES = {"e5m6": 1.5}


# The TransformerEngine release a run uses ("1.6", "2.9"; empty or absent: a current one), a column
# every candidate of a search shares (``SearchSpace.cost_settings``). What it prices: TE's activation
# offloading, whose scheduling changed in 1.10 (``windowed_offload``).
TE_VERSION_COLUMN = "transformer_engine_version"


def release_at_least(release: str, major: int, minor: int) -> bool:
    """Whether a TE release ("1.6", "2.9.1"; empty: a current one) is ``major.minor`` or later."""
    if release in ("", "nan", "None"):
        return True
    return tuple(int(p) for p in release.split(".")[:2]) >= (major, minor)


def fp8_cp_attention(release: str) -> bool:
    """Whether a TE release (empty: a current one) runs FP8 dot-product attention under context
    parallelism: from 1.10 (TransformerEngine 311b6b6, "Add FP8 support to CP implementation with KV
    P2P (#1114)"); an older one runs it in BF16 whatever fp8_dot_product_attention asks."""
    return release_at_least(release, 1, 10)


# The first TransformerEngine release that has each scaling recipe beyond delayed scaling (every TE
# has DelayedScaling), from transformer_engine/common/recipe/__init__.py at each tag (TE mirror):
# v1.10 defines DelayedScaling only; v2.0 adds MXFP8BlockScaling, v2.2 Float8CurrentScaling
# (77fa1e596, "Enabling Per-Tensor Current Scaling Recipe (#1471)"), v2.3 Float8BlockScaling
# (a8f0fe03b, "Blockwise scaling linear quantization recipe (#1559)"), v2.8 NVFP4BlockScaling
# (3f5b47549, "NVFP4 recipe (#2177)"). Megatron-Core builds each precision's recipe from these classes.
RECIPE_FIRST_RELEASE = {"mxfp8": (2, 0), "fp8-current": (2, 2), "fp8-blockwise": (2, 3), "nvfp4": (2, 8)}


def recipe_in_release(precision: str, release: str) -> bool:
    """Whether a TE release (empty: a current one) has ``precision``'s scaling recipe."""
    first = RECIPE_FIRST_RELEASE.get(precision)
    return first is None or release_at_least(release, *first)


# LoRA on a virtual pipeline (vp > 1). NeMo's NLPAdapterModelMixin (the NeMo 1 PEFT path MLPerf's LoRA
# harness runs: ``MegatronGPTSFTModel.add_adapter``) adds the adapters to the layers of
# ``_unwrap_model()``, which is ``self.model[0]``, the first virtual chunk, and gives the optimizer that
# chunk's adapters only (NVIDIA/NeMo@4068955b, tag 24.09-alpha.rc0,
# nemo/collections/nlp/parts/mixins/nlp_adapter_mixins.py L96-101, L198, L315-321; the model stays a
# list of chunks under interleaving, megatron_gpt_model.py L371-372): the chunks after the first train
# no adapters. NeMo 2.1.0 is the first release that adds them to every chunk (2c42fc3961, "Virtual
# pipeline parallel support for LoRA in NLPAdapterModelMixin (#11128)", not in v2.0.0). The space
# knows the run's TE release, not its NeMo: a release up to 1.10 is taken as NeMo 24.09's stack or an
# older one (an assumption, from MLPerf v4.1's harness: mlcommons/training_results_v4.1@b87b9e3
# NVIDIA/benchmarks/llama2_70b_lora/implementations/eos_ngc24.09_nemo/Dockerfile L15, L28, L38, L52
# runs the pytorch 24.09 image's TE, 1.10 (session 38), with NeMo and Megatron-LM 24.09-alpha.rc0).
# Later TE releases are paired with no NeMo release here, so they are let through.
LORA_VIRTUAL_PIPELINE_TE = (1, 11)


def lora_virtual_pipeline(release: str) -> bool:
    """Whether the stack of a TE release (empty: a current one) trains LoRA adapters on every
    virtual pipeline chunk (``LORA_VIRTUAL_PIPELINE_TE``)."""
    return release_at_least(release, *LORA_VIRTUAL_PIPELINE_TE)


def te_at_least(values, major: int, minor: int) -> np.ndarray:
    """``release_at_least`` of each release in ``values`` (TE's, or another library's)."""
    values = np.asarray(values, dtype=object)
    releases, which = np.unique(values.ravel().astype(str), return_inverse=True)
    newer = np.array([release_at_least(r, major, minor) for r in releases], dtype=bool)
    return newer[which].reshape(values.shape)


def routed_act_input_bytes(cols: Mapping[str, np.ndarray], moe_act, act_input_bytes):
    """Bytes per element the routed experts keep of their activation's input. With
    ``--recompute-modules moe_act`` Megatron runs the activation in a ``CheckpointWithoutOutput``
    that keeps its inputs, the BF16 FC1 output, and runs the activation without autograd, so the
    FP8 copy ``activation_func_fp8_input_store`` would save is not kept (Megatron-LM d98e8a64dd
    megatron/core/transformer/moe/experts.py lines 1019-1023 ``TEGroupedMLP.forward``;
    megatron/core/tensor_parallel/random.py lines 777-781 ``CheckpointWithoutOutputFunction.forward``:
    ``torch.no_grad()``, then ``_save_args_to_ctx``): 2 B whatever the knob says. A published row
    may state its own FP8 cache (``MOE_ACT_CACHE_COLUMN`` "fp8": DeepSeek-V3 report §3.3.2 "we cache
    the inputs of the SwiGLU operator and recompute its output ... stored in FP8"). Elsewhere the
    knob's bytes (``act_input_bytes``)."""
    row_fp8 = np.asarray(cols.get(MOE_ACT_CACHE_COLUMN, ""), dtype=object) == "fp8"
    recomputed = np.where(row_fp8, memory.FP8_ACT_INPUT_BYTES, memory.ACT_INPUT_BYTES)
    return np.where(moe_act, recomputed, act_input_bytes)


def _per_value(factorized: tuple[np.ndarray, list], shape, value_of, dtype) -> np.ndarray:
    """``value_of(v)`` for each row's string ``v``, computed once per distinct string (a column of
    Python strings compares at ~40x the cost of a float operation); ``factorized``:
    ``pipeline.factorize`` of the column, ``shape`` its shape."""
    codes, names = factorized
    return np.array([value_of(name) for name in names], dtype=dtype)[codes].reshape(shape)


def knob_test(knobs: Mapping[str, np.ndarray], labels: dict, name: str, test) -> np.ndarray:
    """``test(v)`` (a bool) of each row's string knob ``name``, asked once per distinct string, from
    ``labels[name]`` (``pipeline.factorize`` of the knob, done here where ``labels`` lacks it)."""
    if name not in labels:
        labels[name] = pipeline.factorize(knobs[name])
    return _per_value(labels[name], np.shape(knobs[name]), test, bool)


def knob_in(knobs: Mapping[str, np.ndarray], labels: dict, name: str, values) -> np.ndarray:
    """Whether each row's string knob ``name`` is one of ``values`` (``knob_test``)."""
    return knob_test(knobs, labels, name, lambda knob: knob in values)


def _looked_up(values, table: Mapping[str, float], default: float) -> np.ndarray:
    """``table``'s number for each string of ``values`` (``default`` where it has none)."""
    return _per_value(pipeline.factorize(values), np.shape(values), lambda name: table.get(name, default), float)


# The plan columns a candidate's structure is made of (``space.STRUCTURE_KNOBS``, the data-parallel
# size and the pipeline split) and the global batch: all that ``structure`` reads.
STRUCTURE_COLUMNS = ("tp", "pp", "vp", "cp", "dp", "ep", "etp", "mbs", "gbs", "num_layers_in_first_pipeline_stage",
                     "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
                     "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout")


@dataclass(frozen=True)
class StructureFields:
    """The fields a plan's structure (``STRUCTURE_COLUMNS``) decides on its own, with the model and
    the hardware: the parallel sizes, the micro-batches, the stage layer counts, the data-parallel
    groups. Declared once here for ``Structure`` (one element per distinct structure) and
    ``Candidates`` (one per candidate), so that a term reading these fields alone
    (``Candidates.by_structure``) reads either.

    Pipeline stages are priced at three positions, which cover the fullest and the slowest stage of
    every split Megatron makes (``pipeline``): the first, the first middle one and the last;
    ``*_layers`` and ``*_moe`` are their layer and MoE-layer counts; a hybrid model's
    ``stage_kinds`` each kind's count on them (``pipeline.stage_kind_counts``; None otherwise)."""

    model: ModelSpec
    hw: HardwareSpec
    t: np.ndarray  # tensor parallel
    p: np.ndarray  # pipeline parallel
    v: np.ndarray  # virtual stages per pipeline rank
    c: np.ndarray  # context parallel
    dp: np.ndarray
    e: np.ndarray  # expert parallel
    et: np.ndarray  # expert tensor parallel
    b: np.ndarray  # micro-batch size
    gbs: np.ndarray
    m: np.ndarray  # micro-batches per step on one pipeline
    s_local: np.ndarray  # sequence length on one CP rank
    tokens: np.ndarray  # tokens one GPU processes per micro-batch (before TP)
    first_layers: np.ndarray
    middle_layers: np.ndarray
    last_layers: np.ndarray
    first_moe: np.ndarray
    middle_moe: np.ndarray
    last_moe: np.ndarray
    layers_per_chunk: np.ndarray  # decoder layers of the fullest stage's model chunk
    dp_group: np.ndarray  # dense parameters are replicated over dp*cp GPUs
    dp_per_node: np.ndarray
    edp_group: np.ndarray  # experts over dp*cp*tp / (ep*etp): Megatron's parallel folding
    edp_per_node: np.ndarray
    imbalance: np.ndarray  # the busiest EP rank's tokens over the even share
    stage_kinds: np.ndarray | None  # (first, middle, last) x ``STAGE_KINDS`` (the edge kinds where set) of a hybrid model
    stage_ratios: np.ndarray | None  # (first, middle, last) x ``ModelSpec.dsv4_ratio_classes`` of a DeepSeek-V4 model

    @property
    def single(self) -> np.ndarray:
        """No pipeline: the first stage is also the last."""
        return self.p == 1

    @property
    def stage_layer_counts(self) -> list[tuple]:
        """(decoder layers, of which MoE, each kind's count or None) of the first, middle and last
        stage."""
        return list(zip((self.first_layers, self.middle_layers, self.last_layers),
                        (self.first_moe, self.middle_moe, self.last_moe), self.kinds_on_stages))

    @property
    def kinds_on_stages(self) -> list:
        """``stage_kinds`` of the first, middle and last stage (each None but for a hybrid model); a
        DeepSeek-V4 stage's compress-ratio classes (``stage_ratios``, read by ``Layers.on``)."""
        if self.stage_ratios is not None:
            return list(self.stage_ratios)
        return [None] * 3 if self.stage_kinds is None else list(self.stage_kinds)

    @property
    def has_middle(self) -> np.ndarray:
        return self.p > 2


@dataclass(frozen=True)
class Structure(StructureFields):
    """The ``StructureFields`` of one or many structures and the schedule's peaks (``Candidates``
    holds the peaks of each candidate's stages as ``held``)."""

    peaks: pipeline.Peaks  # what the stages may hold at their peaks, laid out as ``Candidates.held``

    def at(self, rows: np.ndarray) -> Structure:
        """The structures ``rows`` (a 1-D index) alone."""
        return replace(self, peaks=self.peaks.at(rows), **{
            f.name: getattr(self, f.name)[..., rows] for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)})

    def row_fields(self) -> dict:
        """The ``Candidates`` fields these structures decide: the ``StructureFields``, and ``held``
        laid out from ``peaks``."""
        return {f.name: getattr(self, f.name) for f in fields(StructureFields)} | {"held": self.peaks.held()}


# The ``StructureFields`` that read the hardware (``_structure_hardware``).
STRUCTURE_HARDWARE_FIELDS = ("dp_per_node", "edp_per_node", "imbalance")


@dataclass(frozen=True)
class Structures:
    """Candidates as (structure) x (knob combination): ``each`` the ``Structure`` of each distinct
    structure, ``rows`` each candidate's position in it. A search's 1.8 M DeepSeek-V3 candidates have
    18,064 structures (a 65,536-row chunk 3,000-odd), so what depends on the structure alone is
    computed per structure and gathered (one index a row) instead of computed on every row (the
    stage layer counts and schedule peaks take dozens of operations, a group's shape on the two
    network tiers twenty). Bit-identical: every such quantity is computed element by element, and
    the schedule's peaks are laid out from the structures' groups as from the rows' (``Peaks``)."""

    each: Structure
    rows: np.ndarray

    def gathered(self, value):
        """``value`` (an array over ``each``'s structures, or a tuple, list, dict or ``comm.Group`` of
        them) at each candidate's row; an array's last axis is the structures' (``held``'s
        (K, 1) columns, one count for every structure, are kept as they are)."""
        if isinstance(value, np.ndarray):
            n = len(self.each.t)
            if value.ndim == 1:
                return value[self.rows]  # indexing, not take: twice as fast from a short table
            return value.take(self.rows, axis=-1) if value.shape[-1] == n and n > 1 else value
        if isinstance(value, (tuple, list)):
            return type(value)(self.gathered(v) for v in value)
        if isinstance(value, dict):
            return {k: self.gathered(v) for k, v in value.items()}
        if isinstance(value, comm.Group):
            return replace(value, **{f.name: self.gathered(getattr(value, f.name)) for f in fields(value)})
        return value

    def fields(self, names=None) -> dict:
        """``each``'s ``Candidates`` fields (``Structure.row_fields``; ``names``: those
        ``StructureFields`` alone) at each candidate's row."""
        if names is not None:
            return {name: self.gathered(getattr(self.each, name)) for name in names}
        return {name: self.gathered(value) for name, value in self.each.row_fields().items()}

    def replaced(self, **changes) -> Structures:
        return Structures(replace(self.each, **changes), self.rows)


def structures(every: Structure, rows: np.ndarray) -> Structures:
    """The ``Structures`` of candidates whose row i has the structure ``rows[i]`` of ``every`` (the
    ``Structure`` of a search's structures, computed once): the structures ``rows`` uses alone (a
    chunk of a search's rows uses a few of them), in ``every``'s order."""
    used = np.zeros(len(every.t), dtype=bool)
    used[rows] = True
    if used.all():
        return Structures(every, rows)
    return Structures(every.at(np.flatnonzero(used)), (np.cumsum(used) - 1)[rows])


def structure(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
              labels: Mapping[str, tuple[np.ndarray, list]] | None = None) -> Structure:
    """The ``Structure`` of each row of ``cols`` (which may hold other columns too); ``labels``:
    the layout column factorized (``Candidates.labels``) where the caller has it."""
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    t, p, v, c, dp, e, et = (f64(k) for k in ("tp", "pp", "vp", "cp", "dp", "ep", "etp"))
    b, gbs = f64("mbs"), f64("gbs")
    L = model.num_layers
    s_local = model.seq_length / c
    split = (f64("num_layers_in_first_pipeline_stage"), f64("num_layers_in_last_pipeline_stage"),
             f64("account_for_embedding_in_pipeline_split"), f64("account_for_loss_in_pipeline_split"),
             np.asarray(cols["pipeline_model_parallel_layout"], dtype=object))
    groups = pipeline.structure(p, v, *split, (labels or {}).get("pipeline_model_parallel_layout"))
    first_layers, middle_layers, last_layers = pipeline.stage_layers(L, p, v, *split, groups=groups)
    stage_kinds = None
    if model.is_hybrid:  # each kind counted on the layers a stage holds; its MoE layers are its E ones
        ends = gemm_precision.end_layers_of(cols)
        kinds = STAGE_KINDS if any(ends) else tuple(k for k in STAGE_KINDS if EDGE not in k)  # edge kinds where set
        stage_kinds = pipeline.stage_kind_counts(gemm_precision.layer_labels(model.hybrid_layer_pattern, *ends), kinds,
                                                 p, v, *split, groups=groups)
        moe_rows = [kinds.index(k) for k in ("E", "E" + EDGE) if k in kinds]
        first_moe, middle_moe, last_moe = (stage_kinds[i, moe_rows].sum(axis=0) for i in range(3))
    elif model.is_moe:
        first_moe, middle_moe, last_moe = pipeline.stage_pattern_counts(model.moe_layer_pattern, p, v, *split,
                                                                        groups=groups)
    else:
        first_moe = middle_moe = last_moe = np.zeros_like(t)
    stage_ratios = None
    if model.is_dsv4:  # each stage's own layers' compress ratios (Megatron's contiguous slices), not the mean mix
        stage_ratios = pipeline.stage_kind_counts(model.dsv4_decoder_ratios, model.dsv4_ratio_classes, p, v, *split,
                                                  groups=groups)
    pattern = model.moe_layer_pattern if model.is_moe else (0,) * L
    peaks = pipeline.peaks(pattern, p, v, gbs / (b * dp), *split, groups=groups)
    dp_group = dp * c
    edp_group = dp_group * t / (e * et)
    return Structure(
        model=model, hw=hw, t=t, p=p, v=v, c=c, dp=dp, e=e, et=et, b=b, gbs=gbs, m=gbs / (b * dp), s_local=s_local,
        tokens=b * s_local, first_layers=first_layers, middle_layers=middle_layers, last_layers=last_layers,
        first_moe=first_moe, middle_moe=middle_moe, last_moe=last_moe, peaks=peaks,
        layers_per_chunk=np.maximum(np.maximum(first_layers, middle_layers), last_layers) / v,
        dp_group=dp_group, edp_group=edp_group, stage_kinds=stage_kinds, stage_ratios=stage_ratios,
        **_structure_hardware(model, hw, t, e, et, dp_group, edp_group))


def _structure_hardware(model: ModelSpec, hw: HardwareSpec, t, e, et, dp_group, edp_group) -> dict:
    """The ``StructureFields`` that read ``hw`` (``STRUCTURE_HARDWARE_FIELDS``)."""
    return dict(dp_per_node=comm.ranks_per_domain(hw, dp_group, t),
                edp_per_node=comm.ranks_per_domain(hw, edp_group, e * et),
                imbalance=moe.load_imbalance(hw, model, e) if model.is_moe else np.ones_like(t))


@dataclass(frozen=True)
class Candidates(StructureFields):
    """Plan knobs as arrays (one element per candidate) and what the terms derive from them.

    The ``StructureFields`` are the plans' structure's (``structure``); where the candidates'
    structures are known (``structures``), they were computed once per structure. Frozen, as
    ``Structure`` (a dataclass base and its subclasses are frozen alike): a changed copy is made
    with ``replace``; ``memo``, ``labels`` and the cached properties fill in place.
    """

    knobs: Mapping[str, np.ndarray]
    sp: np.ndarray
    flash: np.ndarray
    fsdp: np.ndarray
    full: np.ndarray  # full recompute
    selective: np.ndarray
    is_fp8: np.ndarray
    is_fp4: np.ndarray  # NVFP4
    cast_bytes: np.ndarray  # HBM bytes per element of a quantizing cast under the plan's recipe
    quantized_fraction: np.ndarray  # share of layers whose Linears run the FP8 or FP4 recipe
    quantized_input_bytes: np.ndarray  # bytes per element a quantized layer keeps of a Linear input
    quantized_weight_bytes: np.ndarray  # bytes per weight of its quantized copies (both layouts)
    act_input_bytes: np.ndarray  # bytes per element kept of the activation's input (FP8 copy or BF16)
    routed_act_input_bytes: np.ndarray  # the same for the routed experts (``routed_act_input_bytes``)
    # What the first, middle and last stage may hold at their peaks (``pipeline.held_at_peak``):
    # per position (dense layer-, MoE layer-, edge chunk) micro-batches, each a (K, plans) array.
    held: list
    recomputed_fraction: np.ndarray  # share of a chunk's layers that full recompute covers
    modules: dict  # --recompute-modules name -> mask (selective recompute only)
    grad_bytes: np.ndarray  # bytes per gradient element in the data-parallel reduction
    fp8_param_share: np.ndarray  # share of layer weights kept only in FP8 (--fp8-param-gather)
    gather_bytes: np.ndarray  # bytes per parameter of the parameter all-gather (BF16, FP8 share at 1)
    moment_bytes: np.ndarray  # bytes of each Adam moment (FP32, BF16 with the precision-aware optimizer)
    master_bytes: np.ndarray  # bytes of each master weight (FP32; 16 bits when precision-aware or param_remainders)
    dualpipe: np.ndarray  # a published row's DualPipe schedule (``pipeline.DUALPIPE``), never searched
    dispatch_bytes: np.ndarray  # bytes per token value of an MoE dispatch/combine (a published row's FP8 dispatch)
    windowed_offload: np.ndarray  # TE >= 1.10's load-balanced offload windows (else one layer's, ``stages.offload_time``)
    hbm: float  # achievable HBM bytes/s
    gemm_peak: np.ndarray  # FLOP/s of the Linear GEMMs at full efficiency (quantized and BF16 layers mixed)
    # String knobs as (codes, distinct values), factorized once each (``knob_is``).
    labels: dict = field(default_factory=dict, repr=False, compare=False)
    # Each candidate's structure and what it decides (``by_structure``), where the caller knows them.
    structures: Structures | None = field(default=None, repr=False, compare=False)
    # Terms computed once for these candidates (``once``); not carried over by ``replace``.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def flag(self, name: str) -> np.ndarray:
        return np.asarray(self.knobs[name], dtype=bool)

    def once(self, term):
        """``term(self)``, computed on the first call only: for what several callers price alike
        (the dense and the MoE layer share their attention terms, ``layer_time.shared_terms``)."""
        if term not in self.memo:
            self.memo[term] = term(self)
        return self.memo[term]

    def by_structure(self, term, *values):
        """``term(s, *values)`` for an ``s`` holding the ``StructureFields`` (these candidates, or
        the ``Structure`` of their distinct structures): computed once per structure and gathered
        at each row where the structures are known (``Structures``), on every row otherwise. For a
        quantity of the structure alone that costs more than the one index a row its gathering does
        (a group's shape on the network tiers, a dispatch's time); ``term`` reads
        ``StructureFields`` and ``values`` only, each of which is run-level (one value) or holds one
        per row (a published row's own: then ``term`` is computed on every row)."""
        if self.structures is None or any(np.ndim(value) for value in values):
            return term(self, *values)
        return self.structures.gathered(term(self.structures.each, *values))

    def knob_is(self, name: str, *values: str) -> np.ndarray:
        """Whether each plan's string knob ``name`` is one of ``values``: its distinct strings are
        compared, not its rows (a column of Python strings compares at ~40x the cost of a float
        operation, and the terms ask about precision, dispatcher and CUDA graph a dozen times)."""
        return knob_in(self.knobs, self.labels, name, values)

    def number(self, name: str) -> np.ndarray:
        return np.asarray(self.knobs[name], dtype=float)

    def evenly_loaded(self) -> Candidates:
        """The same candidates with every EP rank at the even share of routed tokens."""
        even = self.structures and self.structures.replaced(imbalance=np.ones_like(self.structures.each.imbalance))
        return replace(self, imbalance=np.ones_like(self.imbalance), structures=even)

    @cached_property
    def keep_scores(self) -> np.ndarray:
        """The s x s attention probabilities are saved for backward (no flash, no core_attn
        recompute)."""
        return ~self.flash & ~self.modules["core_attn"]

    @cached_property
    def attention_output_fused(self) -> np.ndarray:
        """A fused attention kernel saves its BF16 output for its backward: flash attention, core
        attention not recomputed, not FP8 attention (whose FP8 output is the projection's input)."""
        return self.flash & ~self.modules["core_attn"] & ~self.flag("fp8_attention")

    @cached_property
    def attention_output_bytes(self) -> np.ndarray:
        """Bytes kept per element of the attention output (``memory.attention_output_bytes``):
        the fused kernel's BF16 output; the projection's own quantized copy beside it under
        delayed scaling; FP8 attention's one FP8 output, shared with the projection; a published
        row's own cache where it states one (``ATTENTION_OUTPUT_CACHE_COLUMN``: one copy, shared)."""
        delayed = self.knob_is("precision", "fp8-delayed")
        fp8_attention = self.flag("fp8_attention") & (self.quantized_fraction > 0)
        # Under NVFP4 the FP8 attention's output is FP8 (its own current-scaling recipe), not NVFP4.
        attention_bytes = np.where(self.is_fp4, QUANTIZED_INPUT_BYTES["fp8"], self.quantized_input_bytes)
        kept = np.where(fp8_attention, memory.gemm_input_bytes(self.quantized_fraction, attention_bytes),
                        memory.attention_output_bytes(self.quantized_fraction, self.quantized_input_bytes,
                                                      self.attention_output_fused, delayed))
        row_cache = _looked_up(self.knobs.get(ATTENTION_OUTPUT_CACHE_COLUMN, ""), ATTENTION_OUTPUT_CACHE_BYTES, np.nan)
        return np.where(np.isnan(row_cache), kept, row_cache)

    @property
    def offloaded(self) -> np.ndarray:
        """Layers whose saved activations go to the host (first stage; pp = 1 only)."""
        return np.minimum(self.number("cpu_offloading_num_layers"), self.first_layers)

    @property
    def distributed_optimizer(self) -> np.ndarray:
        """Adam states sharded over the data-parallel group (FSDP shards them too)."""
        return self.flag("distributed_optimizer") | self.fsdp

    @property
    def cuda_graph(self) -> np.ndarray:
        return np.asarray(self.knobs["cuda_graph"])

    @cached_property
    def tp_ranks(self) -> comm.Group:
        """The TP group (consecutive ranks) on the two tiers, for every term that prices its collectives."""
        return self.by_structure(lambda s: comm.group(s.hw, s.t, comm.ranks_per_domain(s.hw, s.t, 1)))

    @cached_property
    def dp_ranks(self) -> comm.Group:
        """The data-parallel group of the dense parameters (``dp_group``) on the two tiers."""
        return self.by_structure(lambda s: comm.group(s.hw, s.dp_group, s.dp_per_node))

    @cached_property
    def edp_ranks(self) -> comm.Group:
        """The experts' data-parallel group (``edp_group``) on the two tiers."""
        return self.by_structure(lambda s: comm.group(s.hw, s.edp_group, s.edp_per_node))

    def optimizer_shards(self) -> tuple[np.ndarray, np.ndarray]:
        """GPUs the Adam states of dense parameters and of experts are sharded over."""
        dist_opt = self.distributed_optimizer
        return np.where(dist_opt, self.dp_group, 1.0), np.where(dist_opt, self.edp_group, 1.0)


def candidates(model: ModelSpec, hw: HardwareSpec, cols: Mapping[str, np.ndarray],
               labels: Mapping[str, tuple[np.ndarray, list]] | None = None,
               structures: Structures | None = None) -> Candidates:
    """``cols`` (Plan field name -> array) as ``Candidates``; ``labels``: string columns of
    ``cols`` already factorized, the others factorized here as asked; ``structures``: the rows'
    structures (``structures``; they must be those of ``cols``), whose fields are gathered
    instead of computed on every row (``structure``)."""
    f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
    flag = lambda k: np.asarray(cols[k], dtype=bool)  # noqa: E731
    precision = np.asarray(cols["precision"])
    labels = dict(labels or {})
    full = knob_in(cols, labels, "recompute", ("full",))
    selective = knob_in(cols, labels, "recompute", ("selective",))
    is_fp8 = knob_in(cols, labels, "precision", FP8_PRECISIONS)
    is_fp4 = knob_in(cols, labels, "precision", FP4_PRECISIONS)

    structural = structure(model, hw, cols, labels).row_fields() if structures is None else structures.fields()
    layers_per_chunk = structural["layers_per_chunk"]
    n_recomputed = np.where(f64("recompute_num_layers") > 0,
                            np.minimum(f64("recompute_num_layers"), layers_per_chunk), layers_per_chunk)
    bf16_layer_fraction = np.minimum(2.0 * f64("fp8_bf16_edge_layers") / model.num_layers, 1.0)

    module_codes, module_sets = labels.get("recompute_modules") or pipeline.factorize(cols["recompute_modules"])
    modules = {name: selective & np.array([name in m.split() for m in module_sets], dtype=bool)[module_codes]
               for name in RECOMPUTE_MODULES}
    quantized_fraction = np.where(is_fp8 | is_fp4, 1.0 - bf16_layer_fraction, 0.0)
    fp8_param_share = np.where(flag("fp8_param_gather"), quantized_fraction, 0.0)
    act_input_bytes = np.where(flag("activation_func_fp8_input_store"), memory.FP8_ACT_INPUT_BYTES,
                               memory.ACT_INPUT_BYTES)
    return Candidates(
        knobs=cols, **structural,
        sp=flag("sp"), flash=flag("flash_attention"), fsdp=flag("fsdp"), full=full, selective=selective,
        is_fp8=is_fp8, is_fp4=is_fp4,
        cast_bytes=_per_value(labels["precision"], precision.shape, lambda p: CAST_BYTES.get(p, 0.0), float),
        quantized_fraction=quantized_fraction,
        quantized_input_bytes=np.where(is_fp4, QUANTIZED_INPUT_BYTES["fp4"], QUANTIZED_INPUT_BYTES["fp8"]),
        act_input_bytes=act_input_bytes,
        routed_act_input_bytes=routed_act_input_bytes(cols, modules["moe_act"], act_input_bytes),
        recomputed_fraction=np.where(full, n_recomputed / layers_per_chunk, 0.0),
        modules=modules,
        grad_bytes=np.where(flag("grad_reduce_in_fp32"), 4.0, 2.0),
        fp8_param_share=fp8_param_share,
        gather_bytes=memory.WEIGHT_BYTES - (memory.WEIGHT_BYTES - memory.FP8_WEIGHT_BYTES) * fp8_param_share,
        moment_bytes=np.where(flag("precision_aware_optimizer"), memory.BF16_MOMENT_BYTES, memory.ADAM_MOMENT_BYTES),
        # store_param_remainders applies only without FP8 parameters (use_precision_aware_optimizer_no_fp8_or_ds_fp8)
        master_bytes=np.where((flag("precision_aware_optimizer") & ~flag("fp8_param_gather")) | flag("param_remainders"),
                              memory.MASTER_REMAINDER_BYTES, memory.MASTER_WEIGHT_BYTES),
        dualpipe=np.asarray(cols.get("pipeline_schedule", ""), dtype=object) == pipeline.DUALPIPE,
        dispatch_bytes=np.where(np.asarray(cols.get("moe_dispatch_precision", ""), dtype=object) == "fp8",
                                dispatch.FP8_DISPATCH_MEAN_BYTES, dispatch.DISPATCH_BYTES),
        windowed_offload=te_at_least(cols.get(TE_VERSION_COLUMN, ""), 1, 10),
        labels=labels, structures=structures, **_hardware_fields(hw, cols, labels, is_fp4, quantized_fraction),
    )


def _hardware_fields(hw: HardwareSpec, cols: Mapping[str, np.ndarray], labels: dict, is_fp4,
                     quantized_fraction) -> dict:
    """The ``Candidates`` fields that read ``hw`` (its GPU's kind, its constants) beyond the
    structure's (``_structure_hardware``): the rest depends on the model and the plans only
    (``on_hardware`` reprices those on another ``hw``)."""
    return dict(
        quantized_weight_bytes=np.select(
            # hw.mxfp8: a Blackwell (sm_100) GPU
            [is_fp4, knob_in(cols, labels, "precision", PER_TENSOR_FP8) & hw.mxfp8],
            [QUANTIZED_WEIGHT_BYTES["fp4"], memory.FP8_WEIGHT_BYTES], QUANTIZED_WEIGHT_BYTES["fp8"]),
        hbm=hw.achievable_hbm,  # measured_hbm_speed where a benchmark says
        gemm_peak=gemm.peak(hw, quantized_fraction, is_fp4),
    )


def on_hardware(x: Candidates, hw: HardwareSpec) -> Candidates:
    """``x`` (as ``candidates`` made it) priced on ``hw``: the same candidates and model, every field
    that reads the hardware (``_hardware_fields``, ``_structure_hardware``) computed anew and nothing
    computed once carried over (``replace``: the cached properties and ``memo`` start empty). A
    calibration reprices a row's candidates with many constants: this spares building the plan-only
    fields each time."""
    if x.structures is None:
        structures, structural = None, _structure_hardware(x.model, hw, x.t, x.e, x.et, x.dp_group, x.edp_group)
    else:
        s = x.structures.each
        structures = x.structures.replaced(hw=hw, **_structure_hardware(x.model, hw, s.t, s.e, s.et, s.dp_group,
                                                                        s.edp_group))
        structural = structures.fields(STRUCTURE_HARDWARE_FIELDS)
    return replace(x, hw=hw, structures=structures, **structural,
                   **_hardware_fields(hw, x.knobs, x.labels, x.is_fp4, x.quantized_fraction))
