"""Write ``autoparallel/data/mlperf_inference_v51.csv``: MLPerf Inference v5.1's LLM results on NVIDIA GPUs.

Why: ``validate --inference`` checks the serving simulation on v4.1's results (``mlperf_inference_runs.csv``);
v5.1 (2025-09) adds GPUs (B200, GB200, GB300, H200-NVL, RTX PRO 6000), benchmarks (llama3.1-8b,
llama3.1-405b, deepseek-r1), the Interactive scenario (Server with tighter p99 bounds) and NVFP4
weights, none of which the constants saw: a held-out check.

One row per closed-division result (submitter, system, benchmark, scenario) of the LLM benchmarks on an
NVIDIA GPU (AMD's are ``mlperf_inference_amd_rows.py``'s), in the columns of ``mlperf_inference_runs.csv``
(``../shared/data/README.md``): measured figures from the run's ``mlperf_log_summary.txt`` (tokens/s,
p99 TTFT / TPOT / latency, target QPS, the round's TTFT / TPOT bounds and minimum duration as LoadGen
printed them) and ``mlperf_log_detail.txt`` (the Offline expected QPS the run used), the system from
``systems/<system>.json``, the layout from the NVIDIA harness config the submitter published
(``configs/<system>/<scenario>/<benchmark>.py``, NVIDIA's v5.x layout; the ``WorkloadSetting`` of the
benchmark's accuracy target, MaxP unless the system is a MaxQ one), and from the same setting the serving
path (``serving_path``: trtllm-serve or the C++ executor). A result whose config is not
published (or not in that layout) keeps its row with blank layout and the reason in ``notes``.

Configs are Python modules; they are read with ``ast`` (never executed): module-level names bound to
dict literals, ``{**base, ...}``, ``base | {...}`` and ``dict(base, ...)``, attribute keys
(``llm_fields.tensor_parallelism``) by their attribute name.

    python scripts/mlperf_inference_rows.py            # writes the CSV
    python scripts/mlperf_inference_rows.py --check    # compares with the CSV, exit 1 if it differs
    python scripts/mlperf_inference_rows.py --out F    # writes F instead
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_results import INFERENCE_MIRRORS, SUMMARY, Mirror, inference_results, loadgen_detail, loadgen_summary  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "autoparallel" / "data" / "mlperf_inference_v51.csv"
ROUND = "v5.1"
COLUMNS = ("round,division,submitter,system,gpu,gpus,benchmark,model,scenario,engine,engine_version,tp,pp,ep,"
           "replicas,max_batch,max_num_tokens,weight_precision,kv_precision,tokens_per_s,tokens_per_s_per_gpu,"
           "samples_per_s,target_qps,ttft_p99_ms,tpot_p99_ms,valid,mean_input_len,mean_output_len,source,notes,"
           "gpu_family,ttft_bound_ms,tpot_bound_ms,min_duration_ms,latency_p99_ms,out_tokens_per_sample_perf,"
           "out_tokens_per_sample_acc,nodes,system_name,host_cpu,availability,serving_path").split(",")
#: results directory name -> (model, config file stem, accuracy target of its WorkloadSetting)
BENCHMARKS = {
    "llama2-70b-99": ("llama2-70b", "llama2-70b", "0.99"), "llama2-70b-99.9": ("llama2-70b", "llama2-70b", "0.999"),
    "llama3.1-8b": ("llama3.1-8b", "llama3_1-8b", "0.99"), "llama3_1-8b": ("llama3.1-8b", "llama3_1-8b", "0.99"),
    "llama3.1-405b": ("llama3.1-405b", "llama3_1-405b", "0.99"),
    "llama3_1-405b": ("llama3.1-405b", "llama3_1-405b", "0.99"),
    "mixtral-8x7b": ("mixtral-8x7b", "mixtral-8x7b", "0.99"), "deepseek-r1": ("deepseek-r1", "deepseek-r1", "0.99"),
}
#: the harness config's ``precision`` -> the weight precision's name in the serving cost model
WEIGHTS = {"fp4": "nvfp4", "fp8": "fp8", "fp16": "fp16", "bf16": "bf16"}
#: the systems file's accelerator name (``NVIDIA `` dropped) -> GPU family, as mlperf_inference_runs.csv has it
FAMILY = (("GB300", "GB300"), ("GB200", "GB200"), ("B300", "B300"), ("B200", "B200"), ("GH200", "GH200"),
          ("H200", "H200"), ("H100", "H100"), ("L40S", "L40S"), ("RTX PRO 6000", "RTX PRO 6000"))


# --- a harness config, read without running it ---

class _Env(dict):
    """Module-level names of a config bound so far."""


def _value(node, env: _Env):
    """A config expression's value: literals, dicts (``**`` spread), ``|`` and ``+`` of dicts / numbers,
    names bound earlier, attribute keys by their attribute name, calls by their source text
    (``C.WorkloadSetting(...)``; ``dict(base, k=v)`` as a dict)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                out.update(_value(v, env))
            else:
                out[_key(k, env)] = _value(v, env)
        return out
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, env) for e in node.elts]
    if isinstance(node, ast.Name):
        return env.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, env)
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left, env), _value(node.right, env)
        if isinstance(node.op, ast.BitOr) and isinstance(a, dict):
            return {**a, **b}
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b}
        return ops[type(node.op)]() if type(node.op) in ops else ast.unparse(node)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "dict":
            out = {}
            for a in node.args:
                out.update(_value(a, env))
            out.update({kw.arg: _value(kw.value, env) for kw in node.keywords if kw.arg})
            return out
        return ast.unparse(node)
    return ast.unparse(node)


