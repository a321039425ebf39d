"""Write autoparallel/data/mlperf_training_llama31.csv: MLPerf Training's Llama 3.1 pre-training rows.

MLPerf Training replaced GPT-3 175B with Llama 3.1 405B (v5.0, v5.1) and added Llama 3.1 8B (v5.1).
This reads the MLCommons results mirrors (git directories without a work tree) and writes one row per
NVIDIA-GPU result (NVIDIA and every partner; AMD results are counted and skipped), with exactly the
columns of mlperf_training_gpt3.csv, so that ``measured_runs.from_mlperf`` reads both alike.

Per row:
- the config the submission ran: the ``config_*.sh`` its README names, else the one config of its
  submitter's tree whose node count, GPUs per node and global batch (MINIBS x DP, as NeMo's
  conf/custom.yaml computes it) match the system and the log, narrowed by the learning rate and
  warm-up the log prints (opt_base_learning_rate, opt_learning_rate_warmup_steps) and by a config
  named after the system or kept in its folder; configs named for another GPU (config_GB200_... on a
  B200 system) are not candidates. ``source``d config_common*.sh files are followed (one missing beside
  the config is taken from the submitter's benchmark tree, else NVIDIA's copy: ``BORROWED_SOURCED`` in
  other_knobs; none: ``MISSING_SOURCED``), and what a config leaves unset takes the default its own
  conf/custom.yaml gives (``${oc.env:NAME,default}``). A result whose
  candidates still differ in layout or precision is written with its precision empty and
  ``AMBIGUOUS_CONFIG(...)`` in other_knobs; one with no config at all with ``NO_CONFIG``;
- the layout cross-checked against the log (global_batch_size, gradient_accumulation_steps = MINIBS /
  MBS, max_sequence_length): a mismatch stops the script;
- results whose first log is byte-identical to an earlier round's (Nebius's v5.1 H200 405B
  resubmission of its v5.0 logs) are skipped and listed;
- step_time_s: the mean of the log's tracked_stats train_step_time after dropping the first
  max(2, 10 %) logged points as warm-up, as the GPT-3 rows (the lowest-numbered result_*.txt); every other
  result_*.txt of the system is read too and the spread of their means goes into how_measured.

    python scripts/mlperf_pretrain_rows.py [--v50 DIR] [--v51 DIR] [--out CSV]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path, PurePosixPath

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_results import MIRRORS, Mirror, mllog, truthy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "autoparallel" / "data" / "mlperf_training_llama31.csv"
GPT3 = ROOT / "autoparallel" / "data" / "mlperf_training_gpt3.csv"
BENCHMARKS = {"llama31_405b": ("llama3.1-405b", "405b"), "llama31_8b": ("llama3.1-8b", "8b")}
SEQ_LENGTH = 8192
RESULT = re.compile(r"^([^/]+)/results/([^/]+)/(llama31_405b|llama31_8b)/result_(\d+)\.txt$")
# The config variables other_knobs keeps (effective value, config or custom.yaml default): CUDA graphs,
# the FP8 / FP4 recipe and its TransformerEngine switches, FP8 attention, FP8 parameter gather (FP8_PARAMS in the
# NeMo 25.01 configs, FP8_PARAM_GATHER later), the
# pipeline split, overlap and fusion switches the tool may price.
KNOBS = ("FULL_CUDA_GRAPH", "MCORE_CUDA_GRAPH", "LAYER_CUDA_GRAPH", "CUDA_GRAPH_SCOPE", "FP8_RECIPE", "FP8_HYBRID",
         "FP8_AMAX_HISTORY", "TP_ONLY_AMAX_RED", "FP8_PARAM_GATHER", "FP8_PARAMS", "FP8_DPA", "NVTE_DPA_FP8_RECIPE", "FP4_RECIPE",
         "NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "NVTE_NVFP4_DISABLE_2D_QUANTIZATION",
         "FIRST_LAST_LAYERS_BF16", "NUM_LAYERS_AT_START_IN_BF16", "NUM_LAYERS_AT_END_IN_BF16", "ASYM_PP_EMBED",
         "ASYM_PP_LOSS", "OVERLAP_GRAD_REDUCE", "OVERLAP_PARAM_GATHER", "OVERLAP_PARAM_GATHER_WITH_OPTIM_STEP",
         "DEFER_EMBEDDING_WGRAD_COMPUTE", "USE_TE_OPS", "CE_FUSION_IMPL", "CROSS_ENTROPY_LOSS_FUSION",
         "FUSED_QKV_ROPE", "OVERWRITTEN_NUM_LAYERS")
# The systems a config named after NVIDIA's reference systems was written for (partners' B300 systems
# ran the DGXB200 configs: Nebius configs/nebius_b300_n1/config_DGXB200_1x8x2xtp1pp1cp1_8b.sh).
CONFIG_FAMILY = {"GB300": ("gb300",), "GB200": ("gb200",), "DGXB200": ("b200", "b300"), "DGXH100": ("h100-sxm",),
                 "DGXH200": ("h200",)}
FP8_RECIPES = {"delayed": "fp8-delayed", "tensorwise": "fp8-current", "mxfp8": "mxfp8", "blockwise": "fp8-blockwise"}


def gpu_of(accelerator: str) -> str | None:
    """The tool's hardware preset of a system's accelerator_model_name; None for AMD."""
    name = accelerator.upper()
    if "AMD" in name or "MI3" in name:
        return None
    for key, gpu in (("GB300", "gb300"), ("GB200", "gb200"), ("B300", "b300"), ("B200", "b200"),
                     ("H200-NVL", "h200-nvl"), ("H200", "h200"), ("H100", "h100-sxm")):
        if key in name:
            return gpu
    raise SystemExit(f"unknown accelerator {accelerator!r}")


def yaml_defaults(text: str) -> dict[str, str]:
    """``${oc.env:NAME,default}`` literal defaults of a conf/custom.yaml."""
    return {m.group(1): m.group(2).strip().strip("'\"")
            for m in re.finditer(r"\$\{oc\.env:([A-Z0-9_]+),([^${}]*)\}", text)}


def _expand(value: str, env: dict) -> str:
    value = value.strip()
    if value[:1] in "'\"" and value[-1:] == value[:1]:
        value = value[1:-1]
    if "$(" in value and "$((" not in value:
        return value  # a command substitution (DGXSYSTEM): not needed
    value = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), value)
    value = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)
    arith = re.fullmatch(r"\$\(\((.*)\)\)", value)
    if arith:
        expr = re.sub(r"[A-Za-z_]\w*", lambda m: env.get(m.group(0), "0"), arith.group(1))
        try:
            value = str(int(eval(expr.replace("/", "//"), {"__builtins__": {}})))  # integers only
        except Exception:
            pass
    return value


def run_config(mirror: Mirror, path: str, env: dict | None = None, sourced: list | None = None) -> tuple[dict, list]:
    """The environment a config leaves (``source``d files followed, ``if`` blocks skipped: they only
    act on LOAD_MINIMAL_NUM_SAMPLES=1 / NO_CKPT=1, neither set in a timed run) and the files read."""
    env = {} if env is None else env
    sourced = [] if sourced is None else sourced
    text = mirror.show(path)
    if text is None:
        # A sourced file the submitter left out beside this config: the copy of that name in its own
        # benchmark tree, else in every submitter's tree of the benchmark (Lambda's GB300 config sources
        # NVIDIA's GB200 one), used only where every copy has the same text; else reported missing.
        found = sibling_copy(mirror, path)
        if found is None:
            sourced.append(f"{path} (missing)")
            return env, sourced
        text, origin = found
        sourced.append(f"{path} (absent; same-text copies such as {origin})")
    else:
        sourced.append(path)
    depth = 0
    for raw in text.splitlines():
        line = raw.split(" #")[0].strip() if not raw.strip().startswith("#") else ""
        if not line:
            continue
        if re.match(r"^if\b", line):
            depth += 1
            continue
        if line == "fi" or line.startswith("fi "):
            depth -= 1
            continue
        if depth:
            continue
        m = re.match(r"^(?:source|\.)\s+.*?([\w.-]+\.sh)\s*$", line)
        if m:  # source $(dirname ${BASH_SOURCE[0]})/config_common.sh: a file beside the config
            run_config(mirror, str(PurePosixPath(path).parent / m.group(1)), env, sourced)
            continue
        m = re.match(r'^:\s+"?\$\{(\w+):=([^}]*)\}"?', line)
        if m:
            env.setdefault(m.group(1), m.group(2))
            continue
        m = re.match(r"^unset\s+(\w+)", line)
        if m:
            env.pop(m.group(1), None)
            continue
        m = re.match(r"^(?:export\s+)?(\w+)=(.*)$", line)
        if m:
            env[m.group(1)] = _expand(m.group(2), env)
    return env, sourced


def sibling_copy(mirror: Mirror, path: str) -> tuple[str, str] | None:
    """The text of a file absent at ``path`` that its submitter's benchmark tree, else every
    submitter's tree of the benchmark, holds under the same name relative to an implementation
    folder, when all those copies agree; and one copy's path."""
    parts = path.split("/")
    bench = parts[2]
    tail = "/".join(parts[parts.index("implementations") + 2:]) if "implementations" in parts[:-1] else parts[-1]
    for prefix in (f"{parts[0]}/benchmarks/{bench}/", None):
        paths = [p for p in mirror.files if p != path and p.endswith("/" + tail) and "/benchmarks/" in p
                 and (p.startswith(prefix) if prefix else p.split("/")[2] == bench)]
        texts = {mirror.show(p) for p in paths}
        if len(texts) == 1:
            return texts.pop(), paths[0]
        nvidia = [p for p in paths if p.startswith("NVIDIA/")]
        if prefix is None and nvidia:  # copies differ: NVIDIA's reference implementation, which partners copy
            return mirror.show(nvidia[0]), nvidia[0]
    return None


