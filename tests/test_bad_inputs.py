"""Every user mistake gets one line naming the bad value, exit code 2, no traceback, and leaves
nothing behind (issue 12).

``BAD_INPUTS`` is the table: the arguments of one command line (``{name}`` stands for a file the
``files`` fixture makes: junk YAML, broken presets, damaged run folders, bad CSVs) and a piece of
the message it must get, which names the bad value. Each case runs the real command (``main``)
in an empty working directory, with a user preset folder that holds a binary-junk model preset
(which must break no other preset), and checks: exit code 2, exactly one line on stderr, no
"Traceback", the message, the working directory (where ``results/`` would go) still empty and
the fixture files untouched.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
import shutil
import sqlite3
import sys
from contextlib import closing

import pandas as pd
import pytest
import yaml

from autoparallel import resources
from autoparallel.cli import main

MODEL = """name: tiny
num_layers: 4
hidden_size: 256
ffn_hidden_size: 1024
num_attention_heads: 8
num_query_groups: 4
vocab_size: 1024
seq_length: 128
activation: swiglu
global_batch_size: 16
"""
HARDWARE = """name: {name}
bf16_tflops: 989
fp8_tflops: 1979
memory_gib: 80
hbm_tbps: 3.35
nvlink_domain: 8
nvlink_gbps: 900
internode_gbps: 50
"""
TINY_SPACE = """tp: [8]
pp: [16]
vp: [1]
cp: [1]
ep: [1]
mbs: [1]
sp: [true]
recompute: [full]
precision: [bf16]
"""
PLAN = {"tp": 2, "pp": 2, "dp": 1, "gbs": 4, "mbs": 1}
JUNK = bytes(range(256)) * 4


def _model(**changes) -> str:
    data = yaml.safe_load(MODEL)
    data.update(changes)
    return yaml.safe_dump(data)


def _plan(**changes) -> str:
    return yaml.safe_dump({**PLAN, **changes})


def _search(*args: str) -> None:
    assert main(["search", *args, "--top", "1", "--json"]) == 0


def _only_child(folder):
    (child,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return child


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The files the bad inputs point at, by name."""
    d = tmp_path_factory.mktemp("bad_inputs")
    f = {"dir": d}

    def put(name: str, content: str | bytes) -> None:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        f[name.replace("/", "_").replace(".", "_")] = path

    put("junk.yaml", JUNK)
    put("list.yaml", "- a\n- b\n")
    put("syntax.yaml", "name: x\n  num_layers: [4\n")
    put("deep.yaml", "[" * 5000 + "]" * 5000)
    put("kv_channels.yaml", _model(kv_channels=-128))
    put("query_groups.yaml", _model(num_query_groups=-8))
    put("topk.yaml", _model(num_experts=8, moe_router_topk=20))
    put("gbs0.yaml", _model(global_batch_size=0))
    put("gbs_lots.yaml", _model(global_batch_size="lots"))
    put("layers_huge.yaml", _model(num_layers=10**30))
    put("layers0.yaml", _model(num_layers=0))
    put("hidden_nan.yaml", MODEL.replace("hidden_size: 256", "hidden_size: .nan"))
    put("dropout.yaml", _model(hidden_dropout=1.5))
    put("hw_gemm_negative.yaml", HARDWARE.format(name="g1") + "efficiency:\n  gemm_max: -0.5\n")
    put("hw_gemm_nan.yaml", HARDWARE.format(name="g2") + "efficiency:\n  gemm_max: .nan\n")
    put("hw_gemm_big.yaml", HARDWARE.format(name="g3") + "efficiency:\n  gemm_max: 1.5\n")
    put("hw_memory_inf.yaml", HARDWARE.format(name="g4").replace("memory_gib: 80", "memory_gib: .inf"))
    put("hw_reserve.yaml", HARDWARE.format(name="g5") + "reserve_gib: 90\n")
    put("hw_self.yaml", HARDWARE.format(name="g6") + "efficiency_from: hw_self.yaml\n")
    put("hw_a.yaml", HARDWARE.format(name="ga") + "efficiency_from: hw_b.yaml\n")
    put("hw_b.yaml", HARDWARE.format(name="gb") + "efficiency_from: hw_a.yaml\n")
    put("space_edge.yaml", "fp8_bf16_edge_layers: [-1]\n")
    put("space_inf.yaml", "memory_fraction: .inf\n")
    put("space_key.yaml", "tensor_parallel: [1, 2]\n")
    put("tiny_space.yaml", TINY_SPACE)
    put("infer_space_negative.yaml", "max_batch: [-4]\n")
    put("fp8_nan.yaml", "thresholds:\n  max_loss_gap_pct: .nan\n")
    put("fp8_negative.yaml", "run:\n  steps: -3\n")
    put("plan_two.yaml", _plan(tp="two"))
    put("plan_half.yaml", _plan(tp=1.5))
    put("plan_negative.yaml", _plan(tp=-1))
    put("plan_zero.yaml", _plan(tp=0))
    put("plan_gbs_huge.yaml", _plan(gbs=10**30))
    put("plan_tp3.yaml", _plan(tp=3, pp=1, gbs=3))
    put("serving_best.yaml", yaml.safe_dump({"model": "llama3.1-8b", "engine": "vllm", "gpus": 1,
                                             "layout": {"tp": 1, "pp": 1, "max_batch": 64}}))
    put("plan_pp8.yaml", _plan(tp=1, pp=8, gbs=8))
    put("plan_precision.yaml", _plan(precision="fp7"))
    put("plan_mxfp8.yaml", _plan(precision="mxfp8"))
    put("plan_big.yaml", _plan(tp=1, pp=1, dp=4096, gbs=4096))
    put("plan_dp2.yaml", _plan(tp=1, pp=1, dp=2, gbs=2))
    put("plan_layout.yaml", _plan(pipeline_model_parallel_layout="Et*3|tL"))
    put("plan_good.yaml", _plan())
    put("plan_modules.yaml", _plan(recompute="selective", recompute_modules="core_attn layernorm"))
    put("plan_key.yaml", _plan(tensor_parallel=2))
    put("plan_nogbs.yaml", yaml.safe_dump({"tp": 1, "pp": 1, "dp": 1}))
    put("plan_other_model.yaml", yaml.safe_dump({"model": "gpt3-175b", "plan": PLAN}))
    put("runs_empty.csv", "")
    put("runs_header.csv", "id,model,num_layers,hidden_size,num_attention_heads,ffn_hidden_size,vocab_size,"
                           "activation,seq_length,gpu,num_gpus,gbs,precision\n")
    put("runs_junk.csv", JUNK)
    put("runs_columns.csv", "a,b\n1,2\n")
    put("runs_values.csv", "id,model,num_layers,hidden_size,num_attention_heads,ffn_hidden_size,vocab_size,"
                           "activation,seq_length,gpu,num_gpus,gbs,precision,tp,pp\n"
                           "nemo-x,m,many,4096,32,11008,32000,swiglu,4096,h100-sxm,8,128,bf16,1,1\n")
    header, row = resources.data_file("inference_runs.csv").read_text().splitlines()[:2]
    values = next(csv.reader([row]))
    values[header.split(",").index("tp")] = "two"
    put("inference_values.csv", header + "\n" + ",".join(f'"{v}"' for v in values) + "\n")
    # Measured numbers out of range (issue 25): one published row with its measurement changed.
    lines = resources.data_file("training_runs.csv").read_text().splitlines()
    columns = lines[0].split(",")
    for name, column, value in (("runs_zero.csv", "measured_hw_tflops_per_gpu", "0"),
                                ("runs_negative.csv", "measured_hw_tflops_per_gpu", "-137"),
                                ("runs_inf.csv", "measured_hw_tflops_per_gpu", "inf"),
                                ("runs_no_metric.csv", "measured_hw_tflops_per_gpu", ""),
                                ("runs_mfu.csv", "measured_mfu_pct", "150"),
                                # finite and positive, but no real measurement or count (plausible units)
                                ("runs_tflops_huge.csv", "measured_hw_tflops_per_gpu", "1e30"),
                                ("runs_step_tiny.csv", "measured_iteration_time_s", "1e-12"),
                                ("runs_tp_half.csv", "tp", "1.5"),
                                ("runs_gpus0.csv", "num_gpus", "0")):
        values = next(csv.reader([lines[1]]))
        values[columns.index(column)] = value
        put(name, lines[0] + "\n" + ",".join(f'"{v}"' for v in values) + "\n")
    put("runs_cut.csv", lines[0] + "\n" + lines[1][:60])  # a copy that broke off in its only row
    header, row = resources.data_file("serving_runs.csv").read_text().splitlines()[:2]
    values = next(csv.reader([row]))
    values[header.split(",").index("throughput_tokens_per_s")] = "-10907"
    put("serving_negative.csv", header + "\n" + ",".join(f'"{v}"' for v in values) + "\n")
    put("profiles/layer_profiles.json", "{not json")
    (d / "a_folder").mkdir()
    f["a_folder"] = d / "a_folder"
    put("results_file", "I am a file, not a folder\n")
    put("name_parent.yaml", _model(name="../../outside"))
    put("name_slash.yaml", _model(name="a/b"))
    put("name_empty.yaml", _model(name=""))
    put("name_control.yaml", _model(name="tiny\x1b[31m"))
    put("name_dot.yaml", _model(name=".."))
    put("hw_name_slash.yaml", HARDWARE.format(name="'../gpu'"))
    put("name_nel.yaml", _model(name="tiny\x85next"))
    put("name_bidi.yaml", _model(name="tiny\u202ex"))
    put("name_long.yaml", _model(name="x" * 300))
    put("workload_huge.csv", "input_len,output_len\n1000000000000,10\n")
    put("workload_field.csv", 'input_len,output_len\n"' + "1" * 200_000 + '",5\n')
    put("hw_h100.yaml", (resources.SEARCH_SPACES / "hardware" / "h100-sxm.yaml").read_text())
    put("model_llama.yaml", (resources.SEARCH_SPACES / "models" / "llama3-8b.yaml").read_text())
    put("workload_extra.csv", "input_len,output_len\n100,20\n1,000,20\n")  # a thousands separator, unquoted
    put("workload_bool.jsonl", '{"input_len": 100, "output_len": 20}\n{"input_len": true, "output_len": 20}\n')
    put("runs_id_only.csv", "id,model\nx,y\n")  # an id column, not the runs columns (session 46)
    put("runs_ragged.csv", "id,model\nx,y\nx,y,1,2,3,4\n")  # no CSV table: a row of more fields than the header
    put("runs_binary.csv", b"id,model\n\xd0\xff\x00,y\n")
    put("good.log", (Path(__file__).parent / "fixtures" / "runlogs" / "megatron_tp2_pp2_vp4_sp_selective_fp8.log").read_text())
    put("moe_freq_huge.yaml", _model(num_experts=8, moe_router_topk=2, moe_layer_freq="[1]*1000000000000"))

    # Special files and links (issue 25): nothing may read them endlessly or replace them.
    os.mkfifo(d / "fifo")
    f["fifo"] = d / "fifo"
    os.symlink("link_loop", d / "link_loop")
    f["link_loop"] = d / "link_loop"
    os.symlink(d / "a_folder", d / "link_to_folder")
    f["link_to_folder"] = d / "link_to_folder"
    os.symlink("/dev/null", d / "link_to_null")
    f["link_to_null"] = d / "link_to_null"
    for name, size in (("big.yaml", 17 * 2**20), ("big.csv", 257 * 2**20),  # sparse: no disk used
                       ("big_workload.csv", 65 * 2**20)):
        with open(d / name, "wb") as big:
            big.truncate(size)
        f[name.replace(".", "_")] = d / name

    # A user preset folder with a binary-junk model preset (and a good one of ours).
    home = d / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "junk.yaml").write_bytes(JUNK)
    (home / "models" / "tiny.yaml").write_text(MODEL)
    (home / "hardware").mkdir()
    os.symlink("loop.yaml", home / "hardware" / "loop.yaml")  # a symlink loop: skipped, named when asked for
    os.symlink("mloop.yaml", home / "models" / "mloop.yaml")
    f["home"] = home

    # Run folders: a grid search, an optuna search, a serving search, a 1024-GPU search.
    runs = d / "runs"
    _search("--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--space", "cpu-profiling",
            "--results", str(runs / "grid"))
    grid = _only_child(runs / "grid")
    f["grid"] = grid
    _search("--model", "llama2-7b", "--gpus", "8", "--strategy", "optuna", "--trials", "4", "--grid-seeds", "0",
            "--results", str(runs / "optuna"))
    optuna_run = _only_child(runs / "optuna")
    f["optuna"] = optuna_run
    assert main(["infer", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--json",
                 "--results", str(runs / "infer")]) == 0
    f["infer"] = _only_child(runs / "infer")
    _search("--model", "175b", "--gpus", "1024", "--space", str(d / "tiny_space.yaml"),
            "--results", str(runs / "big"))
    f["big"] = _only_child(runs / "big")

    def damaged(name: str, source, change) -> None:
        path = d / "damaged" / name
        shutil.copytree(source, path)
        change(path)
        f[name] = path
    damaged("manifest_empty", grid, lambda p: (p / "manifest.yaml").write_text(""))
    damaged("manifest_junk", grid, lambda p: (p / "manifest.yaml").write_bytes(JUNK))
    damaged("manifest_no_inputs", grid, lambda p: (p / "manifest.yaml").write_text("command: x\n"))
    damaged("candidates_empty", grid, lambda p: (p / "candidates.csv").write_text(""))
    damaged("candidates_header", grid, lambda p: (p / "candidates.csv").write_text(
        (grid / "candidates.csv").read_text().splitlines()[0] + "\n"))
    damaged("candidates_junk", grid, lambda p: (p / "candidates.csv").write_bytes(JUNK))
    damaged("candidates_missing", grid, lambda p: (p / "candidates.csv").unlink())
    damaged("profiled_run", grid, lambda p: (p / "profiled.csv").write_text("trial,step_time_s\n1,0.5\n"))
    damaged("candidates_fifo", grid, lambda p: ((p / "candidates.csv").unlink(), os.mkfifo(p / "candidates.csv")))
    def table(name: str, change) -> None:
        def write(p):
            frame = pd.read_csv(p / "candidates.csv")
            change(frame)
            frame.to_csv(p / "candidates.csv", index=False)
        damaged(name, grid, write)
    table("candidates_nan", lambda t: t.__setitem__("step_time_s", t["step_time_s"].where(t["rank"] != 1)))
    table("candidates_negative", lambda t: t.__setitem__("peak_memory_gib", t["peak_memory_gib"].where(t["rank"] != 2, -1.0)))
    table("candidates_inf", lambda t: t.__setitem__("tokens_per_s_per_gpu", t["tokens_per_s_per_gpu"].where(t["rank"] != 3, float("inf"))))
    table("candidates_breakdown", lambda t: t.__setitem__("compute_s", t["compute_s"].where(t["rank"] != 1, -0.25)))
    table("candidates_no_column", lambda t: t.pop("tokens_per_s_per_gpu"))
    table("candidates_no_rank", lambda t: t.pop("rank"))
    damaged("candidates_huge", grid, lambda p: os.truncate(p / "candidates.csv", 1025 * 2**20))  # sparse
    damaged("candidates_truncated", grid, lambda p: (p / "candidates.csv").write_text(
        (grid / "candidates.csv").read_text()[:(grid / "candidates.csv").read_text().index("\n3,") + 20]))

    def sql(statement: str):
        def change(p):
            with closing(sqlite3.connect(p / "study.db")) as c:
                c.execute(statement)
                c.commit()
        return change
    damaged("study_no_trials", optuna_run, sql("drop table trials"))
    damaged("study_no_values", optuna_run, sql("delete from trial_values"))
    damaged("study_missing", optuna_run, lambda p: (p / "study.db").unlink())
    damaged("study_corrupt", optuna_run, lambda p: (p / "study.db").write_bytes(b"\0junk" * 500))
    with closing(sqlite3.connect(optuna_run / "study.db")) as c:  # the study is written and closed
        assert c.execute("select count(*) from trials").fetchone()[0] >= 4
    f["snapshot"] = _snapshot(d)
    return f


