"""Write autoparallel/data/mlperf_training_lora_amd.csv: MLPerf Training's Llama-2-70B LoRA rows on AMD Instinct.

Every v5.0 / v5.1 submission whose system JSON names an AMD Instinct MI300X, MI325X, MI350X or MI355X
and that has a ``llama2_70b_lora`` results folder, read as mlperf_training_lora_hopper.csv's rows were:
``step_time_s`` = the log's global_batch_size / the mean ``tracked_stats`` throughput (samples/s) of the
first result file in name order, its first log point dropped (``how_measured``); the layout from the
config the submission ran (the submitter's ``config_*.sh`` under its ``llama2_70b_lora`` benchmark folder for that GPU and node count, the one named
after the system where there is one; several that disagree on the layout are flagged AMBIGUOUS in
``other_knobs`` and the first taken, as the Hopper CSV did). The logs print no hyperparameters but the
LoRA rank and the batch, so the layout cannot be checked against them. ``validate`` predicts these rows
and never fits them (kind ``lora-amd``). Re-run after a new round is mirrored:

    python scripts/mlperf_lora_amd_rows.py [--v5.0 GIT_DIR] [--v5.1 GIT_DIR] [--out CSV]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_results import MIRRORS, Mirror, mllog, write_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "autoparallel" / "data" / "mlperf_training_lora_amd.csv"
COLUMNS_FROM = ROOT / "autoparallel" / "data" / "mlperf_training_lora_hopper.csv"
# accelerator_model_name of the system JSON -> hardware preset
GPU = re.compile(r"AMD Instinct (MI3[0-9]{2}X)")
SEQ_LENGTH = 8192  # the benchmark's packed GovReport sequences
# The config variables other_knobs reports (the ones from_mlperf reads, and the FP8 recipe's history), and
# the activation checkpointing NeMo's activations_checkpoint_granularity / _method / _num_layers read from
# ACG / ACM / ACL (the implementations' src/conf/megatron_gpt_peft_tuning_config.yaml L67-71): the MI300X
# configs recompute 21 layers in full (block), the others set none.
KNOBS = ("FP8_DPA", "FP8_AMAX_HISTORY", "LORA_A2A", "FP8_ACTIVATION", "ACG", "ACM", "ACL")
LAYOUT = ("TP", "PP", "CP", "SP", "MBS", "TP_COMM_OVERLAP") + KNOBS


def exports(text: str) -> dict[str, str]:
    """``export NAME=value`` statements of a config (comments, quotes and a trailing ``;`` stripped;
    ``${NAME:-default}`` read as its default)."""
    out = {}
    for line in text.replace("&&", "\n").splitlines():  # "export ACG=full && export ACM=block": one each
        m = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if not m:
            continue
        value = m.group(2).split("#")[0].strip().rstrip(";").strip().strip('"').strip("'")
        default = re.fullmatch(r"\$\{[A-Za-z_0-9]+:-([^}]*)\}", value)
        out[m.group(1)] = default.group(1) if default else value
    return out


def configs(mirror: Mirror, submitter: str, system: str, gpu: str, nodes: int) -> list[tuple[str, dict]]:
    """The submitter's LoRA configs for ``gpu`` or ``system`` (named by MLPERF_SUBMISSION_PLATFORM or
    the file name) on ``nodes`` nodes (DGXNNODES), as (path, exports)."""
    out = []
    for path in mirror.files:
        if not (re.match(rf"{re.escape(submitter)}/benchmarks?/llama2_70b_lora/", path)
                and re.search(r"/config_[^/]*\.sh$", path) and "common" not in path.rsplit("/", 1)[1]):
            continue
        env = exports(mirror.show(path))
        named = (env.get("MLPERF_SUBMISSION_PLATFORM", "") + " " + path.rsplit("/", 1)[1]).upper()
        if (gpu.upper() in named or system.upper() in named) and env.get("DGXNNODES", "") == str(nodes) and "TP" in env:
            out.append((path, env))
    return out


def pick_config(found: list[tuple[str, dict]], system: str) -> tuple[str, dict, str]:
    """The config the system ran: the one in a folder or file named after the system, else the first;
    a note where the candidates disagree on the layout."""
    named = [c for c in found if system in c[0]]
    chosen = (named or found)[0]
    layouts = {tuple(env.get(k) for k in LAYOUT) for _, env in (named or found)}
    note = "" if len(layouts) == 1 else (
        "AMBIGUOUS: several configs match (" + ";".join(p.rsplit("/", 1)[1] for p, _ in (named or found))
        + "); took first")
    return chosen[0], chosen[1], note


def rows_of(round_: str, repo: str) -> list[dict]:
    mirror = Mirror(repo)
    commit, files = mirror.commit, mirror.files
    rows = []
    for sys_path in sorted(f for f in files if re.fullmatch(r"[^/]+/systems/[^/]+\.json", f)):
        submitter, system = sys_path.split("/")[0], sys_path.rsplit("/", 1)[1][:-5]
        desc = json.loads(mirror.show(sys_path))
        m = GPU.search(desc.get("accelerator_model_name", ""))
        results = sorted(f for f in files if f.startswith(f"{submitter}/results/{system}/llama2_70b_lora/result_"))
        if not m or not results:
            continue
        gpu = m.group(1).lower()
        nodes = int(desc["number_of_nodes"])
        gpus = nodes * int(desc["accelerators_per_node"])
        found = configs(mirror, submitter, system, m.group(1), nodes)
        if not found:
            print(f"skipped {round_} {submitter}/{system}: no {m.group(1)} config for {nodes} node(s)", file=sys.stderr)
            continue
        config, env, note = pick_config(found, system)
        log = mllog(mirror.show(results[0]))
        value = {e["key"]: e["value"] for e in log if e["event_type"] == "POINT_IN_TIME"}
        throughput = [e["value"]["throughput"] for e in log if e["key"] == "tracked_stats"]
        gbs = int(value["global_batch_size"])
        kept = throughput[1:]
        step = gbs / (sum(kept) / len(kept))
        knobs = [f"LORA_FINETUNE(rank={value['lora_rank']})"] + [f"{k}={env[k]}" for k in KNOBS if k in env]
        rows.append({
            "round": round_, "submitter": submitter, "system": system, "gpu": gpu, "gpus": gpus,
            "model": "llama2-70b-lora", "seq_length": SEQ_LENGTH, "global_batch_size": gbs,
            "micro_batch_size": int(env["MBS"]), "tp": int(env["TP"]), "pp": int(env["PP"]), "vp": 1,
            "cp": int(env["CP"]), "ep": 1, "sp": env.get("SP", "False") in ("True", "1"),
            "precision": "fp8-delayed" if env.get("FP8") in ("True", "1") else "bf16",
            "recompute": env.get("ACG") or "none",
            "tp_comm_overlap": env.get("TP_COMM_OVERLAP", "False") in ("True", "1"), "distributed_optimizer": "",
            "fsdp": False, "other_knobs": "; ".join(knobs + ([note] if note else [])),
            "step_time_s": round(step, 4), "tokens_per_s_per_gpu": round(gbs * SEQ_LENGTH / step / gpus, 1),
            "how_measured": (f"GBS / mean tracked_stats throughput (samples/s) over {len(kept)} log points "
                             f"(first 1 of {len(throughput)} dropped)"),
            "source": (f"github.com/mlcommons/training_results_{round_}@{commit} config:{config} log:{results[0]} "
                       f"system:{sys_path}"),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for round_, repo in MIRRORS.items():
        parser.add_argument(f"--{round_}", default=repo, help=f"git dir of mlcommons/training_results_{round_}")
    parser.add_argument("--out", type=Path, default=OUT, help="CSV to write (default: the shipped one)")
    args = vars(parser.parse_args())
    rows = [r for round_ in MIRRORS for r in rows_of(round_, args[round_])]
    write_rows(args["out"], COLUMNS_FROM, rows)
    print(f"wrote {len(rows)} rows to {args['out']}")


if __name__ == "__main__":
    main()
