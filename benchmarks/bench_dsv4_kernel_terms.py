"""DeepSeek-V4 Flash's two held-out 26.08 rows as `validate` prices them, with session 49 h5's kernel terms
(and session 53 s53h1's two) added one at a time (a Markdown table), then each term's forward and backward milliseconds per layer and
micro-batch on the priced candidate, and a what-if the cost model does not use: the attention core at
FlashMLA's published sparse-prefill forward rate (README: up to 1450 TFLOP/s on B200, 128 heads, 2,048
keys) instead of the calibrated attention efficiency.

The terms before they are added: zero, except mHC, which is the unfused module's count (22 hidden-size
elements per token and block forward, twice that backward) before the fused kernels' count replaces it.

    PYTHONPATH=$PWD python benchmarks/bench_dsv4_kernel_terms.py
"""

from __future__ import annotations

import numpy as np

from autoparallel import io, resources
from autoparallel.costmodel import dsa, dsv4, gemm, memory
from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced

TERMS = ("dsa_indexer_topk_time", "dsa_indexer_loss_time", "dsv4_output_groups_bf16_time",
         "dsv4_compressor_time", "hyper_connection_time",
         # session 53 s53h1: the compressor / indexer GEMMs as run, FlashMLA's padded key slots
         "dsv4_compressor_gemms_time", "dsv4_padded_key_slots_time")
# The module each term lives in (the DSA indexer's in ``dsa``, DeepSeek-V4's kernels in ``dsv4``, its GEMM
# term in ``layer_time``).
HOME = {name: next(m for m in (dsa, dsv4, lt) if hasattr(m, name)) for name in TERMS}
FLASHMLA_SPARSE_FWD_B200 = 1450e12  # deepseek-ai/FlashMLA@9241ae3 README.md, "Test & benchmark MLA prefill (Sparse)"


def unfused_mhc(x):
    """The unfused module's mHC passes (the count before the fused kernels')."""
    forward = (2.0 * dsv4.hyper_connection_elements(x.model.hc_mult) * x.tokens / x.t * x.model.hidden_size
               * memory.ACT_INPUT_BYTES / x.hbm)
    return forward, 2.0 * forward


def main() -> None:
    rows = load_runs([resources.data_file("training_runs_dsv4.csv")], moe=True)
    real = {name: getattr(HOME[name], name) for name in TERMS}
    before = {name: (lambda x: (0.0 * x.t, 0.0 * x.t)) for name in TERMS}
    before["hyper_connection_time"] = unfused_mhc
    print("| term added | " + " | ".join(f"{r.hardware.name} tok/s/GPU (error %, step s)" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    try:
        for k in range(len(TERMS) + 1):
            for i, name in enumerate(TERMS):
                setattr(HOME[name], name, real[name] if i < k else before[name])
            cells = []
            for r in rows:
                out, j = priced(r)
                pred = predict_row(r)
                cells.append(f"{pred['predicted']:,.0f} ({pred['error_pct']:+.1f} %, {float(out['step_time_s'][j]):.2f})")
            print(f"| {TERMS[k - 1] if k else 'none (s49h2)'} | " + " | ".join(cells) + " |")
        for r in rows:
            out, i = priced(r)
            x = chosen(r, i)
            ms = {name: "/".join(f"{float(np.ravel(t)[0]) * 1e3:.3f}" for t in real[name](x)) for name in TERMS}
            print(f"\n{r.hardware.name} forward/backward ms per layer and micro-batch: {ms}")
        share = FLASHMLA_SPARSE_FWD_B200 / gemm.bf16_peak(io.load_hardware("b200"))
        attention = lt.attention_time
        lt.attention_time = lambda x: attention(x) * x.hw.efficiency.attention / share
        print(f"\nwhat-if, attention core at {share:.3f} of the BF16 peak (FlashMLA, B200): "
              + ", ".join(f"{r.hardware.name} {predict_row(r)['error_pct']:+.1f} %" for r in rows))
        lt.attention_time = attention
    finally:
        for name in TERMS:
            setattr(HOME[name], name, real[name])


if __name__ == "__main__":
    main()
