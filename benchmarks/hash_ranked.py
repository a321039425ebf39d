"""One hash per ranked table (every candidate, every column, the dtypes) of the searches whose output
a speed change must not move: run it before and after, and the lines must be identical.

    PYTHONPATH=$PWD python benchmarks/hash_ranked.py
"""

from __future__ import annotations

import hashlib

import pandas as pd

from autoparallel import io
from autoparallel.search import run
from autoparallel.space import load_space

CASES = [("deepseek-v3", "h100-sxm", 1024), ("gpt3-175b", "h100-sxm", 1024), ("mixtral-8x7b", "h100-sxm", 64),
         ("llama3-70b", "h100-sxm", 64)]


def main() -> None:
    for name, gpu, gpus in CASES:
        model, hw, space = io.load_model(name), io.load_hardware(gpu), load_space()
        ranked = run.search(model, hw, gpus, model.global_batch_size, space).ranked
        digest = hashlib.sha256(repr(list(zip(ranked.columns, map(str, ranked.dtypes)))).encode())
        digest.update(pd.util.hash_pandas_object(ranked, index=True).to_numpy().tobytes())
        print(name, gpus, len(ranked), digest.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
