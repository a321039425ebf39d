"""Write autoparallel/data/mlperf_training_lora_blackwell.csv: MLPerf Training Llama-2-70B LoRA on Blackwell.

Every llama2_70b_lora result of MLPerf Training v5.0 and v5.1 on B200, B300, GB200 or GB300 (NVIDIA and
every partner the results repositories hold), one row per system, in the columns of
mlperf_training_lora_hopper.csv. The rows are a held-out check (never fitted), so every value comes
from the submission itself:

- the GPU and GPU count from the system's ``systems/<system>.json`` (accelerator_model_name,
  number_of_nodes x accelerators_per_node); AMD systems are counted and skipped (no AMD preset);
- the layout from the ``config_*.sh`` the run sourced (``source``s of config_common*.sh followed):
  the config the log names (the ``:::DLPAL`` line ends with the config's DGXSYSTEM), else the one
  config of the submitter's llama2_70b_lora tree whose node count, GPU count, global batch and
  gradient accumulation equal the system's and the log's (``AMBIGUOUS`` in other_knobs where several
  disagree on a knob); the global batch is NeMo's ``MINIBS x GPUs / (TP x PP x CP)``
  (conf/megatron_gpt_peft_tuning_config.yaml), gradient accumulation ``MINIBS / MBS``;
- cross-checked against what the logs print: global_batch_size and gradient_accumulation_steps (every
  log), and where a log prints NeMo's resolved config (``tensor_model_parallel_size: 1`` ...) each
  layout knob; a disagreement fails the script (``--lenient`` lists them instead);
- the step time from every result_*.txt of the system (the hopper file used one): per log, v5.0's
  GBS / mean tracked_stats ``throughput`` (samples/s) and v5.1's mean tracked_stats
  ``train_step_time`` (its logs print no throughput), each log's first point dropped as warm-up as
  the hopper rows did; the row's value is the median over the logs. FP4 runs (config_common_fp4.sh:
  NVFP4 GEMMs until HEALING_ITER, then TransformerEngine's FP8 delayed scaling, the "healing") are
  measured over the blocks that end at or before HEALING_ITER only: the NVFP4 phase, the layout's
  precision.

Run from the repository root (no arguments needed; the mirrors are git directories without a work
tree)::

    python scripts/mlperf_lora_rows.py [--v50 DIR] [--v51 DIR] [--lenient]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_results import MIRRORS, Mirror, truthy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "autoparallel" / "data" / "mlperf_training_lora_blackwell.csv"
HOPPER = ROOT / "autoparallel" / "data" / "mlperf_training_lora_hopper.csv"
SEQ = 8192
# accelerator_model_name (systems/*.json) -> hardware preset.
GPUS = (("GB300", "gb300"), ("GB200", "gb200"), ("B300", "b300"), ("B200", "b200"))
AMD = re.compile(r"AMD|Instinct|MI3\d\d")
# NeMo's defaults where a config sets nothing (conf/megatron_gpt_peft_tuning_config.yaml of both rounds).
DEFAULTS = {"TP": "1", "PP": "1", "CP": "1", "MBS": "1", "MINIBS": "1", "SP": "0", "FP8": "True", "FP4": "False",
            "FP8_DPA": "0", "FP8_ACT": "0", "FP8_AMAX_HISTORY": "128", "LAYER_CUDA_GRAPH": "False",
            "MCORE_CUDA_GRAPH": "False", "CUDA_GRAPH_SCOPE": "full_iteration", "TP_COMM_OVERLAP": "False",
            "USE_DISTRIBUTED_OPTIMIZER": "True", "HEALING_ITER": "0", "FP4_RECIPE": "nvfp4",
            "HEALING_PRECISION": "FP8_DS", "LORA_A2A": "0", "FP8_PARAM_GATHER": "False", "CP_COMM_TYPE": "a2a",
            "RECOMPUTE_GRANULARITY": "null", "FSDP": "null", "DDP_OVERLAP_GRAD_REDUCE": "False",
            "DDP_OVERLAP_PARAM_GATHER": "False"}
# NeMo's resolved config as some logs print it (key: value under model:/optim:), against the config's
# variable it comes from.
PRINTED = {"tensor_model_parallel_size": "TP", "pipeline_model_parallel_size": "PP",
           "context_parallel_size": "CP", "micro_batch_size": "MBS", "fp4": "FP4", "fp8": "FP8",
           "fp8_dot_product_attention": "FP8_DPA", "enable_cuda_graph": "MCORE_CUDA_GRAPH",
           "external_cuda_graph": "LAYER_CUDA_GRAPH", "healing_iter": "HEALING_ITER",
           "activation_func_fp8_input_store": "FP8_ACT", "cuda_graph_scope": "CUDA_GRAPH_SCOPE",
           "ub_tp_comm_overlap": "TP_COMM_OVERLAP"}


def shell_env(repo: Mirror, path: str, env: dict | None = None) -> dict:
    """The variables a config_*.sh exports, its ``source``d files read first where it sources them
    (``source $(dirname ${BASH_SOURCE[0]})/config_common.sh``): ``export NAME=value`` lines, with
    ``${VAR}`` / ``${VAR:-default}`` substituted and ``$(( ... ))`` evaluated where it is arithmetic."""
    env = {} if env is None else env
    text = repo.show(path) or ""
    folder = path.rsplit("/", 1)[0]
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip().rstrip(";")
        if not line or line.startswith("#"):
            continue
        src = re.match(r"(?:source|\.)\s+.*?([\w.\-]+\.sh)[\"']?$", line)
        if src:
            # Wiwynn's configs/ sources a config_common.sh that sits one folder up: read that one.
            # A file the folder lacks (Wiwynn's configs/ sources the config_common.sh one folder up;
            # University of Florida's hpg.dgxb200x8 holds none): the nearest one of that name in the
            # submitter's llama2_70b_lora tree, noted.
            near = f"{folder}/{src.group(1)}"
            if near not in repo.file_set:
                tree = path.split("/llama2_70b_lora/")[0] + "/llama2_70b_lora/"
                found = sorted((f for f in repo.files if f.startswith(tree) and f.endswith("/" + src.group(1))),
                               key=lambda f: (not f.startswith(folder.rsplit("/", 1)[0]), f))
                if not found:
                    env.setdefault("_NOTES", []).append(f"sources {src.group(1)}, which the submission does not hold")
                    continue
                env.setdefault("_NOTES", []).append(f"{src.group(1)} absent from the config's folder: read {found[0]}")
                near = found[0]
            shell_env(repo, near, env)
            continue
        m = re.match(r"(?:export\s+)?([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if not m:
            continue
        name, value = m.group(1), m.group(2).strip().strip("'\"")

        def sub(match):
            var, default = match.group(1), match.group(3)
            return env.get(var, default if default is not None else "")
        value = re.sub(r"\$\{(\w+)(:-([^}]*))?\}", sub, value)
        value = re.sub(r"\$(\w+)", lambda mm: env.get(mm.group(1), ""), value)
        arith = re.fullmatch(r"\$\(\((.*)\)\)", value)
        if arith and re.fullmatch(r"[\d\s+\-*/()]+", arith.group(1)):
            value = str(int(eval(arith.group(1).replace("/", "//"))))  # digits and operators only
        env[name] = value
    return env


def layout(env: dict) -> dict:
    """The knobs of a config's environment, NeMo's defaults where it sets none."""
    get = lambda k: env.get(k, DEFAULTS.get(k, ""))  # noqa: E731
    tp, pp, cp, mbs, minibs = (int(get(k)) for k in ("TP", "PP", "CP", "MBS", "MINIBS"))
    nodes, per_node = int(env.get("DGXNNODES", 0) or 0), int(env.get("DGXNGPU", 8) or 8)
    gpus = nodes * per_node
    return dict(notes=tuple(env.get("_NOTES", ())), gpus=gpus, nodes=nodes, tp=tp, pp=pp, cp=cp, mbs=mbs,
                gbs=minibs * (gpus // (tp * pp)) // cp,
                ga=minibs // mbs, sp=truthy(get("SP")), fp4=truthy(get("FP4")), fp8=truthy(get("FP8")),
                fp8_dpa=truthy(get("FP8_DPA")), fp8_act=truthy(get("FP8_ACT")),
                amax_history=get("FP8_AMAX_HISTORY"), layer_cg=truthy(get("LAYER_CUDA_GRAPH")),
                mcore_cg=truthy(get("MCORE_CUDA_GRAPH")), cg_scope=get("CUDA_GRAPH_SCOPE"),
                tp_overlap=truthy(get("TP_COMM_OVERLAP")), dist_opt=truthy(get("USE_DISTRIBUTED_OPTIMIZER")),
                healing_iter=int(get("HEALING_ITER") or 0), fp4_recipe=get("FP4_RECIPE"),
                healing_precision=get("HEALING_PRECISION"), lora_a2a=truthy(get("LORA_A2A")),
                fp8_param_gather=truthy(get("FP8_PARAM_GATHER")), cp_comm_type=get("CP_COMM_TYPE"),
                recompute=get("RECOMPUTE_GRANULARITY"), fsdp=get("FSDP"),
                overlap_grad=truthy(get("DDP_OVERLAP_GRAD_REDUCE")),
                overlap_param=truthy(get("DDP_OVERLAP_PARAM_GATHER")),
                rht_off=truthy(env.get("NVTE_NVFP4_DISABLE_RHT", "0")),
                q2d_off=truthy(env.get("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "0")))


def peft_conf(repo: Mirror, config: str) -> tuple[str, str | None]:
    """The implementation's conf/megatron_gpt_peft_tuning_config.yaml and, where the config's folders
    hold none (Oracle's, Supermicro's, Lambda's and the University of Florida's folders ship configs
    only), the path read instead: the submitter's own Blackwell (NeMo 2) one, else NVIDIA's of the
    round (every partner's base). v5.1's passes MCore a ``cuda_graph_scope`` (default full_iteration:
    MCORE_CUDA_GRAPH graphs the whole forward-backward), v5.0's does not (MCore's per-layer graphs) and
    sets ``fp8_params: ${FP8}`` (FP8 primary weights), which v5.1's no longer has."""
    name = "conf/megatron_gpt_peft_tuning_config.yaml"
    folder = config.rsplit("/", 1)[0]
    while "/llama2_70b_lora" in folder:
        if f"{folder}/{name}" in repo.file_set:
            return repo.show(f"{folder}/{name}") or "", None
        folder = folder.rsplit("/", 1)[0]
    for who in (config.split("/", 1)[0], "NVIDIA"):
        found = sorted(f for f in repo.files if f.startswith(f"{who}/") and "/llama2_70b_lora/" in f
                       and f.endswith("/" + name) and not re.search(r"MI3\d\d|/src/", f))
        # The Blackwell implementations' (NeMo 2, train.py) conf reads cp_comm_type; a Hopper
        # submission's NeMo 1 conf (Oracle's H200 folders) does not, and is not the code these ran.
        found = [f for f in found if "cp_comm_type" in (repo.show(f) or "")]
        if found:
            return repo.show(found[0]) or "", found[0]
    return "", None


