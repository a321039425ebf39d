"""Does every cost-model term have a unit test that notices it missing or doubled?

Each term function of the cost model's four steps is scaled by 0 (deleted) and by 2 (doubled),
and each name in a sum is dropped or repeated; ``tests/test_cost_terms.py`` and
``tests/test_dispatch.py`` run against each mutant and must fail. Prints one row per mutant; exits 1 if any survives.

    python benchmarks/bench_term_mutations.py

The same file is the pytest plugin that applies a mutant (``MUTATE=module:function:factor``).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_cost_terms.py", "tests/test_dispatch.py"]
FUNCTIONS = {
    "autoparallel.costmodel.layer_time": [
        "linear_time", "attention_time", "softmax_time", "forward_time", "compute_time", "fp8_cast_time",
        "selective_recompute_time", "full_recompute_time", "cp_comm_time", "fsdp_time",
        "ep_comm_time", "routed_experts_time", "activation_bytes", "stored_activation_bytes", "gemm_input_elements",
        "router_time", "permutation_time", "lora_adapters_time", "amax_reduction_time",
        "norm_recompute_time"],
    "autoparallel.costmodel.tensor_parallel": ["tp_comm_time"],
    "autoparallel.costmodel.memory": ["norm_output_bytes", "kept_logits_bytes"],
    "autoparallel.costmodel.pipeline": ["dualpipe_inflight", "dualpipe_chunks", "held_at_peak", "alive_chunks"],
    "autoparallel.costmodel.stages": ["logits_time", "pp_comm_time", "offload_time", "stage_params", "mtp_time",
                                      "trainable_params"],
    "autoparallel.costmodel.step_time": ["dp_comm_time", "optimizer_time", "weight_cast_time"],
    "autoparallel.costmodel.peak_memory": ["logits_bytes", "model_states", "_in_flight", "mtp_bytes", "cuda_graph_bytes",
                                           "lora_model_states", "dualpipe_end_rank", "dualpipe_stage_moe"],
    "autoparallel.costmodel.finetune": ["adapter_params_gpu", "adapter_stream_elements", "attention_share",
                                        "frozen_activation_bytes", "base_weight_bytes", "cast_bytes"],
    "autoparallel.costmodel.dispatch": ["alltoall_time", "flex_time", "allgather_time", "nodes_per_token",
                                        "distinct_share", "exposed_dispatch"],
}
LAYER = "autoparallel/costmodel/layer_time.py"
STAGES = "autoparallel/costmodel/stages.py"
STEP = "autoparallel/costmodel/step_time.py"
STEP_SUM = '"step_time_s": bottleneck.time + dp_exposed + t_optimizer + weight_cast'


def _layer_sum_mutants() -> list[tuple[str, str, str, str]]:
    """LAYER_TIME_TERMS with each name dropped, and with each name repeated."""
    source = (ROOT / LAYER).read_text()
    tuple_text = re.search(r"LAYER_TIME_TERMS = \(.*?\)\n", source, re.S).group(0)
    names = re.findall(r'"(\w+)"', tuple_text)
    spell = lambda kept: "LAYER_TIME_TERMS = (" + ", ".join(f'"{n}"' for n in kept) + ")\n"  # noqa: E731
    return ([(LAYER, tuple_text, spell(names[:i] + names[i + 1:]), f"layer time without {n}")
             for i, n in enumerate(names)]
            + [(LAYER, tuple_text, spell(names[:i + 1] + names[i:]), f"layer time with {n} twice")
               for i, n in enumerate(names)])


# (file, text, mutant text, what the mutant does): sums with one term dropped or repeated.
EDITS = [
    *_layer_sum_mutants(),
    (STAGES, " + np.where(x.single, t_logits, 0.0) + t_offload", " + np.where(x.single, t_logits, 0.0)",
     "first stage without offloading"),
    (STAGES, "x.first_moe) + stage_pp", "x.first_moe)", "first stage without p2p"),
    (STAGES, "x.middle_moe) + stage_pp", "x.middle_moe)", "middle stage without p2p"),
    (STAGES, "x.last_moe) + stage_pp + t_logits", "x.last_moe) + stage_pp", "last stage without logits"),
    (STAGES, "LOSS_PASSES * 4.0 *", "0 * 4.0 *", "logits without the loss passes"),
    *[(STEP, STEP_SUM, STEP_SUM.replace(f" + {term}", ""), f"step without {term}")
      for term in ("dp_exposed", "t_optimizer", "weight_cast")],
    (STEP, STEP_SUM, STEP_SUM + " + weight_cast", "step with weight_cast twice"),
]


def pytest_configure(config):
    """Applied when pytest loads this file as a plugin: scale one term function's result."""
    spec = os.environ.get("MUTATE")
    if not spec:
        return
    module_name, function, factor = spec.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, function)
    f = float(factor)

    def scaled(*args, **kwargs):
        out = original(*args, **kwargs)
        if isinstance(out, tuple):  # (time, held) or model states
            return tuple(f * o for o in out)
        if isinstance(out, list):  # per-stage (dense, experts) parameters
            return [tuple(f * o for o in stage) for stage in out]
        return f * out
    setattr(module, function, scaled)


def _killed(env: dict) -> bool:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "bench_term_mutations", *TESTS],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    return run.returncode != 0


def main() -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]))
    rows = []
    for module, functions in FUNCTIONS.items():
        for function in functions:
            for factor in ("0", "2"):
                mutant = f"{module.rsplit('.', 1)[1]}.{function} x{factor}"
                rows.append((mutant, _killed(dict(env, MUTATE=f"{module}:{function}:{factor}"))))
    for path, text, mutant_text, label in EDITS:
        file = ROOT / path
        source = file.read_text()
        if source.count(text) != 1:
            raise SystemExit(f"{path}: expected {text!r} once; update EDITS")
        file.write_text(source.replace(text, mutant_text))
        try:
            rows.append((label, _killed(env)))
        finally:
            file.write_text(source)
    print("| mutant | caught by tests/test_cost_terms.py |")
    print("|---|---|")
    for mutant, killed in rows:
        print(f"| {mutant} | {'yes' if killed else 'NO'} |")
    survivors = sum(not killed for _, killed in rows)
    print(f"\n{len(rows)} mutants, {len(rows) - survivors} caught, {survivors} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
