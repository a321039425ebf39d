"""How the cost model predicts NVIDIA's runs newer than its fit (issue 22 item 5).

The rows of autoparallel/data/training_runs_newer.csv (Megatron-Bridge's 26.02-26.08 summaries,
Megatron-LM's DeepSeek-V3 GB200 guide) are never fitted: in-sample here means the shipped
constants (fitted on the older rows, the same models among them), held out the constants refitted
without the row's model. Prints mean / max |error| per release, dense and MoE apart, then per
model, every published layout predicted not to fit with its memory, and the same layouts run on
two GPUs (one release, model, precision, layout and batch): the measured speed ratio beside the
predicted one, which tells a GPU's own speed apart from a layout's.

    PYTHONPATH=. python benchmarks/bench_newer_runs.py
"""

from __future__ import annotations

import pandas as pd

from autoparallel import validate


def table(report: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return report.groupby(by).agg(
        rows=("id", "size"),
        in_sample_mean=("error_pct", lambda e: e.abs().mean()), in_sample_max=("error_pct", lambda e: e.abs().max()),
        held_out_mean=("heldout_error_pct", lambda e: e.abs().mean()),
        held_out_max=("heldout_error_pct", lambda e: e.abs().max()),
        not_fitting=("fits", lambda f: int((~f).sum()))).round(1)


def print_tables(full: pd.DataFrame) -> None:
    """The tables above from ``validate.validate_training()``'s report."""
    newer = full[full.kind.str.endswith("-newer")].copy()
    pd.set_option("display.width", 160)
    print(f"{len(newer)} rows newer than the fit (|error| %):\n")
    print(table(newer, ["source", "kind"]).to_string(), "\n")
    print(table(newer, ["kind"]).to_string(), "\n")
    print(table(newer, ["kind", "gpu"]).to_string(), "\n")
    print(table(newer, ["kind", "model"]).to_string(), "\n")
    moe = full[full.kind.isin(["moe", "moe-newer"])]
    print(f"every MoE row (fitted and newer, {len(moe)}): in-sample mean {moe.error_pct.abs().mean():.1f} %, "
          f"held-out mean {moe.heldout_error_pct.abs().mean():.1f} %, max {moe.heldout_error_pct.abs().max():.1f} %\n")
    bad = newer[~newer.fits]
    print("published layouts predicted not to fit:" if len(bad) else "every published layout is predicted to fit")
    for _, r in bad.iterrows():
        print(f"  {r['id']}: {r['peak_memory_gib']:.0f} GiB")


# GPUs whose published rows repeat a layout run on the other of the pair.
GPU_PAIRS = (("gb200", "gb300"), ("b200", "b300"), ("b200", "gb200"), ("h100-sxm", "h200"))


def gpu_pairs(full: pd.DataFrame) -> pd.DataFrame:
    """Rows whose id differs only in the GPU, for each pair of ``GPU_PAIRS``: measured and predicted
    speed of the second GPU over the first (tokens/s ratio; iteration-time metrics inverted)."""
    out = []
    for first, second in GPU_PAIRS:
        rows = full[full.gpu.isin([first, second])].copy()
        rows["layout"] = rows.id.str.replace(f"-{second}-", "-GPU-").str.replace(f"-{first}-", "-GPU-")
        speed = rows.measured.where(rows.metric != "iteration_time", 1 / rows.measured)
        predicted = rows.predicted.where(rows.metric != "iteration_time", 1 / rows.predicted)
        rows = rows.assign(speed=speed, predicted_speed=predicted)
        both = rows.pivot_table(index="layout", columns="gpu", values=["speed", "predicted_speed"]).dropna()
        for layout, r in both.iterrows():
            out.append({"pair": f"{second} / {first}", "layout": layout,
                        "measured": r[("speed", second)] / r[("speed", first)],
                        "predicted": r[("predicted_speed", second)] / r[("predicted_speed", first)]})
    return pd.DataFrame(out).round(3)


def main() -> None:
    full = validate.validate_training()
    print_tables(full)
    pairs = gpu_pairs(full)
    print("\nthe same layout on two GPUs: speed of the second over the first")
    print(pairs.to_string(index=False))
    print(pairs.groupby("pair")[["measured", "predicted"]].agg(["count", "mean"]).round(3).to_string())


if __name__ == "__main__":
    main()
