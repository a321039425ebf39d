"""A serving layout as commands a user pastes: ``vllm serve``, ``trtllm-serve``, ``trtllm-bench``, SGLang.

Every flag is one the engine's own argument parser declares, as transcribed (with the
repository, path and commit it was read from) in ``search_spaces/engine_flags.yaml``;
``Command.check`` refuses anything else, and values the parser restricts (``choices``) are
checked too. What each engine is told:

- the layout: TP, PP, and ``replicas`` copies of it (vLLM: one server with
  ``--data-parallel-size``; TensorRT-LLM and SGLang: one server per replica on its own GPUs and
  port, behind a load balancer);
- the scheduler: requests in flight (TensorRT-LLM ``--max_batch_size`` per pipeline micro-batch;
  vLLM ``--max-num-seqs`` and SGLang ``--max-running-requests`` for the whole server, so ``pp``
  times that), the iteration token budget (``--max-num-batched-tokens``,
  ``--max_num_tokens``, ``--chunked-prefill-size``) with chunked prefill on, the longest sequence
  (``--max-model-len``, ``--max_seq_len``, ``--context-length``) and the KV memory share the
  cost model assumed for that engine (``search_spaces/inference_assumptions.yaml``);
- precisions: vLLM and SGLang quantize FP8 weights on load and take the KV cache dtype as a
  flag; TensorRT-LLM reads both from the checkpoint (a ModelOpt FP8 checkpoint carries
  ``quant_algo`` and ``kv_cache_quant_algo``), so its commands name the checkpoint to use.

``trtllm-bench throughput`` reproduces the prediction: the same settings, offline at the
predicted number of requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from autoparallel import io

FLAGS_FILE = io.SEARCH_SPACES / "engine_flags.yaml"
GPUS_PER_NODE = 8


@lru_cache(maxsize=1)
def engine_flags() -> dict:
    return io.read_yaml(FLAGS_FILE)


@dataclass(frozen=True)
class Command:
    """One command line: ``program`` then ``args`` (flag, value or None for a switch), optionally
    a subcommand with its own arguments (checked against ``parser + ' ' + subcommand``)."""

    parser: str  # key of engine_flags.yaml
    program: str
    args: tuple[tuple[str, str | None], ...]
    subcommand: str = ""
    sub_args: tuple[tuple[str, str | None], ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())

    def check(self) -> None:
        """Raise if a flag or value is not one the engine's parser accepts (a bug here, not the user's)."""
        parts = [(self.parser, self.args)]
        if self.subcommand:
            parts.append((f"{self.parser} {self.subcommand}", self.sub_args))
        for parser, args in parts:
            spec = engine_flags()[parser]
            choices = spec.get("choices") or {}
            for flag, value in args:
                if flag not in spec["flags"]:
                    raise RuntimeError(f"{parser} has no flag {flag} ({spec['source']['repo']}@"
                                       f"{spec['source']['commit'][:8]} {spec['source']['path']})")
                if flag in choices and value not in choices[flag]:
                    raise RuntimeError(f"{parser} {flag} {value!r} is not one of {choices[flag]}")

    def text(self) -> str:
        self.check()
        fmt = lambda args: [f"{k} {v}" if v is not None else k for k, v in args]  # noqa: E731
        words = [f"{k}={v}" for k, v in self.env] + [self.program] + fmt(self.args)
        if self.subcommand:
            words += [self.subcommand] + fmt(self.sub_args)
        return " ".join(words)


def _checkpoint(model_name: str, weight_precision: str) -> str:
    return f"<{model_name} FP8 checkpoint>" if weight_precision == "fp8" else f"<{model_name} checkpoint>"


def _in_flight(row) -> int:
    """vLLM's max_num_seqs and SGLang's max_running_requests cap the running requests of the
    whole server; TensorRT-LLM's max_batch_size caps each of the ``pp`` micro-batches."""
    return int(row["max_batch"]) * int(row["pp"])


def _gpus(replica: int, per_replica: int) -> str:
    first = replica * per_replica
    return ",".join(str(g % GPUS_PER_NODE) for g in range(first, first + per_replica))


def vllm_serve(row, model_name: str, max_model_len: int, memory_fraction: float) -> Command:
    args = [("--tensor-parallel-size", str(int(row["tp"]))), ("--pipeline-parallel-size", str(int(row["pp"])))]
    if int(row["replicas"]) > 1:
        args.append(("--data-parallel-size", str(int(row["replicas"]))))
    args += [("--max-num-seqs", str(_in_flight(row))),
             ("--max-num-batched-tokens", str(int(row["max_num_tokens"]))),
             ("--enable-chunked-prefill", None),
             ("--max-model-len", str(max_model_len)),
             ("--gpu-memory-utilization", f"{memory_fraction:g}"),
             ("--dtype", "float16" if row["weight_precision"] == "fp16" else "bfloat16")]
    if row["weight_precision"] == "fp8":
        args.append(("--quantization", "fp8"))
    args.append(("--kv-cache-dtype", "fp8" if row["kv_precision"] == "fp8" else "auto"))
    return Command("vllm serve", f"vllm serve <{model_name} checkpoint>", tuple(args))