def lora_configs(repo: Mirror, submitter: str) -> list[str]:
    """The submitter's llama2_70b_lora config_*.sh files (not config_common*, config_mounts, nor the
    vendored Megatron-LM / NeMo trees)."""
    out = []
    for f in repo.files:
        if not f.startswith(f"{submitter}/") or "/llama2_70b_lora/" not in f or "/results/" in f:
            continue
        name = f.rsplit("/", 1)[-1]
        if (re.fullmatch(r"config_.*\.sh", name) and not re.search(r"common|mounts", name)
                and not re.search(r"/(Megatron-LM|NeMo|src)/", f) and not re.search(r"MI3\d\d", name)):
            out.append(f)
    return out


def log_facts(text: str) -> dict:
    """What one result log states: GBS, gradient accumulation, the config it names (DLPAL), the
    resolved NeMo config it prints (if any), its per-block throughput / step time with each block's
    last step."""
    def key(name):
        m = re.search(rf'"key": "{name}", "value": (\d+)', text)
        return int(m.group(1)) if m else None
    dlpal = re.search(r"^(?:\d+: )?:::DLPAL .* '?([\w.+\-]+)'?\s*$", text, re.M)
    printed = {}
    for k in PRINTED:
        m = re.search(rf"^(?:\d+: )?\s+{k}: (\S+)\s*$", text, re.M)
        if m:
            printed[k] = m.group(1)
    blocks = []
    for line in text.splitlines():
        stats = re.search(r'"key": "tracked_stats", "value": (\{[^}]*\})', line)
        value = json.loads(stats.group(1)) if stats else {}
        if "throughput" in value or "train_step_time" in value:
            blocks.append(dict(value, end_step=None))  # its last step: the next line that states one
            continue
        step = re.search(r'"step": (\d+)', line)
        if step and blocks and blocks[-1]["end_step"] is None:
            blocks[-1]["end_step"] = int(step.group(1))
    return dict(gbs=key("global_batch_size"), ga=key("gradient_accumulation_steps"),
                dlpal=dlpal.group(1) if dlpal else None, printed=printed, blocks=blocks)


