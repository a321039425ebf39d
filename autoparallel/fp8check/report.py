"""What an FP8 check shows and leaves behind: the verdict table, the statistics CSV, the plots.

Run folder results/<date>_fp8check_<model>/ (written atomically, like a search's):
``verdicts.md`` / ``verdicts.yaml`` (one row per recipe), ``stats.csv`` (per recipe run,
layer and tensor: MSE, cosine similarity, underflow / overflow %, amax, scale, delayed/current
ratio), ``losses.csv`` (every run's loss per step), ``loss_curves.png`` (each recipe against
BF16, and the relative gap over training) and ``underflow_heatmap.png`` (underflow % by layer
and tensor, one panel per recipe), ``manifest.yaml``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.fp8check import verdict as V
from autoparallel.report import run_folder
from autoparallel.report.plots import _png, _pyplot

# FP8 quantizes three operands; MXFP8 / NVFP4 also the second (wgrad / dgrad) copies, "_t"
TENSORS = ("input", "weight", "grad_output", "input_t", "weight_t", "grad_output_t")


def _worst(summary: pd.DataFrame, column: str, fmt: str) -> str:
    if summary.empty:
        return "-"
    row = summary.loc[summary[column].idxmax()]
    return f"{row.layer} {row.tensor} {fmt.format(row[column])}"


def verdict_rows(result) -> list[dict]:
    """One dict per recipe: final loss, gap, worst layers by underflow / overflow / MSE, verdict."""
    window = result.settings.run.final_window
    rows = []
    for label, verdict in result.verdicts.items():
        summary = result.summary(label)
        full = result.runs[label][0]
        rows.append({
            "recipe": label,
            "final_loss": round(full.final_loss(window), 4),
            "loss_gap_pct": round(verdict.loss_gap_pct, 2) if math.isfinite(verdict.loss_gap_pct)
            else "inf",
            "worst_underflow": _worst(summary, "underflow_pct", "{:.3f} %"),
            "worst_overflow": _worst(summary, "overflow_pct", "{:.3f} %"),
            "worst_mse": _worst(summary, "mse", "{:.2e}"),
            "verdict": verdict.text,
            "bf16_layers": list(verdict.bf16_layers),
            "gap_with_bf16_layers_pct": (round(verdict.gap_with_bf16_layers_pct, 2)
                                         if math.isfinite(verdict.gap_with_bf16_layers_pct)
                                         else None),
            "reruns": verdict.reruns,
        })
    return rows


def verdict_table(result) -> str:
    """Markdown: the BF16 baseline, then one line per recipe."""
    window = result.settings.run.final_window
    head = ("| recipe | final loss | gap vs BF16 | worst underflow | worst overflow | worst MSE | "
            "verdict |\n|---|---|---|---|---|---|---|\n")
    lines = [f"| bf16 | {result.bf16.final_loss(window):.4f} | - | - | - | - | baseline |"]
    for r in verdict_rows(result):
        gap = r["loss_gap_pct"] if isinstance(r["loss_gap_pct"], str) else f"{r['loss_gap_pct']:+.2f} %"
        verdict = r["verdict"]
        if r["gap_with_bf16_layers_pct"] is not None:
            verdict += f" (gap then {r['gap_with_bf16_layers_pct']:+.2f} %)"
        lines.append(f"| {r['recipe']} | {r['final_loss']:.4f} | {gap} | {r['worst_underflow']} | "
                     f"{r['worst_overflow']} | {r['worst_mse']} | {verdict} |")
    return head + "\n".join(lines) + "\n"


# The verdict table with its worst-layer columns takes this many columns (each names a layer, a tensor
# and a figure); a narrower terminal gets those as lines under the table.
WIDE_CHECK = 180
WORST = (("worst_underflow", "worst underflow"), ("worst_overflow", "worst overflow"), ("worst_mse", "worst MSE"))


def print_check(result, console) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    narrow = console.width < WIDE_CHECK
    title = (f"fp8-check of {result.model.name} on its proxy ({result.proxy.num_layers} layers, hidden "
             f"{result.proxy.hidden_size}, {result.settings.run.steps} steps, {result.seconds:.0f} s)")
    # Narrow: the title is a line of its own above the table (rich wrapped it to the table's width,
    # centred over two lines), as search's and infer's tables have theirs.
    t = (Table(header_style="bold", box=box.SIMPLE_HEAD) if narrow
         else Table(title=title, header_style="bold"))
    for c in ("recipe", "final loss", "gap vs BF16") + (() if narrow else tuple(h for _, h in WORST)) + ("verdict",):
        t.add_column(c, no_wrap=narrow and c != "verdict")
    window = result.settings.run.final_window
    t.add_row("bf16", f"{result.bf16.final_loss(window):.4f}", "-", *(() if narrow else ("-",) * 3), "baseline")
    rows = verdict_rows(result)
    for r in rows:
        gap = r["loss_gap_pct"] if isinstance(r["loss_gap_pct"], str) else f"{r['loss_gap_pct']:+.2f} %"
        style = "green" if r["verdict"] == "ok" else "red" if r["verdict"].startswith("reject") \
            else "yellow"
        short = "reject (below)" if style == "red" else r["verdict"]
        worst = () if narrow else tuple(r[k] for k, _ in WORST)
        t.add_row(r["recipe"], f"{r['final_loss']:.4f}", gap, *worst, f"[{style}]{short}[/{style}]")
    if narrow:
        console.print(title, highlight=False)
    console.print(t)
    for r in rows if narrow else ():  # the worst layers, whole, one per line
        console.print(f"{escape(r['recipe'])}:")
        for key, head in WORST:
            console.print(f"  {head}: {escape(r[key])}", overflow="fold", highlight=False)
    for label, verdict in result.verdicts.items():
        if verdict.status == V.REJECT:
            console.print(f"[red]{label}[/red]: {verdict.text}")
        elif verdict.status == V.OK_BF16:
            console.print(f"[yellow]{label}[/yellow]: full FP8 failed ({verdict.worst or 'loss gap'})"
                          f"; with layers {list(verdict.bf16_layers)} in BF16 the gap is "
                          f"{verdict.gap_with_bf16_layers_pct:+.2f} %")


# --- plots -------------------------------------------------------------------------------------

def _smooth(values: list[float], window: int = 10) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if len(x) < window:
        return x
    kernel = np.ones(window) / window
    return np.convolve(x, kernel, mode="valid")


def loss_curves_png(result) -> bytes:
    plt = _pyplot()
    fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(11, 4))
    base = _smooth(result.bf16.losses)
    steps = np.arange(len(base)) + (len(result.bf16.losses) - len(base)) + 1
    ax.plot(steps, base, color="black", lw=2, label="bf16")
    gap_ax.axhline(0, color="black", lw=1)
    limit = result.settings.thresholds.max_loss_gap_pct
    gap_ax.axhline(limit, color="red", ls="--", lw=1, label=f"threshold {limit:g} %")
    for label, runs in result.runs.items():
        for run in runs:
            name = label + (f" + BF16 layers {list(run.bf16_layers)}" if run.bf16_layers else "")
            curve = _smooth(run.losses)
            line, = ax.plot(steps, curve, lw=1, ls="-" if not run.bf16_layers else ":", label=name)
            gap_ax.plot(steps, 100 * (curve - base) / base, lw=1, color=line.get_color(),
                        ls=line.get_linestyle(), label=name)
    ax.set(xlabel="step", ylabel="training loss (10-step mean)", yscale="log",
           title=f"{result.proxy.name}: loss")
    gap_ax.set(xlabel="step", ylabel="gap vs bf16 (%)", title="relative gap (10-step means)")
    ax.legend(fontsize=7)
    gap_ax.legend(fontsize=7)
    return _png(fig)


def underflow_heatmap_png(result) -> bytes:
    plt = _pyplot()
    labels = list(result.runs)
    fig, axes = plt.subplots(1, len(labels), figsize=(3.4 * len(labels) + 1, 0.28 *
                                                      max(8, _n_modules(result)) + 1.5),
                             squeeze=False)
    image = None
    for k, (ax, label) in enumerate(zip(axes[0], labels)):
        s = result.summary(label)
        grid = s.pivot_table(index="layer", columns="tensor", values="underflow_pct",
                             aggfunc="mean", sort=False)
        grid = grid.reindex(columns=[t for t in TENSORS if t in grid.columns or t in TENSORS[:3]])
        image = ax.imshow(np.log10(grid.to_numpy(dtype=float) + 1e-4), aspect="auto",
                          cmap="magma_r", vmin=-4, vmax=2)
        ax.set_xticks(range(len(grid.columns)),
                      [t.replace("grad_output", "grad") for t in grid.columns], fontsize=8)
        ax.set_yticks(range(len(grid.index)), grid.index if k == 0 else [], fontsize=6)
        for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=5,
                        color="white" if v > 1 else "black")
        ax.set_title(f"{label}\n{result.verdicts[label].text[:40]}", fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), label="log10 underflow %")
    fig.suptitle(f"{result.proxy.name}: underflow % by layer and tensor (mean over recorded steps)",
                 fontsize=9)
    return _png(fig)


def _n_modules(result) -> int:
    return max((result.summary(k)["layer"].nunique() for k in result.runs), default=1)


# --- run folder ---------------------------------------------------------------------------------

def new_check_dir(root: Path, model: str) -> Path:
    return run_folder.new_dir(root, f"fp8check_{model}")


def losses_frame(result) -> pd.DataFrame:
    columns = {"bf16": result.bf16.losses}
    for label, runs in result.runs.items():
        for run in runs:
            key = label + (f"+bf16{list(run.bf16_layers)}" if run.bf16_layers else "")
            columns[key] = run.losses
    frame = pd.DataFrame(columns)
    frame.insert(0, "step", np.arange(1, len(frame) + 1))
    return frame


def write_check_folder(result, root: Path, command: list[str], plots: bool = True) -> Path:
    run_dir = new_check_dir(Path(root), result.model.name)
    run_folder.write_yaml(run_dir / run_folder.MANIFEST, run_folder.manifest(command, {
        "kind": "fp8-check", "model": io.to_dict(result.model), "proxy": io.to_dict(result.proxy),
        "settings": io.to_dict(result.settings), "seconds": round(result.seconds, 1)}))
    run_folder.write_csv(run_dir / "stats.csv", result.stats_table())
    run_folder.write_csv(run_dir / "losses.csv", losses_frame(result))
    run_folder.write_atomic(run_dir / "verdicts.md",
                            f"# fp8-check of {result.model.name}\n\n" + verdict_table(result))
    run_folder.write_yaml(run_dir / "verdicts.yaml", {"model": result.model.name,
                                                      "proxy": result.proxy.name,
                                                      "verdicts": verdict_rows(result)})
    if plots:
        run_folder.write_atomic(run_dir / "loss_curves.png", loss_curves_png(result))
        run_folder.write_atomic(run_dir / "underflow_heatmap.png", underflow_heatmap_png(result))
    return run_dir


__all__ = ["print_check", "verdict_rows", "verdict_table", "write_check_folder"]
