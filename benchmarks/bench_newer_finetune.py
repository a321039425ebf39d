"""How the cost model predicts Megatron-Bridge's newer fine-tuning runs (issue 27).

The rows of autoparallel/data/finetune_runs_newer.csv (26.06's Llama 3 70B SFT and LoRA tables, written
by scripts/newer_finetune_runs.py) are never fitted. Prints each row's error in sample (the shipped
constants) and held out (its GPU family refitted without the 70B rows, as ``validate`` does), mean and
max per kind, then how much the two settings no source states move the in-sample errors: the packed
SQuAD documents' mean length (100 / 200 / 400 tokens) and unpacked data (the performance launcher's
default ``--data mock``: one causal 4,096-token sequence).

    PYTHONPATH=. python benchmarks/bench_newer_finetune.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from autoparallel import resources, validate
from autoparallel.measured_runs import load_runs, predict_row

FILE = "finetune_runs_newer.csv"


def errors(path: Path) -> pd.DataFrame:
    return pd.DataFrame([predict_row(p) for p in load_runs([path])])


def held_out() -> dict[str, float]:
    """Each row's error with its family refitted without its model (validate's leave-one-model-out fold)."""
    rows = validate.all_runs()
    ours = [p for p in rows if p.kind in ("sft-newer", "lora-newer")]
    out: dict[str, float] = {}
    for group, family in sorted({(p.model_group, p.family) for p in ours}):
        out.update({i: r["error_pct"] for i, r in validate._refit_and_predict(rows, group, family).items()})
    return out


def summary(report: pd.DataFrame, column: str) -> str:
    return "; ".join(f"{kind} {g[column].abs().mean():.1f} / {g[column].abs().max():.1f}"
                     for kind, g in report.groupby("kind"))


def main() -> None:
    path = resources.data_file(FILE)
    report = errors(path)
    held = held_out()
    report["heldout_error_pct"] = report["id"].map(held)
    pd.set_option("display.width", 200)
    print(report[["id", "measured", "predicted", "error_pct", "heldout_error_pct", "fits", "peak_memory_gib"]]
          .round(1).to_string(index=False))
    print(f"\nmean / max |error| %, in sample: {summary(report, 'error_pct')}")
    print(f"mean / max |error| %, held out:  {summary(report, 'heldout_error_pct')}\n")
    base = pd.read_csv(path)
    print("in-sample error % per row (file order) with the unstated dataset settings changed:")
    with tempfile.TemporaryDirectory() as tmp:
        for label, packed, tokens in (("packed, 100-token documents", 1, 100), ("packed, 200 (shipped)", 1, 200),
                                      ("packed, 400-token documents", 1, 400), ("unpacked (--data mock)", 0, None)):
            changed = base.assign(packed_sequence=packed, document_tokens=tokens if tokens else pd.NA)
            changed.to_csv(Path(tmp) / FILE, index=False)
            r = errors(Path(tmp) / FILE)
            print(f"  {label:28s} {' '.join(f'{e:+.1f}' for e in r.error_pct)}   mean {summary(r, 'error_pct')}")


if __name__ == "__main__":
    main()
