"""Published serving measurements, read into rows the cost model can predict, one set per engine.

Two CSVs (package data, copies of ``../shared/data``), read as the assumptions YAML's
``validation`` block says:

- ``inference_runs.csv``: FasterTransformer's A100 end-to-end latencies (static batching);
  rows whose ``notes`` start with ``OOM`` have no latency and check the memory model instead.
- ``serving_runs.csv``: the in-flight batching rows of TensorRT-LLM's performance overview
  (offline max throughput, output tokens/s of one TP group) by release, each with the engine
  that ran it and the max batch / max tokens the benchmark built the engine with. Every other
  row of that file is kept with the reason it is not predicted (static-batching tables, TTFT-only
  tables, NeMo / vLLM rows without input and output lengths), so the report
  accounts for every row.

A ``Measured`` set holds one engine's rows: ``frame`` has the layout columns the cost model
takes, ``measured`` (the published figure), ``metric`` and ``reason`` ('' = predicted).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import io, ranges, resources
from autoparallel.costmodel.inference import InferenceEfficiency, ServingEngine, StaticBatch
from autoparallel.costmodel.inflight import InflightBatch
from autoparallel.errors import SpecError, UserError
from autoparallel.serve.assumptions import ASSUMPTIONS, load_assumptions, load_engine, validation_model

FT_RUNS = resources.data_file("inference_runs.csv")
SERVING_RUNS = resources.data_file("serving_runs.csv")
GPT_DEFAULTS = {"vocab_size": 51200, "seq_length": 2048, "activation": "gelu", "normalization": "layernorm"}
COST_COLUMNS = ("tp", "pp", "batch", "max_batch", "max_num_tokens", "input_len", "output_len",
          "weight_precision", "kv_precision")


@dataclasses.dataclass
class Measured:
    """One engine's published rows and how to predict them."""

    engine: ServingEngine
    metric: str  # "latency_ms" (static batching) or "output_tokens_per_s" (in-flight)
    frame: pd.DataFrame  # model, hardware, COST_COLUMNS, measured, reason, plus the CSV's columns
    models: dict
    memory_fraction: float = 0.9
    decode_steps_is_output_len: bool = False

    @property
    def predicted_rows(self) -> pd.DataFrame:
        return self.frame[self.frame["reason"] == ""]


def _read(path: Path, needed: set[str]) -> pd.DataFrame:
    from autoparallel.measured_runs import read_measured_csv, unreadable_csv
    try:
        frame = read_measured_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise unreadable_csv(path, exc, FT_CSV if needed == set(FT_COLUMNS) else
                             f"a header with the columns {', '.join(sorted(needed))} and a row per measured run") from None
    missing = sorted(needed - set(frame.columns))
    if missing:
        raise UserError(f"{path}: missing column(s) {missing}")
    lines = pd.Series([f"at line {i + 2}" for i in range(len(frame))], index=frame.index)
    return ranges.skip_bad_rows(frame, f"runs CSV {path}", lines, MEASURED_COLUMNS, counts=COUNT_COLUMNS)


# The measured numbers of a serving row: each, where given, finite and positive.
MEASURED_COLUMNS = ("throughput_tokens_per_s", "ttft_ms", "tpot_ms", "latency_ms")
# Its counts, where given (lengths and batch are text in some published rows: "not stated", "max").
COUNT_COLUMNS = ("num_gpus", "tp", "pp")


# The columns of a FasterTransformer runs CSV (the shipped inference_runs.csv, `validate --inference --runs`).
FT_COLUMNS = ("model", "tp", "pp", "input_len", "output_len", "batch_or_concurrency", "latency_ms", "notes")
FT_CSV = (f"a header with the serving columns ({', '.join(FT_COLUMNS)}) and a row per measured run, "
          "as autoparallel/data/inference_runs.csv holds them")