def _snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.lstat().st_mtime_ns for p in folder.rglob("*")}


# (arguments, part of the one-line message: it names the bad value). {name}: a file of `files`.
BAD_INPUTS = [
    # --- the command line itself
    # (the top level said "error: usage: ..."; a word no command took was sent to `autoparallel --help`)
    ([], "autoparallel: error: the following arguments are required: COMMAND"),
    (["serch"], "autoparallel: error: argument COMMAND: invalid choice: 'serch'"),
    (["models", "--all"], "models: unrecognized arguments: --all (see `autoparallel models --help`)"),
    (["hardware", "h100"], "hardware: unrecognized arguments: h100 (see `autoparallel hardware --help`)"),
    # a flag of another command named none of this one's (session 52: infer's precisions are two flags)
    (["infer", "--model", "llama3.1-70b", "--gpus", "8", "--precision", "fp8"],
     "infer: unrecognized arguments: --precision fp8; did you mean --kv-precision or --weight-precision?"),
    # a misspelt engine or workload named the valid ones but, unlike a model, GPU or space, no close one (session 53)
    (["infer", "--model", "llama3.1-8b", "--gpus", "1", "--engine", "vlm"],
     "unknown serving engine 'vlm'; did you mean 'vllm'? valid: tensorrt-llm"),
    (["infer", "--model", "llama3.1-8b", "--gpus", "1", "--workload", "sharegtp"],
     "--workload 'sharegtp' is neither a file nor a known workload; did you mean 'sharegpt'? valid: mlperf-llama2-70b"),
    (["runs", "import", "x.log", "--gpu", "h100-sxm", "--bogus"],
     "runs import: unrecognized arguments: --bogus (see `autoparallel runs import --help`)"),
    # a flag as Megatron-LM or an engine spells it, typed back from an export (session 53: --micro-batch-size
    # was offered --global-batch-size, --tensor-model-parallel-size nothing)
    (["search", "--model", "175b", "--gpus", "8", "--micro-batch-size", "2"],
     "unrecognized arguments: --micro-batch-size 2; did you mean --mbs?"),
    (["estimate", "--model", "175b", "--gpus", "8", "--pp", "1", "--tensor-model-parallel-size", "8"],
     "unrecognized arguments: --tensor-model-parallel-size 8; did you mean --tp?"),
    (["search", "--model", "175b", "--gpus", "8", "--sequence-parallel"],
     "unrecognized arguments: --sequence-parallel; did you mean --sp?"),
    (["infer", "--model", "llama3.1-70b", "--gpus", "8", "--tensor-parallel-size", "8"],
     "unrecognized arguments: --tensor-parallel-size 8; did you mean --tp?"),
    (["infer", "--model", "llama3.1-70b", "--gpus", "8", "--max-num-seqs=64"],
     "unrecognized arguments: --max-num-seqs=64; did you mean --max-batch?"),
    (["infer", "--model", "llama3.1-70b", "--gpus", "8", "--tp_size", "8"],
     "unrecognized arguments: --tp_size 8; did you mean --tp?"),
    # a flag shortened: argparse's prefix matching took it silently (session 53); a required one shortened
    # was "the following arguments are required: --gpu" only
    (["infer", "--model", "llama3.1-8b", "--gpus", "1", "--max-ttft", "100"],
     "infer: unrecognized arguments: --max-ttft 100; did you mean --max-ttft-ms?"),
    (["search", "--mod", "175b", "--gpus", "8"], "search: unrecognized arguments: --mod 175b; did you mean --model?"),
    (["export", "{dir}", "--form", "yaml"], "export: unrecognized arguments: --form yaml; did you mean --format?"),
    (["runs", "import", "x.log", "--gp", "h100-sxm"],
     "the following arguments are required: --gpu; unrecognized arguments: --gp; did you mean --gpu?"),
    # --- search: flags
    (["search", "--model", "175b", "--gpus", "1000000000000000000000"],
     "expected an integer in 1..2147483647, got 1000000000000000000000"),
    (["search", "--model", "175b", "--gpus", "-4"], "--gpus: expected an integer in 1..2147483647, got -4"),
    (["search", "--model", "175b", "--gpus", "four"], "--gpus: expected an integer in 1..2147483647, got 'four'"),
    (["search", "--model", "175b", "--gpus", "1024", "--gbs", "0"], "--gbs/--global-batch-size: expected an integer in 1..2147483647, got 0"),
    (["search", "--model", "175b", "--gpus", "1024", "--precision", "fp9"], "invalid choice: 'fp9'"),
    (["search", "--model", "175b"], "search needs --model and --gpus"),
    (["search", "--model", "gpt-175b", "--gpus", "1024"], "unknown model 'gpt-175b'. Did you mean 'gpt3-175b'?"),
    (["search", "--model", "175b", "--gpus", "1024", "--gpu", "h1000"], "unknown hardware 'h1000'"),
    (["search", "--model", "175b", "--gpus", "1024", "--space", "huge"], "unknown search space 'huge'"),
    # a missing file said only "models file '...' does not exist": now what would do, as for a name (session 52)
    (["search", "--model", "{dir}/nope.yaml", "--gpus", "8"], "model file '{dir}/nope.yaml' does not exist. Valid: "),
    (["estimate", "--model", "llama3-70b.yaml", "--gpus", "8"],
     "model file 'llama3-70b.yaml' does not exist. Did you mean 'llama3-70b'? Valid: cpu-small,"),
    (["infer", "--model", "llama3-70b", "--gpus", "8", "--gpu", "h100.yaml"],
     "hardware file 'h100.yaml' does not exist. Did you mean 'h100-sxm'? Valid: a100-sxm-80g,"),
    (["search", "--model", "junk", "--gpus", "8"], "junk.yaml: not a YAML text file (byte 0x80 at offset 128 is not UTF-8)"),
    # --- search: nothing valid or nothing fits, the pinned knob or the input named first
    (["search", "--model", "175b", "--gpus", "1024", "--mbs", "8", "--gbs", "4"],
     "with mbs pinned to 8: gbs 4 is not divisible by mbs*dp in any layout"),
    (["search", "--model", "175b", "--gpus", "1024", "--precision", "mxfp8"],
     "with precision pinned to mxfp8: mxfp8 needs Blackwell; h100-sxm lacks it"),
    (["search", "--model", "175b", "--gpus", "10000000"],
     "10000000 GPUs leave at least 78125 data-parallel replicas"),
    (["search", "--model", "175b", "--gpus", "1024", "--tp", "16"],
     "with tp pinned to 16: tp=16 crosses the 8-GPU NVLink domain"),
    (["search", "--model", "175b", "--gpus", "1024", "--pp", "7"], "with pp pinned to 7: tp*pp*cp=7 does not divide"),
    (["search", "--model", "llama3-8b", "--gpus", "8", "--tp", "3"],
     "with tp pinned to 3: tp*pp*cp=3 does not divide 8 GPUs; tp*pp*cp can be 1, 2, 4, 8"),
    (["search", "--model", "llama2-7b", "--gpus", "8", "--ep", "2"], "with ep pinned to 2: ep>1 or etp>1 needs a MoE model"),
    (["search", "--model", "mixtral-8x7b", "--gpus", "64", "--profile", "layer", "--no-save"],
     "--profile layer times dense layers only; mixtral-8x7b is a mixture of experts: use --profile job"),
    (["search", "--model", "175b", "--gpus", "1024", "--precision", "fp8-delayed", "--fp8-bf16-edge-layers", "1"],
     "delayed scaling cannot keep first/last layers in BF16"),
    (["search", "--model", "175b", "--gpus", "7"], "the smallest mbs*dp is 7"),
    (["search", "--model", "llama3.1-405b", "--gpus", "8"], "no layout of llama3.1-405b fits on 8 x h100-sxm"),
    (["search", "--model", "175b", "--gpus", "16", "--recompute", "none", "--mbs", "4"],
     "with mbs pinned to 4 and recompute pinned to none: the smallest memory need"),
    # --- search: model, hardware and space YAML
    (["search", "--model", "{kv_channels_yaml}", "--gpus", "8"], "key 'kv_channels': expected an integer in 1..2147483647, got -128"),
    (["search", "--model", "{query_groups_yaml}", "--gpus", "8"], "key 'num_query_groups': expected an integer in 1..2147483647, got -8"),
    (["search", "--model", "{topk_yaml}", "--gpus", "8"], "moe_router_topk must be in 1..num_experts=8, got 20"),
    (["search", "--model", "{gbs0_yaml}", "--gpus", "8"], "key 'global_batch_size': expected an integer in 1..2147483647, got 0"),
    (["search", "--model", "{gbs_lots_yaml}", "--gpus", "8"], "key 'global_batch_size': expected int or null, got 'lots'"),
    # a model's counts (``ModelSpec.POSITIVE_KEYS``) are taken in 1..2147483647: the message quotes that range (s56h7)
    (["search", "--model", "{layers_huge_yaml}", "--gpus", "8"], "key 'num_layers': expected an integer in 1..2147483647, got 1000000000000000000000000000000"),
    (["search", "--model", "{layers0_yaml}", "--gpus", "8"], "key 'num_layers': expected an integer in 1..2147483647, got 0"),
    (["search", "--model", "{hidden_nan_yaml}", "--gpus", "8"], "key 'hidden_size': expected int, got nan"),
    (["search", "--model", "{dropout_yaml}", "--gpus", "8"], "hidden_dropout must be in [0, 1), got 1.5"),
    (["search", "--model", "{list_yaml}", "--gpus", "8"], "list.yaml: expected a mapping of keys to values, got a list"),
    (["search", "--model", "{syntax_yaml}", "--gpus", "8"], "syntax.yaml: not valid YAML: line 2"),
    (["search", "--model", "{deep_yaml}", "--gpus", "8"], "deep.yaml: not valid YAML"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_gemm_negative_yaml}"], "key 'gemm_max': expected a finite number >= 0, got -0.5"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_gemm_nan_yaml}"], "key 'gemm_max': expected a finite number >= 0, got nan"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_gemm_big_yaml}"], "efficiency.gemm_max must be in (0, 1], got 1.5"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_memory_inf_yaml}"], "key 'memory_gib': expected a finite number >= 0, got inf"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_reserve_yaml}"], "reserve_gib=90.0 must be below memory_gib=80.0"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_self_yaml}"], "efficiency_from makes a cycle (hw_self -> hw_self)"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_a_yaml}"], "efficiency_from makes a cycle (hw_a -> hw_b -> hw_a)"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "{space_edge_yaml}"], "key 'fp8_bf16_edge_layers'[0]: expected an integer in 0..2147483647, got -1"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "{space_inf_yaml}"], "key 'memory_fraction': expected a finite number >= 0, got inf"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "{space_key_yaml}"], "unknown key 'tensor_parallel'"),
    # --- search: where results go
    (["search", "--model", "175b", "--gpus", "64", "--results", "{results_file}"], "results_file is a file, not a folder"),
    (["search", "--model", "175b", "--gpus", "64", "--results", "{results_file}/runs"], "which is a file"),
    # --- search: Optuna
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--seed", "-5"], "--seed: expected a seed in 0..2147483647, got -5"),
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--storage", "foo://bar"],
     "cannot open --storage foo://bar: Can't load plugin: sqlalchemy.dialects:foo; give a database URL "
     "(sqlite:///study.db), journal:PATH or journal"),
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--storage", "{dir}/study.db"],  # a path, no URL
     "cannot open --storage {dir}/study.db: Could not parse SQLAlchemy URL from given URL string; give a database URL "
     "(sqlite:///study.db), journal:PATH or journal"),
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--storage", "sqlite:////no/such/dir/s.db"],
     "cannot open --storage sqlite:////no/such/dir/s.db"),
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--objectives", "speed"], "bad --objectives 'speed'"),
    (["search", "--model", "175b", "--gpus", "64", "--strategy", "optuna", "--trials", "0"], "--trials: expected an integer in 1..2147483647, got 0"),
    (["search", "--resume", "{grid}"], "is a grid search: there is nothing to resume"),
    (["search", "--resume", "{study_missing}"], "study_missing has no study.db or study.journal"),
    (["search", "--resume", "{study_corrupt}"], "cannot open the study in"),
    (["search", "--resume", "{dir}/no_such_run"], "no_such_run is not a run folder (no such folder)"),
    (["search", "--resume", "{infer}"],
     "is a run folder of `inference`, not of a training search; its ranked.md and candidates.csv are its report"),
    # --- search: profiling
    (["search", "--model", "cpu-small", "--gpus", "4", "--profile", "layer", "--results", "{dir}/profiles"],
     "layer_profiles.json is not a layer-profile store"),
    (["search", "--model", "175b", "--gpus", "1024", "--profile", "job"], "--profile job on 1024 GPUs: a job of 1024 ranks is larger than"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--profile", "job", "--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address 127.0.0.1:1: nothing answers at 127.0.0.1:1"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--profile", "job", "--executor", "ray", "--ray-address", "nowhere"],
     "--ray-address 'nowhere' is not host:port"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--profile", "job", "--memory-cap-gib", "nan"],
     "--memory-cap-gib: expected a positive finite number, got nan"),
    (["search", "--model", "175b", "--gpus", "64", "--fp8-check", "--fp8-check-settings", "{fp8_nan_yaml}"],
     "key 'max_loss_gap_pct': expected a finite number >= 0, got nan"),
    # --- estimate
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "3", "--pp", "8"], "with tp pinned to 3 and pp pinned to 8: tp*pp*cp=24 does not divide 512"),
    (["estimate", "--model", "175b", "--gpus", "512"], "estimate needs at least --tp and --pp"),
    # estimate's one layout read "1 x pipeline layout has ..." (session 55)
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "2", "--pipeline-layout", "E|t*32|L"],
     "gbs 128: pipeline layout has 3 virtual stages, not divisible by pp=2"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "2", "--pipeline-layout", "Et*16 | t*16L"],
     "has unknown symbol(s) ' '; known:"),
    (["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "1", "--pp", "8", "--pipeline-layout",
      "Et|(t*2|)*30mL", "--account-for-loss-in-pipeline-split"],
     "--account-for-loss-in-pipeline-split has no effect with --pipeline-layout"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--fp8-param-gather"],
     "--fp8-param-gather keeps FP8 weights: give an FP8 --precision"),
    (["search", "--model", "175b", "--gpus", "512", "--precision", "nvfp4", "--fp8-param-gather"],
     "--fp8-param-gather keeps FP8 weights: it needs an FP8 --precision (fp8-delayed, fp8-current, fp8-blockwise, "
     "mxfp8), got --precision nvfp4"),
    (["search", "--model", "175b", "--gpus", "512", "--precision", "nvfp4"],
     "with precision pinned to nvfp4: nvfp4 needs Blackwell FP4 tensor cores; h100-sxm lacks them"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--cuda-graph", "partial"],
     "argument --cuda-graph: invalid choice: 'partial'"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--seq-length", "0"],
     "argument --seq-length: expected an integer in 1..2147483647, got 0"),
    (["search", "--model", "llama3.1-8b", "--gpus", "8", "--seq-length", "262144"],
     "--seq-length 262144 is above llama3.1-8b's max_position_embeddings 131072; give at most 131072"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--recompute-num-layers", "0"],
     "--recompute-num-layers: expected an integer in 1..2147483647, got 0"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--precision", "mxfp8"], "mxfp8 needs Blackwell"),
    # --- export
    (["export", "{dir}/no_such_run"], "no_such_run is not a run folder (no such folder)"),
    (["export", "{results_file}"], "results_file is not a run folder (a file)"),
    (["export", "{grid}", "-o", "{a_folder}"], "--output {a_folder} is a folder; give a file name"),
    (["export", "{grid}", "-o", "{dir}/no/such/dir/out.yaml"], "the folder {dir}/no/such/dir does not exist"),
    (["export", "{manifest_empty}"], "manifest.yaml: expected a mapping of keys to values, got an empty file"),
    (["export", "{manifest_junk}"], "manifest.yaml: not a YAML text file"),
    (["export", "{manifest_no_inputs}"], "not a search's manifest (no inputs model, hardware, gpus, gbs, space)"),
    (["export", "{candidates_empty}"], "candidates.csv is empty"),
    (["export", "{candidates_header}"], "this run has no feasible plan"),
    (["export", "{candidates_junk}"], "candidates.csv is not a candidates table"),
    (["export", "{candidates_missing}"], "has no candidates.csv yet"),
    (["export", "{grid}", "--rank", "0"], "--rank: expected an integer in 1..2147483647, got 0"),
    (["export", "{grid}", "--rank", "99999"], "--rank 99999 is out of range"),
    (["export", "{grid}", "--format", "json"], "invalid choice: 'json'"),
    (["export", "{infer}"], "is a run folder of `inference`"),
    # --- report
    (["report", "{candidates_empty}"], "candidates.csv is empty"),
    (["report", "{manifest_junk}"], "not a YAML text file"),
    (["report", "{study_missing}"], "has no study.db or study.journal"),
    (["report", "{study_corrupt}"], "cannot open the study in"),
    # --- fine-tuning flags (issue 27)
    (["search", "--model", "llama2-70b", "--gpus", "8", "--lora-rank", "16"], "--lora-rank has no effect without --finetune"),
    (["estimate", "--model", "llama2-70b", "--gpus", "8", "--tp", "4", "--pp", "1", "--finetune", "full",
      "--lora-targets", "linear_qkv"], "--lora-targets has no effect with --finetune full"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "lora", "--lora-targets", "q_proj"],
     "got 'q_proj'"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "sft"], "invalid choice: 'sft'"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "lora", "--lora-dropout", "1"],
     "expected a dropout probability in [0, 1), got 1 "),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "full", "--lora-a2a"],
     "--lora-a2a has no effect with --finetune full"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--transformer-engine-version", "1.6rc2"],
     "expected a release number such as 1.6 or 2.9, got '1.6rc2'"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "full", "--fp8-transpose-per-microbatch"],
     "--fp8-transpose-per-microbatch has no effect with --finetune full"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "lora", "--document-tokens", "512"],
     "--document-tokens has no effect without --packed-sequence"),
    (["search", "--model", "llama2-70b", "--gpus", "8", "--finetune", "full", "--packed-sequence",
      "--document-tokens", "5000"], "--document-tokens 5000 is longer than the sequence (4096 tokens)"),
    (["search", "--model", "mixtral-8x7b", "--gpus", "8", "--finetune", "lora"], "mixtral-8x7b is a mixture of experts"),
    (["estimate", "--model", "llama2-70b", "--gpus", "8", "--tp", "4", "--pp", "1", "--finetune", "lora", "--fsdp"],
     "LoRA's frozen base is priced unsharded"),
    # --- validate and calibrate
    (["validate", "--runs", "{runs_empty_csv}"], "runs_empty.csv is empty"),
    (["validate", "--no-mlperf"], "--no-mlperf has no effect without --inference"),
    (["calibrate", "--gpu", "h800", "--dry-run"], "no dense rows of training_runs.csv, training_runs_more.csv"),
    (["validate", "--inference", "--tie-bands", "x.yaml"], "--tie-bands has no effect with --inference"),
    (["validate", "--no-cross-validation", "--tie-bands", "x.yaml"], "--tie-bands needs the held-out errors"),
    (["search", "--model", "deepseek-v3", "--gpus", "256", "--pipeline-layout", "Et|(tt|)*30x"],
     "has unknown symbol(s) 'x'"),
    (["search", "--model", "deepseek-v3", "--gpus", "256", "--pipeline-layout", "Et|(tt|)*0L"],
     "a repeat is (stages)*N or t*N with N a positive integer"),
    (["validate", "--tie-bands", "{runs_empty_csv}/x.yaml"], "runs_empty.csv is a file, not a folder"),
    # --recompute-modules (session 50): a set that does not apply, or beside a recompute that does not read it
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--recompute", "selective",
      "--recompute-modules", "mhc"], "--recompute-modules 'mhc': mhc in recompute_modules needs Hyper-Connections"),
    (["search", "--model", "llama3-8b", "--gpus", "8", "--recompute-modules", "attn"],
     "--recompute-modules 'attn': recompute_modules 'attn': choose from core_attn, mla_up_proj, moe_act"),
    (["search", "--model", "llama3-8b", "--gpus", "8", "--recompute", "full", "--recompute-modules", "core_attn"],
     "--recompute-modules has no effect with --recompute full"),
    (["estimate", "--model", "deepseek-v3", "--gpus", "256", "--tp", "1", "--pp", "8", "--ep", "32",
      "--recompute-modules", "moe_act"], "--recompute-modules has no effect with estimate's default --recompute none"),
    # a preset of the other kind: --model vr200 drew "Did you mean 'gpt3-20b'?" (session 50)
    (["search", "--model", "vr200", "--gpus", "8"], "unknown model 'vr200'. It is a hardware preset: --gpu vr200."),
    (["infer", "--model", "gpt-oss-20b", "--gpus", "8", "--gpu", "GLM-5"],
     "unknown hardware 'GLM-5'. It is a model preset: --model GLM-5."),
    (["search", "--model", "175b", "--gpus", "64", "--moe-token-dispatcher-type", "flex"],
     "--moe-token-dispatcher-type flex picks how MoE tokens reach their experts; gpt3-175b is dense"),
    # the default dispatcher on a dense model was accepted and did nothing (session 50)
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--moe-token-dispatcher-type",
      "alltoall"], "--moe-token-dispatcher-type alltoall picks how MoE tokens reach their experts; llama3-8b is dense"),
    # a hybrid's pipeline layout was refused per candidate, as counts of reasons (session 50)
    (["search", "--model", "nemotron-3-nano", "--gpus", "8", "--pipeline-layout", "Et*26|t*26L"],
     "--pipeline-layout Et*26|t*26L: nemotron-3-nano is a hybrid Mamba-Transformer, whose pipeline stages are '|' "
     "marks in its --hybrid-layer-pattern"),
    (["search", "--model", "175b", "--gpus", "64", "--moe-token-dispatcher-type", "carrier"],
     "invalid choice: 'carrier'"),
    (["search", "--model", "mixtral-8x7b", "--gpus", "64", "--moe-shared-expert-overlap"],
     "--moe-shared-expert-overlap runs the shared experts beside the all-to-alls; mixtral-8x7b has no shared experts"),
    (["search", "--model", "deepseek-v3", "--gpus", "256", "--moe-shared-expert-overlap",
      "--overlap-moe-expert-parallel-comm"], "--moe-shared-expert-overlap cannot go with --overlap-moe-expert-parallel-comm"),
    (["search", "--model", "deepseek-v3", "--gpus", "256", "--moe-shared-expert-overlap",
      "--moe-token-dispatcher-type", "allgather"], "only works with the alltoall or flex token dispatcher"),
    (["validate", "--runs", "{runs_header_csv}"], "runs_header.csv has a header but no rows"),
    # a runs file that is no CSV table got pandas' words ("Error tokenizing data. C error: Expected 2 fields in
    # line 3, saw 6"), a log "lacks column(s) id, model, ..." (session 53): what is wrong and what a runs CSV is
    (["validate", "--runs", "{runs_junk_csv}"], "runs CSV {runs_junk_csv} is not a CSV table: line "),
    (["validate", "--runs", "{runs_columns_csv}"],
     "runs_columns.csv has none of the runs columns; expected a header of the runs columns (id, model, "),
    (["calibrate", "--gpu", "h100-sxm", "--runs", "{runs_ragged_csv}"],
     "runs CSV {runs_ragged_csv} is not a CSV table: line 3 has 6 comma-separated fields, its header 2; expected a "
     "header of the runs columns (id, model, num_layers,"),
    (["calibrate", "--gpu", "h100-sxm", "--runs", "{runs_binary_csv}"],
     "runs CSV {runs_binary_csv} is not a CSV table: line 2 is not UTF-8 text (byte 0xd0 at offset 9); expected a header"),
    (["runs", "import", "{good_log}", "--gpu", "h100-sxm", "--runs", "{runs_ragged_csv}"],
     "is not a CSV table: line 3 has 6 comma-separated fields, its header 2; expected a header of the runs columns"),
    (["validate", "--runs", "{good_log}"], "as `autoparallel runs import` writes them from training logs"),
    (["validate", "--inference", "--runs", "{runs_ragged_csv}"],
     "not a CSV table: line 3 has 6 comma-separated fields, its header 2; expected a header with the serving "
     "columns (model, tp, pp,"),
    (["validate", "--runs", "{runs_values_csv}"], "row nemo-x: num_layers = 'many' is not a positive integer"),
    (["validate", "--runs", "{dir}/missing.csv"], "missing.csv does not exist"),
    (["validate", "--inference", "--runs", "{runs_empty_csv}"], "runs_empty.csv is empty"),
    # session 56: the second CSV was dropped without a word (the serving check reads one)
    (["validate", "--inference", "--runs", "{inference_values_csv}", "--runs", "{runs_empty_csv}"],
     "--inference reads one FasterTransformer runs CSV, got 2 --runs ({inference_values_csv}, {runs_empty_csv}): give one"),
    (["validate", "--inference", "--runs", "{runs_header_csv}"], "has a header but no rows"),
    (["validate", "--inference", "--runs", "{inference_values_csv}"], "row at line 2: tp = 'two' is not a positive integer"),
    (["calibrate"], "calibrate needs --gpu"),
    (["calibrate", "--gpu", "h1000"], "unknown hardware 'h1000'"),
    (["calibrate", "--gpu", "h100-sxm", "--runs", "{runs_empty_csv}"], "runs_empty.csv is empty"),
    (["calibrate", "--gpu", "h100-sxm", "-o", "{a_folder}"], "--output {a_folder} is a folder"),
    # a run's table was replaced by a preset without a word (session 55)
    (["calibrate", "--gpu", "h100-sxm", "-o", "{grid}/candidates.csv"], "--output {grid}/candidates.csv exists and "
     "is not a hardware preset (expected a mapping of keys to values, got a plain string); calibrate writes a whole "
     "preset there: give a new file name, or a hardware YAML to replace"),
    (["calibrate", "--from", "{grid}"], "has no measurements"),
    (["calibrate", "--from", "{dir}/no_such_run"], "no_such_run is not a run folder"),
    # --- fp8-check (refused before the proxy trains)
    (["fp8-check", "--model", "llama3-8b", "--recipes", "mxfp4"], "--recipes: mxfp4 cannot be checked; choose from fp8-delayed, fp8-current, fp8-blockwise, mxfp8, nvfp4"),
    (["fp8-check", "--model", "llama3-8b", "--settings", "{fp8_nan_yaml}"], "key 'max_loss_gap_pct': expected a finite number >= 0, got nan"),
    (["fp8-check", "--model", "llama3-8b", "--settings", "{fp8_negative_yaml}"], "key 'steps': expected an integer in 0..2147483647, got -3"),
    # a repeated recipe or an empty item is refused, not run once (s55h8)
    (["fp8-check", "--model", "llama3-8b", "--recipes", "fp8-delayed,fp8-delayed"],
     "--recipes 'fp8-delayed,fp8-delayed' names fp8-delayed twice; name each recipe once, from fp8-delayed,"),
    (["fp8-check", "--model", "llama3-8b", "--recipes", "delayed,fp8-delayed"],
     "names fp8-delayed twice (as delayed and fp8-delayed)"),
    (["fp8-check", "--model", "llama3-8b", "--recipes", "fp8-delayed,"],
     "--recipes 'fp8-delayed,' has an empty item; give comma-separated names from fp8-delayed,"),
    (["fp8-check", "--model", "llama3-8b", "--recipes", "fp8-delayed,,mxfp8"], "has an empty item"),
    (["fp8-check", "--model", "llama3-8b", "--steps", "0"], "--steps: expected an integer in 1..2147483647, got 0"),
    (["fp8-check", "--model", "llama3-8b", "--seed", "-1"], "--seed: expected a seed in 0..2147483647, got -1"),
    (["fp8-check", "--model", "llama3-8b", "--results", "{results_file}"], "is a file, not a folder"),
    (["fp8-check", "--model", "lama3-8b"], "unknown model 'lama3-8b'"),
    # --- infer
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--max-latency-ms", "nan"], "--max-latency-ms: expected a positive finite number, got nan"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--max-latency-ms", "-5"], "--max-latency-ms: expected a positive finite number, got -5"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--latency-metric", "fast"], "--latency-metric 'fast' is not one of"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--weight-precision", "fp4"], "--weight-precision 'fp4' is not one of"),
    (["infer", "--model", "llama3-8b", "--gpus", "99999999999"], "--gpus: expected an integer in 1..2147483647, got 99999999999"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--results", "{results_file}"], "is a file, not a folder"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--space", "{infer_space_negative_yaml}"], "key 'max_batch'[0]: expected an integer in 0..2147483647, got -4"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--max-ttft-ms", "inf"], "--max-ttft-ms: expected a positive finite number, got inf"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--request-rate", "0"], "--request-rate: expected a positive finite number, got 0"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--tp", "3"], "--tp 3 does not divide --gpus 8: --tp can be 1, 2, 4, 8"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--tp", "4", "--pp", "4"],
     "--tp 4 x --pp 4 = 16 GPUs a replica does not divide --gpus 8"),
    # --- runs import
    (["runs"], "the following arguments are required: ACTION"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h1000"], "unknown hardware 'h1000'"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--warmup", "-1"], "--warmup: expected an integer in 0..2147483647, got -1"),
    # --- profile (refused before any rank is spawned)
    (["profile", "--model", "cpu-small", "--plan", "{plan_two_yaml}"], "key 'tp': expected int, got 'two'"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_half_yaml}"], "key 'tp': expected int, got 1.5"),
    # a plan's counts are taken in 1..2147483647: the message quotes that range, not 0.. (s55h8)
    (["profile", "--model", "cpu-small", "--plan", "{plan_negative_yaml}"], "key 'tp': expected an integer in 1..2147483647, got -1"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_zero_yaml}"], "key 'tp': expected an integer in 1..2147483647, got 0"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_gbs_huge_yaml}"],
     f"key 'gbs': expected an integer in 1..2147483647, got {10**30}"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_tp3_yaml}"], "8 attention heads not divisible by tp=3"),
    # an `infer` run's best.yaml: "plan: unknown key 'engine'; valid keys: tp, pp, ... (43 of them)" (session 53)
    (["profile", "--plan", "{serving_best_yaml}"],
     "{serving_best_yaml} is an `infer` run's best.yaml (a serving layout): profile measures a training plan"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_pp8_yaml}"], "4 layers not divisible by pp*vp=8"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_precision_yaml}"], "key 'precision': expected one of"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_mxfp8_yaml}"], "precision 'mxfp8' is not supported by the built-in transformer"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_big_yaml}"], "a job of 4096 ranks is larger than"),
    # "hang" without its rank passed, then each rank failed on "not enough values to unpack" (session 55)
    (["profile", "--model", "cpu-small", "--plan", "{plan_good_yaml}", "--device", "cpu", "--fault", "hang"],
     "fault='hang': use kill:RANK or hang:RANK"),
    # plan fields the built-in transformer ignores were measured as another plan (session 55)
    (["profile", "--model", "cpu-small", "--plan", "{plan_layout_yaml}"], "pipeline_model_parallel_layout='Et*3|tL': "
     "the built-in transformer splits the layers evenly over pp*vp stages (use --trainer megatron for an uneven split)"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_modules_yaml}"], "selective recompute of 'core_attn "
     "layernorm': the built-in transformer recomputes the attention core only (recompute_modules core_attn)"),
    # two ranks of llama3.1-405b fit the rank count and died of memory a minute in (session 55)
    (["profile", "--model", "llama3.1-405b", "--plan", "{plan_dp2_yaml}", "--device", "cpu"],
     "its 2 CPU ranks need at least 4,536 GiB for llama3.1-405b's weights and gradients alone"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_key_yaml}"], "unknown key 'tensor_parallel'"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_nogbs_yaml}"], "missing required key 'gbs'"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_other_model_yaml}"],
     "--model cpu-small, but {plan_other_model_yaml} is a plan for 'gpt3-175b' (its 'model' key)"),
    (["profile", "--plan", "{plan_tp3_yaml}"], "profile --plan needs --model"),
    # a missing file said "cannot read X" without the flag that named it (session 53)
    (["profile", "--model", "cpu-small", "--plan", "{dir}/no_plan.yaml"],
     "--plan: cannot read {dir}/no_plan.yaml: No such file or directory"),
    (["fp8-check", "--model", "llama3-8b", "--settings", "{dir}/no_settings.yaml"],
     "--settings: cannot read {dir}/no_settings.yaml: No such file or directory"),
    (["fp8-check", "--model", "llama3-8b", "--settings", "{dir}"], "--settings: YAML file {dir} is a folder, not a regular file"),
    (["search", "--model", "175b", "--gpus", "64", "--fp8-check", "--fp8-check-settings", "{dir}/no_settings.yaml"],
     "--fp8-check-settings: cannot read {dir}/no_settings.yaml: No such file or directory"),
    (["profile", "--model", "cpu-small", "--rank", "1", "{big}"], "--model cpu-small is not the model of"),
    (["profile", "--rank", "1", "{big}"], "a job of 1024 ranks is larger than"),
    (["profile", "--rank", "one", "{grid}"], "--rank expects N RUN_DIR, got 'one' for N"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_tp3_yaml}", "--memory-cap-gib", "nan"],
     "--memory-cap-gib: expected a positive finite number, got nan"),
    (["profile", "--model", "cpu-small", "--plan", "{plan_tp3_yaml}", "--timeout", "0"], "--timeout: expected a positive number of seconds, got 0"),
    (["profile", "--model", "cpu-small", "--rank", "1", "{grid}", "--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "nothing answers at 127.0.0.1:1"),
    # --- measured numbers are finite and positive: a bad row is skipped, none left is exit 2
    (["validate", "--runs", "{runs_zero_csv}"],
     "runs CSV row narayanan21-table1-gpt-1.7b: measured_hw_tflops_per_gpu = 0"),
    (["validate", "--runs", "{runs_negative_csv}"], "measured_hw_tflops_per_gpu = -137"),
    (["validate", "--runs", "{runs_inf_csv}"], "measured_hw_tflops_per_gpu = inf is not a finite positive number; no usable row is left"),
    (["validate", "--runs", "{runs_no_metric_csv}"], "measured_hw_tflops_per_gpu is empty or NaN; no usable row is left"),
    (["validate", "--runs", "{runs_mfu_csv}"], "measured_mfu_pct = 150"),
    (["calibrate", "--gpu", "a100-sxm-80g", "--runs", "{runs_zero_csv}", "--dry-run"], "measured_hw_tflops_per_gpu = 0"),
    (["validate", "--inference", "--runs", "{serving_negative_csv}"],
     "row at line 2: throughput_tokens_per_s = -10907 is not a finite positive number; no usable row is left"),
    # --- a damaged run folder is named and refused with the first damage found
    (["export", "{candidates_nan}"], "candidates.csv is damaged: rank 1: step_time_s is empty"),
    (["export", "{candidates_negative}"], "candidates.csv is damaged: rank 2: peak_memory_gib = -1.0 is not a finite positive number"),
    (["export", "{candidates_inf}"], "candidates.csv is damaged: rank 3: tokens_per_s_per_gpu = inf"),
    (["export", "{candidates_breakdown}"], "candidates.csv is damaged: rank 1: compute_s = -0.25 is not a finite non-negative number"),
    (["export", "{candidates_no_column}"], "candidates.csv is damaged: it has no column tokens_per_s_per_gpu"),
    (["export", "{candidates_truncated}"], "candidates.csv is damaged: rank 3"),
    (["report", "{candidates_nan}"], "candidates.csv is damaged: rank 1: step_time_s is empty"),
    (["report", "{study_no_trials}"], "study.db is damaged: it has no table trials"),
    (["search", "--resume", "{study_no_trials}"], "study.db is damaged: it has no table trials"),
    (["report", "{study_no_values}"], "completed trials have no values"),
    (["search", "--resume", "{study_no_values}"], "completed trials have no values"),
    # --- flags with no effect in the combination: an error naming both
    (["search", "--model", "175b", "--gpus", "64", "--recompute", "none", "--recompute-num-layers", "2"],
     "--recompute-num-layers has no effect with --recompute none"),
    (["search", "--model", "175b", "--gpus", "64", "--recompute", "selective", "--recompute-num-layers", "2"],
     "--recompute-num-layers has no effect with --recompute selective"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--recompute", "none", "--recompute-num-layers", "1"],
     "--recompute-num-layers has no effect with --recompute none"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--recompute", "full", "--recompute-num-layers", "13"],
     "--recompute-num-layers 13 is above the 12 layers of a pipeline chunk of gpt3-175b with --pp 8; give at most 12"),
    (["search", "--model", "175b", "--gpus", "64", "--recompute-num-layers", "97"],
     "--recompute-num-layers 97 is above the 96 layers of gpt3-175b"),
    (["search", "--model", "175b", "--gpus", "64", "--fsdp", "--no-distributed-optimizer"],
     "--fsdp needs the distributed optimizer (Megatron-FSDP shards the optimizer state itself); drop --no-distributed-optimizer"),
    (["estimate", "--model", "175b", "--gpus", "64", "--tp", "8", "--pp", "8", "--fsdp", "--no-distributed-optimizer"],
     "--fsdp needs the distributed optimizer"),
    (["search", "--model", "175b", "--gpus", "64", "--trials", "50"], "--trials has no effect with --strategy grid"),
    (["search", "--model", "175b", "--gpus", "64", "--workers", "4"], "--workers has no effect with --strategy grid"),
    (["search", "--model", "175b", "--gpus", "64", "--sampler", "random"], "--sampler has no effect with --strategy grid"),
    (["search", "--model", "175b", "--gpus", "64", "--storage", "sqlite:///x.db"], "--storage has no effect with --strategy grid"),
    (["search", "--model", "175b", "--gpus", "64", "--no-save", "--results", "{dir}/elsewhere"], "--results has no effect with --no-save"),
    (["search", "--resume", "{optuna}", "--model", "gpt3-175b"], "--model gpt3-175b has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--gpus", "16"], "--gpus 16 has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--trials", "9"], "--trials has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--seq-length", "4096"], "--seq-length has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--tp", "2"], "--tp has no effect with --resume"),
    (["estimate", "--from-log", "{runs_junk_csv}", "--tp", "2"], "--tp has no effect with --from-log"),
    (["estimate", "--from-log", "{runs_junk_csv}", "--gpu", "h100-sxm"],
     "--from-log {runs_junk_csv}: no printed configuration"),
    (["estimate", "--from-log", "{runs_junk_csv}", "--model", "175b"], "--model has no effect with --from-log"),
    (["calibrate", "--gpu", "h100-sxm", "--dry-run", "-o", "{dir}/fit.yaml"], "--output has no effect with --dry-run"),
    (["calibrate", "--gpu", "h100-sxm", "--moe", "--as", "mine"], "--as has no effect with --moe"),
    (["calibrate", "--gpu", "h100-sxm", "--with-published"], "--with-published has no effect with no --runs"),
    (["calibrate", "--gpu", "b200", "--moe", "--gpu-speed"], "--gpu-speed has no effect with --moe"),
    (["calibrate", "--gpu", "cpu-local"], "no published run was measured on cpu-local; nothing to fit"),
    (["search", "--model", "", "--gpus", "8"], "--model: expected a value, got an empty string"),
    (["search", "--model=", "--gpus", "8"], "--model: expected a value, got an empty string"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", " "], "--gpu: expected a value, got an empty string"),
    (["export", "{grid}", "-o", ""], "-o: expected a value, got an empty string"),
    # a positional was "an argument" (session 55): named as its usage shows it
    (["export", ""], "RUN_DIR: expected a value, got an empty string"),
    (["runs", "import", "", "--gpu", "h100-sxm"], "LOG: expected a value, got an empty string"),
    (["profile", "--rank", "1", ""], "RUN_DIR of --rank: expected a value, got an empty string"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "loop"], "loop.yaml: Too many levels of symbolic links"),
    (["search", "--model", "mloop", "--gpus", "64"], "mloop.yaml: Too many levels of symbolic links"),
    # --- names are names: a preset name never becomes a path
    (["search", "--model", "{name_parent_yaml}", "--gpus", "8"], "name '../../outside' contains a path separator"),
    (["search", "--model", "{name_slash_yaml}", "--gpus", "8"], "name_slash.yaml: name 'a/b' contains a path separator"),
    (["search", "--model", "{name_empty_yaml}", "--gpus", "8"], "name_empty.yaml: name '' is empty"),
    (["search", "--model", "{name_control_yaml}", "--gpus", "8"], "name 'tiny\\x1b[31m' contains a control character"),
    (["search", "--model", "{name_dot_yaml}", "--gpus", "8"], "name '..' starts with '.' or contains '..'"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{hw_name_slash_yaml}"], "name '../gpu' contains a path separator"),
    (["infer", "--model", "{name_parent_yaml}", "--gpus", "8"], "name '../../outside' contains a path separator"),
    (["calibrate", "--gpu", "h100-sxm", "--as", "../mine"], "--as '../mine' contains a path separator"),
    (["calibrate", "--gpu", "h100-sxm", "--as", ".."], "--as '..' starts with '.' or contains '..'"),
    # --- outputs never destroy what they name: not a device, a FIFO, a folder or a link loop
    (["export", "{grid}", "-o", "/dev/null"], "--output /dev/null is a character device, not a regular file; refusing to replace it"),
    (["export", "{grid}", "-o", "{fifo}"], "--output {fifo} is a FIFO (named pipe), not a regular file; refusing to replace it"),
    (["export", "{grid}", "-o", "{link_to_null}"], "--output {link_to_null} is a character device, not a regular file"),
    (["export", "{grid}", "-o", "{link_to_folder}"], "--output {link_to_folder} is a folder; give a file name"),
    (["export", "{grid}", "-o", "{link_loop}"], "--output {link_loop} is a symbolic link that cannot be followed"),
    (["calibrate", "--gpu", "h100-sxm", "-o", "{fifo}"], "--output {fifo} is a FIFO (named pipe), not a regular file"),
    (["calibrate", "--gpu", "h100-sxm", "-o", "/dev/null"], "--output /dev/null is a character device, not a regular file"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--runs", "{fifo}"], "--runs {fifo} is a FIFO (named pipe)"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--runs", "{a_folder}"], "--runs {a_folder} is a folder; give a file name, e.g. {a_folder}/runs.csv"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--runs", "{link_loop}"], "--runs {link_loop} is a symbolic link that cannot"),
    # --- inputs are regular files of a bounded size, read with a cap
    (["search", "--model", "/dev/zero", "--gpus", "8"], "YAML file /dev/zero is a character device, not a regular file"),
    (["search", "--model", "{fifo}", "--gpus", "8"], "YAML file {fifo} is a FIFO (named pipe), not a regular file"),
    (["search", "--model", "{a_folder}", "--gpus", "8"], "YAML file {a_folder} is a folder, not a regular file"),
    (["search", "--model", "{big_yaml}", "--gpus", "8"], "YAML file {big_yaml} is 17 MiB; a YAML file is at most 16 MiB"),
    (["search", "--model", "175b", "--gpus", "64", "--gpu", "{fifo}"], "YAML file {fifo} is a FIFO"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "/dev/zero"], "YAML file /dev/zero is a character device"),
    (["search", "--model", "{link_loop}", "--gpus", "8"], "cannot read {link_loop}: Too many levels of symbolic links"),
    (["profile", "--model", "cpu-small", "--plan", "{fifo}"], "YAML file {fifo} is a FIFO"),
    (["validate", "--runs", "{fifo}"], "runs CSV {fifo} is a FIFO (named pipe), not a regular file"),
    (["validate", "--runs", "{big_csv}"], "runs CSV {big_csv} is 257 MiB; a runs CSV is at most 256 MiB"),
    (["validate", "--inference", "--runs", "/dev/zero"], "runs CSV /dev/zero is a character device"),
    (["calibrate", "--gpu", "h100-sxm", "--runs", "{fifo}"], "runs CSV {fifo} is a FIFO"),
    (["export", "{candidates_fifo}"], "candidates.csv is a FIFO (named pipe), not a regular file"),
    (["report", "{candidates_fifo}"], "candidates.csv is a FIFO (named pipe), not a regular file"),
    (["search", "--model", "{moe_freq_huge_yaml}", "--gpus", "8"], "moe_layer_freq '[1]*1000000000000' has a count of 1000000000000 for 4 layers"),
    (["@no-torch", "profile", "--model", "cpu-small", "--rank", "1", "{grid}"], "profile runs the built-in transformer and needs torch"),
    # --- fresh-eyes rerun of issue 25 (2026-11-26): each failed before its fix
    (["validate", "--runs", "{runs_tflops_huge_csv}"],
     "measured_hw_tflops_per_gpu = 1e+30 is outside the plausible 0.001..100000 TFLOP/s"),
    (["validate", "--runs", "{runs_step_tiny_csv}"], "measured_iteration_time_s = 1e-12 is outside the plausible 0.0001..86400 s"),
    (["validate", "--runs", "{runs_tp_half_csv}"], "row narayanan21-table1-gpt-1.7b: tp = 1.5 is not a positive integer"),
    (["validate", "--runs", "{runs_gpus0_csv}"], "row narayanan21-table1-gpt-1.7b: num_gpus = 0 is not a positive integer"),
    (["calibrate", "--gpu", "a100-sxm-80g", "--runs", "{runs_tp_half_csv}", "--dry-run"], "tp = 1.5 is not a positive integer"),
    (["validate", "--runs", "{runs_cut_csv}"], "runs_cut.csv is damaged: its only row, line 2 is cut off after 8 of"),
    (["report", "{candidates_no_rank}"], "candidates.csv is not a candidates table (no column rank)"),
    (["export", "{candidates_no_rank}"], "candidates.csv is not a candidates table (no column rank)"),
    (["export", "{candidates_huge}"], "candidates.csv is 1,025 MiB; a run table is at most 1,024 MiB"),
    (["report", "{candidates_huge}"], "candidates.csv is 1,025 MiB; a run table is at most 1,024 MiB"),
    (["search", "--model", "{name_nel_yaml}", "--gpus", "8"], "name 'tiny\\x85next' contains a control character (U+0085)"),
    (["search", "--model", "{name_bidi_yaml}", "--gpus", "8"], "name 'tiny\\u202ex' contains a control character (U+202E)"),
    (["search", "--model", "{name_long_yaml}", "--gpus", "8"], "is 300 bytes long; a name is at most 100"),
    (["calibrate", "--gpu", "h100-sxm", "--as", "x" * 300], "is 300 bytes long; a name is at most 100"),
    (["calibrate", "--gpu", "h100-sxm", "--as", "mine\u202e"], "contains a control character (U+202E)"),
    (["export", "{grid}", "-o", "{dir}/newdir/"], "--output {dir}/newdir/ ends in a path separator, so it names a folder"),
    (["calibrate", "--gpu", "h100-sxm", "-o", "{dir}/newdir/"], "--output {dir}/newdir/ ends in a path separator"),
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--runs", "{dir}/newdir/"], "--runs {dir}/newdir/ ends in a path separator, so it names a folder; give a file name, e.g. {dir}/newdir/runs.csv"),
    # a --runs you name is written where you say, as export -o is: a missing folder is refused (only the
    # default results/runs.csv makes results/), where it once made /nonexistent at the root
    (["runs", "import", "{runs_junk_csv}", "--gpu", "h100-sxm", "--runs", "{dir}/newdir/deeper/runs.csv"],
     "--runs {dir}/newdir/deeper/runs.csv: the folder {dir}/newdir/deeper does not exist"),
    (["@home={results_file}", "calibrate", "--gpu", "h100-sxm"],
     "your preset folder {results_file}/hardware (AUTOPARALLEL_HOME={results_file}) is under {results_file}, which is a file"),
    (["@home={results_file}", "calibrate", "--from", "{grid}"], "which is a file, not a folder"),
    (["search", "--model", "175b", "--gpus", "64", "--json", "--wide"], "--wide has no effect with --json"),
    (["search", "--model", "175b", "--gpus", "64", "--json", "--explain"], "--explain has no effect with --json"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--json", "--wide"], "--wide has no effect with --json"),
    (["search", "--model", "175b", "--gpus", "64", "--tokens", "-5T"], "--tokens: expected a positive token count up to 1e18"),
    (["search", "--model", "175b", "--gpus", "64", "--tokens", "1T", "--gpu-hour-cost", "-1e3"],
     "--gpu-hour-cost: expected a positive price in USD per GPU-hour, at most 1e6, got -1e3"),
    (["search", "--model", "175b", "--gpus", "64", "--train-days", "-inf"], "--train-days: expected a positive number of days"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--latency-metric", "ttft"],
     "--latency-metric has no effect with no --max-latency-ms"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{fifo}"], "workload file {fifo} is a FIFO (named pipe)"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{a_folder}"], "workload file {a_folder} is a folder"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{big_workload_csv}"],
     "workload file {big_workload_csv} is 65 MiB; a workload file is at most 64 MiB"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{workload_field_csv}"],
     "not a CSV of input_len,output_len pairs (field larger than field limit"),
    # --- fresh eyes on recent flags (2026-11-26)
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{workload_huge_csv}"],
     "row 1: input_len '1000000000000' is not a whole number of tokens in 1..2147483647"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--request-rate", "1e300"],
     "no serving layout of llama3-8b on 8 x h100-sxm serves --request-rate 1e+300 requests/s"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--executor", "slurm"],
     "--executor has no effect with no --profile: only a profiled search reads it"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--top-k", "3"], "--top-k has no effect with no --profile"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--device", "cpu"], "--device has no effect with no --profile"),
    (["search", "--resume", "{optuna}", "--profile-steps", "3"], "--profile-steps has no effect with no --profile"),
    (["search", "--model", "cpu-small", "--gpus", "4", "--gpu", "cpu-local", "--trainer", "builtin"],
     "--trainer builtin has no effect with --executor local"),
    # --- s41h3's audit of the installed wheel (2026-11-28): each ran (exit 0) or misled before its fix
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{workload_extra_csv}"],
     "--workload {workload_extra_csv} row 2: 3 fields, the header names 2"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--workload", "{workload_bool_jsonl}"],
     "--workload {workload_bool_jsonl} row 2: input_len true is not a whole number of tokens"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--requests", "50"],
     "--requests has no effect with no --workload, --scenario or --latency-percentile"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--seed", "3"],
     "--seed has no effect with no --workload, --scenario or --latency-percentile"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--no-save", "--results", "{dir}/out"],
     "--results has no effect with --no-save"),
    (["fp8-check", "--model", "cpu-small", "--no-save", "--results", "{dir}/out"], "--results has no effect with --no-save"),
    (["search", "--model", "175b", "--gpus", "1024", "--pp", "8", "--decoder-first-pipeline-num-layers", "200"],
     "--decoder-first-pipeline-num-layers 200 is more than the 96 layers of gpt3-175b; give at most 96 in all"),
    (["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--decoder-first-pipeline-num-layers",
      "50", "--decoder-last-pipeline-num-layers", "50"], "--decoder-first-pipeline-num-layers 50 + "
     "--decoder-last-pipeline-num-layers 50 is more than the 96 layers of gpt3-175b"),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--space", "training"],
     "--space training is a search space of `search` (it sets activation_func_fp8_input_store); infer's spaces: inference"),
    (["export", "{grid}", "--format", "launch", "-o", "{grid}/manifest.yaml"],
     "--output {grid}/manifest.yaml is the run folder's own manifest.yaml, which export and report read"),
    (["export", "{grid}", "-o", "{grid}/candidates.csv"], "is the run folder's own candidates.csv"),
    # what --profile measured was replaced by a YAML document (session 55)
    (["export", "{profiled_run}", "-o", "{profiled_run}/profiled.csv"], "is the run folder's own profiled.csv"),
    (["runs", "import", "{dir}/no_such.log", "--gpu", "h100-sxm", "--runs", "{dir}/out.csv"],
     "the log could not be read (cannot read {dir}/no_such.log: No such file or directory); nothing written"),
    (["calibrate", "--gpu", "h100-sxm", "--as", "h200"], "--as h200 names the shipped preset h200: the fit of h100-sxm "
     "would take its place for every --gpu h200; give a new name for your cluster"),
    (["calibrate", "--gpu", "h100-sxm", "--as", "H100"], "--as H100 names the shipped preset h100-sxm"),
    (["search", "--resume", "{optuna}", "--gpu", "h200"], "--gpu has no effect with --resume: a resumed search keeps its own"),
    (["search", "--resume", "{optuna}", "--tokens", "1T"], "--tokens has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--strategy", "grid"], "--strategy has no effect with --resume"),
    (["search", "--resume", "{optuna}", "--results", "{dir}/out"], "--results has no effect with --resume: the search goes on in"),
    (["search", "--model", "175b", "--gpus", "64", "--fp8-check-settings", "{dir}/x.yaml"],
     "--fp8-check-settings has no effect with no --fp8-check"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "inference"],
     "--space inference is a search space of `infer` (it sets add_max_batch); search's spaces: training, cpu-profiling"),
    (["search", "--model", "{hw_h100_yaml}", "--gpus", "8"], "--model {hw_h100_yaml} is a hardware preset (it sets "),
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--gpu", "{model_llama_yaml}"],
     "--gpu {model_llama_yaml} is a model preset (it sets activation); give a hardware preset (`autoparallel hardware`)"),
    (["search", "--model", "175b", "--gpus", "64", "--space", "{model_llama_yaml}"],
     "--space {model_llama_yaml} is a model preset (it sets activation); search's spaces: training, cpu-profiling"),
    # --- session 46's audit: each was exit 0 (or a misleading message) before
    (["infer", "--model", "llama3-8b", "--gpus", "8", "--scenario", "offline", "--request-rate", "5"],
     "--scenario offline sends every request at once; drop --request-rate 5, or drop --scenario to simulate 5 requests/s"),
    (["search", "--model", "llama3-8b", "--gpus", "8", "--overlap-moe-expert-parallel-comm"],
     "--overlap-moe-expert-parallel-comm overlaps the MoE all-to-alls; llama3-8b is dense (no experts): drop it"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--overlap-moe-expert-parallel-comm"],
     "--overlap-moe-expert-parallel-comm overlaps the MoE all-to-alls; llama3-8b is dense"),
    (["runs", "import", "{good_log}", "--gpu", "h100-sxm", "--runs", "{runs_id_only_csv}"],
     "{runs_id_only_csv} is not a runs CSV: it lacks column(s) num_layers, hidden_size"),
    (["runs", "import", "{good_log}", "--gpu", "h100-sxm", "--runs", "{dir}/out.csv", "--warmup", "100000"],
     "no logged interval after --warmup 100000 (the last ends at iteration 100): give a lower --warmup"),
    (["search", "--model", "llama3-8b", "--gpus", "8", "--pipeline-layout", "E|t*32L"],  # was NaN rows, "feasible"
     "pipeline layout puts no decoder layer (t) on pipeline rank 0 at pp=2"),
]