def custom_yaml(mirror: Mirror, config: str) -> tuple[str | None, dict]:
    """The conf/custom.yaml nearest the config (its directory, then each parent), else the copy
    its benchmark tree holds (``sibling_copy``)."""
    folder = PurePosixPath(config).parent
    while str(folder) not in ("", "."):
        path = f"{folder}/conf/custom.yaml"
        text = mirror.show(path)
        if text is not None:
            return path, yaml_defaults(text)
        folder = folder.parent
    found = sibling_copy(mirror, str(PurePosixPath(config).parent / "conf" / "custom.yaml"))
    return (found[1], yaml_defaults(found[0])) if found else (None, {})


def read_log(text: str) -> dict:
    """The hyper-parameters a result log prints and its per-step train_step_time values."""
    out = {"steps": []}
    for rec in mllog(text):
        key, value = rec.get("key"), rec.get("value")
        if key == "tracked_stats" and isinstance(value, dict) and "train_step_time" in value:
            out["steps"].append(float(value["train_step_time"]))
        elif key in ("global_batch_size", "gradient_accumulation_steps", "max_sequence_length",
                     "opt_base_learning_rate", "opt_learning_rate_warmup_steps", "submission_platform"):
            out.setdefault(key, value)
    return out


def step_time(steps: list[float]) -> tuple[float, int, int]:
    """Mean train_step_time after dropping the first max(2, 10 %) logged points (the GPT-3 rows' rule)."""
    drop = max(2, int(0.1 * len(steps)))
    kept = steps[drop:]
    return sum(kept) / len(kept), len(kept), drop


