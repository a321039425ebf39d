"""MLPerf Inference runs as validation of the traffic simulation (serve/mlperf.py, issue 29 item 4).

Issue 29's targets: Offline and Server tokens/s per GPU within 15 % mean |error| (met), p99 TTFT /
TPOT within 25 % (not met: a strict expected failure quoting today's figures, beside a regression
guard at them). In sample: these are the fitted constants' rows.
"""

import json

import pandas as pd
import pytest

from autoparallel import cli, io, resources
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.simulate import run_workload
from autoparallel.serve.workload import load_workload

# Today's figures (in-sample mean |error| %, 2026-11-27): the expected failure's reason and the
# regression guard's bounds; update them here when the serving model moves.
# 46.9 / 34.0 (own rate 44.1 / 29.5) before the H100 / H800 presets took the 79.65 GiB the driver
# reports instead of 80 (session 36): a smaller KV pool, the ill-conditioned p99s move (RESULTS.md).
# 48.8 / 34.1 (own rate 49.0 / 30.0) before the MLPerf output spreads took LoadGen's measured
# percentiles (sigma 0.57 / 0.70 instead of 0.8) and the mean inputs their refit (257 -> 261,
# 663 -> 667; session 37): TTFT rose only through NVIDIA's two H200 Mixtral runs, which sit at the
# simulated replica's capacity knee (p99 TTFT 1.16 -> 1.89 s against 0.54-0.57 s; with the inputs
# unrefitted the same spreads give 46.6 / 34.7): every other group's TTFT and TPOT moved <= 3 points.
# 54.8 / 33.3 (own rate 49.1 / 26.6) before the MoE plugin's permute and top-k sum bytes were
# priced and Mixtral's mean input refitted 667 -> 653 (session 39, s39h2; the own-rate TTFT got
# worse, through the Mixtral runs: 81.1 -> 84.0 % over their 12).
# 47.4 / 33.0 (own rate 50.0 / 26.3) before the gated activation's pass was priced for dense and
# MoE layers alike, every engine refitted and Mixtral's mean input refitted 653 -> 615 (session 40,
# s40h1; over the 35 runs both keep up with 48.7 / 33.8 -> 41.8 / 32.7; the own-rate TTFT got
# worse, through HPE's H100 llama2-70b and the H100 Mixtral runs' own rates).
# 41.7 / 32.7 (own rate 55.9 / 25.1) before a one-GPU engine's KV pool left 1.32 GiB beside the
# weights and activations (TensorRT-LLM's documented log: the driver's 0.55 + context 0.77) instead
# of the 4 GiB training reserve, every engine refitted and Mixtral's mean input refitted 615 -> 621
# (session 41, s41h1). 40.5 / 30.5 (own rate 49.1 / 21.7) before the fit's step scale had a floor from
# each constant's bounds and every engine was refitted into the same minimum's flat directions
# (session 42, s42h3: the own-rate TTFT loosened 49.1 -> 49.7; held out 42.2 -> 36.9).
P99 = {"ttft": 40.6, "tpot": 30.4}
# The same at the simulated replica's own Server rate (the largest within the bounds), over all 38
# Server runs (2026-11-28, session 42).
P99_OWN = {"ttft": 49.7, "tpot": 21.5}


@pytest.fixture(scope="module")
def rows():
    return mlperf.load_rows()


@pytest.fixture(scope="module")
def report(rows):
    """Every kept run predicted with the fitted constants (in sample only: the LOMO refits are the
    CLI's business; `validate --inference` prints both)."""
    return mlperf.predict_rows(rows[0], cross=False)


def test_rows_kept_and_left_out(rows):
    kept, left_out = rows
    assert len(kept) + len(left_out) == len(pd.read_csv(resources.data_file(mlperf.DATA)))
    assert set(kept["division"]) == {"closed"} and set(kept["engine"]) == {"TensorRT-LLM"}
    assert not kept.duplicated(subset=list(mlperf.SAME_RUN)).any()  # -99 / -99.9 copies counted once
    assert left_out.str.contains("same run submitted as -99 and -99.9").sum() > 0
    capped = left_out.str.startswith("power-capped run (MaxQ)")
    assert capped.sum() == 6 and not kept["notes"].str.contains("MaxQ", regex=False).any()
    for preset in mlperf.settings()["gpus"].values():
        io.load_hardware(preset)
    assert set(kept["scenario"]) == {"Offline", "Server"} and set(kept["kv_fraction"]) <= {0.9, 0.95, 0.97}


