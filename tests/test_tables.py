"""Ranked tables (issue 13): one row per layout with its variants counted, hidden knobs shown,
MFU on the BF16 peak, the tie band, no truncation in logs; candidates.csv / .parquet types;
what `search` and `estimate` print."""

import io as stdio
import sys

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from autoparallel.cli import main
from autoparallel.report import run_folder, tables
from autoparallel.search import run as runs
from autoparallel.space import load_space


@pytest.fixture(scope="module")
def result_175b(gpt175b, h100):
    return runs.search(gpt175b, h100, 1024, 2048, load_space())


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = dict(fits=True, tp=8, pp=8, vp=1, cp=1, ep=1, dp=16, mbs=1, sp=True, recompute="none",
                recompute_num_layers=0, precision="fp8-delayed", tp_comm_overlap=True, fp8_bf16_edge_layers=0,
                grad_reduce_in_fp32=True, distributed_optimizer=True, overlap_grad_reduce=True,
                flash_attention=True, fsdp=False, peak_memory_gib=60.0, step_time_s=5.0,
                model_tflops_per_gpu=800.0)
    frame = pd.DataFrame([{**base, **r} for r in rows])
    frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame


def test_175b_top_50_fit_in_at_most_15_rows_with_the_tie_band(result_175b, h100):
    rows = tables.grouped(result_175b.ranked, 50, h100)
    assert 1 <= len(rows) <= 15
    assert not rows.duplicated(list(tables.LAYOUT_KEYS)).any()
    assert rows["tie"].iloc[0] == "yes"
    text = tables.markdown_table(result_175b.ranked, 50, h100, 0.95)
    error = tables.prediction_error()
    assert f"within {error.step_time_relative_error:.1%} of the best" in text and "RESULTS.md" in text
    assert "BF16 dense peak (989 TFLOP/s" in text and "76.0 GiB" in text
    assert len([line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]) == len(rows)


def test_variants_of_a_layout_collapse_and_say_what_differs(h100):
    frame = _frame([dict(tokens_per_s_per_gpu=1000.0), dict(tokens_per_s_per_gpu=990.0, vp=2),
                    dict(tokens_per_s_per_gpu=980.0, fp8_bf16_edge_layers=1, precision="fp8-current"),
                    dict(tokens_per_s_per_gpu=970.0, tp=4, dp=32, grad_reduce_in_fp32=False)])
    rows = tables.grouped(frame, 50, h100)
    assert list(rows["variants"]) == ["+2", "-"]
    assert rows["differs_in"].iloc[0] == "VP, precision, BF16 edge layers"
    assert rows["other_knobs"].iloc[1] == "grad reduce in FP32: no"


def test_mfu_on_the_bf16_peak_and_fp8_utilisation_beside_it(result_175b, h100):
    f = result_175b.feasible
    mixed = pd.concat([f[f.precision == "fp8-delayed"].head(20), f[f.precision == "bf16"].head(20)])
    rows = tables.grouped(mixed.sort_values("tokens_per_s_per_gpu", ascending=False), 40, h100)
    assert rows["mfu"].to_numpy() == pytest.approx(rows["model_tflops_per_gpu"].to_numpy() / 989)
    fp8 = rows["precision"].str.startswith("fp8")
    assert fp8.any() and (~fp8).any()
    assert rows["fp8_utilisation"][fp8].to_numpy() == pytest.approx(rows["model_tflops_per_gpu"][fp8].to_numpy() / 1979)
    assert rows["fp8_utilisation"][~fp8].isna().all()


def test_tie_is_the_prediction_error_band(h100):
    error = tables.PredictionError(0.1, "test")
    frame = _frame([dict(tokens_per_s_per_gpu=1000.0), dict(tokens_per_s_per_gpu=905.0, tp=4, dp=32),
                    dict(tokens_per_s_per_gpu=895.0, tp=2, dp=64)])
    assert tables.grouped(frame, 50, h100, error)["tie"].tolist() == ["yes", "yes", "-"]