def _key(node, env):
    return node.attr if isinstance(node, ast.Attribute) else _value(node, env)


def read_config(text: str) -> dict:
    """``EXPORTS`` of a v5.x harness config: {WorkloadSetting source text: settings dict}."""
    env = _Env()
    for stmt in ast.parse(text).body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            env[stmt.targets[0].id] = _value(stmt.value, env)
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)  # base.update({...})
              and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "update"
              and isinstance(stmt.value.func.value, ast.Name)
              and isinstance(env.get(stmt.value.func.value.id), dict) and stmt.value.args):
            env[stmt.value.func.value.id].update(_value(stmt.value.args[0], env))
    exports = env.get("EXPORTS")
    return exports if isinstance(exports, dict) else {}


def pick_setting(exports: dict, target: str, maxq: bool) -> tuple[str, dict] | None:
    """The (key, settings) of the Custom harness at ``target`` accuracy and the system's power setting."""
    power = "MaxQ" if maxq else "MaxP"
    for key, value in exports.items():
        if (isinstance(value, dict) and f"AccuracyTarget({target})" in key.replace(" ", "")
                and f"PowerSetting.{power}" in key and "HarnessType.Custom" in key):
            return key, value
    return None


def config_path(mirror: Mirror, submitter: str, system: str, scenario: str, stem: str) -> str | None:
    """The submitter's config of the result: ``configs/<system>/<scenario>/<stem>.py``, the system's
    name with its ``_TRT`` suffixes dropped if needed (NVIDIA's config directories omit them)."""
    names = [system]
    while names[-1].endswith("_TRT"):
        names.append(names[-1].removesuffix("_TRT"))
    for name in names:
        path = f"closed/{submitter}/configs/{name}/{scenario}/{stem}.py"
        if path in mirror.file_set:
            return path
    return None


# --- one result ---

def _f(x, scale=1.0, digits=None):
    if x is None or x == "":
        return ""
    v = float(x) * scale
    return round(v, digits) if digits is not None else v


def _num(v):
    """A CSV cell: integers without ``.0``, floats as Python prints them, blanks blank."""
    if v is None or v == "":
        return ""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v)) + ".0"
    return str(v)


