"""Nemotron 3 Nano vs Qwen3-30B-A3B served on one H200: the predicted throughput ratio beside
NVIDIA's published claim (no constant is fitted to it).

Published: "up to 3.3x higher inference throughput than similarly-sized open models like
GPT-OSS-20B and Qwen3-30B-A3B-Thinking-2507" on a single H200 (Nemotron 3 Nano technical report,
arXiv 2512.20848, abstract; "on a single H200 GPU" in the summaries of it found by the search
tool). The request lengths of that measurement were not found in the sources read, so the table
prints several; 8K input / 16K output is the generation-heavy setting NVIDIA used for Nemotron
Nano 2's throughput claims (an assumption that Nano 3's is the same).

Each model's best layout on one GPU (``infer``'s steady-state search, max throughput, no latency
bound) for each engine that serves both; output tokens/s per GPU and their ratio.

    PYTHONPATH=$PWD python benchmarks/bench_hybrid_serving.py
"""

from __future__ import annotations

from autoparallel import io
from autoparallel.serve import search as serve
from autoparallel.serve.assumptions import load_engine
from autoparallel.serve.space import load_space

LENGTHS = ((1024, 1024), (8192, 1024), (1024, 8192), (8192, 16384))
ENGINES = ("vllm", "sglang", "tensorrt-llm")
PUBLISHED = 3.3


def best(model, hw, engine, input_len, output_len):
    """(output tokens/s per GPU, the layout's weights / KV precision) of the best feasible layout."""
    request = serve.Request(input_len, output_len)
    result = serve.search(model, hw, 1, request, load_space(), engine)
    row = result.entry(1)
    return float(row["output_tokens_per_s_per_gpu"]), f"{row['weight_precision']}/{row['kv_precision']}"


def main() -> None:
    hw = io.load_hardware("h200")
    nano, qwen = io.load_model("nemotron-3-nano"), io.load_model("qwen3-30b-a3b")
    print(f"{'engine':13} {'in/out':>11} {'nano tok/s':>11} {'(w/kv)':>9} {'qwen tok/s':>11} {'(w/kv)':>9} "
          f"{'ratio':>6}  published up to {PUBLISHED}x")
    for engine_name in ENGINES:
        engine = load_engine(engine_name)
        for input_len, output_len in LENGTHS:
            a, pa = best(nano, hw, engine, input_len, output_len)
            b, pb = best(qwen, hw, engine, input_len, output_len)
            print(f"{engine_name:13} {f'{input_len}/{output_len}':>11} {a:11,.0f} {pa:>9} {b:11,.0f} {pb:>9} "
                  f"{a / b:6.2f}")


if __name__ == "__main__":
    main()