def test_an_870_token_mean_input_would_need_more_than_the_fp8_peak(rows):
    """Why the llama2-70b mean input is not the first guess (870): the best H200 Offline run makes
    output tokens at a rate whose prefill and decode GEMMs alone would then exceed the H200's FP8
    peak (2 FLOPs per layer parameter per token), while the fitted mean (261) needs less than it."""
    kept, _ = rows
    h200 = kept[(kept["hardware"] == "h200") & (kept["model"] == "llama2-70b") & (kept["scenario"] == "Offline")]
    per_gpu = h200["tokens_per_s_per_gpu"].max()
    model, hw = io.load_model("llama2-70b"), io.load_hardware("h200")
    out_len = load_workload("mlperf-llama2-70b").mean_output
    flops_at = lambda mean_in: 2 * model.num_layers * model.layer_params * per_gpu / out_len * (mean_in + out_len)  # noqa: E731
    assert flops_at(870) > hw.fp8_tflops * 1e12
    assert flops_at(load_workload("mlperf-llama2-70b").mean_input) < 0.7 * hw.fp8_tflops * 1e12


def test_offline_runs_as_many_samples_as_loadgen_sends(rows):
    """LoadGen's Offline query holds max(min count, 1.1 x min_duration x offline_expected_qps)
    samples: NVIDIA's DGX-H100 llama2-70b-99.9 log (target_qps 76, 2,400 s) says 200,640. The
    validation simulates each replica's share of that, not one pass over the 24,576-sample dataset
    (whose last batch's drain is a larger share of the simulated run than of MLPerf's)."""
    assert mlperf.offline_sample_count("llama2-70b", 76.0, 2_400_000.0) == 200_640
    assert mlperf.offline_sample_count("llama2-70b", 1.0, 2_400_000.0) == 24_576  # the dataset at least
    assert mlperf.offline_sample_count("mixtral-8x7b", float("nan"), 2_400_000.0) == 15_000  # no published QPS
    # the run's requested_min_query_count where its log gives one (NVIDIA's v5.1 DeepSeek-R1: 6 x the dataset)
    assert mlperf.offline_sample_count("deepseek-r1", 10.0, 600_000.0, 26_328.0) == 26_328
    assert mlperf.offline_sample_count("deepseek-r1", 10.0, 600_000.0) == 6_600
    kept, _ = rows
    offline = kept[kept["scenario"] == "Offline"]
    dgx = offline[(offline["system"] == "DGX-H100_H100-SXM-80GBx8_TRT") & (offline["model"] == "llama2-70b")]
    assert set(dgx["offline_requests"]) == {211_200}  # its -99 config: offline_expected_qps 80
    assert (offline["offline_requests"] >= offline["model"].map(mlperf.settings()["offline_requests"])).all()


def test_a_config_qps_too_low_for_min_duration_is_raised(rows):
    """Juniper's 16-GPU config publishes offline_expected_qps 19 (50,160 samples, ~6,300 per
    replica: five minutes of work), but its run is valid, so it lasted its 600 s minimum: the
    simulated replica gets as many requests as it serves in that time (x LoadGen's 1.1 slack)."""
    kept, _ = rows
    row = kept[(kept["scenario"] == "Offline") & (kept["system"] == "DGX-H100_H100-SXM-80GBx16_TRT")].iloc[0]
    assert int(row["offline_requests"]) == 50_160 and row["min_duration_ms"] == 600_000
    wl = load_workload("mlperf-llama2-70b")
    cost, sched = mlperf.harness_replica(io.load_model("llama2-70b"), io.load_hardware("h100-sxm"),
                                         efficiency_for("tensorrt-llm"), wl, 2, 1, 896, 4096, kv_fraction=0.9)
    share = 50_160 // int(row["replicas"])
    short = run_workload(cost, sched, wl, None, share)
    assert short.duration < 600  # what the published config alone would simulate
    run = mlperf.offline_run(cost, sched, wl, share, 600.0)
    assert run.duration >= 600 and len(run.arrival) == pytest.approx(1.1 * share * 600 / short.duration, abs=1)
    assert mlperf.offline_run(cost, sched, wl, share).duration == short.duration  # no minimum: as published


def test_offline_within_the_issue_tolerance(report):
    """Issue 29: Offline tokens/s per GPU mean |error| <= 15 % (measured 4.1 %; the mean input
    lengths are fitted on the H100 Offline runs, the other GPUs' are held out)."""
    offline = report[report["scenario"] == "Offline"]
    assert offline["in_sample_pct"].abs().mean() <= 15.0
    held = offline[offline["hardware"] != "h100-sxm"]
    assert len(held) >= 10 and held["in_sample_pct"].abs().mean() <= 15.0


def test_server_tokens_within_the_issue_tolerance(report):
    """Server sustained tokens/s per GPU: mean |error| <= 15 % (measured 6.4 %, 2026-11-27)."""
    m = mlperf.scenario_means(report)
    assert m["server_tokens_pct"] <= 15.0
    server = report[report["scenario"] == "Server"]
    kept, over = server[~server["in_sample_overloaded"]], server[server["in_sample_overloaded"]]
    assert kept["in_sample_ttft_pct"].notna().all() and kept["in_sample_tpot_pct"].notna().all()
    # Only where the modelled capacity falls short of what the submission sustained (2026-11-27: the
    # two H200-SXM-141GB-CTS runs, a custom-cooled H200 priced as the plain one, and Supermicro's
    # H100 run at 82.24 requests/s, the highest H100 rate submitted) are the p99s absent.
    assert over["in_sample_tpot_pct"].isna().all() and len(over) <= 3 and (over["in_sample_pct"] < 0).all()
    assert m["server_overloaded_in_sample_runs"] == len(over)


