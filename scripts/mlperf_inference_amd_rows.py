"""Write autoparallel/data/mlperf_inference_amd.csv: MLPerf Inference v5.1 LLM results on AMD Instinct GPUs.

Every result of mlcommons/inference_results_v5.1 whose system JSON names an AMD Instinct MI3xx GPU and whose
benchmark is llama2-70b (-99, -99.9; Offline, Server, Interactive) or mixtral-8x7b, closed division, and the
open division's AMD llama2-70b rows (MI355X), in the columns of mlperf_inference_runs.csv (the v4.1 NVIDIA
rows; autoparallel/data/README.md). The measured figures come from the run's ``mlperf_log_summary.txt``
(output tokens/s, samples/s, p99 TTFT / TPOT / latency, the target QPS, the latency bounds and the minimum
duration LoadGen ran under); the layout from the harness config the run used: the measurements README of
the result names it (``main.py --config-path .../harness_llm/models/<model>/ --config-name <name>``), read
from the submitter's own ``code/`` copy of AMD's vLLM harness (its ``vllm_engine_config`` over the harness's base config.yaml:
tensor_parallel_size, max_num_seqs as max_batch, max_num_batched_tokens as max_num_tokens, quantization,
kv_cache_dtype, block_size, gpu_memory_utilization, enable_chunked_prefill, num_scheduler_steps, in the
notes), and the GFX clock the harness's ``scripts/power_settings.sh`` holds for the model, scenario and GPU
(``rocm-smi --setperfdeterminism``, in the notes). The harness runs one engine per GPU group: replicas = GPUs / (TP x PP), ``harness_config.device_count``
GPUs in all. A result whose config cannot be found (MangoBoost's LLMBoost publishes none) keeps its
measured figures with a blank layout and the reason in ``notes``; a MXFP4 model (MI355X) is written as run
(``weight_precision`` mxfp4) with the reason the validation skips it. Re-run after a new round is mirrored:

    python scripts/mlperf_inference_amd_rows.py [--mirror GIT_DIR] [--out CSV]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_results import Mirror, write_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "autoparallel" / "data" / "mlperf_inference_amd.csv"
COLUMNS_FROM = ROOT / "autoparallel" / "data" / "mlperf_inference_runs.csv"
MIRROR = "/work/.mirror/mlcommons+inference_results_v5.1/repo"
ROUND = "v5.1"
GPU = re.compile(r"AMD Instinct (MI3[0-9]{2}X)", re.I)
RESULT = re.compile(r"(closed|open)/([^/]+)/results/([^/]+)/([^/]+)/([^/]+)/performance/run_1/mlperf_log_summary\.txt")
# benchmark folder -> the model column; the dataset's mean output length (the data README: OpenOrca 294.45,
# the Mixtral mix 144.84 tokens), as mlperf_inference_runs.csv states it
MODELS = {"llama2-70b-99": "llama2-70b", "llama2-70b-99.9": "llama2-70b", "mixtral-8x7b": "mixtral-8x7b"}
MEAN_OUTPUT = {"llama2-70b": 294.45, "mixtral-8x7b": 144.84}
# The open division's other MI3xx rows (Krai's llama3.1-70b, AMD's pruned / fine-tuned 405B) change the model.
OPEN_SUBMITTERS = ("AMD",)
# vLLM's kv_cache_dtype "auto" stores K/V in the model's dtype; the AMD llama2-70b checkpoint is exported as
# float16 (closed/AMD/setup/dataset_and_model/quantize_llama2_70b.sh: --data_type float16). AMD's base
# config sets fp8, so no v5.1 row is "auto".
AUTO_KV = "fp16"
# vllm_engine_config keys written to notes (what the simulation reads besides the layout columns)
ENGINE_KEYS = ("block_size", "gpu_memory_utilization", "enable_chunked_prefill", "num_scheduler_steps",
               "enforce_eager", "quantization", "kv_cache_dtype")
ENV_KEYS = ("VLLM_LLAMA2_MLPERF_SCHED", "VLLM_LLAMA2_MLPERF_MAX_TARGET_DECODE_BATCH",
            "VLLM_LLAMA2_MLPERF_MIN_TARGET_DECODE_BATCH", "VLLM_LLAMA2_MLPERF_MIN_REQUIRE_PREFILL_QUERY", "VLLM_USE_V1")


def summary_fields(text: str) -> dict[str, str]:
    """``name : value`` lines of an mlperf_log_summary.txt (the first of a repeated name)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([^:=]+?)\s*:\s*(\S.*?)\s*$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2)
    return out


