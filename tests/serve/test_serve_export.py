"""Engine commands: every flag exported is one the engine's parser declares (engine_flags.yaml)."""

import re

import pandas as pd
import pytest

from autoparallel.serve import export
from autoparallel.serve.export import Command, commands, engine_flags

LAYOUTS = [
    {"tp": 1, "pp": 2, "replicas": 4, "max_batch": 35, "max_num_tokens": 8192, "weight_precision": "fp8",
     "kv_precision": "fp8", "concurrency": 70.0},
    {"tp": 8, "pp": 1, "replicas": 1, "max_batch": 256, "max_num_tokens": 2048, "weight_precision": "bf16",
     "kv_precision": "bf16", "concurrency": 256.0},
    {"tp": 2, "pp": 1, "replicas": 4, "max_batch": 64, "max_num_tokens": 512, "weight_precision": "fp16",
     "kv_precision": "fp8", "concurrency": 64.0},
    {"tp": 8, "pp": 2, "replicas": 2, "max_batch": 32, "max_num_tokens": 2048, "weight_precision": "bf16",
     "kv_precision": "bf16", "concurrency": 64.0},  # each replica on two 8-GPU nodes
    {"tp": 8, "pp": 1, "ep": 8, "replicas": 1, "max_batch": 128, "max_num_tokens": 8192, "weight_precision": "fp8",
     "kv_precision": "fp8", "concurrency": 128.0},  # a MoE model's experts spread over the TP group
    {"tp": 4, "pp": 1, "ep": 4, "replicas": 2, "max_batch": 64, "max_num_tokens": 2048, "weight_precision": "fp8",
     "kv_precision": "fp8", "concurrency": 64.0},  # expert parallel with replicas: one vLLM server each
]


def _all(cmds) -> list[Command]:
    out = []
    for c in cmds.values():
        out += c if isinstance(c, list) else [c]
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_exported_flag_is_in_the_engine_parser(layout):
    row = pd.Series(layout)
    flags = engine_flags()
    for cmd in _all(commands(row, "llama3.1-70b", 2304)):
        parts = [(cmd.parser, cmd.args)] + ([(f"{cmd.parser} {cmd.subcommand}", cmd.sub_args)] if cmd.subcommand else [])
        for parser, args in parts:
            spec = flags[parser]
            for flag, value in args:
                assert flag in spec["flags"], (parser, flag)
                if flag in (spec.get("choices") or {}):
                    assert value in spec["choices"][flag], (parser, flag, value)
        text = cmd.text().split(cmd.program, 1)[1]  # cmd.text() runs Command.check too
        for flag in re.findall(r"(?<= )--?[a-zA-Z][\w-]*", text):
            assert flag in flags[cmd.parser]["flags"] or flag in flags.get(f"{cmd.parser} {cmd.subcommand}",
                                                                          {}).get("flags", []), flag


def test_flag_lists_name_their_snapshot():
    for parser, spec in engine_flags().items():
        src = spec["source"]
        assert src["repo"].count("/") == 1 and src["path"], parser
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), parser
        assert len(spec["flags"]) == len(set(spec["flags"])) >= 6, parser


def test_an_unknown_flag_is_refused():
    with pytest.raises(RuntimeError, match="vllm serve has no flag --max-batch-size"):
        Command("vllm serve", "vllm serve m", (("--max-batch-size", "8"),)).text()
    with pytest.raises(RuntimeError, match="not one of"):
        Command("sglang", "python -m sglang.launch_server", (("--kv-cache-dtype", "fp8"),)).text()