def layout(env: dict, defaults: dict, gpus: int) -> dict:
    """The layout a config's environment sets, NeMo's conf/custom.yaml filling what it leaves unset."""
    def get(name, fallback=None):
        value = env.get(name, defaults.get(name, fallback))
        return None if value in (None, "", "null", "None") else value
    tp, pp = int(get("TENSOR_MODEL_PARALLEL", 1)), int(get("PIPELINE_MODEL_PARALLEL", 1))
    cp = int(get("CONTEXT_PARALLEL", 1))
    vp = get("INTERLEAVED_PIPELINE")
    vp = 1 if vp in (None, "0") or pp == 1 else int(vp)
    mbs = int(get("MICRO_BATCH_SIZE", 1))
    dp = gpus // (tp * pp * cp)
    if truthy(get("FP4", "False")):
        precision = "nvfp4" if get("FP4_RECIPE", "nvfp4") == "nvfp4" else f"fp4-{get('FP4_RECIPE')}"
    elif truthy(get("FP8", "False")):
        precision = FP8_RECIPES.get(str(get("FP8_RECIPE", "delayed")), f"fp8-{get('FP8_RECIPE')}")
    else:
        precision = "bf16"
    recompute = get("ACT_CKPT_GRANULARITY") or "none"
    knobs = []
    for name in KNOBS:
        value = get(name)
        if value is None:
            continue
        value = str(value).strip("'\"")
        value = {"true": "1", "false": "0"}.get(value.lower(), value)
        knobs.append(f"{name}={value}")
    return {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": int(get("EXPERT_PARALLEL", 1)),
            "sp": truthy(get("SEQ_PARALLEL", "True")) and tp > 1, "micro_batch_size": mbs,
            "global_batch_size": int(get("MINIBS", 0)) * dp, "minibs": int(get("MINIBS", 0)),
            "precision": precision, "recompute": recompute,
            "tp_comm_overlap": truthy(get("TP_COMM_OVERLAP", "False")) and tp > 1,
            "distributed_optimizer": truthy(get("USE_DIST_OPTIMIZER", "True")), "fsdp": False,
            "other_knobs": "; ".join(knobs), "nodes": int(get("DGXNNODES", 0)), "per_node": int(get("DGXNGPU", 0)),
            "model_size": get("MODEL_SIZE", "405b"), "lr": get("LR"), "warmup": get("WARMUP_STEPS")}


