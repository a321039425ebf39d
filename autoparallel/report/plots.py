"""The report's figures (matplotlib, Agg backend: no display needed), returned as PNG bytes.

matplotlib is imported inside the functions so the rest of the package never pays for it.
"""

from __future__ import annotations

import io as _io

import numpy as np
import pandas as pd

BREAKDOWN_PARTS = (  # (column, label) in stacking order
    ("compute_s", "compute"), ("fp8_cast_s", "FP8 casts, amax reduction"), ("recompute_s", "recompute"),
    ("tp_comm_s", "TP comm (exposed)"), ("cp_comm_s", "CP comm (exposed)"), ("pp_comm_s", "PP comm (exposed)"),
    ("bubble_s", "pipeline bubble"), ("dp_comm_s", "DP comm (exposed)"), ("optimizer_s", "optimizer"),
)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        from autoparallel.errors import UserError
        raise UserError("reports need matplotlib: pip install 'autoparallel[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _png(fig) -> bytes:
    buffer = _io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def pareto_front(memory: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both lower memory and higher throughput,
    in order of increasing memory."""
    order = np.lexsort((-throughput, memory))
    best = np.maximum.accumulate(throughput[order])
    improved = np.r_[True, best[1:] > best[:-1]]
    return order[improved & (throughput[order] >= best)]


def throughput_vs_memory(frame: pd.DataFrame, memory_limit_gib: float) -> bytes:
    plt = _pyplot()
    priced = frame[frame["peak_memory_gib"].notna()]
    fits = priced["fits"].to_numpy(dtype=bool)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(priced.loc[~fits, "peak_memory_gib"], priced.loc[~fits, "tokens_per_s_per_gpu"], s=3,
               c="#bbbbbb", label="does not fit", rasterized=True)
    ax.scatter(priced.loc[fits, "peak_memory_gib"], priced.loc[fits, "tokens_per_s_per_gpu"], s=3,
               c="#1f77b4", label="fits", rasterized=True)
    feasible = priced[fits]
    if not feasible.empty:
        front = pareto_front(feasible["peak_memory_gib"].to_numpy(), feasible["tokens_per_s_per_gpu"].to_numpy())
        ax.step(feasible["peak_memory_gib"].to_numpy()[front], feasible["tokens_per_s_per_gpu"].to_numpy()[front],
                where="post", c="#d62728", lw=1.5, label="Pareto front")
    ax.axvline(memory_limit_gib, c="k", ls="--", lw=1, label=f"memory limit {memory_limit_gib:.0f} GiB")
    clipped = int((priced["peak_memory_gib"] > 3 * memory_limit_gib).sum())
    ax.set_xlim(0, min(3 * memory_limit_gib, 1.05 * priced["peak_memory_gib"].max()))
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens / s / GPU")
    ax.set_title(f"{len(priced):,} priced candidates" + (f" ({clipped:,} beyond 3x the limit not shown)" if clipped else ""))
    ax.legend(loc="lower right", markerscale=4)
    return _png(fig)


def step_breakdown(top: pd.DataFrame) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"#{int(r)}" for r in top["rank"]]
    bottom = np.zeros(len(top))
    for column, label in BREAKDOWN_PARTS:
        values = top[column].to_numpy(dtype=float)
        ax.bar(labels, values, bottom=bottom, label=label)
        bottom += values
    ax.set_ylabel("seconds per step")
    ax.set_title("step time of the top layouts, by term")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _png(fig)


def predicted_vs_measured(frame: pd.DataFrame) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    x, y = frame["step_time_s"].to_numpy(float), frame["measured_step_time_s"].to_numpy(float)
    ax.scatter(x, y)
    lim = [0, 1.05 * np.nanmax(np.r_[x, y])]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured step time (s)")
    return _png(fig)
