"""One training log -> one row of the runs CSV.

The row has the columns of the published ``training_runs_more.csv`` (model, layout, precision,
measured figures) and, because a log states them where a paper does not, whether the embeddings
are tied, the dropout probabilities (dropout masks are saved activations) and the layout knobs the
published rows leave to the validation's search: the full-recompute layer count, the uneven
pipeline split, CPU offloading, BF16 edge layers, the distributed optimizer and its overlaps,
FP32 gradient reduction, TP communication overlap, flash attention (``LOG_COLUMNS``, named as
``Plan`` names them), and the peak memory PyTorch allocated and reserved. The measured
iteration time is the median of the logged intervals after warm-up.

A log that cannot be turned into a row raises ``UnreadableLog`` with a one-line reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoparallel import ranges, resources, safefile
from autoparallel.errors import UserError
from autoparallel.runlogs.arguments import read_arguments
from autoparallel.runlogs.metrics import Interval, Measurements, measure

ID_PREFIX = "log"  # validation.yaml's block for these rows: `assumptions_key` of "log-..."
# Launchers prefix each line: `srun -l` ("3: "), torchrun's --tee / log redirects ("[default3]:").
_LAUNCHER_PREFIX = re.compile(r"^(?:\d+: |\[default\d+\]:|\[rank\d+\]: ?)")
FP8_RECIPES = {"delayed": "fp8-delayed", "tensorwise": "fp8-current", "blockwise": "fp8-blockwise",
               "mxfp8": "mxfp8"}  # Megatron-LM --fp8-recipe -> Plan.precision
LOG_COLUMNS = ("tie_embeddings", "hidden_dropout", "attention_dropout", "recompute_num_layers",
               "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
               "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
               "cpu_offloading_num_layers", "fp8_bf16_edge_layers", "distributed_optimizer", "overlap_grad_reduce",
               "overlap_param_gather", "grad_reduce_in_fp32", "tp_comm_overlap", "flash_attention",
               "measured_max_allocated_gib", "measured_max_reserved_gib")
_NOT_CONTENT = ("id", "model", "source", "notes")


class UnreadableLog(UserError):
    """A log that cannot become a runs row; the message says why in one line."""


@dataclass(frozen=True)
class TrainingLog:
    path: Path
    framework: str  # arguments.MEGATRON_LM or MEGATRON_BRIDGE
    arguments: dict[str, Any]  # Megatron-LM argument names
    measurements: Measurements


def runs_columns() -> list[str]:
    """The published runs CSV's columns (the schema users' rows share) plus ``LOG_COLUMNS``."""
    header = resources.data_file("training_runs_more.csv").read_text().splitlines()[0]
    return header.split(",") + list(LOG_COLUMNS)


def read_log(path: Path) -> TrainingLog:
    try:
        text = safefile.read_text(path, "training log", errors="replace")
    except UserError as exc:
        raise UnreadableLog(str(exc)) from None
    lines = [_LAUNCHER_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    try:
        framework, arguments = read_arguments(lines)
    except ValueError as exc:
        raise UnreadableLog(str(exc)) from None
    return TrainingLog(Path(path), framework, arguments, measure(lines))


def to_row(log: TrainingLog, gpu: str, warmup: int | None = None) -> dict[str, Any]:
    """The runs row of ``log`` measured on hardware preset ``gpu`` (logs rarely name the GPU).

    Read in steps, each refusing what it cannot price with a one-line ``UnreadableLog``: what is
    not modelled, the model's and batch's sizes, the layout and its knobs, the steady intervals;
    then the columns, in the runs CSV's order, and a check of the log's own measured figures."""
    a, notes = log.arguments, []
    _refuse_unmodelled(a)
    sizes = _sizes(a, log.measurements)
    layout = _layout(a, log.measurements, sizes, notes)
    step_s, tflops = _steady_step(log, warmup, notes)
    row: dict[str, Any] = {
        "model": _slug(log.path.stem), **_model_columns(a, sizes), **_layout_columns(a, sizes, layout, gpu),
        **_measured_columns(sizes, layout, step_s, tflops),
        "source": f"{log.framework} log {log.path.name}", "notes": "; ".join(notes),
        **_knob_columns(a, log.measurements, layout),
    }
    for name in LOG_MEASURED:  # a log's own numbers: a zero or nan step time is no run
        if row[name] is not None and (reason := ranges.problem(name, row[name])):
            raise UnreadableLog(reason)
    row["id"] = f"{ID_PREFIX}-{row['model']}-{content_hash(row)}"
    return row


@dataclass(frozen=True)
class _Sizes:
    """The counts every row needs, read first: a log that leaves one out cannot be priced."""
    layers: int
    hidden: int
    heads: int
    seq: int
    mbs: int
    gbs: int
    vocab: int


@dataclass(frozen=True)
class _Layout:
    """How the run was laid out and which knobs it set, as ``Plan`` names them."""
    tp: int
    pp: int
    cp: int
    ep: int
    gpus: int
    precision: str
    recompute: str
    recompute_layers: int
    fsdp: bool
    sp: bool
    edge: int  # BF16 edge layers at each end under FP8
    grads_fp32: bool


def _need(a: dict[str, Any], name: str) -> Any:
    """An argument the row cannot do without: the log is unreadable if the configuration leaves it out."""
    if a.get(name) is None:
        raise UnreadableLog(f"the configuration does not state {name}")
    return a[name]


def _count(a: dict[str, Any], name: str, default: int | None = None) -> int:
    """A count the configuration states (``default`` if it may be left out): a whole
    number of at least 1, or the log is unreadable (``tp=1.5`` was read as 1)."""
    value = _need(a, name) if default is None or a.get(name) is not None else default
    if reason := ranges.count_problem(name, value):
        raise UnreadableLog(f"the configuration's {reason}")
    return int(value)


def _sizes(a: dict[str, Any], m: Measurements) -> _Sizes:
    """The model's and the batch's sizes; the vocabulary as the tokenizer padded it where the log
    says so (the embedding's real size), else the configuration's."""
    layers, hidden, heads, seq, mbs, gbs = (_count(a, name) for name in (
        "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size", "global_batch_size"))
    vocab = m.vocab_size or a.get("vocab_size")
    if not vocab:
        raise UnreadableLog('no vocabulary size: neither the tokenizer\'s "padded vocab" line nor vocab_size')
    return _Sizes(layers, hidden, heads, seq, mbs, gbs, vocab)


def _layout(a: dict[str, Any], m: Measurements, sizes: _Sizes, notes: list[str]) -> _Layout:
    """The parallel layout and the knobs that change its price; what is priced otherwise than the
    log ran it is said in ``notes``."""
    tp, pp, cp, ep = (_count(a, k, 1) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                "context_parallel_size", "expert_model_parallel_size"))
    gpus = _world_size(a, m, tp * pp * cp, sizes.mbs, sizes.gbs)
    precision = _precision(a)
    recompute, recompute_layers = _recompute(a, notes)
    fsdp = _fsdp(a, notes)
    sp = bool(a.get("sequence_parallel")) and tp > 1
    edge = _edge_layers(a, precision, notes)
    return _Layout(tp, pp, cp, ep, gpus, precision, recompute, recompute_layers, fsdp, sp, edge,
                   _grads_fp32(a, precision))


def _fsdp(a: dict[str, Any], notes: list[str]) -> bool:
    """Whether weights, gradients and optimizer states are all sharded (FSDP2, or Megatron-FSDP's
    optim_grads_params); Megatron-FSDP's lighter strategies are priced as the distributed optimizer."""
    fsdp = bool(a.get("use_torch_fsdp2")) or (
        bool(a.get("use_megatron_fsdp")) and a.get("data_parallel_sharding_strategy") == "optim_grads_params")
    if a.get("use_megatron_fsdp") and not fsdp:
        notes.append(f"Megatron-FSDP {a.get('data_parallel_sharding_strategy')} priced as the distributed optimizer")
    return fsdp


def _edge_layers(a: dict[str, Any], precision: str, notes: list[str]) -> int:
    """BF16 layers at each end under FP8: the plan keeps as many at both ends, so uneven counts
    are priced as the larger at each."""
    if precision in ("bf16", "fp16") or not a.get("first_last_layers_bf16"):
        return 0
    start, end = int(a.get("num_layers_at_start_in_bf16") or 0), int(a.get("num_layers_at_end_in_bf16") or 0)
    if start != end:
        notes.append(f"BF16 layers {start} first / {end} last priced as {max(start, end)} at each end")
    return max(start, end)


def _grads_fp32(a: dict[str, Any], precision: str) -> bool:
    """Whether gradients are reduced in FP32: as stated, else Megatron-LM's default (FP32 unless
    --grad-reduce-in-bf16, or FP16 training)."""
    grads_fp32 = a.get("accumulate_allreduce_grads_in_fp32")
    if grads_fp32 is None:
        grads_fp32 = not a.get("grad_reduce_in_bf16") and precision != "fp16"
    return grads_fp32


def _steady_step(log: TrainingLog, warmup: int | None, notes: list[str]) -> tuple[float, float | None]:
    """The median step time (seconds) and logged TFLOP/s of the steady intervals, each interval
    checked first: one impossible figure makes the log unreadable rather than skewing the median."""
    steady = steady_intervals(log, warmup)
    for interval in steady:
        reason = (ranges.problem("elapsed time per iteration (ms)", interval.elapsed_ms)
                  or (interval.tflops is not None and ranges.problem("TFLOP/s", interval.tflops)))
        if reason:
            raise UnreadableLog(f"iteration {interval.iteration}: {reason}")
    logged_tflops = [i.tflops for i in steady if i.tflops is not None]
    notes.insert(0, f"median of {len(steady)} logged intervals after warm-up (of {len(log.measurements.intervals)})")
    return (statistics.median(i.elapsed_ms for i in steady) / 1000.0,
            statistics.median(logged_tflops) if logged_tflops else None)


def _model_columns(a: dict[str, Any], sizes: _Sizes) -> dict[str, Any]:
    """The architecture columns (num_layers .. activation)."""
    return {
        "num_layers": sizes.layers, "hidden_size": sizes.hidden, "num_attention_heads": sizes.heads,
        "num_query_groups": _count(a, "num_query_groups") if a.get("group_query_attention") else sizes.heads,
        "ffn_hidden_size": int(_need(a, "ffn_hidden_size")), "vocab_size": int(sizes.vocab),
        "activation": "swiglu" if a.get("swiglu") else "squared_relu" if a.get("squared_relu") else "gelu",
    }


def _layout_columns(a: dict[str, Any], sizes: _Sizes, layout: _Layout, gpu: str) -> dict[str, Any]:
    """The published columns of the layout (seq_length .. precision)."""
    return {
        "seq_length": sizes.seq, "gpu": gpu, "num_gpus": layout.gpus, "tp": layout.tp, "pp": layout.pp,
        "cp": layout.cp, "vp": int(a.get("virtual_pipeline_model_parallel_size") or 1), "ep": layout.ep,
        "sp": int(layout.sp), "recompute": layout.recompute, "mbs": sizes.mbs, "gbs": sizes.gbs,
        "precision": layout.precision,
    }


def _measured_columns(sizes: _Sizes, layout: _Layout, step_s: float, tflops: float | None) -> dict[str, Any]:
    """The published measured columns: throughput per GPU from the median step time."""
    return {
        "measured_tokens_per_s_per_gpu": sizes.gbs * sizes.seq / (step_s * layout.gpus),
        "measured_model_tflops_per_gpu": tflops,
        "measured_iteration_time_s": step_s,
    }


def _knob_columns(a: dict[str, Any], m: Measurements, layout: _Layout) -> dict[str, Any]:
    """What a log states where a paper does not (``LOG_COLUMNS``, after kv_channels and fsdp)."""
    return {
        "kv_channels": a.get("kv_channels"), "fsdp": layout.gpus // (layout.tp * layout.pp) if layout.fsdp else 0,
        "tie_embeddings": (None if a.get("untie_embeddings_and_output_weights") is None
                           else int(not a["untie_embeddings_and_output_weights"])),
        "hidden_dropout": a.get("hidden_dropout"), "attention_dropout": a.get("attention_dropout"),
        "recompute_num_layers": layout.recompute_layers,
        "num_layers_in_first_pipeline_stage": int(a.get("decoder_first_pipeline_num_layers") or 0),
        "num_layers_in_last_pipeline_stage": int(a.get("decoder_last_pipeline_num_layers") or 0),
        "account_for_embedding_in_pipeline_split": int(bool(a.get("account_for_embedding_in_pipeline_split"))),
        "account_for_loss_in_pipeline_split": int(bool(a.get("account_for_loss_in_pipeline_split"))),
        "cpu_offloading_num_layers": int(a.get("cpu_offloading_num_layers") or 0),
        "fp8_bf16_edge_layers": layout.edge,
        "distributed_optimizer": int(bool(a.get("use_distributed_optimizer")) or layout.fsdp),
        "overlap_grad_reduce": int(bool(a.get("overlap_grad_reduce"))),
        "overlap_param_gather": int(bool(a.get("overlap_param_gather"))),
        "grad_reduce_in_fp32": int(bool(layout.grads_fp32)),
        "tp_comm_overlap": int(bool(a.get("tp_comm_overlap")) and layout.sp),
        "flash_attention": int(_flash_attention(a)),
        "measured_max_allocated_gib": m.max_allocated_gib, "measured_max_reserved_gib": m.max_reserved_gib,
    }


LOG_MEASURED = ("measured_tokens_per_s_per_gpu", "measured_model_tflops_per_gpu", "measured_iteration_time_s",
                "measured_max_allocated_gib", "measured_max_reserved_gib")


def steady_intervals(log: TrainingLog, warmup: int | None = None) -> list[Interval]:
    """The logged intervals after warm-up at the run's global batch size (a batch ramp-up's
    smaller batches are left out); UnreadableLog if none."""
    m, gbs = log.measurements, log.arguments.get("global_batch_size")
    if not m.intervals:
        raise UnreadableLog('no "elapsed time per iteration (ms)" line: the job logged no training interval')
    steady = [i for i in m.steady(warmup) if i.global_batch_size in (None, gbs)]
    if not steady and warmup is not None:  # "(or give --warmup)" was said to a --warmup too high
        raise UnreadableLog(f"no logged interval after --warmup {warmup} (the last ends at iteration "
                            f"{max(i.iteration for i in m.intervals)}): give a lower --warmup")
    if not steady:
        n = len(m.intervals)
        which = "the one logged interval is" if n == 1 else f"all {n} logged intervals are"
        raise UnreadableLog(f"{which} warm-up: log more iterations (or give --warmup)")
    return steady


def content_hash(row: dict[str, Any]) -> str:
    """Eight hex digits of what the row says about the run (not where the log lay): the same
    run imported twice, under any file name, gets the same one."""
    def plain(value: Any) -> Any:
        return f"{value:.6g}" if isinstance(value, float) else value
    content = {k: plain(v) for k, v in row.items() if k not in _NOT_CONTENT}
    return hashlib.sha1(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _slug(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", stem).strip("_")[:60] or "run"


def _refuse_unmodelled(a: dict[str, Any]) -> None:
    if a.get("num_experts"):
        raise UnreadableLog(f"a mixture-of-experts model (num_experts={a['num_experts']}): only dense models "
                            "are calibrated so far")
    for flag, what in (("multi_latent_attention", "multi-latent attention"),
                       ("is_hybrid_model", "a hybrid (Mamba) model"),
                       ("hybrid_override_pattern", "a hybrid (Mamba) model"),
                       ("pipeline_model_parallel_layout", "a --pipeline-model-parallel-layout"),
                       ("fp4", "FP4 training")):
        if a.get(flag):
            raise UnreadableLog(f"{what} ({flag}={a[flag]}) is not modelled")


def _world_size(a: dict[str, Any], m: Measurements, model_parallel: int, mbs: int, gbs: int) -> int:
    """GPUs of the job: Megatron-LM prints world_size; a Bridge log only the micro-batch count,
    from which dp = gbs / (mbs * micro-batches)."""
    world = a.get("world_size") or m.world_size
    if not world and m.microbatches:
        world = gbs // (mbs * m.microbatches) * model_parallel
    if not world:
        raise UnreadableLog('no world size: neither world_size nor the "number of microbatches" line')
    if world % model_parallel:
        raise UnreadableLog(f"world size {world} is not a multiple of tp*pp*cp={model_parallel}")
    return int(world)


def _precision(a: dict[str, Any]) -> str:
    if a.get("fp8"):
        recipe = a.get("fp8_recipe") or "delayed"  # releases before --fp8-recipe only had delayed scaling
        if recipe not in FP8_RECIPES:
            raise UnreadableLog(f"FP8 recipe {recipe!r} is not modelled (known: {', '.join(FP8_RECIPES)})")
        return FP8_RECIPES[recipe]
    if a.get("bf16"):
        return "bf16"
    if a.get("fp16"):
        return "fp16"
    raise UnreadableLog("FP32 training (neither bf16 nor fp16) is not modelled")


def _recompute(a: dict[str, Any], notes: list[str]) -> tuple[str, int]:
    """Plan's recompute and its full-recompute layer count per pipeline chunk (0: all).

    ``--recompute-method block --recompute-num-layers N`` recomputes N layers of each chunk;
    ``uniform`` recomputes every layer (N only groups the stored inputs)."""
    granularity = a.get("recompute_granularity")
    if granularity is None:
        return "none", 0
    if granularity == "selective":
        modules = a.get("recompute_modules") or ["core_attn"]
        if set(modules) - {"core_attn"}:
            notes.append(f"selective recompute of {modules} priced as core attention only")
        return "selective", 0
    if granularity != "full":
        raise UnreadableLog(f"recompute_granularity {granularity!r} is not modelled")
    if a.get("recompute_method") == "block":
        return "full", int(a.get("recompute_num_layers") or 0)
    if (a.get("recompute_num_layers") or 1) > 1:
        notes.append(f"uniform recompute in groups of {a['recompute_num_layers']} priced as storing every "
                     "layer's input")
    return "full", 0


def _flash_attention(a: dict[str, Any]) -> bool:
    """Whether the attention core keeps the s x s scores out of memory: every backend but the
    unfused and local ones (TransformerEngine picks flash or cuDNN fused attention)."""
    backend = a.get("attention_backend")
    if backend is not None:
        return str(backend).split(".")[-1] not in ("unfused", "local")
    return bool(a.get("use_flash_attn")) or a.get("transformer_impl") == "transformer_engine"