def _close(a, b) -> bool:
    return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-6)


def pick_config(mirror: Mirror, submitter: str, system: str, bench: str, gpu: str, gpus: int,
                log: dict) -> tuple[list, str]:
    """The configs consistent with the system and its log, and how they were chosen."""
    readme_hits = []
    for path in mirror.files:  # the README written for this system (README-<system>.md)
        if path.startswith(f"{submitter}/benchmarks/{bench}/") and system in PurePosixPath(path).name \
                and PurePosixPath(path).name.startswith("README"):
            text = mirror.show(path) or ""
            readme_hits += [m.group(0) for m in re.finditer(r"benchmarks/\S+?/config_[\w.-]+\.sh", text)]
    if readme_hits:
        paths = sorted({f"{submitter}/{hit}" for hit in readme_hits if f"{submitter}/{hit}" in mirror.files})
        if paths:
            return paths, "README"
    configs = [p for p in mirror.files if p.startswith(f"{submitter}/benchmarks/llama3")  # HPE's llama3_8b
               and re.search(r"/config_[^/]*\.sh$", p) and not re.search(r"/config_(common|mounts)[^/]*\.sh$", p)]
    size = BENCHMARKS[bench][1]
    fits = []
    for path in configs:
        family = re.match(r"config_(GB300|GB200|DGXB200|DGXH100|DGXH200)_", PurePosixPath(path).name)
        if family and gpu not in CONFIG_FAMILY[family.group(1)]:
            continue
        env, _ = run_config(mirror, path)
        _, defaults = custom_yaml(mirror, path)
        lay = layout(env, defaults, gpus)
        if lay["nodes"] * lay["per_node"] != gpus or lay["model_size"] != size:
            continue
        if lay["global_batch_size"] != int(log["global_batch_size"]):
            continue
        if lay["lr"] is not None and not _close(lay["lr"], log.get("opt_base_learning_rate")):
            continue
        if lay["warmup"] is not None and not _close(lay["warmup"], log.get("opt_learning_rate_warmup_steps")):
            continue
        fits.append(path)
    stem = re.sub(r"^\d+x", "", system)  # Dell's 1xXE9780x8B300-SXM-270GB ran config_XE9780x8B300-SXM-270GB_...
    own = [p for p in fits if p.startswith(f"{submitter}/benchmarks/{bench}/")] or fits
    folder = lambda p: PurePosixPath(p).parent.name  # noqa: E731
    for named, how in (([p for p in own if stem in PurePosixPath(p).name], "config named after the system"),
                       ([p for p in own if folder(p) == system], "config in the system's folder"),
                       ([p for p in own if system.startswith(folder(p))], "config in the system family's folder")):
        if named:
            return named, how
    return own, "match of nodes x GPUs, GBS, LR and warm-up to the log"