def test_an_overloaded_replica_has_no_p99_to_compare(rows):
    """At three times a run's target QPS the simulated replica's queue grows for the whole
    (600-2,400 s) run: flagged, its p99s NaN rather than a figure that only grows with the run."""
    kept, _ = rows
    one = kept[(kept["scenario"] == "Server") & (kept["hardware"] == "h100-sxm")].head(1).copy()
    normal = mlperf.predict_rows(one, cross=False)
    one["target_qps"] *= 3.0
    heavy = mlperf.predict_rows(one, cross=False)
    assert not normal["in_sample_overloaded"].iloc[0] and normal["in_sample_ttft_ms"].notna().all()
    assert heavy["in_sample_overloaded"].iloc[0]
    assert heavy[["in_sample_ttft_ms", "in_sample_tpot_ms"]].isna().all(axis=None)
    # the sustained rate found does not depend on the target
    assert heavy["in_sample_tokens_per_s"].iloc[0] == normal["in_sample_tokens_per_s"].iloc[0]


@pytest.mark.xfail(strict=True, reason=f"issue 29 target: p99 TTFT and TPOT at the target QPS within 25 %; "
                                       f"{P99['ttft']} / {P99['tpot']} % on 2026-11-27 under MAX_UTILIZATION "
                                       "over MLPerf's run length "
                                       "(the simulated mean iteration at Server load is ~0.6x the measured; "
                                       "no load-monotone predictor beats 20.7 / 5.4 % on these runs; the p99s' "
                                       "elasticity to the rate there is a median ~4, up to ~44 for Mixtral's TTFT)")
def test_server_p99_target(report):
    m = mlperf.scenario_means(report)
    assert m["ttft_p99_pct"] <= 25.0 and m["tpot_p99_pct"] <= 25.0


def test_server_p99_regression_guard(report):
    m = mlperf.scenario_means(report)
    assert m["ttft_p99_pct"] <= P99["ttft"] + 0.1 and m["tpot_p99_pct"] <= P99["tpot"] + 0.1


def test_p99s_at_the_own_server_rate_hold_no_measured_qps(rows):
    """The own-rate p99s are the simulated Server result's own: every Server run has them (the
    simulated system is never past its own rate), they do not move with the submitted QPS, and a
    tighter TPOT bound lowers the rate and with it the p99 TPOT there, to about the bound."""
    kept, _ = rows
    one = kept[(kept["scenario"] == "Server") & (kept["hardware"] == "h100-sxm")
               & (kept["model"] == "llama2-70b")].head(1).copy()
    normal = mlperf.predict_rows(one, cross=False)
    one["target_qps"] *= 3.0
    heavy = mlperf.predict_rows(one, cross=False)
    cols = ["in_sample_ttft_own_ms", "in_sample_tpot_own_ms"]
    assert normal[cols].notna().all(axis=None)
    assert heavy["in_sample_overloaded"].iloc[0] and heavy["in_sample_tpot_ms"].isna().all()
    assert (heavy[cols].to_numpy() == normal[cols].to_numpy()).all()
    tight = one.assign(target_qps=one["target_qps"] / 3.0, tpot_bound_ms=0.6 * normal["in_sample_tpot_own_ms"])
    bound = float(tight["tpot_bound_ms"].iloc[0])
    tighter = mlperf.predict_rows(tight, cross=False)
    assert tighter["in_sample_tokens_per_s"].iloc[0] < normal["in_sample_tokens_per_s"].iloc[0]
    # about the bound: the rate is searched over 3,000-request runs from an empty engine, the p99
    # taken over the run's minimum duration (~12,000 requests here), whose ramp is a smaller share
    # (2026-11-27: 91.7 ms at a 86.7 ms bound; searching over the whole duration too costs 5x the
    # time for 0.2 points of the own-rate figures and moves Server tokens/s 6.40 -> 6.55 %; 106.4 ms
    # at a 96.5 ms bound since the one-GPU KV pool and the refit of session 41: loosened 1.10 -> 1.12)
    assert float(tighter["in_sample_tpot_own_ms"].iloc[0]) <= 1.12 * bound


def test_server_p99_at_the_own_rate_regression_guard(report):
    m = mlperf.scenario_means(report)
    server = report[report["scenario"] == "Server"]
    assert server[["in_sample_ttft_own_pct", "in_sample_tpot_own_pct"]].notna().all(axis=None)
    assert m["ttft_p99_own_pct"] <= P99_OWN["ttft"] + 0.1 and m["tpot_p99_own_pct"] <= P99_OWN["tpot"] + 0.1