def trtllm_serve(row, model_name: str, max_model_len: int, memory_fraction: float) -> list[Command]:
    per_replica = int(row["tp"]) * int(row["pp"])
    out = []
    for k in range(int(row["replicas"])):
        args = (("--backend", "pytorch"), ("--tp_size", str(int(row["tp"]))), ("--pp_size", str(int(row["pp"]))),
                ("--max_batch_size", str(int(row["max_batch"]))),
                ("--max_num_tokens", str(int(row["max_num_tokens"]))),
                ("--max_seq_len", str(max_model_len)), ("--enable_chunked_prefill", None),
                ("--kv_cache_free_gpu_memory_fraction", f"{memory_fraction:g}"), ("--port", str(8000 + k)))
        out.append(Command("trtllm-serve", f"trtllm-serve {_checkpoint(model_name, row['weight_precision'])}", args,
                           env=(("CUDA_VISIBLE_DEVICES", _gpus(k, per_replica)),)))
    return out


def trtllm_bench(row, model_name: str, max_model_len: int, memory_fraction: float) -> Command:
    """The throughput benchmark of one replica at the predicted settings and requests in flight."""
    main = (("--model", f"<{model_name} HF name>"),
            ("--model_path", _checkpoint(model_name, row["weight_precision"])))
    sub = (("--backend", "pytorch"), ("--tp", str(int(row["tp"]))), ("--pp", str(int(row["pp"]))),
           ("--max_batch_size", str(int(row["max_batch"]))), ("--max_num_tokens", str(int(row["max_num_tokens"]))),
           ("--max_seq_len", str(max_model_len)), ("--kv_cache_free_gpu_mem_fraction", f"{memory_fraction:g}"),
           ("--scheduler_policy", "guaranteed_no_evict"), ("--enable_chunked_context", None),
           ("--concurrency", str(int(round(row["concurrency"])))), ("--dataset", "<dataset.jsonl>"))
    return Command("trtllm-bench", "trtllm-bench", main, "throughput", sub)


def sglang(row, model_name: str, max_model_len: int, memory_fraction: float) -> list[Command]:
    per_replica = int(row["tp"]) * int(row["pp"])
    out = []
    for k in range(int(row["replicas"])):
        args = [("--model-path", f"<{model_name} checkpoint>"), ("--tp-size", str(int(row["tp"]))),
                ("--pp-size", str(int(row["pp"]))), ("--max-running-requests", str(_in_flight(row))),
                ("--chunked-prefill-size", str(int(row["max_num_tokens"]))), ("--context-length", str(max_model_len)),
                ("--mem-fraction-static", f"{memory_fraction:g}"),
                ("--dtype", "float16" if row["weight_precision"] == "fp16" else "bfloat16")]
        if row["weight_precision"] == "fp8":
            args.append(("--quantization", "fp8"))
        args += [("--kv-cache-dtype", "fp8_e4m3" if row["kv_precision"] == "fp8" else "auto"),
                 ("--base-gpu-id", str(k * per_replica % GPUS_PER_NODE)), ("--port", str(30000 + k))]
        out.append(Command("sglang", "python -m sglang.launch_server", tuple(args)))
    return out


def commands(row, model_name: str, max_model_len: int) -> dict[str, Command | list[Command]]:
    """Every engine's commands for one layout, with each engine's own KV memory share."""
    from autoparallel.serve.assumptions import load_engine
    share = {name: load_engine(name).kv_memory_fraction for name in ("vllm", "tensorrt-llm", "sglang")}
    return {"vllm": vllm_serve(row, model_name, max_model_len, share["vllm"]),
            "trtllm-serve": trtllm_serve(row, model_name, max_model_len, share["tensorrt-llm"]),
            "trtllm-bench": trtllm_bench(row, model_name, max_model_len, share["tensorrt-llm"]),
            "sglang": sglang(row, model_name, max_model_len, share["sglang"])}


def best_document(result, row) -> dict:
    """The winner as one YAML document: layout, predicted metrics, the engines' commands."""
    from autoparallel.serve.search import record
    r = result.request
    rec = record(row)
    max_model_len = r.max_model_len or r.input_len + r.output_len
    text = lambda c: [x.text() for x in c] if isinstance(c, list) else c.text()  # noqa: E731
    return {
        "model": result.model.name,
        "hardware": result.hardware.name,
        "gpus": result.gpus,
        "engine": result.engine.name,
        "request": {"input_len": r.input_len, "output_len": r.output_len, "max_model_len": max_model_len,
                    "max_ttft_ms": r.max_ttft_ms, "max_tpot_ms": r.max_tpot_ms, "max_e2e_ms": r.max_e2e_ms,
                    "request_rate": r.request_rate},
        "layout": rec["config"],
        "predicted": {k: rec[k] for k in rec if k not in ("config", "serving", "breakdown")},
        "serving": rec["serving"],
        "breakdown": rec["breakdown"],
        "commands": {name: text(c) for name, c in commands(row, result.model.name, max_model_len).items()},
        "note": (f"predicted for {result.engine.name} by autoparallel's serving cost model (constants fitted to "
                 "published measurements, search_spaces/inference_assumptions.yaml); the other engines' commands "
                 "set the same layout and limits. Confirm with the trtllm-bench command (or vLLM's / SGLang's "
                 "own benchmark) before sizing a fleet."),
    }
