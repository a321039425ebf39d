"""Ranked tables (issue 13): one row per layout with its variants counted, hidden knobs shown,
MFU on the BF16 peak, the tie band, no truncation in logs; candidates.csv / .parquet types;
what `search` and `estimate` print."""

import io as stdio
import re
import sys

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from autoparallel import io
from autoparallel.cli import main
from autoparallel.report import fit, run_folder, tables
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
    error = tables.prediction_error().for_hardware(h100)  # the H100 family's dense band
    assert f"within {error.step_time_relative_error:.1%} of the best" in text and "h100-sxm family" in text
    assert "BF16 dense peak (989 TFLOP/s" in text and "75.7 GiB" in text
    assert len([line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]) == len(rows)


def test_variants_of_a_layout_collapse_and_say_what_differs(h100):
    frame = _frame([dict(tokens_per_s_per_gpu=1000.0), dict(tokens_per_s_per_gpu=990.0, vp=2),
                    dict(tokens_per_s_per_gpu=980.0, fp8_bf16_edge_layers=1, precision="fp8-current"),
                    dict(tokens_per_s_per_gpu=970.0, tp=4, dp=32, grad_reduce_in_fp32=False)])
    rows = tables.grouped(frame, 50, h100)
    assert list(rows["variants"]) == ["+2", "-"]
    assert rows["differs_in"].iloc[0] == "vp,prec,edge"
    assert rows["other_knobs"].iloc[1] == "nog32"
    key = tables.legend(h100)[-1]
    assert "vp = virtual pipeline stages" in key and "g32 = gradients reduced in FP32" in key


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