def step_time(facts: dict, gbs: int, healing_iter: int, fp4: bool) -> tuple[float, int, int] | None:
    """One log's step time: GBS / mean throughput where it logs throughput (v5.0), else the mean
    train_step_time (v5.1), its first block dropped; FP4 runs' NVFP4 blocks only (those ending at
    or before HEALING_ITER). Returns (seconds, points used, points logged)."""
    blocks = facts["blocks"]
    if fp4 and healing_iter:
        blocks = [b for b in blocks if b["end_step"] is not None and b["end_step"] <= healing_iter]
    if len(blocks) < 2:
        return None
    kept = blocks[1:]
    if all("throughput" in b for b in blocks):
        return gbs / statistics.mean(b["throughput"] for b in kept), len(kept), len(blocks)
    return statistics.mean(b["train_step_time"] for b in kept), len(kept), len(blocks)


def gpu_of(system: dict) -> str | None:
    name = str(system.get("accelerator_model_name", ""))
    return next((preset for token, preset in GPUS if token in name), None)


def choose_config(repo: Mirror, submitter: str, system: str, gpus: int, gpu: str,
                  logs: list[dict]) -> tuple[str, dict, list[str]]:
    """The config a system ran (see the module docstring), its layout, and notes. Among several
    candidates: those that agree with what the logs print, then those in a folder or of a name that
    carries the system's name, then those of the GPU's name."""
    configs = lora_configs(repo, submitter)
    named = {f.rsplit("/", 1)[-1][len("config_"):-len(".sh")] for f in configs}
    notes = []
    gbs, ga = logs[0]["gbs"], logs[0]["ga"]
    dlpal = next((log["dlpal"] for log in logs if log["dlpal"]), None)
    envs = {f: layout(shell_env(repo, f)) for f in configs}
    fits = [f for f, lay in envs.items() if lay["gpus"] == gpus and lay["gbs"] == gbs and lay["ga"] == ga]
    token = {"gb300": "GB300", "gb200": "GB200", "b300": "B300", "b200": "B200"}[gpu]
    bare = re.sub(r"^\d+x", "", system)

    def narrow(pool, *tests):
        for test in tests:
            kept = [f for f in pool if test(f)]
            pool = kept or pool
        return pool
    agrees = lambda f: not cross_check(envs[f], logs)  # noqa: E731
    def by_system(f):
        folders = f.split("/")[3:-1]  # below <submitter>/benchmarks/llama2_70b_lora/
        return (bare in f.rsplit("/", 1)[-1]
                or any(d == system or (len(d) > 3 and system.startswith(d)) for d in folders if d != "implementations"))
    if dlpal and dlpal in named:
        chosen = [f for f in configs if f.endswith(f"/config_{dlpal}.sh")]
        pool = narrow(chosen, lambda f: f in fits, agrees, by_system)
        if len(chosen) > 1:
            notes.append(f"log names config_{dlpal}.sh, held in {len(chosen)} folders; took the one "
                         "that matches the logs and the system")
        return pool[0], envs[pool[0]], notes
    if dlpal:
        notes.append(f"log names config {dlpal}, which the submission does not hold")
    if not fits:
        return same_layout_config(repo, submitter, gpus, gpu, token, gbs, ga, notes)
    preferred = narrow(fits, agrees, by_system, lambda f: token in f.rsplit("/", 1)[-1])
    knobs = lambda f: {k: v for k, v in envs[f].items() if k != "nodes"}  # noqa: E731
    if len({json.dumps(knobs(f), sort_keys=True) for f in preferred}) > 1:
        notes.append("AMBIGUOUS: several configs match ("
                     + ";".join(f.rsplit("/", 1)[-1] for f in preferred) + "); took first")
    return preferred[0], envs[preferred[0]], notes