def test_p99s_are_loadgens_nearest_rank_not_interpolated():
    """LoadGen reports ``sorted[floor(count x 0.99)]`` (loadgen/results.cc), no interpolation."""
    x = list(range(100, 0, -1))  # 1..100 in any order
    assert mlperf.loadgen_percentile(x, 99.0) == 100.0  # numpy's linear rule would give 99.01
    assert mlperf.loadgen_percentile(range(1, 201), 99.0) == 199.0
    assert mlperf.loadgen_percentile([7.0], 99.0) == 7.0


def test_p99_at_the_submitted_rate_is_ill_conditioned(rows):
    """Why the p99s at the submitted QPS miss by more than the tokens/s: near capacity a queue's
    p99 grows like 1 / (1 - load), so a small rate (or capacity) error is a large p99 error. On
    NVIDIA's H200 Llama-2-70B Server run (12.63 requests/s per replica) 2 % more requests/s
    lengthen the simulated p99 TPOT by > 10 % (elasticity ~9: benchmarks/bench_issue29_p99_rows.py),
    so its -44 % TPOT miss is what a ~6 % capacity error alone would give."""
    kept, _ = rows
    run = kept[(kept["submitter"] == "NVIDIA") & (kept["hardware"] == "h200") & (kept["model"] == "llama2-70b")
               & (kept["scenario"] == "Server") & (kept["replicas"] == 8) & (kept["max_batch"] == 896)
               & (kept["target_qps"] == 101.0)].iloc[0]
    wl = load_workload("mlperf-llama2-70b")
    cost, sched = mlperf.harness_replica(io.load_model("llama2-70b"), io.load_hardware("h200"),
                                         efficiency_for("tensorrt-llm"), wl, 1, 1, 896, 4096,
                                         kv_fraction=run["kv_fraction"])
    rate = run["target_qps"] / run["replicas"]
    tpot = [mlperf.loadgen_percentile(run_workload(cost, sched, wl, r, 20000).tpot, 99.0) for r in (rate, 1.02 * rate)]
    assert tpot[1] > 1.10 * tpot[0]


def test_summary_groups_per_round_gpu_benchmark_scenario(report):
    table = mlperf.summary(report)
    assert list(table.columns[:4]) == ["round", "hardware", "model", "scenario"]
    assert table["runs"].sum() == len(report)
    offline, server = table[table["scenario"] == "Offline"], table[table["scenario"] == "Server"]
    assert offline["ttft_p99_pct"].isna().all() and offline["latency_p99_pct"].isna().all()  # no p99s offline
    assert server["tpot_p99_pct"].notna().all() and server["latency_p99_pct"].notna().all()
    assert table["lomo_pct"].isna().all()  # this report has no LOMO refits: NaN, not a copy of in sample


def test_mean_iteration_time_not_only_the_tail_is_short(report):
    """The p99 misses come from the mean iteration time at Server load, not from the tail's shape:
    the p99 end-to-end latency (a ~1,000-token answer, i.e. ~1,000 iterations) is short by about
    as much as the p99 TPOT (RESULTS.md, 2026-11-26; a regression bound, not the issue's target)."""
    server = report[(report["scenario"] == "Server") & ~report["in_sample_overloaded"]]
    e2e, tpot = server["in_sample_latency_pct"], server["in_sample_tpot_pct"]
    assert (e2e < 0).mean() > 0.9 and abs(e2e.mean() - tpot.mean()) < 15.0


def test_validate_inference_prints_mlperf_in_80_columns(capsys, monkeypatch, held_out, report, rows):
    from autoparallel.serve import validate
    monkeypatch.setattr(validate, "held_out_report", lambda runs=None, cross=True: held_out)
    monkeypatch.setattr(validate, "mlperf_report", lambda cross=True: (report, rows[1]))
    monkeypatch.setattr(validate, "held_out_mlperf_reports", lambda: [])  # test_serve_mlperf_v51.py, _amd.py
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["validate", "--inference"]) == 0
    out = capsys.readouterr().out
    start = out.index("MLPerf Inference, simulated")
    table = [line for line in out[start:].splitlines() if line.strip().startswith("v4.1")]
    assert table and max(len(line) for line in table) <= 80
    assert "MLPerf mean |error| of tokens/s per GPU: Offline" in " ".join(out.split())
    assert cli.main(["validate", "--inference", "--json"]) == 0
    ml = json.loads(capsys.readouterr().out)["mlperf"]
    assert {"offline_tokens_pct", "server_tokens_pct", "ttft_p99_pct", "tpot_p99_pct", "latency_p99_pct"} <= set(ml)
    assert len(ml["rows"]) == len(report)  # every run, with its layout, measurement and errors
    one = next(r for r in ml["rows"] if r["scenario"] == "Server")
    assert {"round", "hardware", "model", "tp", "replicas", "target_qps", "tpot_p99_ms", "in_sample_tpot_ms",
            "in_sample_tpot_pct", "in_sample_latency_pct"} <= set(one)
    assert one["in_sample_tpot_pct"] == pytest.approx(
        100 * (one["in_sample_tpot_ms"] - one["tpot_p99_ms"]) / one["tpot_p99_ms"])
    groups = ml["by_round_gpu_benchmark_scenario"]
    assert {"tokens_pct", "lomo_pct", "ttft_p99_lomo_pct", "tpot_p99_lomo_pct", "latency_p99_pct"} <= set(groups[0])
    assert ml["not_predicted"]["GPU without a preset"] > 0