def rows_of(round_: str, mirror: Mirror, amd: list, seen_logs: dict, duplicates: list) -> list[dict]:
    results: dict[tuple, list] = {}
    for path in mirror.files:
        m = RESULT.match(path)
        if m:
            results.setdefault(m.groups()[:3], []).append(path)
    rows = []
    for (submitter, system, bench), logs in sorted(results.items()):
        logs.sort(key=lambda p: int(RESULT.match(p).group(4)))
        sys_path = f"{submitter}/systems/{system}.json"
        info = json.loads(re.sub(r",\s*([}\]])", r"\1", mirror.show(sys_path) or "{}"))
        accelerator = str(info.get("accelerator_model_name", ""))
        gpu = gpu_of(accelerator)
        if gpu is None:
            amd.append(f"{round_} {submitter} {system} {bench} ({accelerator})")
            continue
        gpus = int(info["number_of_nodes"]) * int(info["accelerators_per_node"])
        model, size = BENCHMARKS[bench]
        first = mirror.show(logs[0]) or ""
        if first in seen_logs:  # Nebius's v5.1 H200 405B logs are byte-identical to its v5.0 ones
            duplicates.append(f"{round_} {submitter} {system} {bench}: {logs[0]} = {seen_logs[first]}")
            continue
        seen_logs[first] = f"{round_} {logs[0]}"
        parsed = [read_log(mirror.show(p) or "") for p in logs]
        log = parsed[0]
        if int(log["max_sequence_length"]) != SEQ_LENGTH:
            raise SystemExit(f"{logs[0]}: sequence length {log['max_sequence_length']}")
        step, kept, drop = step_time(log["steps"])
        means = [step_time(p["steps"])[0] for p in parsed if len(p["steps"]) > 2]
        spread = f"; the {len(means)} logs' means {min(means):.4g}-{max(means):.4g} s" if len(means) > 1 else ""
        how = (f"mean of tracked_stats train_step_time over {kept} logged points of {PurePosixPath(logs[0]).name} "
               f"(first {drop} of {kept + drop} dropped as warm-up){spread}")
        configs, chosen_by = pick_config(mirror, submitter, system, bench, gpu, gpus, log)
        base = {"round": round_, "submitter": submitter, "system": system, "gpu": gpu, "gpus": gpus, "model": model,
                "seq_length": SEQ_LENGTH, "global_batch_size": int(log["global_batch_size"]),
                "step_time_s": round(step, 4),
                "tokens_per_s_per_gpu": round(int(log["global_batch_size"]) * SEQ_LENGTH / step / gpus, 1),
                "how_measured": how}
        src = f"github.com/mlcommons/training_results_{round_}@{mirror.commit}"
        logs_src = f"log:{logs[0]}"
        if not configs:
            rows.append({**base, "other_knobs": "NO_CONFIG", "source": f"{src} {logs_src} system:{sys_path}"})
            continue
        layouts = []
        for path in configs:
            env, sourced = run_config(mirror, path)
            yaml_path, defaults = custom_yaml(mirror, path)
            layouts.append((path, layout(env, defaults, gpus), sourced, yaml_path))
        keys = ("tp", "pp", "vp", "cp", "micro_batch_size", "global_batch_size", "precision", "other_knobs")
        distinct = {tuple(lay[k] for k in keys) for _, lay, _, _ in layouts}
        path, lay, sourced, yaml_path = layouts[0]
        if len(distinct) > 1:
            names = "|".join(PurePosixPath(p).name for p, *_ in layouts)
            rows.append({**base, "other_knobs": f"AMBIGUOUS_CONFIG({names})",
                         "source": f"{src} {logs_src} system:{sys_path}"})
            continue
        # Cross-check against the log's printed hyper-parameters.
        if lay["global_batch_size"] != int(log["global_batch_size"]):
            raise SystemExit(f"{path}: GBS {lay['global_batch_size']} but the log says {log['global_batch_size']}")
        accumulation = lay["minibs"] / lay["micro_batch_size"]
        if not math.isclose(accumulation, float(log["gradient_accumulation_steps"])):
            raise SystemExit(f"{path}: MINIBS/MBS {accumulation} but the log says {log['gradient_accumulation_steps']}")
        missing = [s for s in sourced if s.endswith("(missing)")]
        borrowed = [s for s in sourced if "(absent;" in s]
        knobs = lay["other_knobs"] + (f"; MISSING_SOURCED={','.join(PurePosixPath(s.split()[0]).name for s in missing)}"
                                      if missing else "")
        knobs += "".join(f"; BORROWED_SOURCED={PurePosixPath(s.split()[0]).name}(from {s.split()[-1].rstrip(')')})"
                         for s in borrowed)
        rows.append({**base, **{k: lay[k] for k in ("micro_batch_size", "tp", "pp", "vp", "cp", "ep", "sp", "precision",
                                                      "recompute", "tp_comm_overlap", "distributed_optimizer", "fsdp")},
                     "other_knobs": knobs,
                     "source": f"{src} config:{path} ({chosen_by}) {logs_src} system:{sys_path}"
                               + (f" defaults:{yaml_path}" if yaml_path else "")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--v50", default=MIRRORS["v5.0"])
    parser.add_argument("--v51", default=MIRRORS["v5.1"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    columns = list(pd.read_csv(GPT3, nrows=0).columns)
    amd: list[str] = []
    seen_logs: dict[str, str] = {}
    duplicates: list[str] = []
    rows = []
    for round_, git_dir in (("v5.0", args.v50), ("v5.1", args.v51)):
        rows += rows_of(round_, Mirror(git_dir), amd, seen_logs, duplicates)
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for name in ("micro_batch_size", "tp", "pp", "vp", "cp", "ep"):  # integers, empty where no config was found
        frame[name] = frame[name].astype("Int64")
    frame.to_csv(args.out, index=False)
    print(f"{len(frame)} NVIDIA-GPU rows to {args.out}; {len(amd)} AMD results skipped:")
    for line in amd:
        print("  ", line)
    print(f"{len(duplicates)} results skipped as byte-identical to an earlier round's:")
    for line in duplicates:
        print("  ", line)
    for _, r in frame.iterrows():
        print(f"{r['round']} {r['submitter']:>22} {r['system']:>40} {r['gpu']:>8} {r['gpus']:>5} {r['model']:>14} "
              f"tp{r['tp']} pp{r['pp']} vp{r['vp']} cp{r['cp']} mbs{r['micro_batch_size']} gbs{r['global_batch_size']} "
              f"{r['precision']} {r['step_time_s']}s")


if __name__ == "__main__":
    main()