def test_layout_reaches_each_engine():
    row = pd.Series(LAYOUTS[0])
    cmds = commands(row, "llama3.1-70b", 2304)
    vllm = cmds["vllm"].text()
    assert "--tensor-parallel-size 1 --pipeline-parallel-size 2 --data-parallel-size 4" in vllm
    assert "--max-num-seqs 70" in vllm  # the whole server's running requests: pp x max batch
    assert "--quantization fp8" in vllm and "--kv-cache-dtype fp8" in vllm
    serve = cmds["trtllm-serve"]
    assert len(serve) == 4  # one server per replica, each on its own GPUs and port
    gpus = [re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", c.text())[1] for c in serve]
    assert gpus == ["0,1", "2,3", "4,5", "6,7"]
    assert all("--max_batch_size 35" in c.text() for c in serve)  # per micro-batch
    bench = cmds["trtllm-bench"].text()
    assert " throughput " in bench and "--concurrency 70" in bench and "--tp 1 --pp 2" in bench
    sglang = [c.text() for c in cmds["sglang"]]
    assert [re.search(r"--base-gpu-id (\d+)", s)[1] for s in sglang] == ["0", "2", "4", "6"]
    assert all("--max-running-requests 70" in s and "--kv-cache-dtype fp8_e4m3" in s for s in sglang)


def test_flags_file_ships_with_the_package():
    assert export.FLAGS_FILE.is_file() and "search_spaces" in str(export.FLAGS_FILE)


def test_replicas_are_placed_on_the_nodes_they_run_on():
    """GPU indices are a node's own; a replica wider than a node is launched as each engine's
    multi-node serving documents, never as GPU indices that repeat on one host."""
    row = pd.Series({**LAYOUTS[1], "tp": 8, "pp": 2, "replicas": 2})  # 2 replicas x 16 GPUs on 8-GPU nodes
    cmds = commands(row, "llama3.1-405b", 2304, gpus_per_node=8)
    serve = [c.text() for c in cmds["trtllm-serve"]]
    assert [s.split(" trtllm-llmapi-launch ")[0] for s in serve] == [
        "mpirun -np 16 -H <node0>:8,<node1>:8", "mpirun -np 16 -H <node2>:8,<node3>:8"]
    assert all("CUDA_VISIBLE_DEVICES" not in s and "--gpus_per_node 8" in s for s in serve)
    assert cmds["trtllm-bench"].text().startswith("mpirun -np 16 -H <node0>:8,<node1>:8 trtllm-llmapi-launch")
    sglang = [c.text() for c in cmds["sglang"]]
    ranks = [(re.search(r"--dist-init-addr (\S+)", s)[1], re.search(r"--node-rank (\d)", s)[1]) for s in sglang]
    assert ranks == [("<node0>:20000", "0"), ("<node0>:20000", "1"), ("<node2>:20001", "0"), ("<node2>:20001", "1")]
    assert all("--nnodes 2" in s and "--base-gpu-id" not in s for s in sglang)
    vllm = cmds["vllm"].text()
    assert "--distributed-executor-backend ray" in vllm and "--data-parallel-backend ray" in vllm

    on_gh200 = commands(pd.Series(LAYOUTS[0]), "llama3.1-70b", 2304, gpus_per_node=4)  # 4 replicas x 2 GPUs
    gpus = [re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", c.text())[1] for c in on_gh200["trtllm-serve"]]
    assert gpus == ["0,1", "2,3", "0,1", "2,3"]
    assert export.placement_document(pd.Series(LAYOUTS[0]), 4)["replicas"] == [
        "<node0> GPUs 0,1", "<node0> GPUs 2,3", "<node1> GPUs 0,1", "<node1> GPUs 2,3"]
    assert "vllm" not in export.placement_document(pd.Series(LAYOUTS[0]), 8)


def test_nvfp4_weights_reach_vllm_and_sglang_as_the_nvfp4_checkpoint():
    """Neither vLLM nor SGLang quantizes to NVFP4 on load: an NVFP4 layout runs from the pre-quantized
    (ModelOpt) checkpoint, read with ``--quantization modelopt_fp4`` (vllm-project/vllm@05d90956
    vllm/model_executor/layers/quantization/__init__.py; sgl-project/sglang@d9a2188f
    python/sglang/srt/arg_groups/choices.py). Before session 56 both loaded the 16-bit checkpoint with no
    quantization: a BF16 server sold as the NVFP4 prediction."""
    row = pd.Series({**LAYOUTS[1], "weight_precision": "nvfp4", "kv_precision": "fp8"})
    cmds = commands(row, "llama3.1-70b", 2304)
    vllm = cmds["vllm"].text()
    assert "vllm serve <llama3.1-70b NVFP4 checkpoint>" in vllm and "--quantization modelopt_fp4" in vllm
    for s in (c.text() for c in cmds["sglang"]):
        assert "--model-path <llama3.1-70b NVFP4 checkpoint>" in s and "--quantization modelopt_fp4" in s
    assert all("<llama3.1-70b NVFP4 checkpoint>" in c.text() for c in cmds["trtllm-serve"])
    fp8 = commands(pd.Series(LAYOUTS[0]), "llama3.1-70b", 2304)  # FP8: quantized on load from the 16-bit one
    assert "vllm serve <llama3.1-70b checkpoint>" in fp8["vllm"].text()


@pytest.mark.parametrize("policy", ["max_utilization", "guaranteed_no_evict"])
def test_trtllm_serve_runs_the_capacity_policy_priced(policy):
    """trtllm-serve has no scheduler-policy flag and builds GUARANTEED_NO_EVICT itself
    (NVIDIA/TensorRT-LLM@4c05a748 tensorrt_llm/commands/serve.py get_llm_args), so a prediction under
    MAX_UTILIZATION reaches it through --extra_llm_api_options (SchedulerConfig.capacity_scheduler_policy,
    tensorrt_llm/llmapi/llm_args.py@fcd3f316); trtllm-bench has its own --scheduler_policy."""
    row = pd.Series(LAYOUTS[0])
    cmds = commands(row, "llama3.1-70b", 2304, capacity_policy=policy)
    serve = [c.text() for c in cmds["trtllm-serve"]]
    assert f"--scheduler_policy {policy}" in cmds["trtllm-bench"].text()
    options = export.llm_api_options(policy, attention_dp=False)
    if policy == "max_utilization":
        assert options == {"scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}
        assert all("--extra_llm_api_options extra_llm_api_options.yaml" in s for s in serve)
    else:
        assert options == {} and not any("--extra_llm_api_options" in s for s in serve)
    assert export.llm_api_options(policy, attention_dp=True)["enable_attention_dp"] is True


@pytest.mark.parametrize("weights, kv, name", [
    ("fp8", "fp8", "<llama3.1-70b FP8 checkpoint>"),
    ("bf16", "bf16", "<llama3.1-70b checkpoint>"),
    ("bf16", "fp8", "<llama3.1-70b checkpoint with an FP8 KV cache>"),
    ("fp16", "fp8", "<llama3.1-70b checkpoint with an FP8 KV cache>"),
    ("fp8", "bf16", "<llama3.1-70b FP8 checkpoint with a 16-bit KV cache>"),
    ("nvfp4", "bf16", "<llama3.1-70b NVFP4 checkpoint with a 16-bit KV cache>"),
])
def test_trtllm_commands_name_a_checkpoint_with_the_kv_precision_priced(weights, kv, name):
    """TensorRT-LLM takes the KV cache dtype from the checkpoint's kv_cache_quant_algo (no flag of
    trtllm-serve or trtllm-bench sets it), so a layout whose KV precision differs from its checkpoint's
    usual one (FP8 beside quantized weights, 16 bits beside 16-bit ones) names it; before session 56 a
    BF16-weight, FP8-KV layout named the plain checkpoint and would have run a 16-bit KV cache."""
    row = pd.Series({**LAYOUTS[1], "weight_precision": weights, "kv_precision": kv})
    cmds = commands(row, "llama3.1-70b", 2304)
    assert all(f"trtllm-serve {name} " in c.text() for c in cmds["trtllm-serve"])
    assert f"--model_path {name} " in cmds["trtllm-bench"].text()
