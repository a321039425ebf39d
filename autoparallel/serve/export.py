"""A serving layout as commands a user pastes: ``vllm serve``, ``trtllm-serve``, ``trtllm-bench``, SGLang.

Every flag is one the engine's own argument parser declares, as transcribed (with the
repository, path and commit it was read from) in ``search_spaces/engine_flags.yaml``;
``Command.check`` refuses anything else, and values the parser restricts (``choices``) are
checked too. What each engine is told:

- the layout: TP, PP, and ``replicas`` copies of it (vLLM: one server with
  ``--data-parallel-size``; TensorRT-LLM and SGLang: one server per replica on its own GPUs and
  port, behind a load balancer); a MoE layout's expert parallelism (ep = tp: vLLM
  ``--enable-expert-parallel``, TensorRT-LLM ``--ep_size`` / ``--ep``, SGLang ``--ep-size``).
  vLLM spreads experts over TP x DP, so an expert-parallel layout with replicas runs one vLLM
  server per replica, as the other engines do;
- the scheduler: requests in flight (TensorRT-LLM ``--max_batch_size`` per pipeline micro-batch;
  vLLM ``--max-num-seqs`` and SGLang ``--max-running-requests`` for the whole server, so ``pp``
  times that), the iteration token budget (``--max-num-batched-tokens``,
  ``--max_num_tokens``, ``--chunked-prefill-size``) with chunked prefill on, the longest sequence
  (``--max-model-len``, ``--max_seq_len``, ``--context-length``) and the KV memory share the
  cost model assumed for that engine (``search_spaces/inference_assumptions.yaml``);
- precisions: vLLM and SGLang quantize FP8 weights on load (``--quantization fp8``) and take
  the KV cache dtype as a flag; NVFP4 weights neither quantizes on load, so they run from the
  pre-quantized (ModelOpt) checkpoint with ``--quantization modelopt_fp4``; TensorRT-LLM reads
  both from the checkpoint (a ModelOpt FP8 checkpoint carries ``quant_algo`` and
  ``kv_cache_quant_algo``), so its commands name the checkpoint to use, with its KV cache
  precision where that is not the usual one (FP8 beside quantized weights, 16 bits beside 16-bit);
- TensorRT-LLM's capacity policy: ``trtllm-bench --scheduler_policy``; trtllm-serve has no flag
  for it (it builds GUARANTEED_NO_EVICT), so MAX_UTILIZATION reaches it as an LLM API option
  (``--extra_llm_api_options``, the file best.yaml's ``extra_llm_api_options`` holds).

``trtllm-bench throughput`` reproduces the prediction: the same settings, offline at the
predicted number of requests in flight.

Placement: replica k takes GPUs k*tp*pp onwards, nodes of the hardware's ``gpus_per_node``
filled in order (hosts written ``<node0>``, ``<node1>``, ...). A replica on one node gets its
GPUs (``CUDA_VISIBLE_DEVICES``, SGLang ``--base-gpu-id``); one that spans nodes is launched as each
engine documents multi-node serving: TensorRT-LLM under MPI (``mpirun ... trtllm-llmapi-launch
trtllm-serve``, ``--gpus_per_node``), SGLang once per node (``--nnodes``, ``--node-rank``,
``--dist-init-addr``), vLLM on the head of a Ray cluster over the nodes
(``--distributed-executor-backend ray``, ``--data-parallel-backend ray``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from autoparallel import io

FLAGS_FILE = io.SEARCH_SPACES / "engine_flags.yaml"
DIST_INIT_PORT = 20000  # SGLang's rendezvous on a replica's first node, one port per replica


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


def _checkpoint(model_name: str, weight_precision: str, kv_precision: str | None = None) -> str:
    """The checkpoint a command loads: a pre-quantized one for FP8 and NVFP4 weights (the engines read
    the quantization from its config). ``kv_precision`` (TensorRT-LLM's commands, which take the KV
    cache dtype from the checkpoint's ``kv_cache_quant_algo`` too): named where it is not the usual
    one of such a checkpoint (FP8 beside quantized weights, ModelOpt's default; 16 bits beside
    16-bit ones)."""
    quantized = {"fp8": "FP8", "nvfp4": "NVFP4"}
    name = f"{model_name} {quantized[weight_precision]}" if weight_precision in quantized else model_name
    kv = ""
    if kv_precision is not None and (kv_precision == "fp8") != (weight_precision in quantized):
        kv = " with an FP8 KV cache" if kv_precision == "fp8" else " with a 16-bit KV cache"
    return f"<{name} checkpoint{kv}>"


#: ``--quantization`` of vLLM and SGLang per weight precision: FP8 quantized on load from the 16-bit
#: checkpoint, NVFP4 read from a ModelOpt NVFP4 checkpoint (neither engine quantizes to it on load).
#: Both names are in vllm-project/vllm@05d90956 vllm/model_executor/layers/quantization/__init__.py
#: and sgl-project/sglang@d9a2188f python/sglang/srt/arg_groups/choices.py.
QUANTIZATION = {"fp8": "fp8", "nvfp4": "modelopt_fp4"}


def _loaded_checkpoint(model_name: str, weight_precision: str) -> str:
    """The checkpoint vLLM and SGLang load: the 16-bit one, or the NVFP4 one for NVFP4 weights."""
    return _checkpoint(model_name, "nvfp4" if weight_precision == "nvfp4" else "bf16")


def _quantization(weight_precision: str) -> tuple[tuple[str, str], ...]:
    """vLLM's and SGLang's ``--quantization`` argument (none for 16-bit weights)."""
    method = QUANTIZATION.get(weight_precision)
    return (("--quantization", method),) if method else ()


def _ep(row) -> int:
    """The layout's expert parallel size (1 where the row predates the column)."""
    ep = row.get("ep", 1)
    return 1 if ep is None or ep != ep else int(ep)


def _ep_args(row, flag: str) -> tuple[tuple[str, str], ...]:
    """``flag`` with the expert parallel size, or nothing for a layout without EP."""
    return ((flag, str(_ep(row))),) if _ep(row) > 1 else ()


def _in_flight(row) -> int:
    """vLLM's max_num_seqs and SGLang's max_running_requests cap the running requests of the
    whole server; TensorRT-LLM's max_batch_size caps each of the ``pp`` micro-batches."""
    return int(row["max_batch"]) * int(row["pp"])


@dataclass(frozen=True)
class Replica:
    """Where one copy of the layout runs: ``slots[i]`` of its GPUs on node ``first_node + i``,
    from local GPU ``first_gpu`` on the first."""

    index: int
    first_node: int
    first_gpu: int
    slots: tuple[int, ...]

    @property
    def on_one_node(self) -> bool:
        return len(self.slots) == 1

    @property
    def hosts(self) -> list[str]:
        return [f"<node{self.first_node + i}>" for i in range(len(self.slots))]

    @property
    def mpirun(self) -> str:
        """The MPI launch of a replica over its nodes (TensorRT-LLM's multi-node serving)."""
        hosts = ",".join(f"{host}:{n}" for host, n in zip(self.hosts, self.slots))
        return f"mpirun -np {sum(self.slots)} -H {hosts}"

    @property
    def visible_devices(self) -> str:
        return ",".join(str(g) for g in range(self.first_gpu, self.first_gpu + self.slots[0]))


def placement(row, gpus_per_node: int) -> list[Replica]:
    """The replicas of a layout, nodes filled in order."""
    size = int(row["tp"]) * int(row["pp"])
    out = []
    for k in range(int(row["replicas"])):
        node, local = divmod(k * size, gpus_per_node)
        slots, left, free = [], size, gpus_per_node - local
        while left:
            slots.append(min(left, free))
            left -= slots[-1]
            free = gpus_per_node
        out.append(Replica(k, node, local, tuple(slots)))
    return out


def node_count(replicas: list[Replica]) -> int:
    return replicas[-1].first_node + len(replicas[-1].slots)


def vllm_serve(row, model_name: str, max_model_len: int, memory_fraction: float,
               gpus_per_node: int) -> Command | list[Command]:
    """One server for every replica (``--data-parallel-size``) or, for an expert-parallel layout
    with replicas, one per replica (vLLM's EP would otherwise span the replicas)."""
    replicas = placement(row, gpus_per_node)
    program = f"vllm serve {_loaded_checkpoint(model_name, row['weight_precision'])}"
    if _ep(row) == 1 or len(replicas) == 1:
        return Command("vllm serve", program, _vllm_args(row, max_model_len, memory_fraction, replicas))
    out = []
    for r in replicas:
        args = (*_vllm_args(row, max_model_len, memory_fraction, [r]), ("--port", str(8000 + r.index)))
        env = (("CUDA_VISIBLE_DEVICES", r.visible_devices),) if r.on_one_node else ()
        out.append(Command("vllm serve", program, args, env=env))
    return out


def _vllm_args(row, max_model_len: int, memory_fraction: float, replicas: list[Replica]) -> tuple:
    """The arguments of one vLLM server running ``replicas`` (data parallel when more than one)."""
    args = [("--tensor-parallel-size", str(int(row["tp"]))), ("--pipeline-parallel-size", str(int(row["pp"])))]
    if len(replicas) > 1:
        args.append(("--data-parallel-size", str(len(replicas))))
    if _ep(row) > 1:
        args.append(("--enable-expert-parallel", None))
    if node_count(replicas) - replicas[0].first_node > 1:  # the nodes these replicas span
        args.append(("--distributed-executor-backend", "ray"))
        if len(replicas) > 1:
            args.append(("--data-parallel-backend", "ray"))
    args += [("--max-num-seqs", str(_in_flight(row))),
             ("--max-num-batched-tokens", str(int(row["max_num_tokens"]))),
             ("--enable-chunked-prefill", None),
             ("--max-model-len", str(max_model_len)),
             ("--gpu-memory-utilization", f"{memory_fraction:g}"),
             ("--dtype", "float16" if row["weight_precision"] == "fp16" else "bfloat16"),
             *_quantization(row["weight_precision"])]
    args.append(("--kv-cache-dtype", "fp8" if row["kv_precision"] == "fp8" else "auto"))
    return tuple(args)


def trtllm_serve(row, model_name: str, max_model_len: int, memory_fraction: float,
                 gpus_per_node: int) -> list[Command]:
    program = f"trtllm-serve {_checkpoint(model_name, row['weight_precision'], row['kv_precision'])}"
    out = []
    for replica in placement(row, gpus_per_node):
        args = (("--backend", "pytorch"), ("--tp_size", str(int(row["tp"]))), ("--pp_size", str(int(row["pp"]))),
                *_ep_args(row, "--ep_size"),
                ("--max_batch_size", str(int(row["max_batch"]))),
                ("--max_num_tokens", str(int(row["max_num_tokens"]))),
                ("--max_seq_len", str(max_model_len)), ("--enable_chunked_prefill", None),
                ("--kv_cache_free_gpu_memory_fraction", f"{memory_fraction:g}"), ("--port", str(8000 + replica.index)))
        if replica.on_one_node:
            out.append(Command("trtllm-serve", program, args, env=(("CUDA_VISIBLE_DEVICES", replica.visible_devices),)))
            continue
        out.append(Command("trtllm-serve", f"{replica.mpirun} trtllm-llmapi-launch {program}",
                           args + (("--gpus_per_node", str(gpus_per_node)),)))
    return out


def trtllm_bench(row, model_name: str, max_model_len: int, memory_fraction: float, gpus_per_node: int,
                 capacity_policy: str = "guaranteed_no_evict") -> Command:
    """The throughput benchmark of one replica at the predicted settings, requests in flight and
    KV capacity policy."""
    replica = placement(row, gpus_per_node)[0]
    main = (("--model", f"<{model_name} HF name>"),
            ("--model_path", _checkpoint(model_name, row["weight_precision"], row["kv_precision"])))
    sub = (("--backend", "pytorch"), ("--tp", str(int(row["tp"]))), ("--pp", str(int(row["pp"]))),
           *_ep_args(row, "--ep"),
           ("--max_batch_size", str(int(row["max_batch"]))), ("--max_num_tokens", str(int(row["max_num_tokens"]))),
           ("--max_seq_len", str(max_model_len)), ("--kv_cache_free_gpu_mem_fraction", f"{memory_fraction:g}"),
           ("--scheduler_policy", capacity_policy), ("--enable_chunked_context", None),
           ("--concurrency", str(int(round(row["concurrency"])))), ("--dataset", "<dataset.jsonl>"))
    program = "trtllm-bench"
    if not replica.on_one_node:
        program = f"{replica.mpirun} trtllm-llmapi-launch trtllm-bench"
    return Command("trtllm-bench", program, main, "throughput", sub)


def sglang(row, model_name: str, max_model_len: int, memory_fraction: float, gpus_per_node: int) -> list[Command]:
    out = []
    for replica in placement(row, gpus_per_node):
        args = [("--model-path", _loaded_checkpoint(model_name, row["weight_precision"])), ("--tp-size", str(int(row["tp"]))),
                ("--pp-size", str(int(row["pp"]))), *_ep_args(row, "--ep-size"),
                ("--max-running-requests", str(_in_flight(row))),
                ("--chunked-prefill-size", str(int(row["max_num_tokens"]))), ("--context-length", str(max_model_len)),
                ("--mem-fraction-static", f"{memory_fraction:g}"),
                ("--dtype", "float16" if row["weight_precision"] == "fp16" else "bfloat16"),
                *_quantization(row["weight_precision"])]
        args += [("--kv-cache-dtype", "fp8_e4m3" if row["kv_precision"] == "fp8" else "auto"),
                 ("--port", str(30000 + replica.index))]
        if replica.on_one_node:
            out.append(Command("sglang", "python -m sglang.launch_server",
                               (*args, ("--base-gpu-id", str(replica.first_gpu)))))
            continue
        rendezvous = f"{replica.hosts[0]}:{DIST_INIT_PORT + replica.index}"
        for rank in range(len(replica.slots)):  # one command per node, run on that node
            out.append(Command("sglang", "python -m sglang.launch_server", (
                *args, ("--nnodes", str(len(replica.slots))), ("--node-rank", str(rank)),
                ("--dist-init-addr", rendezvous))))
    return out


OPTIONS_FILE = "extra_llm_api_options.yaml"  # the file best.yaml's extra_llm_api_options go into


def llm_api_options(capacity_policy: str, attention_dp: bool) -> dict:
    """The TensorRT-LLM LLM API options trtllm-serve has no flag for, as best.yaml's
    ``extra_llm_api_options`` (empty: the commands read no options file). trtllm-serve builds its
    SchedulerConfig with GUARANTEED_NO_EVICT (NVIDIA/TensorRT-LLM@4c05a748
    tensorrt_llm/commands/serve.py get_llm_args), and ``--extra_llm_api_options`` overwrites it
    (``SchedulerConfig.capacity_scheduler_policy``, tensorrt_llm/llmapi/llm_args.py@fcd3f316)."""
    options = {}
    if attention_dp:
        options["enable_attention_dp"] = True
    if capacity_policy != "guaranteed_no_evict":
        options["scheduler_config"] = {"capacity_scheduler_policy": capacity_policy.upper()}
    return options


def commands(row, model_name: str, max_model_len: int, gpus_per_node: int = 8,
             context: int | None = None,
             capacity_policy: str = "guaranteed_no_evict",
             attention_dp: bool = False) -> dict[str, Command | list[Command]]:
    """Every engine's commands for one layout, with each engine's own KV memory share; past the
    model's ``context``, vLLM and SGLang get the variable that lets them serve it; trtllm-bench
    and trtllm-serve run TensorRT-LLM's ``capacity_policy`` (the one the prediction priced).
    ``attention_dp``: TensorRT-LLM's only (the one engine it is priced on). Both reach TensorRT-LLM
    as LLM API options (``llm_api_options``) read from ``--extra_llm_api_options``."""
    from autoparallel.serve.assumptions import load_engine
    from autoparallel.serve.space import LONG_CONTEXT_ENV
    share = {name: load_engine(name).kv_memory_fraction for name in ("vllm", "tensorrt-llm", "sglang")}
    out = {"vllm": vllm_serve(row, model_name, max_model_len, share["vllm"], gpus_per_node),
           "trtllm-serve": trtllm_serve(row, model_name, max_model_len, share["tensorrt-llm"], gpus_per_node),
           "trtllm-bench": trtllm_bench(row, model_name, max_model_len, share["tensorrt-llm"], gpus_per_node,
                                         capacity_policy),
           "sglang": sglang(row, model_name, max_model_len, share["sglang"], gpus_per_node)}
    if context is not None and max_model_len > context:
        for name in ("vllm", "sglang"):
            env = tuple(LONG_CONTEXT_ENV[name].split("=", 1))
            add = lambda c: replace(c, env=(*c.env, env))  # noqa: E731
            out[name] = [add(c) for c in out[name]] if isinstance(out[name], list) else add(out[name])
    if llm_api_options(capacity_policy, attention_dp):
        option = ("--extra_llm_api_options", OPTIONS_FILE)
        out["trtllm-serve"] = [replace(c, args=(*c.args, option)) for c in out["trtllm-serve"]]
        out["trtllm-bench"] = replace(out["trtllm-bench"], sub_args=(*out["trtllm-bench"].sub_args, option))
    if attention_dp:
        out = {name: out[name] for name in ("trtllm-serve", "trtllm-bench")}
    return out


def placement_document(row, gpus_per_node: int) -> dict:
    """Where the commands run (best.yaml): the nodes, each replica's hosts and GPUs, how vLLM
    reaches more than one node."""
    replicas = placement(row, gpus_per_node)
    nodes = node_count(replicas)
    where = [f"{r.hosts[0]} GPUs {r.visible_devices}" if r.on_one_node else " + ".join(r.hosts) for r in replicas]
    doc = {"nodes": nodes, "gpus_per_node": gpus_per_node, "replicas": where}
    if nodes > 1:
        doc["vllm"] = ("start a Ray cluster over the nodes (`ray start --head` on <node0>, `ray start --address "
                       "<node0>:6379` on the others) and run the vllm command on <node0>")
    return doc


def _capacity_policy(engine) -> str:
    """The capacity policy trtllm-bench is told: a TensorRT-LLM prediction's own (``infer
    --capacity-policy``); TensorRT-LLM's default for the other engines' predictions."""
    from autoparallel.serve.assumptions import capacity_policy_of
    return capacity_policy_of(engine) if engine.name.startswith("tensorrt-llm") else "guaranteed_no_evict"


def best_document(result, row, rec: dict, attention_dp: bool = False) -> dict:
    """The winner as one YAML document: layout, predicted metrics (``rec``, the search's record of
    ``row``), the engines' commands; ``attention_dp`` (a simulated ``infer --attention-dp``): the
    layout says so and the commands are TensorRT-LLM's, with the options file they read."""
    r = result.request
    max_model_len = r.max_model_len or r.input_len + r.output_len
    text = lambda c: [x.text() for x in c] if isinstance(c, list) else c.text()  # noqa: E731
    doc = {
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
        "placement": placement_document(row, result.hardware.gpus_per_node),
        "commands": {name: text(c) for name, c in
                     commands(row, result.model.name, max_model_len, result.hardware.gpus_per_node,
                              result.model.context_length, _capacity_policy(result.engine), attention_dp).items()},
        "note": (f"predicted for {result.engine.name} by autoparallel's serving cost model (constants fitted to "
                 "published measurements, search_spaces/inference_assumptions.yaml); the other engines' commands "
                 "set the same layout and limits. Confirm with the trtllm-bench command (or vLLM's / SGLang's "
                 "own benchmark) before sizing a fleet."),
    }
    options = llm_api_options(_capacity_policy(result.engine), attention_dp)
    if options:
        doc["extra_llm_api_options"] = options
        doc["note"] += (f" The TensorRT-LLM commands read {OPTIONS_FILE}: write extra_llm_api_options there "
                        "(trtllm-serve has no flag for its capacity policy).")
    if attention_dp:
        doc["layout"] = {**doc["layout"], "attention_dp": True}
        doc["note"] = (f"each TP rank runs attention on its own requests (max batch, max tokens and KV pool per "
                       f"rank): write extra_llm_api_options to {OPTIONS_FILE}, which the commands read. "
                       "'predicted' is the steady-state model's, which does not price attention DP; 'simulated' "
                       "is what the traffic simulation measured with it. Confirm with the trtllm-bench command "
                       "before sizing a fleet.")
    return doc