def layout(settings: dict, model: str, stem: str, gpus: int) -> dict:
    """The row's layout columns from the config's settings (blank where it does not say)."""
    runtime = settings.get("trtllm_runtime_flags") or {}
    build = settings.get("trtllm_build_flags") or {}
    ckpt = settings.get("trtllm_checkpoint_flags") or {}
    tp, pp = int(settings.get("tensor_parallelism", 1)), int(settings.get("pipeline_parallelism", 1))
    ep = settings.get("moe_expert_parallelism")
    batch = settings.get("gpu_batch_size")
    if isinstance(batch, dict):  # keyed by the benchmark's name, dotted or not (llama3.1-8b / llama3_1-8b)
        batch = batch.get(model, batch.get(stem, next(iter(batch.values())) if len(batch) == 1 else None))
    tokens = runtime.get("max_num_tokens", build.get("max_num_tokens"))
    return {"tp": tp, "pp": pp, "ep": int(ep) if ep else "", "replicas": gpus // (tp * pp) if gpus % (tp * pp) == 0 else "",
            "max_batch": int(batch) if batch else "", "max_num_tokens": int(tokens) if tokens else "",
            "weight_precision": WEIGHTS.get(str(settings.get("precision")), str(settings.get("precision") or "")),
            "kv_precision": str(ckpt.get("kv_cache_dtype", "")) or ""}


#: runtime flags only NVIDIA's trtllm-serve path reads (``TrtllmEndpointConfig``, closed/NVIDIA/code/llmlib/config.py)
ENDPOINT_FLAGS = ("workers_per_core", "max_concurrency")


def serving_path(settings: dict) -> str:
    """How the harness serves the row (s52h6): ``trtllm_endpoint`` (trtllm-serve, TensorRT-LLM's PyTorch
    backend by default: ``TrtllmExtraYAMLConfig`` trtllm_backend 'pytorch') when the setting's runtime flags
    carry one the endpoint alone reads, else ``trtllm_executor`` (a TRT engine on the C++ executor).
    Why: NVIDIA's README runs Llama3.1-8b and DeepSeek-R1 with ``--core_type=trtllm_endpoint``, the
    others on the executor, and the two paths schedule and batch differently. Read off the published
    flags, so a run launched on the endpoint whose config sets neither flag would read as executor."""
    runtime = settings.get("trtllm_runtime_flags") or {}
    return "trtllm_endpoint" if any(k in runtime for k in ENDPOINT_FLAGS) else "trtllm_executor"


NOTE_KEYS = ("kvcache_free_gpu_mem_frac", "batch_scheduler_policy", "enable_chunked_context", "enable_attention_dp",
             "moe_backend", "max_concurrency", "gemm_plugin", "gemm_allreduce_plugin", "use_fp8_context_fmha",
             "norm_quant_fusion")


def config_notes(key: str, settings: dict) -> str:
    flags = {**(settings.get("trtllm_build_flags") or {}), **(settings.get("trtllm_runtime_flags") or {})}
    parts = [f"{k}={flags[k]}" for k in NOTE_KEYS if k in flags]
    for k in ("use_graphs", "vboost_slider", "server_target_qps", "offline_expected_qps", "min_duration"):
        if k in settings:
            parts.append(f"config {k}={settings[k]}")
    setting = key.replace("C.", "").replace("WorkloadSetting", "")
    return f"config {setting} | " + "; ".join(parts)