def test_pipes_get_a_sane_width_and_wide_gets_every_column(result_175b, h100, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = stdio.StringIO()
    tables.print_ranked(result_175b.ranked, "t", 50, Console(file=out, width=400), h100, 0.95)
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= fit.PIPE_WIDTH and "…" not in out.getvalue()
    (note,) = [line for line in lines if line.startswith("--wide adds ")]
    assert "other" in note and "precision" not in note  # the lowest priority went first
    assert len(lines) == 1 + 2 + len(tables.grouped(result_175b.ranked, 50, h100)) + 1 + 3  # title, header, rows, note, legend
    monkeypatch.setenv("COLUMNS", "120")
    out = stdio.StringIO()
    tables.print_ranked(result_175b.ranked, "t", 50, Console(file=out, width=400), h100, 0.95, wide=True)
    header = out.getvalue().splitlines()[1].split()
    assert {"differs", "other", "TFLOP/s", "var"} <= set(header) and "--wide adds" not in out.getvalue()
    assert max(map(len, out.getvalue().splitlines())) > 120  # --wide: as wide as the table needs


def test_short_legend_is_three_lines_under_80_columns(h100):
    lines = tables.short_legend(h100, 0.95)
    assert len(lines) <= 3 and all(len(line) <= 80 for line in lines)
    assert "75.7" in lines[1] and "989" in lines[1] and "--explain" in lines[2]


def test_fit_drops_whole_columns_lowest_priority_first_and_never_the_kept_ones():
    cols = [fit.Column("a", "A"), fit.Column("b", "B", drop=1), fit.Column("c", "C", drop=2),
            fit.Column("d", "D", drop=2), fit.Column("e", "EEEE")]
    rows = [["1", "22", "333", "4444", "5"]]
    # natural widths 1, 2, 3, 4, 4 with gaps of 2: 14 + 8 = 22
    assert fit.fit(cols, rows, 22) == [0, 1, 2, 3, 4]
    assert fit.fit(cols, rows, 21) == [0, 1, 2, 4]  # the rightmost of the two drop=2 columns first
    assert fit.fit(cols, rows, 13) == [0, 1, 4]
    assert fit.fit(cols, rows, 3) == [0, 4]  # kept columns stay even when they alone are too wide
    assert fit.fit(cols, rows, None) == [0, 1, 2, 3, 4]
    assert fit.dropped_note(cols, [0, 4], "") == "--wide adds B, C, D"



def test_serving_tables_drop_a_column_every_row_shares_first_and_name_its_value():
    """At 80 columns `infer --scenario server` dropped 'max tokens' (drop 2) and kept 'weights' and 'KV'
    (drop 1), fp8 in every row: rows 3 and 4 looked identical (session 46). With constant_first a column
    with one value in every row goes first, and the note under the table gives that value."""
    cols = [fit.Column("a", "A"), fit.Column("tokens", "max tokens", drop=2), fit.Column("w", "weights", drop=1)]
    rows = [["1", "2048", "fp8"], ["2", "8192", "fp8"]]
    assert fit.fit(cols, rows, 16) == [0, 2]  # by priority alone: the column that tells the rows apart goes
    assert fit.fit(cols, rows, 16, constant_first=True) == [0, 1]
    assert fit.dropped_note(cols, [0, 1], "", rows) == "every row: weights fp8"
    assert fit.dropped_note(cols, [0], "; x", rows) == "every row: weights fp8; --wide adds max tokens; x"
    assert fit.dropped_note(cols, [0, 1], "") == "--wide adds weights"  # without rows: as before
    out = stdio.StringIO()
    fit.print_table(Console(file=out, width=16, force_terminal=True, color_system=None), None, cols, rows,
                    constant_first=True)
    assert "8192" in out.getvalue() and "every row: weights fp8" in " ".join(out.getvalue().split())

def test_a_column_that_tells_rows_apart_goes_last_and_is_named_if_it_goes():
    """`infer` at 80 columns dropped 'max tokens' (and weights, KV) but kept the end-to-end latency:
    Pareto rows 1475 and 1472 read TP8 PP1 1 replica batch 1 both, with different TTFTs (session 47).
    A knob column that tells shown rows apart now goes after every other droppable one; if the table
    is still too wide, the note says which hidden column the rows that look alike differ in."""
    cols = [fit.Column("a", "A", knob=True), fit.Column("tokens", "max tokens", drop=3, knob=True),
            fit.Column("w", "weights", drop=2, knob=True), fit.Column("e2e", "e2e", drop=1)]
    rows = [["1", "512", "fp8", "5151"], ["1", "2048", "fp8", "5093"], ["2", "512", "bf16", "5222"]]
    # natural widths 1, 10, 7, 4 with gaps of 2: 28 in all
    assert fit.fit(cols, rows, 23) == [0, 1, 3]  # by priority max tokens went first; it tells rows 1, 2 apart
    assert fit.fit(cols, rows, 16) == [0, 1]  # the weights (row 3 is told apart by A) and e2e go before it
    assert fit.dropped_note(cols, [0, 1], "", rows, constants=False) == "--wide adds weights, e2e"
    assert fit.fit(cols, rows, 10) == [0]
    assert fit.dropped_note(cols, [0], "", rows, constants=False) == \
        "rows alike here differ in max tokens; --wide adds max tokens, weights, e2e"
    plain = [fit.Column(c.key, c.header, c.fmt, c.drop) for c in cols]  # not knobs: priority alone, as before
    assert fit.fit(plain, rows, 23) == [0, 2, 3]


def test_kept_columns_wider_than_the_screen_run_on_whole():
    cols = [fit.Column("a", "A"), fit.Column("b", "B")]
    out = stdio.StringIO()
    fit.print_table(Console(file=out, width=10, force_terminal=True, color_system=None), None, cols,
                    [["x" * 8, "y" * 8]])
    assert "x" * 8 + "  " + "y" * 8 in out.getvalue()


def test_text_columns_align_left_and_numbers_right():
    """Every column of the ranked tables was right-aligned: precisions, recomputes, engines and model
    names read ragged on their left (session 48). Text now starts at its column's left edge, numbers
    (counts, %, SI, $, +N) end at the right one; a column without values goes by its format."""
    cols = [fit.Column("rank", "#"), fit.Column("precision", "precision"), fit.Column("sp", "SP"),
            fit.Column("tok", "tok/s/GPU", "{:,.0f}"), fit.Column("mfu", "MFU"), fit.Column("cost", "cost"),
            fit.Column("var", "var"), fit.Column("lomo", "LOMO %", "{:.1f}")]
    rows = [["1", "fp8-delayed", "yes", "1,946", "88.4%", "$5.35M", "+2", "-"],
            ["12", "bf16", "-", "792", "5.1%", "$12K", "-", "-"]]
    assert [fit.justify(c, rows, i) for i, c in enumerate(cols)] == [
        "right", "left", "left", "right", "right", "right", "right", "right"]
    out = stdio.StringIO()
    fit.print_table(Console(file=out, width=80, color_system=None), None, cols, rows)
    header, _, first, second = out.getvalue().splitlines()
    for word in ("precision", "SP"):  # text: header and cells start together
        assert header.index(word) == first.index({"precision": "fp8-delayed", "SP": "yes"}[word]) == \
            second.index({"precision": "bf16", "SP": "-  "}[word])
    for head, a, b in (("tok/s/GPU", "1,946", "792"), ("MFU", "88.4%", "5.1%"), ("cost", "$5.35M", "$12K")):
        end = header.index(head) + len(head)  # numbers: header and cells end together
        assert first.index(a) + len(a) == end == second.index(b) + len(b)


def test_a_coded_column_that_tells_rows_apart_stays_and_a_shared_column_goes_first():
    """The 80-column search table dropped the precision (fp8-delayed or fp8-blockwise) while it showed
    EP 1 in every row: a column with codes that rows differ in stays, coded where its name does not
    fit, a column every row shares going first where even that is too wide, and goes as before where
    nothing fits; the note says what went, what every row holds and what a code means."""
    cols = [fit.Column("a", "A"), fit.Column("ep", "EP", knob=True),
            fit.Column("t", "tie", alike=(("yes", "every row is a tie"),)),
            fit.Column("p", "precision", drop=1, knob=True, short="prec", codes=(("fp8-delayed", "fp8d"),)),
            fit.Column("o", "other", drop=2)]
    rows = [["1", "1", "yes", "fp8-delayed", "x"], ["2", "1", "yes", "bf16", "y"]]
    assert fit.fit(cols, rows, 22) == [0, 1, 2]  # by priority alone the precision went
    columns, cells, shown = fit.narrowed(cols, rows, 22)  # 1 + 2 + 3 + 4 (coded) + 3 gaps = 16
    assert shown == [0, 1, 2, 3] and [r[3] for r in cells] == ["fp8d", "bf16"] and columns[3].header == "prec"
    assert fit.dropped_note(columns, shown, "", cells, constants=False) == "prec: fp8d = fp8-delayed; --wide adds other"
    columns, cells, shown = fit.narrowed(cols, rows, 13)  # EP, a knob every row shares, goes first
    assert shown == [0, 2, 3] and fit.dropped_note(columns, shown, "", cells, constants=False) == \
        "every row: EP 1; prec: fp8d = fp8-delayed; --wide adds other"
    columns, cells, shown = fit.narrowed(cols, rows, 8)  # then the tie mark: A + prec = 7
    assert shown == [0, 3] and fit.dropped_note(columns, shown, "", cells, constants=False).startswith(
        "every row: EP 1; every row is a tie; prec:")
    assert fit.narrowed(cols, rows, 5)[2] == fit.fit(cols, rows, 5) == [0, 1, 2]  # too narrow even so
    same = [["1", "1", "yes", "bf16", "x"], ["2", "1", "yes", "bf16", "y"]]  # no row differs: it goes
    columns, cells, shown = fit.narrowed(cols, same, 17)
    assert shown == [0, 1, 2] and fit.dropped_note(columns, shown, "", cells, constants=False) == \
        "every row: precision bf16; --wide adds other"
    assert fit.narrowed(cols, rows, 40)[2] == [0, 1, 2, 3, 4]


def test_a_long_title_keeps_its_count_and_time_together():
    """At 80 columns `infer` ended its title "(1,751 candidates in 0.25" / "s)", at 100 `search` did the
    same (session 48): a title too wide for the terminal puts its parenthetical on a line of its own."""
    title = "llama3-70b on 64 x h100-sxm, gbs 128, seq 8192: top 8 of 42,629 feasible (83,369 candidates in 0.29 s)"
    assert fit.title_lines(title, 120) == [title]
    assert fit.title_lines(title, 100) == [title[:title.index(" (")], "(83,369 candidates in 0.29 s)"]
    assert fit.title_lines("a (b) c", 3) == ["a", "(b)", "c"]  # no closing parenthetical, no comma: at its words
    served = ("llama3.1-70b on 8 x h100-sxm (tensorrt-llm), mlperf-llama2-70b, server, p99 TTFT <= 2000 ms, "
              "p99 TPOT <= 200 ms: 5,000 simulated requests per layout (8 layouts in 7.2 s)")
    assert fit.title_lines(served, 80) == [  # infer's server title broke "p99 TTFT <=" / "2000 ms"
        "llama3.1-70b on 8 x h100-sxm (tensorrt-llm), mlperf-llama2-70b, server,",
        "p99 TTFT <= 2000 ms, p99 TPOT <= 200 ms: 5,000 simulated requests per layout", "(8 layouts in 7.2 s)"]
    assert fit.title_lines("aaaa, bb, cc", 6) == ["aaaa,", "bb, cc"]
    out = stdio.StringIO()
    fit.print_table(Console(file=out, width=100, force_terminal=True, color_system=None), title, [fit.Column("a", "A")],
                    [["1"]])
    assert out.getvalue().splitlines()[1] == "(83,369 candidates in 0.29 s)"


def test_a_phrase_wider_than_the_line_keeps_layouts_and_figures_whole():
    """The memory message's parenthesis is one phrase wider than 80 columns; broken at its words it
    read "(TP8 PP1 CP1" / "DP1: 325.2 GiB" (and "325.2" / "GiB" at 90): a layout string and a figure
    with its unit are one word to the break."""
    text = ("the smallest memory need is 329.8 GiB against a limit of 79.7 GiB (TP8 PP1 CP1 DP1: 325.2 GiB of "
            "weights, gradients and optimizer state, 0.7 of activations); search --gpus 64")
    for width in range(30, 130):
        lines = fit.phrase_lines(text, width, lead="autoparallel: error:")
        assert " ".join(lines) == f"autoparallel: error: {text}"
        assert any("(TP8 PP1 CP1 DP1:" in line for line in lines), (width, lines)
        assert not any(line.endswith(("329.8", "79.7", "325.2")) for line in lines), (width, lines)
        assert all(len(line) <= width for line in lines), (width, lines)


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
    commands = re.sub(r" \\\n +", " ", out)  # the shell's line continuations, joined
    assert f"autoparallel export {run_dir} --rank 1 --format megatron" in commands
    assert f"sbatch {run_dir / 'train.sh'}" in commands and "DATA_PATH=..." in commands
    hints = out[out.index("rank 1 as Megatron-LM flags"):].splitlines()
    assert all(len(line) <= 80 for line in hints if str(run_dir) not in line), hints
    assert "launch rank 1 on 2 nodes x 8 GPUs:" in hints
    assert (run_dir / "train.sh").read_text().startswith("#!/bin/bash\n#SBATCH --nodes=2")


def _hint(out: str, run_dir) -> tuple[list[str], list[str]]:
    """The closing hint's lines after the run folder's, and the --format values it offers."""
    hints = out[out.index(f"run folder: {run_dir}"):].splitlines()[1:]
    offered = re.findall(r"--format ([a-z0-9-]+(?:, [a-z0-9-]+)*)", re.sub(r" \\\n +", " ", "\n".join(hints)))
    return hints, [f for group in offered for f in group.split(", ")]


@pytest.mark.parametrize("args", [
    # DeepSeek-V4: the reason no flags are written was one 420-column line
    ["--model", "deepseek-v4-flash", "--gpus", "128", "--gpu", "gb300", "--tp", "1", "--pp", "1", "--ep", "64",
     "--precision", "mxfp8"],
    # NVFP4 rank 1: the hint offered nemo, nemo2 and nemo2-yaml, which export refuses for it
    ["--model", "llama3-8b", "--gpus", "8", "--gpu", "b200", "--tp", "1", "--pp", "1", "--precision", "nvfp4"],
    # FP8 attention: best.yaml's megatron_args raised, so the saved search failed (exit 2) after pricing
    ["--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--precision", "fp8-delayed",
     "--fp8-attention"],
    # a hybrid: "rank 1 as Megatron-LM flags (or --format launch, yaml; best.yaml holds its Megatron-Bridge provider):"
    ["--model", "nemotron-3-nano", "--gpus", "8", "--gpu", "b200", "--tp", "1", "--pp", "1", "--ep", "8",
     "--precision", "bf16"],
], ids=["dsv4", "nvfp4", "fp8-attention", "hybrid"])
def test_every_format_the_closing_hint_offers_exports_and_its_lines_fit_80_columns(args, tmp_path, capsys):
    assert main(["search", *args, "--results", str(tmp_path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    hints, offered = _hint(out, run_dir)
    long = [line for line in hints if len(line) > 80 and str(run_dir) not in line]  # a long path stays whole
    assert not long and offered, long
    for fmt in offered:
        assert main(["export", str(run_dir), "--format", fmt, "-o", str(tmp_path / f"rank1.{fmt}")]) == 0, fmt
    capsys.readouterr()


def test_estimate_compares_with_the_usable_limit(capsys):
    assert main(["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--vp", "5",
                 "--cp", "2", "--precision", "fp8-delayed"]) == 0
    out = capsys.readouterr().out
    assert "GiB of 79.7 usable, 4 GiB reserve included" in out and "MFU (BF16 peak)" in out


def test_estimate_title_is_a_line_above_its_table(monkeypatch):
    """At 80 columns the estimate's title was a rich table title: wrapped at the table's width and
    centred, "recompute=none" alone in the middle of the second line."""
    from rich.console import Console

    from autoparallel.cli import estimate
    buffer = stdio.StringIO()
    monkeypatch.setattr(estimate, "console", Console(file=buffer, width=80))
    assert main(["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "4"]) == 0
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("llama3-70b on 64 x h100-sxm: TP4 PP4 VP1 CP1 DP4 MBS1 GBS128")
    assert lines[1].lstrip().startswith("recompute=none") and not lines[1].startswith("  ")


def test_estimate_prices_the_recompute_modules_pinned_and_names_them(capsys):
    """Selective recompute's module set was the first of the space that applies (moe_act for
    DeepSeek-V4-Pro), could not be pinned and was not shown: Bridge's recipe runs 'mla_up_proj mhc'."""
    import json
    base = ["estimate", "--model", "deepseek-v4-pro", "--gpus", "256", "--gpu", "gb300", "--tp", "1", "--pp", "4",
            "--vp", "4", "--ep", "64", "--precision", "mxfp8", "--recompute", "selective"]
    peaks = {}
    for modules in ("moe_act", "mla_up_proj mhc"):
        assert main([*base, "--recompute-modules", modules, "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["config"]["recompute_modules"] == modules
        peaks[modules] = result["peak_memory_gib"]
    assert peaks["mla_up_proj mhc"] < peaks["moe_act"]  # mhc spares the n-stream tensors
    assert main([*base, "--recompute-modules", "mla_up_proj,mhc"]) == 0
    assert "recompute=selective (mla_up_proj mhc)" in " ".join(capsys.readouterr().out.split())


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
    expected = run_folder._with_integers(run_folder.rounded(frame)).to_csv(index=False, lineterminator="\n")
    assert (tmp_path / "c.csv").read_text() == expected
    run_folder.write_csv(tmp_path / "empty.csv", frame.iloc[:0])
    assert (tmp_path / "empty.csv").read_text() == frame.iloc[:0].to_csv(index=False, lineterminator="\n")


def test_search_reports_pricing_progress_up_to_every_valid_row(h100):
    model = io.load_model("llama3-70b")
    seen = []
    result = runs.search(model, h100, 64, 128, load_space(), progress=lambda done, total: seen.append((done, total)))
    valid = int((result.ranked["reason"] == "").sum() + result.ranked["reason"].str.startswith("out of memory").sum())
    assert len(seen) >= 2 and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (valid, valid)


def test_piped_search_prints_no_progress_residue(capsys):
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--no-save", "--top", "3"]) == 0
    assert capsys.readouterr().out.startswith("llama3-8b on 16 x h100-sxm")


def test_report_prints_the_searchs_table_digit_for_digit(tmp_path, monkeypatch, capsys):
    """`report` re-renders the table `search` printed from the stored candidates.csv: the same rows,
    to the last digit (MFU was stored to 4 decimals, so the search's 74.3% came back as 74.4%)."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--top", "20", "--wide",
                 "--results", str(tmp_path)]) == 0
    searched = capsys.readouterr().out.splitlines()
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert main(["report", str(run_dir)]) == 0
    reported = capsys.readouterr().out.splitlines()

    def rows(lines):  # rank to tie (the variant count is of the rows each table shows)
        return [s.split()[:18] for s in lines if re.match(r"^\s*\d+\s+\d+\s+\d+\s", s)]
    assert rows(searched) and rows(reported)[:len(rows(searched))] == rows(searched)


def test_the_note_keeps_its_parts_whole_where_that_takes_no_more_lines():
    """The 175B note at 80 columns ended "FP8 util, var," / "differs, other" and put "fp8b =
    fp8-blockwise" a line below its "prec:" (session 52): each part of the note starts a line where
    that takes no more lines than breaking it at any phrase; where it would, the note is as before."""
    note = ("every row: SP yes; prec: fp8d = fp8-delayed, fp8c = fp8-current, fp8b = fp8-blockwise; "
            "--wide adds recompute, TP ovl, TFLOP/s, FP8 util, var, differs, other")
    assert fit.note_lines(note, 80) == [
        "every row: SP yes;", "prec: fp8d = fp8-delayed, fp8c = fp8-current, fp8b = fp8-blockwise;",
        "--wide adds recompute, TP ovl, TFLOP/s, FP8 util, var, differs, other"]
    saved = note + "; all in the run folder's ranked.md"  # whole parts would take four lines
    assert fit.note_lines(saved, 80) == fit.phrase_lines(saved, 80)
    for text in (note, saved, "a; b, c", "every row is a tie; prec: fp8c = fp8-current"):
        for width in range(20, 200):
            lines = fit.note_lines(text, width)
            assert " ".join(lines) == text and all(len(line) <= width for line in lines), (width, lines)
            assert len(lines) <= len(fit.phrase_lines(text, width)), (width, lines)