def _fill(text: str, files: dict) -> str:
    return text.format(**{k: str(v) for k, v in files.items() if k != "snapshot"})


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a)[:70] for a, _ in BAD_INPUTS])
def test_bad_input_gets_one_line_and_exit_2(args, message, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # results/ would go here
    monkeypatch.setenv(resources.HOME_ENV, str(files["home"]))  # holds a junk preset
    if args and args[0] == "@no-torch":
        monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
        args = args[1:]
    if args and args[0].startswith("@home="):  # AUTOPARALLEL_HOME pointing elsewhere
        monkeypatch.setenv(resources.HOME_ENV, _fill(args[0][len("@home="):], files))
        args = args[1:]
    try:
        code = main([_fill(a, files) for a in args])
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert _fill(message, files) in err
    assert list(tmp_path.iterdir()) == []  # no results/, no layer_profiles.json, nothing
    assert _snapshot(files["dir"]) == files["snapshot"]  # no fixture file touched


def test_the_table_covers_every_command():
    commands = {a[1] if a[0].startswith("@") else a[0] for a, _ in BAD_INPUTS if a}
    assert commands == {"search", "estimate", "export", "report", "validate", "calibrate", "fp8-check",
                        "infer", "profile", "runs", "models", "hardware", "serch"}
    assert len(BAD_INPUTS) >= 60


def test_a_junk_preset_breaks_no_other_preset(files, monkeypatch, capsys):
    monkeypatch.setenv(resources.HOME_ENV, str(files["home"]))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gpt3-175b" in out and "tiny" in out and "skipped junk.yaml" in out and "skipped mloop.yaml" in out
    assert main(["hardware"]) == 0
    assert "h100-sxm" in (out := capsys.readouterr().out) and "skipped loop.yaml" in out
    assert main(["estimate", "--model", "tiny", "--gpus", "4", "--tp", "2", "--pp", "2", "--json"]) == 0


def test_the_largest_counts_run_without_overflow(capsys):
    """The largest accepted counts go through the vectorised model: finite numbers, no warnings."""
    import json
    import math
    assert main(["search", "--model", "175b", "--gpus", str(2**31 - 1), "--gbs", str(2**31 - 1), "--no-save",
                 "--json", "--top", "1"]) == 0
    out = capsys.readouterr()
    best = json.loads(out.out)[0]
    assert out.err == "" and best["config"]["dp"] == 2**31 - 1
    assert all(math.isfinite(best[k]) and best[k] > 0 for k in ("step_time_s", "tokens_per_s_per_gpu", "peak_memory_gib"))


def test_a_bad_measured_row_is_skipped_with_its_reason_and_the_rest_used(tmp_path, capsys):
    """Of a bad row and a good one, the good one is used and the bad one named on stderr."""
    from autoparallel import measured_runs
    lines = resources.data_file("training_runs.csv").read_text().splitlines()
    bad = next(csv.reader([lines[1]]))
    bad[lines[0].split(",").index("measured_hw_tflops_per_gpu")] = "-1"
    (tmp_path / "runs.csv").write_text("\n".join([lines[0], ",".join(f'"{v}"' for v in bad), lines[2]]) + "\n")
    rows = measured_runs.load_runs([tmp_path / "runs.csv"])
    assert [r.id for r in rows] == [next(csv.reader([lines[2]]))[0]]
    err = capsys.readouterr().err
    assert err == (f"autoparallel: warning: runs CSV row {bad[0]} skipped: measured_hw_tflops_per_gpu = -1 "
                   "is not a finite positive number\n")


@pytest.mark.parametrize("pattern, change, reason", [
    (r"elapsed time per iteration \(ms\): [0-9.]+ \|", "elapsed time per iteration (ms): 0.0 |",
     "elapsed time per iteration (ms) = 0.0 is not a finite positive number"),
    (r"throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|", "throughput per GPU (TFLOP/s/GPU): 0.0 |",
     "TFLOP/s = 0.0 is not a finite positive number"),
    (r"throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|", "throughput per GPU (TFLOP/s/GPU): 1e30 |",
     "TFLOP/s = 1e+30 is outside the plausible 0.001..100000 TFLOP/s"),
    (r"elapsed time per iteration \(ms\): [0-9.]+ \|", "elapsed time per iteration (ms): 0.000000001 |",
     "elapsed time per iteration (ms) = 1e-09 is outside the plausible 0.1..8.64e+07 ms"),
    (r"max allocated: [0-9.]+", "max allocated: 1e15", "measured_max_allocated_gib = 9.76562e+11 is outside the plausible"),
    (r"tensor_model_parallel_size \.+ 2\n", "tensor_model_parallel_size ..... 1.5\n",
     "the configuration's tensor_model_parallel_size = 1.5 is not a positive integer"),
], ids=["zero-step", "zero-tflops", "huge-tflops", "tiny-step", "huge-memory", "fractional-tp"])
def test_a_log_with_a_bad_measurement_is_skipped_with_its_reason(pattern, change, reason, tmp_path, capsys):
    import re
    from pathlib import Path
    source = Path(__file__).parent / "fixtures" / "runlogs" / "megatron_tp2_pp2_vp4_sp_selective_fp8.log"
    text = re.sub(pattern, change, source.read_text())
    assert text != source.read_text()
    (tmp_path / "job.log").write_text(text)
    code = main(["runs", "import", str(tmp_path / "job.log"), "--gpu", "h100-sxm", "--runs", str(tmp_path / "runs.csv")])
    out, err = capsys.readouterr()
    assert code == 2 and "the log could not be read" in err and len(err.splitlines()) == 1
    # one log alone: its reason is said once, in the error (stdout repeated it before s55h8)
    assert reason in err and reason not in out and err.count(reason) == 1
    assert not (tmp_path / "runs.csv").exists()