def row(mirror: Mirror, submitter: str, system: str, benchmark: str, scenario: str) -> dict | None:
    """The CSV row of one result (None for a system without an NVIDIA GPU)."""
    base = f"closed/{submitter}/results/{system}/{benchmark}/{scenario}/"
    sysfile = f"closed/{submitter}/systems/{system}.json"
    sysj = json.loads(mirror.show(sysfile) or "{}")
    accel = str(sysj.get("accelerator_model_name", ""))
    if "NVIDIA" not in accel:
        return None
    gpu = accel.replace("Virtualized ", "").removeprefix("NVIDIA ").strip()
    family = next((f for name, f in FAMILY if name in gpu), gpu)
    nodes = int(sysj.get("number_of_nodes") or 1)
    gpus = int(sysj.get("accelerators_per_node") or 0) * nodes
    s = loadgen_summary(mirror.show(base + SUMMARY))
    detail = loadgen_detail(mirror.show(base + "performance/run_1/mlperf_log_detail.txt") or "")
    model, stem, target = BENCHMARKS[benchmark]
    offline = s.get("Scenario") == "Offline"
    tokens = float(s["Tokens per second"] if offline else s["Completed tokens per second"])
    samples = float(s["Samples per second"] if offline else s["Completed samples per second"])
    framework = str(sysj.get("framework", ""))
    engine = "TensorRT-LLM" if framework.startswith("TensorRT") else framework.split(" ")[0]
    r = dict.fromkeys(COLUMNS, "")
    r.update({"round": ROUND, "division": "closed", "submitter": submitter, "system": system, "gpu": gpu,
              "gpus": gpus, "benchmark": benchmark, "model": model, "scenario": scenario, "engine": engine,
              "engine_version": framework.split(",")[0] if engine == "TensorRT-LLM" else framework,
              "tokens_per_s": tokens, "tokens_per_s_per_gpu": round(tokens / gpus, 2) if gpus else "",
              "samples_per_s": samples, "target_qps": "" if offline else float(s["target_qps"]),
              "ttft_p99_ms": "" if offline else _f(s.get("99.00 percentile first token latency (ns)"), 1e-6, 3),
              "tpot_p99_ms": "" if offline else _f(s.get("99.00 percentile time to output token (ns)"), 1e-6, 3),
              "valid": s.get("Result is", ""), "gpu_family": family,
              "ttft_bound_ms": _f(s.get("ttft_latency (ns)"), 1e-6), "tpot_bound_ms": _f(s.get("tpot_latency (ns)"), 1e-6),
              "min_duration_ms": _f(s.get("min_duration (ms)")),
              "latency_p99_ms": _f(s.get("99.00 percentile latency (ns)"), 1e-6, 1),
              "out_tokens_per_sample_perf": round(tokens / samples, 1) if samples else "",
              "nodes": nodes, "system_name": sysj.get("system_name", ""), "host_cpu": sysj.get("host_processor_model_name", ""),
              "availability": sysj.get("status", "")})
    sources = [f"github.com/mlcommons/inference_results_v5.1@{mirror.commit[:12]}: {base}{SUMMARY}", sysfile]
    notes = []
    if detail.get("requested_offline_expected_qps") is not None and offline:
        notes.append(f"run offline_expected_qps={detail['requested_offline_expected_qps']}")
    if detail.get("requested_min_query_count") is not None and offline:  # LoadGen's floor on the query's samples
        notes.append(f"run min_query_count={detail['requested_min_query_count']}")
    notes.append(f"performance_sample_count={s.get('performance_sample_count', '')}")
    path = config_path(mirror, submitter, system, scenario, stem)
    if engine != "TensorRT-LLM":
        notes.append(f"engine {framework}: not NVIDIA's TensorRT-LLM harness")
    elif path is None:
        notes.append("layout not published: no configs/<system>/<scenario>/<benchmark>.py in the submission")
    else:
        picked = pick_setting(read_config(mirror.show(path)), target, "maxq" in system.lower())
        if picked is None:
            notes.append(f"layout not published: {path} has no Custom MaxP setting at accuracy {target}")
        else:
            key, settings = picked
            sources.append(path)
            r.update(layout(settings, model, stem, gpus))
            r["serving_path"] = serving_path(settings)
            if not r["kv_precision"]:
                notes.append("KV cache precision not stated (no trtllm_checkpoint_flags kv_cache_dtype)")
            notes.append(config_notes(key, settings))
    notes.append(f"software: {framework}")
    r["source"] = "; ".join(sources)
    r["notes"] = " | ".join(notes)
    return r


def rows(mirror: Mirror) -> list[dict]:
    out = []
    for submitter, system, benchmark, scenario in inference_results(mirror, tuple(BENCHMARKS)):
        r = row(mirror, submitter, system, benchmark, scenario)
        if r is not None:
            out.append(r)
    return out


def render(rs: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rs:
        w.writerow([_num(r[c]) if isinstance(r[c], float) else r[c] for c in COLUMNS])
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the CSV instead of writing it")
    ap.add_argument("--out", type=Path, default=OUT, help="where to write (default: the shipped CSV)")
    args = ap.parse_args(argv)
    text = render(rows(Mirror(INFERENCE_MIRRORS[ROUND])))
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print("identical" if same else f"{args.out} differs")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({text.count(chr(10)) - 1} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