def load_fastertransformer(path: Path | None = None) -> Measured:
    path = Path(path) if path else FT_RUNS
    frame = _read(path, set(FT_COLUMNS))
    a = load_assumptions()["validation"]["fastertransformer"]
    shapes = a["models"]
    unknown = sorted(set(frame["model"]) - set(shapes))
    if unknown:
        raise UserError(f"{path}: no model shape for {unknown} in {ASSUMPTIONS} (validation.fastertransformer.models)")
    models = {name: validation_model(name, shapes[name], {**GPT_DEFAULTS, "ffn_hidden_size": 4 * shapes[name]["hidden_size"]},
                                     f"{ASSUMPTIONS}: validation.fastertransformer")
              for name in frame["model"].unique()}
    if a["decode_steps"] not in ("output_len", "output_len - 1"):
        raise SpecError(f"{ASSUMPTIONS}: validation.fastertransformer.decode_steps must be 'output_len' or 'output_len - 1'")
    frame = frame.copy()
    frame["oom"] = frame["notes"].fillna("").str.startswith("OOM")
    if (frame["latency_ms"].isna() & ~frame["oom"]).any():
        raise UserError(f"{path}: rows without latency_ms must be marked OOM in notes")
    frame["hardware"] = a["hardware"]
    frame["batch"] = frame["batch_or_concurrency"]
    frame["max_batch"] = frame["batch"]
    frame["max_num_tokens"] = np.nan
    frame["weight_precision"] = frame["kv_precision"] = a["precision"]
    frame["measured"] = frame["latency_ms"]
    frame["reason"] = np.where(frame["oom"], "OOM in the source (checked against the memory model)", "")
    return Measured(load_engine(a["engine"]), "latency_ms", frame, models, float(a["memory_fraction"]),
                    a["decode_steps"] == "output_len")


def _settings(entry: dict, model: str, tp: int, seq_len: int) -> dict:
    """max_batch / max_num_tokens a release's benchmark built this model's engine with."""
    per_tp = (entry.get("by_model") or {}).get(model, {}).get(f"tp{tp}")
    if per_tp is None:
        return entry["settings"]
    return per_tp.get(str(seq_len), {k: per_tp[k] for k in ("max_batch", "max_num_tokens")})


def _not_predicted(frame: pd.DataFrame) -> pd.Series:
    """Why a serving_runs.csv row outside the in-flight tables is not predicted."""
    src, notes = frame["source"].fillna(""), frame["notes"].fillna("")
    reason = pd.Series("not an in-flight batching table", index=frame.index)
    reason[notes.str.contains("static batching|static_batching|largest power of 2|max TP/PP/DP|BS1", regex=True)] = (
        "static-batching table (gptSessionBenchmark era)")
    reason[notes.str.contains("1st token latency")] = "TTFT-only table (batch 1, output 1)"
    reason[src.str.contains("NeMo")] = "NeMo / FasterTransformer on Triton (p99 latency with the server in the loop)"
    reason[src.str.contains("vllm-benchmark")] = "vLLM benchmark: input and output lengths not stated"
    return reason


def load_serving_runs(path: Path | None = None) -> list[Measured]:
    """The in-flight rows of serving_runs.csv, one ``Measured`` per engine (release)."""
    path = Path(path) if path else SERVING_RUNS
    raw = _read(path, {"source", "model", "gpu", "tp", "pp", "precision", "input_len", "output_len",
                       "batch_or_concurrency", "throughput_tokens_per_s", "notes"})
    a = load_assumptions()["validation"]["serving_runs"]
    where = f"{ASSUMPTIONS}: validation.serving_runs"
    shapes = a["models"]
    out = []
    for entry in a["inflight"]:
        rows = raw[raw["source"].fillna("").str.contains(f"version {entry['release']}", regex=False)].copy()
        if rows.empty:
            raise UserError(f"{path}: no rows of TensorRT-LLM release {entry['release']} ({where}.inflight)")
        rows["release"] = entry["release"]
        rows["hardware"] = rows["gpu"].map(a["gpus"]).fillna("")
        rows["weight_precision"] = rows["precision"].map(a["precisions"]).fillna("")
        rows["kv_precision"] = rows["weight_precision"]
        rows["input_len"] = pd.to_numeric(rows["input_len"], errors="coerce")
        rows["output_len"] = pd.to_numeric(rows["output_len"], errors="coerce")
        rows["measured"] = rows["throughput_tokens_per_s"]
        reason = pd.Series("", index=rows.index)
        anomalous = rows["notes"].fillna("").str.extract(r"value ([0-9.]+) looks anomalous")[0].astype(float)
        reason[np.isclose(rows["measured"], anomalous)] = "flagged anomalous in the row's notes"
        reason[rows["weight_precision"] == ""] = "precision not mapped"
        reason[rows["hardware"] == ""] = "GPU without a hardware preset"
        reason[~rows["model"].isin(shapes)] = "no model shape"
        rows["reason"] = reason
        settings = [_settings(entry, m, int(t), int(i + o)) if r == "" else {"max_batch": np.nan, "max_num_tokens": np.nan}
                    for m, t, i, o, r in zip(rows["model"], rows["tp"], rows["input_len"], rows["output_len"], reason)]
        rows["max_batch"] = [s["max_batch"] for s in settings]
        rows["max_num_tokens"] = [s["max_num_tokens"] for s in settings]
        rows["batch"] = rows["max_batch"]
        release_shapes = {**shapes, **(entry.get("models") or {})}
        models = {m: validation_model(m, release_shapes[m], {}, where) for m in rows.loc[reason == "", "model"].unique()}
        out.append(Measured(load_engine(entry["engine"]), "output_tokens_per_s", rows, models))
    return out