def ns_to_ms(value: str | None) -> float | str:
    return round(int(value) / 1e6, 2) if value else ""


def harness_config(mirror: Mirror, division: str, submitter: str, system: str, bench: str, scenario: str,
                   model: str) -> tuple[str, dict] | tuple[None, str]:
    """(path, parsed YAML) of the harness config the measurements README runs, or (None, why not)."""
    readme = mirror.show(f"{division}/{submitter}/measurements/{system}/{bench}/{scenario}/README.md") or ""
    names = set(re.findall(r"--config-name\s+(\S+)", readme))
    if len(names) != 1:
        return None, ("layout not published: the measurements README names no harness config"
                      if not names else f"AMBIGUOUS: the README names {sorted(names)}")
    name = names.pop()
    code = set(re.findall(r"/code/([^/\s]+)/main\.py", readme))
    tail = f"/harness_llm/models/{model}/{name}.yaml".lower()
    found = [f for f in mirror.files if f.startswith(f"{division}/{submitter}/") and f.lower().endswith(tail)]
    mine = [f for f in found if any(f"/code/{c}/" in f for c in code)]
    path = (mine or sorted(found) or [None])[0]
    if path is None:
        return None, f"layout not published: no {name}.yaml for {model} in {submitter}'s code"
    return path, merged(mirror, path)


def merged(mirror: Mirror, path: str) -> dict:
    """The model config over the harness's base config, section by section, as the harness merges them
    (harness_llm/common/config_parser.py: ``OmegaConf.merge(base_config, model_cfg)``, the base
    ``harness_llm/common/config.yaml`` beside the model config: e.g. kv_cache_dtype fp8, dtype float16,
    VLLM_USE_V1 0 where the model config sets none)."""
    cfg = yaml.safe_load(mirror.show(path)) or {}
    base = yaml.safe_load(mirror.show(path.split("/harness_llm/")[0] + "/harness_llm/common/config.yaml") or "") or {}
    out = dict(base)
    for key, value in cfg.items():
        out[key] = {**(base.get(key) or {}), **value} if isinstance(value, dict) else value
    return out


def gfx_clock_mhz(mirror: Mirror, config: str, model: str, scenario: str, gpu: str) -> tuple[int, str] | None:
    """(MHz, path) of the GFX clock cap AMD's harness sets for the run: ``run_harness.sh`` sources
    ``scripts/power_settings.sh <model> <gpu> <scenario>`` beside ``main.py``, which runs ``rocm-smi
    --setperfdeterminism <MHz>`` (performance determinism: the GFX clock held at that MHz) per model,
    scenario and GPU; None where the submitter's code has no such script or it sets none."""
    code = config.split("/harness_llm/")[0]
    path = f"{code}/scripts/power_settings.sh"
    text = mirror.show(path)
    if not text:
        return None
    name = f"{model}_{scenario.lower()}" if model == "llama2-70b" else model
    body = re.search(rf"^{re.escape(name)}\(\)\s*\{{(.*?)^\}}", text, re.S | re.M)
    if not body:
        return None
    branches = re.split(r'GPU_NAME"\s*==\s*"', body.group(1))
    for branch in branches[1:] if len(branches) > 1 else branches:
        if len(branches) > 1 and not branch.startswith(f'{gpu}"'):
            continue
        mhz = re.search(r"--setperfdeterminism\s+([0-9]+)", branch.split("elif")[0])
        return (int(mhz.group(1)), path) if mhz else None
    return None