def same_layout_config(repo: Mirror, submitter: str, gpus: int, gpu: str, token: str, gbs: int, ga: int,
                       notes: list[str]) -> tuple[str, dict, list[str]]:
    """A system whose submission holds no config of its size (Dell's v5.0 GB200 rows, Supermicro's v5.0 N2): every
    Blackwell config of the round is TP1 PP1 MBS1, so the log's GBS and GA fix the layout
    (DP = GBS / GA, CP = GPUs / DP); its other knobs from the submitter's own config of that GPU, else
    NVIDIA's, of the same CP if one has it, with DGXNNODES, CP and MINIBS set to match (the hopper
    file's "same-layout config ... overridden to match log" rows)."""
    dp = gbs // ga
    cp = gpus // dp
    pool = [f for who in (submitter, "NVIDIA") for f in lora_configs(repo, who) if token in f.rsplit("/", 1)[-1]]
    if gpu == "b200" or not pool:
        pool = [f for who in (submitter, "NVIDIA") for f in lora_configs(repo, who) if "B200" in f]
    envs = {f: layout(shell_env(repo, f)) for f in pool}
    if any((lay["tp"], lay["pp"], lay["mbs"]) != (1, 1, 1) for lay in envs.values()):
        raise SystemExit(f"{submitter}: no config of {gpus} GPUs, and the round's {token} configs "
                         "are not all TP1 PP1 MBS1")
    ref = next((f for f in pool if envs[f]["cp"] == cp), None) or max(pool, key=lambda f: envs[f]["cp"])
    lay = dict(envs[ref], gpus=gpus, nodes=gpus // (envs[ref]["gpus"] // envs[ref]["nodes"]), cp=cp, gbs=gbs, ga=ga)
    notes.append(f"no config with this exact size/GBS; used same-layout config {ref.rsplit('/', 1)[-1]} "
                 f"with DGXNNODES/CP/MINIBS set to match log (GBS {gbs}, GA {ga}: CP {cp})")
    return ref, lay, notes


def cross_check(lay: dict, logs: list[dict]) -> list[str]:
    """Disagreements between the config's layout and what the logs print."""
    bad = []
    for log in logs:
        if log["gbs"] != lay["gbs"] or log["ga"] != lay["ga"]:
            bad.append(f"log GBS {log['gbs']} GA {log['ga']} vs config {lay['gbs']} {lay['ga']}")
        mapping = {"TP": "tp", "PP": "pp", "CP": "cp", "MBS": "mbs", "FP4": "fp4", "FP8": "fp8", "FP8_DPA": "fp8_dpa",
                   "MCORE_CUDA_GRAPH": "mcore_cg", "LAYER_CUDA_GRAPH": "layer_cg", "HEALING_ITER": "healing_iter",
                   "FP8_ACT": "fp8_act", "CUDA_GRAPH_SCOPE": "cg_scope", "TP_COMM_OVERLAP": "tp_overlap"}
        for key, value in log["printed"].items():
            want = lay[mapping[PRINTED[key]]]
            got = (truthy(value) if isinstance(want, bool) else int(value) if isinstance(want, int) else value)
            if got != want:
                bad.append(f"log prints {key}: {value}, config gives {want}")
    return sorted(set(bad))


def other_knobs(lay: dict, conf: str) -> str:
    scoped = "cuda_graph_scope:" in conf
    parts = ["LORA_FINETUNE(rank=16)"]
    if lay["layer_cg"]:
        parts.append("LAYER_CUDA_GRAPH=1")
    if lay["mcore_cg"]:
        # v5.0's train.py passes enable_cuda_graph only (MCore's per-layer graphs); v5.1's passes
        # cuda_graph_scope too (default full_iteration: one graph of the whole forward-backward).
        parts.append("MCORE_CUDA_GRAPH=1" + (f"; CUDA_GRAPH_SCOPE={lay['cg_scope']}" if scoped else ""))
    parts.append(f"FP8_DPA={int(lay['fp8_dpa'])}")
    if lay["fp4"]:
        parts.append(f"FP4_RECIPE={lay['fp4_recipe']}; HEALING_ITER={lay['healing_iter']}; "
                     f"HEALING_PRECISION={lay['healing_precision']}")
        if lay["rht_off"]:
            parts.append("NVTE_NVFP4_DISABLE_RHT=1")
        if lay["q2d_off"]:
            parts.append("NVTE_NVFP4_DISABLE_2D_QUANTIZATION=1")
    else:
        parts.append(f"FP8_AMAX_HISTORY={lay['amax_history']}")
    if lay["fp8_act"]:
        parts.append("FP8_ACTIVATION=True")
    if re.search(r"^\s*fp8_params: .*oc.env:FP8,", conf, re.M) and lay["fp8"]:
        parts.append("FP8_PARAMS=True")  # v5.0's conf: fp8_params: ${FP8} (FP8 primary weights)
    parts.append(f"FP8_PARAM_GATHER={int(lay['fp8_param_gather'])}")
    if lay["lora_a2a"]:
        parts.append("LORA_A2A=1")
    parts.append(f"CP_COMM_TYPE={lay['cp_comm_type']}")
    if "DDP_OVERLAP_GRAD_REDUCE" in conf:
        # The conf's ddp block (overlap_grad_reduce / overlap_param_gather: ${DDP_OVERLAP_...,False}),
        # which train.py hands both Megatron's DDP config and NeMo's MegatronCommOverlapCallback.
        parts.append(f"DDP_OVERLAP_GRAD_REDUCE={int(lay['overlap_grad'])}; "
                     f"DDP_OVERLAP_PARAM_GATHER={int(lay['overlap_param'])}")
    return "; ".join(parts)


def rows(repos: dict[str, Mirror], lenient: bool = False) -> tuple[list[dict], list[str], list[str]]:
    out, amd, problems = [], [], []
    for rnd, repo in repos.items():
        systems: dict[tuple[str, str], list[str]] = {}
        for f in repo.files:
            m = re.fullmatch(r"([^/]+)/results/([^/]+)/llama2_70b_lora/(result_\d+\.txt)", f)
            if m:
                systems.setdefault((m.group(1), m.group(2)), []).append(f)
        for (submitter, name), paths in sorted(systems.items()):
            sys_path = f"{submitter}/systems/{name}.json"
            system = json.loads(repo.show(sys_path) or "{}")
            if AMD.search(str(system.get("accelerator_model_name", ""))):
                amd.append(f"{rnd} {submitter} {name} (AMD)")
                continue
            gpu = gpu_of(system)
            if gpu is None:
                continue  # Hopper (mlperf_training_lora_hopper.csv)
            gpus = int(system["number_of_nodes"]) * int(system["accelerators_per_node"])
            texts = [(p, repo.show(p)) for p in sorted(paths, key=lambda p: int(re.search(r"(\d+)\.txt", p).group(1)))]
            logs = [dict(log_facts(t), path=p) for p, t in texts if t]
            logs = [log for log in logs if log["gbs"]]
            if not logs:  # Dell's v5.1 2xXE9685L: the mirror lacks every log's blob
                amd.append(f"{rnd} {submitter} {name} (no readable result log in the mirror)")
                continue
            config, lay, notes = choose_config(repo, submitter, name, gpus, gpu, logs)
            if lay["gpus"] != gpus:
                problems.append(f"{rnd} {submitter} {name}: config {config} has {lay['gpus']} GPUs, system {gpus}")
            bad = cross_check(lay, logs)
            if bad:
                problems.append(f"{rnd} {submitter} {name} ({config}): " + "; ".join(bad))
            times = [(log["path"], step_time(log, lay["gbs"], lay["healing_iter"], lay["fp4"])) for log in logs]
            times = [(p, t) for p, t in times if t]
            if not times:
                problems.append(f"{rnd} {submitter} {name}: no log with two step-time points")
                continue
            secs = statistics.median(t[0] for _, t in times)
            spread = (max(t[0] for _, t in times) - min(t[0] for _, t in times)) / secs * 100
            metric = ("GBS / mean tracked_stats throughput (samples/s)" if rnd == "v5.0"
                      else "mean tracked_stats train_step_time")
            phase = f" over the NVFP4 blocks (ending at or before step {lay['healing_iter']})" if lay["fp4"] else ""
            how = (f"median over {len(times)} result logs of {metric}{phase}, each log's first point dropped "
                   f"({min(t[1] for _, t in times)}-{max(t[1] for _, t in times)} points kept; spread {spread:.1f} %)")
            notes = list(lay["notes"]) + notes
            printed = sum(1 for log in logs if log["printed"])
            conf, conf_path = peft_conf(repo, config)
            knobs = other_knobs(lay, conf)
            if conf_path:
                notes.append(f"no NeMo conf beside the config: read {conf_path}")
            if printed:
                notes.append(f"layout cross-checked against the NeMo config {printed} of {len(logs)} logs print")
            out.append(dict(
                round=rnd, submitter=submitter, system=name, gpu=gpu, gpus=gpus, model="llama2-70b-lora",
                seq_length=SEQ, global_batch_size=lay["gbs"], micro_batch_size=lay["mbs"], tp=lay["tp"],
                pp=lay["pp"], vp=1, cp=lay["cp"], ep=1, sp=lay["sp"],
                precision="nvfp4" if lay["fp4"] else "fp8-delayed",
                recompute="none" if lay["recompute"] in ("null", "") else lay["recompute"],
                tp_comm_overlap=lay["tp_overlap"], distributed_optimizer=lay["dist_opt"],
                fsdp=lay["fsdp"] not in ("null", ""), other_knobs="; ".join([knobs, *notes]),
                step_time_s=round(secs, 4), tokens_per_s_per_gpu=round(lay["gbs"] * SEQ / secs / gpus, 1),
                how_measured=how,
                source=(f"github.com/mlcommons/training_results_{rnd}@{repo.commit} config:{config} "
                        f"log:{times[0][0]} system:{sys_path}")))
    if problems and not lenient:
        raise SystemExit("cross-checks failed:\n  " + "\n  ".join(problems))
    return out, amd, problems


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--v50", default=MIRRORS["v5.0"], help="git dir of mlcommons/training_results_v5.0")
    parser.add_argument("--v51", default=MIRRORS["v5.1"], help="git dir of mlcommons/training_results_v5.1")
    parser.add_argument("--lenient", action="store_true", help="list cross-check failures instead of failing")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    found, skipped, problems = rows({"v5.0": Mirror(args.v50), "v5.1": Mirror(args.v51)}, args.lenient)
    columns = list(pd.read_csv(HOPPER, nrows=0).columns)
    pd.DataFrame(found, columns=columns).to_csv(args.out, index=False)
    print(f"wrote {len(found)} rows to {args.out}; skipped {len(skipped)}:")
    for line in skipped:
        print("  ", line)
    for p in problems:
        print("problem:", p, file=sys.stderr)


if __name__ == "__main__":
    main()
