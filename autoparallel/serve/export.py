"""A serving layout as the settings serving engines take: vLLM engine arguments and TensorRT-LLM
build / runtime arguments, plus the YAML document of the winner.

Names are the engines' own: vLLM ``EngineArgs`` (tensor_parallel_size, pipeline_parallel_size,
max_num_seqs, quantization, kv_cache_dtype, max_model_len, gpu_memory_utilization, dtype) and
TensorRT-LLM's ``trtllm-build`` / LLM API (tp_size, pp_size, max_batch_size, max_input_len,
max_seq_len, quant_algo, kv_cache_quant_algo). ``replicas`` independent servers share the GPUs
(behind a load balancer); each gets the same arguments.
"""

from __future__ import annotations


def vllm_args(row, input_len: int, output_len: int, memory_fraction: float) -> dict:
    return {
        "tensor_parallel_size": int(row["tp"]),
        "pipeline_parallel_size": int(row["pp"]),
        "max_num_seqs": int(row["batch"]),
        "quantization": "fp8" if row["weight_precision"] == "fp8" else None,
        "kv_cache_dtype": "fp8" if row["kv_precision"] == "fp8" else "auto",
        "dtype": "float16" if row["weight_precision"] == "fp16" else "bfloat16",
        "max_model_len": int(input_len + output_len),
        "gpu_memory_utilization": float(memory_fraction),
    }


def vllm_command(model_name: str, args: dict) -> str:
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in args.items() if v is not None]
    return f"vllm serve <{model_name} checkpoint> " + " ".join(flags)


def trtllm_args(row, input_len: int, output_len: int) -> dict:
    out = {
        "tp_size": int(row["tp"]),
        "pp_size": int(row["pp"]),
        "max_batch_size": int(row["batch"]),
        "max_input_len": int(input_len),
        "max_seq_len": int(input_len + output_len),
        "max_num_tokens": int(max(input_len, 8192)),
    }
    if row["weight_precision"] == "fp8":
        out["quant_algo"] = "FP8"
    if row["kv_precision"] == "fp8":
        out["kv_cache_quant_algo"] = "FP8"
    return out


def best_document(result, row) -> dict:
    """The winner as one YAML document: layout, predicted metrics, engine arguments."""
    from autoparallel.serve.search import record
    r = result.request
    rec = record(row)
    v = vllm_args(row, r.input_len, r.output_len, result.space.memory_fraction)
    return {
        "model": result.model.name,
        "hardware": result.hardware.name,
        "gpus": result.gpus,
        "request": {"input_len": r.input_len, "output_len": r.output_len,
                    "max_latency_ms": r.max_latency_ms, "latency_metric": r.latency_metric},
        "layout": rec["config"],
        "predicted": {k: rec[k] for k in rec if k not in ("config", "breakdown")},
        "breakdown": rec["breakdown"],
        "vllm": {**v, "replicas": int(row["replicas"]), "command": vllm_command(result.model.name, v)},
        "tensorrt_llm": {**trtllm_args(row, r.input_len, r.output_len), "replicas": int(row["replicas"])},
        "note": ("predicted by autoparallel's inference cost model, fitted to FasterTransformer on A100 "
                 "(search_spaces/inference_assumptions.yaml); confirm with the engine's own benchmark"),
    }