def row_of(mirror: Mirror, path: str) -> dict | None:
    division, submitter, system, bench, scenario = RESULT.fullmatch(path).groups()
    model = MODELS.get(bench)
    if model is None or (division == "open" and submitter not in OPEN_SUBMITTERS):
        return None
    sys_path = f"{division}/{submitter}/systems/{system}.json"
    desc = json.loads(mirror.show(sys_path) or "{}")
    accel = desc.get("accelerator_model_name", "")
    if not GPU.search(accel):
        return None
    nodes, per_node = int(desc["number_of_nodes"]), int(desc["accelerators_per_node"])
    gpus = nodes * per_node
    s = summary_fields(mirror.show(path))
    offline = scenario == "Offline"
    tokens = float(s["Tokens per second"] if offline else s["Completed tokens per second"])
    samples = float(s["Samples per second"] if offline else s["Completed samples per second"])
    row = {"round": ROUND, "division": division, "submitter": submitter, "system": system, "gpu": accel,
           "gpus": gpus, "benchmark": bench, "model": model, "scenario": scenario, "engine": "vLLM",
           "tokens_per_s": tokens, "tokens_per_s_per_gpu": round(tokens / gpus, 2), "samples_per_s": samples,
           "target_qps": "" if offline else float(s["target_qps"]),
           "ttft_p99_ms": "" if offline else ns_to_ms(s.get("99.00 percentile first token latency (ns)")),
           "tpot_p99_ms": "" if offline else ns_to_ms(s.get("99.00 percentile time to output token (ns)")),
           "valid": s.get("Result is", ""), "mean_input_len": "", "mean_output_len": MEAN_OUTPUT[model],
           "gpu_family": GPU.search(accel).group(1).upper() if "(" not in accel else "",
           "ttft_bound_ms": ns_to_ms(s.get("ttft_latency (ns)")), "tpot_bound_ms": ns_to_ms(s.get("tpot_latency (ns)")),
           "min_duration_ms": float(s["min_duration (ms)"]),
           "latency_p99_ms": ns_to_ms(s.get("99.00 percentile latency (ns)")),
           "out_tokens_per_sample_perf": round(tokens / samples, 1), "out_tokens_per_sample_acc": "",
           "nodes": nodes, "system_name": desc.get("system_name", "").strip(),
           "host_cpu": desc.get("host_processor_model_name", ""), "availability": desc.get("status", "")}
    framework = desc.get("framework", "")
    version = re.search(r"vllm[- ]v?([0-9][^,\s]*)", framework, re.I)
    row["engine_version"] = f"vLLM {version.group(1)}" if version else framework
    notes = [f"software: {framework}"]
    if offline:
        notes.append(f"offline_expected_qps={s['target_qps']}; samples_per_query={s['samples_per_query']}")
    config, cfg = harness_config(mirror, division, submitter, system, bench, scenario, model)
    sources = [path, sys_path]
    if config is None:
        notes.insert(0, cfg)
    else:
        sources.append(config)
        eng, env = cfg.get("vllm_engine_config") or {}, cfg.get("vllm_env_config") or {}
        devices = int((cfg.get("harness_config") or {}).get("device_count", gpus))
        tp, pp = int(eng.get("tensor_parallel_size", 1)), int(eng.get("pipeline_parallel_size", 1))
        quant = str(eng.get("quantization", "")).lower()
        mx = "mxfp4" in str(eng.get("model", "")).lower() or "mxfp4" in str(cfg.get("model_path", "")).lower()
        kv = str(eng.get("kv_cache_dtype", "auto")).lower()
        row.update(tp=tp, pp=pp, replicas=devices // (tp * pp), max_batch=int(eng["max_num_seqs"]),
                   max_num_tokens=int(eng["max_num_batched_tokens"]),
                   weight_precision="mxfp4" if mx else ("fp8" if quant == "fp8" else quant or "bf16"),
                   kv_precision=AUTO_KV if kv == "auto" else kv)
        if mx:
            notes.insert(0, "MXFP4 weights and activations (OCP MX block scaling): the tool's FP4 is NVFP4 only")
        if devices != gpus:
            notes.insert(0, f"harness device_count {devices} != the system's {gpus} GPUs")
        notes.append("config " + "; ".join(f"{k}={eng[k]}" for k in ENGINE_KEYS if k in eng))
        env_set = [f"{k}={env[k]}" for k in ENV_KEYS if k in env]
        if env_set:
            notes.append("env " + "; ".join(env_set))
        if kv == "auto":
            notes.append(f"kv: kv_cache_dtype not set (vLLM 'auto': the model's dtype, {AUTO_KV})")
        clock = gfx_clock_mhz(mirror, config, model, scenario, GPU.search(accel).group(1).lower())
        if clock:
            notes.append(f"perfdeterminism_mhz={clock[0]} ({clock[1]}, sourced by run_harness.sh)")
    if nodes > 1:
        notes.insert(0, f"multi-node ({nodes} nodes)" + (", mixed GPUs" if "(" in accel else ""))
    row["source"] = f"github.com/mlcommons/inference_results_v5.1@{mirror.commit[:12]}: " + "; ".join(sources)
    row["notes"] = " | ".join(notes)
    return row


def rows_of(repo: str) -> list[dict]:
    mirror = Mirror(repo)
    return [r for r in (row_of(mirror, f) for f in mirror.files if RESULT.fullmatch(f)) if r is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=MIRROR, help="git dir of mlcommons/inference_results_v5.1")
    parser.add_argument("--out", type=Path, default=OUT, help="CSV to write (default: the shipped one)")
    args = parser.parse_args()
    rows = rows_of(args.mirror)
    write_rows(args.out, COLUMNS_FROM, rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