def not_predicted_serving_rows(path: Path | None = None) -> pd.DataFrame:
    """Every serving_runs.csv row outside the in-flight tables, with the reason."""
    path = Path(path) if path else SERVING_RUNS
    raw = _read(path, {"source", "notes"})
    a = load_assumptions()["validation"]["serving_runs"]
    inflight = np.zeros(len(raw), dtype=bool)
    for entry in a["inflight"]:
        inflight |= raw["source"].fillna("").str.contains(f"version {entry['release']}", regex=False).to_numpy()
    rest = raw[~inflight].copy()
    rest["reason"] = _not_predicted(rest)
    skipped = [m.frame[m.frame["reason"] != ""] for m in load_serving_runs(path)]
    return pd.concat([rest, *skipped])


@lru_cache(maxsize=None)
def _hardware(name: str):
    return io.load_hardware(name)


@dataclasses.dataclass
class _Group:
    """Rows of one model on one GPU: one vectorised cost-model call."""

    positions: np.ndarray  # where these rows sit in the rows given to ``groups``
    model: object
    hw: object
    cols: dict
    decode_steps: np.ndarray
    batch: InflightBatch | StaticBatch  # the rows up to the constants: built once, priced per constants


def groups(measured: Measured, rows: pd.DataFrame) -> list[_Group]:
    """Split ``rows`` by (model, GPU) once, and build what their pricing does not owe to the
    constants (``InflightBatch`` / ``StaticBatch``), so a fit can price them many times."""
    out = []
    engine = measured.engine
    keys = list(zip(rows["model"], rows["hardware"]))
    for key in dict.fromkeys(keys):
        pos = np.array([i for i, k in enumerate(keys) if k == key])
        group = rows.iloc[pos]
        out_len = group["output_len"].to_numpy(dtype=float)
        steps = out_len if measured.decode_steps_is_output_len else out_len - 1
        model, hw, cols = measured.models[key[0]], _hardware(key[1]), {k: group[k].to_numpy() for k in COST_COLUMNS}
        if engine.batching == "static":
            batch = StaticBatch(model, hw, cols, measured.memory_fraction, decode_steps=steps,
                                microbatching=engine.microbatching, flash_attention=engine.flash_attention)
        else:
            batch = InflightBatch(model, hw, engine, cols)
        out.append(_Group(pos, model, hw, cols, steps, batch))
    return out


def _estimate(measured: Measured, eff: InferenceEfficiency, g: _Group) -> tuple[np.ndarray, dict]:
    """(the published metric's prediction, the cost model's columns) of one group."""
    est = g.batch.estimate(eff)
    if measured.engine.batching == "static":
        return est["latency_s"] * 1e3, est
    return est["output_tokens_per_s_per_replica"], est


def predicted_values(measured: Measured, eff: InferenceEfficiency, parts: list[_Group], n: int) -> np.ndarray:
    """The published metric's prediction for ``n`` rows split into ``parts`` (the fit's fast path:
    in-flight rows' throughput alone, ``InflightBatch.throughput``)."""
    out = np.empty(n)
    for g in parts:
        inflight = isinstance(g.batch, InflightBatch)
        out[g.positions] = g.batch.throughput(eff) if inflight else _estimate(measured, eff, g)[0]
    return out


def predict(measured: Measured, eff: InferenceEfficiency, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows (default: every predicted one) with ``predicted``, ``error_pct`` and the cost model's columns."""
    rows = measured.predicted_rows if rows is None else rows
    extra = {"predicted": np.full(len(rows), np.nan)}
    for key in ("ttft_ms", "tpot_ms", "memory_gib"):
        extra[key] = np.full(len(rows), np.nan)
    extra["fits"] = np.zeros(len(rows), dtype=bool)
    for g in groups(measured, rows):
        value, est = _estimate(measured, eff, g)
        extra["predicted"][g.positions] = value
        extra["ttft_ms"][g.positions] = est["ttft_s"] * 1e3
        extra["tpot_ms"][g.positions] = est["tpot_s"] * 1e3
        extra["memory_gib"][g.positions] = est["memory_per_gpu_gib"]
        extra["fits"][g.positions] = est["fits"]
    out = rows.assign(**extra)
    out["error_pct"] = 100.0 * (out["predicted"] - out["measured"]) / out["measured"]
    return out


__all__ = ["Measured", "load_fastertransformer", "load_serving_runs", "not_predicted_serving_rows", "groups",
           "predicted_values", "predict"]