def test_validate_inference_breaks_its_prose_between_phrases_at_80_columns(capsys, monkeypatch, held_out, report,
                                                                            rows):
    """At 80 columns `validate --inference` left "(LOMO)" alone under its title, split "(in sample," /
    "LOMO)", printed "Server 6.5" / "% (LOMO 7.7 %)" (a figure and its unit on two lines) and named two
    dropped columns "LOMO, LOMO": titles and paragraphs now break between phrases only."""
    import re

    from autoparallel.serve import validate
    monkeypatch.setattr(validate, "held_out_report", lambda runs=None, cross=True: held_out)
    monkeypatch.setattr(validate, "mlperf_report", lambda cross=True: (report, rows[1]))
    monkeypatch.setattr(validate, "held_out_mlperf_reports", lambda: [])  # test_serve_mlperf_v51.py, _amd.py
    from autoparallel.cli.common import console
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(console, "width", 80)  # the CLI's console, as an 80-column terminal sizes it
    assert cli.main(["validate", "--inference"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and "(LOMO)" not in [line.strip() for line in lines]
    for line, after in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", line.rstrip()) and after.lstrip().startswith("%")), (line, after)
        assert line.count("(") == line.count(")") or not line.startswith(("MLPerf Inference", "serving cost")), line
    assert "LOMO, LOMO" not in "\n".join(lines)
    assert "mean |error| % in sample and leave-one-model-out (LOMO)" in lines


def test_no_mlperf_skips_it(capsys, monkeypatch, held_out):
    from autoparallel.serve import validate
    monkeypatch.setattr(validate, "held_out_report", lambda runs=None, cross=True: held_out)
    monkeypatch.setattr(validate, "mlperf_report", lambda cross=True: pytest.fail("simulated anyway"))
    monkeypatch.setattr(validate, "held_out_mlperf_reports", lambda: pytest.fail("simulated anyway"))
    assert cli.main(["validate", "--inference", "--no-mlperf", "--json"]) == 0
    assert "mlperf" not in json.loads(capsys.readouterr().out)


def _nvidia_replica(kept, system, model, scenario):
    """NVIDIA's run of ``system`` (v4.1), its simulated replica and the benchmark's workload."""
    run = kept[(kept["submitter"] == "NVIDIA") & (kept["system"] == system) & (kept["model"] == model)
               & (kept["scenario"] == scenario)].iloc[0]
    hardware = run["hardware"]
    wl = load_workload(mlperf.settings()["workloads"][model])
    cost, sched = mlperf.harness_replica(io.load_model(model), io.load_hardware(hardware),
                                         efficiency_for("tensorrt-llm"), wl, int(run["tp"]), int(run["pp"]),
                                         int(run["max_batch"]), int(run["max_num_tokens"]),
                                         run["weight_precision"], run["kv_precision"], run["kv_fraction"])
    return run, cost, sched, wl


def test_h200_offline_at_the_submitted_batch_does_not_pause(rows):
    """NVIDIA ran its H200 Llama-2-70B Offline engine at max batch 806 (Server 896), which a pausing
    engine would not reward. With the assumed output sigma 0.8 the simulated replica paused 0.68
    times per request there (its long-answer tail held too much KV); with the spread LoadGen's
    latency percentiles give (0.57, search_spaces/workloads.yaml) it does not (0.01), and at the
    Server's 896 it still does (the pool binds past ~810 requests of ~555 tokens)."""
    import dataclasses
    kept, _ = rows
    run, cost, sched, wl = _nvidia_replica(kept, "H200-SXM-141GBx8_TRT", "llama2-70b", "Offline")
    assert int(run["max_batch"]) == 806
    n = 20_000
    assert run_workload(cost, sched, wl, None, n).preemptions / n < 0.1
    wide = dataclasses.replace(wl, output=dataclasses.replace(wl.output, sigma=0.8))
    assert run_workload(cost, sched, wide, None, n).preemptions / n > 0.2  # 0.26 (> 0.3 with the 4 GiB reserve, s40h5)


def test_the_server_miss_is_the_service_level_not_the_queueing(rows):
    """LoadGen's summary of NVIDIA's DGX-H100 llama2-70b-99.9 Server run (75 QPS, 4 replicas) gives
    the mean TTFT 275.9 ms and mean TPOT 155.0 ms: the mean TTFT is 1.78 mean decode iterations.
    Simulated at the same rate the mean TTFT is the same number of (simulated) iterations, within
    15 %: the queueing is right. The iteration itself is short (simulated mean TPOT < 0.7 x the
    measured): the p99 misses are the service level at that load (benchmarks/bench_issue29_p99_rows.py
    --shape prints six such runs)."""
    import math

    import numpy as np
    kept, _ = rows
    run, cost, sched, wl = _nvidia_replica(kept, "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b", "Server")
    assert run["target_qps"] == 75.0
    rate = run["target_qps"] / run["replicas"]
    sim = run_workload(cost, sched, wl, rate, math.ceil(rate * run["min_duration_ms"] / 1e3))
    ttft, tpot = float(np.mean(sim.ttft)), float(np.mean(sim.tpot))
    assert ttft / tpot == pytest.approx(275.9 / 155.0, rel=0.15)
    assert tpot < 0.7 * 0.1550


@pytest.mark.parametrize("submitter, system, qps, mean_latency_s", [
    ("HPE", "HPE_Cray_XD670_H100_SXM_80GBx8_TRT", 80.0, 36.92),
    ("NVIDIA", "H200-SXM-141GBx8_TRT", 101.0, 35.85)])
def test_at_the_measured_concurrency_the_throughput_is_within_6_percent(rows, submitter, system, qps, mean_latency_s):
    """The engine's cost at the measured operating point is right; where it sits is not. LoadGen's
    summaries give the mean latency, so Little's law gives the requests in flight per replica
    (HPE's H100 TP2 x4 run: 738; NVIDIA's H200 TP1 x8: 453). The simulated replica holding that many
    (an all-at-once run capped there) makes within 6 % of the measured Server tokens/s (2026-11-27:
    +0.3 % and +4.7 %), but at the submitted rate NVIDIA's H200 replica settles at fewer than 0.6 x
    the measured requests in flight (222): between ~200 requests and the max batch the throughput
    is nearly flat in the batch, so a few % of throughput moves the operating point, and the
    iteration time and TPOT with it, by ~2 x (benchmarks/bench_issue29_p99_rows.py --shape)."""
    import math

    import numpy as np
    kept, _ = rows
    run = kept[(kept["submitter"] == submitter) & (kept["system"] == system) & (kept["scenario"] == "Server")
               & (kept["target_qps"] == qps)].iloc[0]
    rate = qps / run["replicas"]
    in_flight = rate * mean_latency_s
    wl = load_workload(mlperf.settings()["workloads"][run["model"]])

    def sim(max_batch):
        return mlperf.harness_replica(io.load_model(run["model"]), io.load_hardware(run["hardware"]),
                                      efficiency_for("tensorrt-llm"), wl, int(run["tp"]), int(run["pp"]), max_batch,
                                      int(run["max_num_tokens"]), run["weight_precision"], run["kv_precision"],
                                      run["kv_fraction"])
    cost, sched = sim(round(in_flight))
    at_n = run_workload(cost, sched, wl, None, 20_000).steady_requests_per_s * wl.mean_output
    assert at_n == pytest.approx(rate * wl.mean_output, rel=0.06)
    if submitter == "NVIDIA":
        cost, sched = sim(int(run["max_batch"]))
        poisson = run_workload(cost, sched, wl, rate, math.ceil(rate * run["min_duration_ms"] / 1e3))
        assert rate * float(np.mean(poisson.finish - poisson.arrival)) < 0.6 * in_flight


def test_at_the_measured_concurrency_the_tpot_distribution_is_loadgens(rows):
    """The p99 TPOT miss at the submitted QPS is where the simulated replica operates, not what its
    iteration costs there. NVIDIA's DGX-H100 llama2-70b Server run (75 QPS over 4 TP2 replicas;
    LoadGen's summary: mean latency 44.95 s, so 843 requests in flight per replica; TPOT p50 156.4,
    p99 175.4 ms): at the submitted rate the simulated replica holds ~500 and its p99 TPOT is 107 ms
    (-39 %). Driven to hold the measured 843 (a rate ~10 % above the submitted one: its capacity at
    mid batch is that much above the engine's) its TPOT p50 and p99 are within 10 % of LoadGen's
    (2026-11-27: 151 / 170 ms): the per-iteration cost at the measured batch is right, so a
    per-iteration cost growing with the batch (host work, attention) would put it off."""
    import numpy as np
    kept, _ = rows
    run, cost, sched, wl = _nvidia_replica(kept, "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b", "Server")
    rate = run["target_qps"] / run["replicas"]
    matched, sim = mlperf.rate_at_concurrency(cost, sched, wl, rate, rate * 44.95)
    assert matched > 1.05 * rate
    p = lambda q: 1e3 * mlperf.loadgen_percentile(sim.tpot, q)  # noqa: E731
    assert p(50) == pytest.approx(156.4, rel=0.10)
    assert p(99) == pytest.approx(175.4, rel=0.10)
    assert 1e3 * float(np.mean(sim.tpot)) == pytest.approx(155.0, rel=0.10)


def test_a_pool_with_1_gib_beside_the_weights_holds_loadgens_mixtral_requests(rows):
    """Why the strict xfail below hangs on the memory beside the weights. TensorRT-LLM sizes its
    paged KV pool as ``kv_cache_free_gpu_mem_fraction`` of the memory cudaMemGetInfo reports free
    once the engine (weights and TensorRT's activation memory), its runtime buffers and decoder
    exist (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp:
    ``BaseKVCacheManager::calculateFreeMemBytes`` after ``createRuntimeContexts`` /
    ``createBuffers`` / ``createDecoder``; docs/source/reference/memory.md), as
    ``costmodel.inflight.kv_pool`` does.
    At the mean input fitted with the MoE plugin's permute and top-k sum and the gated activation
    priced and the one-GPU pool sized as TensorRT-LLM's log shows (621 tokens, session 41; 615 in
    session 40 under the 4 GiB reserve; 653 in session 39 with the permute and sum alone;
    ``costmodel.inference.moe_plugin_bytes``, ``gated_activation_bytes``) a pool at NVIDIA's fraction 0.9 holds the
    0.97 x 653 requests LoadGen's mean latency puts in flight if 1 GiB or less of activations, CUDA
    context and runtime buffers sit beside the FP8 weights; the simulated pool (2.5 GiB of
    activations for 16,384 tokens and 1.32 GiB the driver and the CUDA context hold, as TensorRT-LLM's
    documented H100 log has them; costmodel.inflight.CONTEXT_GIB) holds ~614 of the 634 (~590 at
    input 653 and ~540 with the 4 GiB training reserve, session 40). At the input fitted before (667) not even a pool with
    nothing but the weights beside it held all 653 (s38h5)."""
    import dataclasses

    import numpy as np
    from autoparallel.costmodel.inference import layout
    kept, _ = rows
    run, cost, sched, wl = _nvidia_replica(kept, "DGX-H100_H100-SXM-80GBx8_TRT", "mixtral-8x7b", "Server")
    need = 0.97 * run["target_qps"] / run["replicas"] * 15.02
    hw = io.load_hardware(run["hardware"])
    lay = layout(io.load_model("mixtral-8x7b"), hw, efficiency_for("tensorrt-llm"), 1.0, 1.0,
                 run["weight_precision"], run["kv_precision"])
    kv_token, weights = float(np.ravel(lay.kv_bytes_per_token())[0]), float(np.ravel(lay.weights())[0])
    gib = 2.0 ** 30

    def holds(beside_gib, mean_input):
        pool = run["kv_fraction"] * (hw.memory_gib * gib - weights - beside_gib * gib)
        w = dataclasses.replace(wl, input=dataclasses.replace(wl.input, mean=float(mean_input)))
        return pool / kv_token / mlperf.tokens_held_per_request(w, sched.block)

    assert run["kv_fraction"] == pytest.approx(0.9)
    assert wl.input.mean == pytest.approx(621, abs=10)
    assert holds(1.0, wl.input.mean) >= need
    assert holds(0.0, 667) < need / 0.97
    simulated = sched.kv_blocks * sched.block * kv_token
    assert simulated / kv_token / mlperf.tokens_held_per_request(wl, sched.block) < need


@pytest.mark.xfail(strict=True, reason=(
    "the simulated H100 Mixtral KV pool holds ~614 requests of the workload (mean input 621, "
    "fitted on the Offline runs) but LoadGen's mean latency puts 653 in flight on NVIDIA's run "
    "(692 on Supermicro's): the pool's 2.5 GiB of activations (16,384 tokens) and the 1.32 GiB the "
    "driver and CUDA context hold (TensorRT-LLM's documented log; 4 GiB before session 40) beside "
    "the weights are too much; a pool with 1 GiB or less beside them holds 0.97 of them "
    "(test_a_pool_with_1_gib_beside_the_weights_holds_loadgens_mixtral_requests; "
    "RESULTS 2026-11-27, s38h2 / s38h5 and s39h2)"))
def test_the_simulated_pool_holds_the_requests_loadgen_measured_in_flight(rows):
    """Little's law on LoadGen's summary (NVIDIA DGX-H100 mixtral-8x7b Server: 348 QPS over 8 TP1
    replicas, mean latency 15.02 s) gives 653 requests in flight per replica; under MAX_UTILIZATION
    an engine holds at most what its KV pool fits. The simulated pool over the time-averaged KV of an
    in-flight request (prompt + half its answer, whole blocks, weighted by the answer's length)
    must hold them."""
    kept, _ = rows
    run, cost, sched, wl = _nvidia_replica(kept, "DGX-H100_H100-SXM-80GBx8_TRT", "mixtral-8x7b", "Server")
    in_flight = run["target_qps"] / run["replicas"] * 15.02
    assert sched.kv_blocks * sched.block / mlperf.tokens_held_per_request(wl, sched.block) >= 0.97 * in_flight


def test_pipeline_parallel_speedup_is_nvidias_published_one_point_two():
    """NVIDIA's own TensorRT-LLM PP measurement on this benchmark (mlperf.PP_SPEEDUP: "pipeline
    parallelism enabled a 1.2x speedup ... on HGX H100 compared to our results published in August"):
    the layout its next round configures (TP1 PP2 b1024 t1024, KV 0.95) over the August one (TP2
    b896 t4096, KV 0.90) is simulated within 1.2 as rounded to one decimal, Offline and Server
    (RESULTS.md, session 38 s38h3: 1.22 / 1.23). Pricing the TP all-reduce cheaper, or PP dearer,
    until the submitted TP2 tied with the search's PP2 (issue 29's band) would take it below 1.15."""
    r = mlperf.pp_speedup()
    assert r["published"] == 1.2
    for scenario in ("offline", "server"):
        assert 1.15 <= r[f"{scenario}_speedup"] < 1.25, (scenario, r)
    # the August layout itself is priced as measured (v4.1 H100 TP2 Offline, 30 runs, median 3,017 tok/s/GPU)
    assert r["before_offline"] == pytest.approx(3017, rel=0.05)


def test_pp_beats_the_submitted_tp_and_more_with_a_pool_that_does_not_pause():
    """RESULTS.md, session 38 (s38h3): what the search's TP1 PP2 b512 t512 gains over the submitted
    H100 TP2 b896 t4096 is two terms. PP drops the TP all-reduce: TP1 PP2 at the submitted b896 t4096
    is already faster than TP2. But TensorRT-LLM admits up to max batch x micro-batches requests
    (trtGptModelInflightBatching.cpp: CapacityScheduler(getMaxBatchSize() * mNumMicroBatches, ...))
    into one shared KV pool, and under MAX_UTILIZATION the overflow is paused and recomputed: PP2 at
    b896 (1,792 admitted) pauses most requests; at b512 t512 (NVIDIA's next round: b1024 t1024, KV
    0.95) it pauses none and gains more. TP2 itself prefers the large budget (its all-reduce floor
    is paid per iteration)."""
    wl = load_workload(mlperf.settings()["workloads"]["llama2-70b"])
    spec, hw, eff = io.load_model("llama2-70b"), io.load_hardware("h100-sxm"), efficiency_for("tensorrt-llm")
    n = 6144
    runs = {}
    for tp, pp, b, t in ((2, 1, 896, 4096), (1, 2, 896, 4096), (1, 2, 512, 512), (2, 1, 896, 512)):
        cost, sched = mlperf.harness_replica(spec, hw, eff, wl, tp, pp, b, t)
        r = run_workload(cost, sched, wl, None, n)
        runs[(tp, pp, b, t)] = (r.output_tokens_per_s / (tp * pp), r.preemptions)
    submitted, pp_same, pp_small = runs[(2, 1, 896, 4096)], runs[(1, 2, 896, 4096)], runs[(1, 2, 512, 512)]
    assert submitted[1] == 0
    assert pp_same[0] > submitted[0] and pp_same[1] > 0.5 * n
    assert pp_small[0] > 1.03 * pp_same[0] and pp_small[0] > 1.1 * submitted[0] and pp_small[1] == 0
    assert runs[(2, 1, 896, 512)][0] < submitted[0]


def test_the_gap_to_the_pp_best_is_the_tp_all_reduce():
    """RESULTS.md, session 43 (s43h2): the two submitted layouts furthest from the search's best
    (L40S TP4 b1024 t4096 at ~half of TP1 PP4 b512 t512; H100 TP2 b896 t4096 at ~86 % of TP1 PP2 b512
    t512) are behind by their TP all-reduce alone: with it free each is at least as fast per GPU as
    the PP best, and the pipeline's hand-offs cost the PP best < 1 %. PP is priced as its stages'
    share of TP1's per-layer cost plus the hand-off, the submitted TP as its measured rows (L40S
    within 2 %): the gap is the PCIe (L40S) or NVLink (H100) all-reduce TensorRT-LLM's PP does not
    run, not a PP price. (The L40S TP1 rows of
    serving_runs.csv, TensorRT-LLM 0.12, GPT-J-6B and Llama-2-7B: within 6 %; its L40S TP2-TP8
    70B rows are over-predicted by 18-98 %: TP on PCIe is if anything dearer than priced.)"""
    rows = {r["hardware"]: r for r in mlperf.pp_gap(6144)}
    l40s, h100 = rows["l40s"], rows["h100-sxm"]
    assert l40s["share"] < 0.55 and 0.8 < h100["share"] < 0.9
    for r in rows.values():
        assert r["share_free_allreduce"] > 1.0
        assert r["best_free_p2p_tps"] / r["best_tps"] < 1.01
