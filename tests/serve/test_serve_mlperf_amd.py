"""MLPerf Inference v5.1 on AMD Instinct (mlperf_inference_amd.csv) as a held-out group of
`validate --inference`: the rows as scripts/mlperf_inference_amd_rows.py writes them, the ones kept
and why the others are not, each kept layout a fitting candidate of the inference space, and the
group predicted with the vllm engine as each row's harness config runs it, reported apart."""

from __future__ import annotations

import io as stdio
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from autoparallel import io, resources
from autoparallel.serve import mlperf
from autoparallel.serve import search as serve
from autoparallel.serve.space import load_space
from autoparallel.serve.workload import load_workload

CSV = "mlperf_inference_amd.csv"
ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/mlcommons+inference_results_v5.1/repo")


@pytest.fixture(scope="module")
def entry():
    (amd,) = [h for h in mlperf.held_out_sets() if h["csv"] == CSV]
    return amd


@pytest.fixture(scope="module")
def rows(entry):
    return mlperf.load_rows(entry["csv"], entry["engine"], entry["engine_column"])


@pytest.fixture(scope="module")
def report(rows, entry):
    """Every kept run predicted in sample (as validate --inference predicts held-out groups)."""
    return mlperf.predict_rows(rows[0], cross=False, engine=entry["engine"])


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no mirror of mlcommons/inference_results_v5.1 to re-read")
def test_the_script_rewrites_the_csv_byte_for_byte(tmp_path):
    out = tmp_path / CSV
    subprocess.run([sys.executable, str(ROOT / "scripts" / "mlperf_inference_amd_rows.py"), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == resources.data_file(CSV).read_bytes()


def test_the_csv_has_the_v41_columns_and_amds_layouts():
    frame = pd.read_csv(resources.data_file(CSV))
    assert list(frame.columns) == list(pd.read_csv(resources.data_file(mlperf.DATA), nrows=0).columns)
    assert set(frame["engine"]) == {"vLLM"} and (frame["valid"] == "VALID").all()
    laid = frame[frame["tp"].notna()]
    # AMD's harness: one TP1 engine per GPU, FP8 weights (MXFP4 on MI355X) and an FP8 KV cache (base config.yaml)
    assert (laid["tp"] == 1).all() and (laid["replicas"] == laid["gpus"]).all()
    assert set(laid["weight_precision"]) == {"fp8", "mxfp4"} and set(laid["kv_precision"]) == {"fp8"}
    inter = frame[frame["scenario"] == "Interactive"]
    assert len(inter) and set(inter["ttft_bound_ms"]) == {450.0} and set(inter["tpot_bound_ms"]) == {40.0}
    assert frame.loc[frame["tp"].isna(), "notes"].str.startswith(("layout not published", "multi-node")).all()


def test_rows_kept_and_left_out(rows):
    kept, left_out = rows
    assert len(kept) + len(left_out) == len(pd.read_csv(resources.data_file(CSV)))
    assert set(kept["hardware"]) == {"mi300x", "mi325x"} and set(kept["division"]) == {"closed"}
    assert set(kept["scenario"]) == {"Offline", "Server", "Interactive"}
    assert not kept.duplicated(subset=list(mlperf.SAME_RUN)).any()
    reasons = left_out.value_counts()
    assert reasons["layout not published"] == 32  # MangoBoost's LLMBoost (Dell, Supermicro, its own)
    assert reasons[next(r for r in reasons.index if r.startswith("MXFP4"))] == 2  # open MI355X
    # each kept row runs the vllm engine as its config sets it: AMD's block size and memory fraction
    assert {s.engine for s in kept["engine_settings"]} == {"vllm"}
    assert {s.kv_block_tokens for s in kept["engine_settings"]} == {16, 32} and kept["kv_fraction"].between(0.9, 1.0).all()
    inter = kept[kept["scenario"] == "Interactive"]
    assert inter.loc[inter["hardware"] == "mi325x", "engine_settings"].map(lambda s: s.chunked_prefill).all()  # chunked
    assert not kept.loc[kept["scenario"] != "Interactive", "engine_settings"].map(lambda s: s.chunked_prefill).any()


def test_every_kept_layout_is_a_fitting_candidate_of_the_inference_space(rows, entry):
    """As benchmarks/bench_issue29_serving.py checks the v4.1 layouts: the space pinned to the row's
    TP, PP and precisions offers the layout and some max batch of it fits; the row's own max batch and
    token budget fit too (the vllm engine as the row ran it)."""
    kept, _ = rows
    keys = ["model", "hardware", "gpus", "tp", "pp", "max_batch", "max_num_tokens", "weight_precision",
            "kv_precision", "kv_fraction", "engine_settings"]
    for _, r in kept[keys].drop_duplicates().iterrows():
        model = io.load_model(mlperf.settings()["models"][r["model"]])
        hw = io.load_hardware(r["hardware"])
        wl = load_workload(mlperf.settings()["workloads"][r["model"]])
        engine = mlperf.engine_as_run(r["engine_settings"], r["kv_fraction"])
        pins = dict(tp=int(r["tp"]), pp=int(r["pp"]), weight_precision=r["weight_precision"],
                    kv_precision=r["kv_precision"])
        found = serve.search(model, hw, int(r["gpus"]), serve.Request.of_workload(wl), load_space().pinned(**pins),
                             engine, require_feasible=False)
        assert found.ranked["fits"].astype(bool).any(), (r["hardware"], r["model"], found.ranked["reason"].iloc[0])
        own = serve.search(model, hw, int(r["gpus"]), serve.Request.of_workload(wl),
                           load_space().pinned(**pins, max_batch=int(r["max_batch"]),
                                               max_num_tokens=int(r["max_num_tokens"])), engine, require_feasible=False)
        assert own.ranked["fits"].astype(bool).all(), (r["hardware"], r["model"], r["max_batch"])


def test_the_group_is_predicted_and_reported_apart(report, rows, entry, monkeypatch, capsys):
    from autoparallel.serve import validate
    assert len(report) == len(rows[0]) and report["in_sample_tokens_per_s"].gt(0).all()
    table = mlperf.summary(report)
    assert set(table["round"]) == {"v5.1"} and set(table["hardware"]) == {"mi300x", "mi325x"}
    inter = table[table["scenario"] == "Interactive"]
    assert inter["ttft_p99_pct"].notna().all() and inter["tpot_p99_pct"].notna().all()  # p99s beside Server's
    monkeypatch.setenv("COLUMNS", "80")  # the width report.fit's tables read
    console = Console(file=stdio.StringIO(), width=80)
    validate.print_held_out_mlperf(entry, report, rows[1], console)
    text = console.file.getvalue()
    assert "MLPerf Inference held out (never fitted): amd," in " ".join(text.split()) and "v5.1" in text and "Interactive" in text
    assert max(len(line) for line in text.splitlines() if line.startswith("v5.1")) <= 80
    assert "32 layout not published" in " ".join(text.split())
    # validate --inference --json: the group under mlperf.held_out, the v4.1 part as it was
    for name in ("fastertransformer_report", "held_out_report", "not_predicted_serving_rows"):
        monkeypatch.setattr(validate, name, lambda *a, **k: pd.DataFrame())
    monkeypatch.setattr(validate, "json_report", lambda *a: {})
    monkeypatch.setattr(validate, "mlperf_report", lambda cross: (report, rows[1]))
    monkeypatch.setattr(validate, "held_out_mlperf_reports", lambda: [(entry, report, rows[1])])
    assert validate.run(None, True, console) == 0
    ml = json.loads(capsys.readouterr().out)["mlperf"]
    amd = ml["held_out"]["amd"]
    assert amd["csv"] == CSV and amd["engine"] == "vllm" and len(amd["rows"]) == len(report)
    assert amd["not_predicted"]["layout not published"] == 32


def test_each_row_runs_as_amds_harness_sets_it(rows):
    """vllm_settings reads a row's config as AMD's harness runs it: vLLM V0 without chunked prefill
    runs prefills first and mixes no decode into them (vllm/core/scheduler.py ``_schedule_default``),
    AMD's VLLM_LLAMA2_MLPERF_SCHED admits prompts only below its target decode batch, and
    scripts/power_settings.sh holds the GFX clock (rocm-smi --setperfdeterminism), and V0 runs
    num_scheduler_steps decode iterations per scheduler call (multi-step) and, with AMD's MLPerf
    scheduler, gates prefills on MIN_REQUIRE_PREFILL_QUERY (10 where unset); the MI325X Interactive runs
    use V1 with chunked prefill, which reads none of the MLPerf scheduler's knobs and has no multi-step."""
    kept, _ = rows
    one = lambda hw, model, scenario, submitter="AMD": kept[(kept.hardware == hw) & (kept.model == model) & (  # noqa: E731
        kept.scenario == scenario) & (kept.submitter == submitter)]["engine_settings"].iloc[0]
    assert one("mi300x", "llama2-70b", "Offline") == ("vllm", 32, False, True, 1536, 1400, 11, 10)
    assert one("mi325x", "llama2-70b", "Server") == ("vllm", 32, False, True, 832, 1600, 9, 10)
    assert one("mi325x", "mixtral-8x7b", "Offline") == ("vllm", 16, False, True, 0, 1500, 13, 0)
    assert one("mi325x", "llama2-70b", "Interactive") == ("vllm", 16, True, False, 0, 1700, 1, 0)
    assert one("mi300x", "llama2-70b", "Interactive").scheduler_steps == 8  # V0, num_scheduler_steps 8
    assert one("mi300x", "llama2-70b", "Server").prefill_min_waiting == 8  # MIN_REQUIRE_PREFILL_QUERY 8
    assert one("mi325x", "llama2-70b", "Interactive", "Vultr").gfx_clock_mhz == 1600  # Vultr's own power_settings.sh
    engine = mlperf.engine_as_run(one("mi300x", "llama2-70b", "Offline"), 0.98)
    assert engine.prefill_priority and not engine.chunked_prefill and engine.kv_memory_fraction == 0.98
    assert engine.scheduler_steps == 11 and mlperf.engine_as_run(one("mi325x", "llama2-70b", "Interactive"), 1.0).scheduler_steps == 1
    hw = io.load_hardware("mi300x")
    slow = mlperf.gfx_clock(hw, 1400)
    assert slow.fp8_tflops == pytest.approx(hw.fp8_tflops * 1400 / 2100) and slow.hbm_tbps == hw.hbm_tbps
    assert mlperf.gfx_clock(hw, 0) is hw and mlperf.gfx_clock(io.load_hardware("h100-sxm"), 1400).fp8_tflops == 1979


def test_a_harness_clock_above_the_sustained_gemm_rate_does_not_speed_the_matrix_peaks():
    """gfx_clock scales each matrix peak by the lock, capped at the GPU's sustained GEMM speed measured
    against the H100 (mlperf.matrix_clock): the MI300X Interactive lock of 2,000 MHz (0.952 of the
    2,100 the peaks are quoted at) gives its FP8 peak 0.717 = (1,222.9 / 1,290.1) / (2,614.9 / 1,979)
    (Azure's FP8 pair) and its BF16 peak 0.636 = (668.4 / 794.5) / (1,307.4 / 989) (the BF16 MAMF pair);
    the exponential units take the lock. Locks under the sustained speed stand as before."""
    mi300x, mi325x = io.load_hardware("mi300x"), io.load_hardware("mi325x")
    fp8, bf16 = (1222.9 / 1290.1) / (2614.9 / 1979), (668.4 / 794.5) / (1307.4 / 989)
    fast = mlperf.gfx_clock(mi300x, 2000)
    assert fast.fp8_tflops == pytest.approx(2614.9 * fp8) == pytest.approx(1979 * 1222.9 / 1290.1)
    assert fast.bf16_tflops == pytest.approx(1307.4 * bf16)
    assert fast.exp_tera_per_s == pytest.approx(mi300x.exp_tera_per_s * 2000 / 2100)
    offline = mlperf.gfx_clock(mi300x, 1400)  # FP8 under 0.717: the lock; BF16 over 0.636: the cap
    assert offline.fp8_tflops == pytest.approx(2614.9 * 1400 / 2100) and offline.bf16_tflops == pytest.approx(1307.4 * bf16)
    assert mlperf.gfx_clock(mi300x, 1300).bf16_tflops == pytest.approx(1307.4 * 1300 / 2100)
    inter = mlperf.gfx_clock(mi325x, 1700)  # 0.810 under the MI325X's FP8 0.856, over its BF16 0.758
    assert inter.fp8_tflops == pytest.approx(2614.9 * 1700 / 2100)
    assert inter.bf16_tflops == pytest.approx(1307.4 * bf16 * 843 / 708)
    assert mlperf.matrix_clock(0.9, 0.7) == 0.7 and mlperf.matrix_clock(0.6, 0.7) == 0.6