def test_logs_get_the_whole_table(result_175b, h100):
    out = stdio.StringIO()
    tables.print_ranked(result_175b.ranked, "t", 50, Console(file=out, width=80), h100, 0.95)
    text = out.getvalue()
    assert "fp8-delayed" in text and "…" not in text and max(map(len, text.splitlines())) > 80


def test_candidates_csv_counts_are_integers_and_parquet_sits_beside(result_175b, tmp_path, monkeypatch):
    run_folder.write_csv(tmp_path / "c.csv", result_175b.ranked)
    lines = (tmp_path / "c.csv").read_text().splitlines()
    header = lines[0].split(",")
    for line in (lines[1], lines[-1]):  # best feasible and a rejected row
        cells = dict(zip(header, line.split(",")))
        for col in ("tp", "pp", "vp", "mbs", "dp", "recompute_num_layers", "fp8_bf16_edge_layers"):
            assert cells[col].isdigit(), (col, cells[col])
    assert lines[1].split(",")[header.index("num_microbatches")].isdigit()
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on a machine without pyarrow
    assert run_folder.write_parquet(tmp_path / "c.parquet", result_175b.ranked) is False
    assert not (tmp_path / "c.parquet").exists()


def test_parquet_round_trips_when_pyarrow_is_installed(result_175b, tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is the optional [parquet] extra")
    assert run_folder.write_parquet(tmp_path / "c.parquet", result_175b.ranked)
    back = pd.read_parquet(tmp_path / "c.parquet")
    assert len(back) == len(result_175b.ranked) and back["tp"].dtype.kind == "i"


def test_search_prints_how_to_export_and_launch_rank_1(tmp_path, capsys):
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--results", str(tmp_path), "--top", "5"]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    assert f"autoparallel export {run_dir} --rank 1 --format megatron" in out
    assert f"sbatch {run_dir / 'train.sh'}" in out and "DATA_PATH=..." in out
    assert (run_dir / "train.sh").read_text().startswith("#!/bin/bash\n#SBATCH --nodes=2")


def test_estimate_compares_with_the_usable_limit(capsys):
    assert main(["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--vp", "5",
                 "--cp", "2", "--precision", "fp8-delayed"]) == 0
    out = capsys.readouterr().out
    assert "GiB of 76.0 GiB usable (95% of 80 GiB)" in out and "MFU (BF16 peak)" in out


def test_candidates_csv_is_what_pandas_writes(tmp_path, monkeypatch):
    """The fast writer formats each column's distinct values once; its file must stay byte for
    byte pandas' own (rounded floats, missing counts, quoted reasons), across piece boundaries."""
    monkeypatch.setattr(run_folder, "CSV_ROWS_PER_PIECE", 2)
    frame = pd.DataFrame({
        "tp": [1, 2, 4, 8, 8],
        "num_microbatches": [32.0, np.nan, 8.0, 1.0, 2.0],
        "step_time_s": [1.23456789, np.nan, np.inf, -0.0, 1e17],
        "tiny": [1e-5, 0.00004, 2.5e-7, 3.0, 12345.678912],
        "fits": [True, False, True, False, False],
        "reason": ["", 'out of memory: needs 80.2 GiB, limit 76.0 GiB', 'a "quoted" one', "two\nlines", None],
        "pipeline_model_parallel_layout": ["Et*3|(tt|)*29m", "", "", "", ""],
    })
    run_folder.write_csv(tmp_path / "c.csv", frame)
    expected = run_folder._with_integers(frame.round(run_folder.FLOAT_DIGITS)).to_csv(index=False, lineterminator="\n")
    assert (tmp_path / "c.csv").read_text() == expected
    run_folder.write_csv(tmp_path / "empty.csv", frame.iloc[:0])
    assert (tmp_path / "empty.csv").read_text() == frame.iloc[:0].to_csv(index=False, lineterminator="\n")
