"""The cost model against published measurements (both runs files, dense and MoE rows apart).

Dense tolerances from issue 11: in-sample mean |error| <= 6 %, no row worse than 15 %;
leave-one-model-out (each model's rows predicted by constants refitted without them) mean <= 10 %,
max <= 25 %. MoE (issue 22): leave-one-model-out mean <= 15 %, in-sample <= 10 %, no row worse than
35 %, DeepSeek-V3's own run within 15 %: all missed today, held as strict expected failures with
today's figures in the reason (meeting one turns the suite red until the test is updated), beside
regression bounds at the figures reached. Every published layout, dense or MoE, predicted to fit.
"""

import pytest

from autoparallel import validate

MLPERF_MEAN, MLPERF_MAX = 6.0, 12.0  # issue 23's targets
MLPERF_MAX_REACHED = 13.6  # 2026-11-26, since the parameter all-gather runs one bucket ahead (was 17.7)
# Issue 27, MLPerf's Llama-2-70B LoRA rows: reached in sample and held out (the target: mean <= 10 %).
LORA_MEAN, LORA_HELDOUT_MEAN, LORA_MAX = 5.1, 5.3, 29.3  # 2026-11-26 (log-corrected rows): 5.0, 5.2, 29.2
LORA_BY_SYSTEM_MEAN = 9.5  # held out by system (GPU and node-count family), 2026-11-26: 9.4
NEMOFT_MEAN, NEMOFT_HELDOUT_MEAN = 16.4, 16.6  # NeMo 24.07's SFT / LoRA table, 2026-11-26: 16.3, 16.5


@pytest.fixture(scope="module")
def full_report():
    return validate.validate_training()


@pytest.fixture(scope="module")
def report(full_report):
    return full_report[full_report.kind == "dense"]


@pytest.fixture(scope="module")
def moe_report(full_report):
    return full_report[full_report.kind == "moe"]


def test_every_dense_row_of_both_files_is_predicted(report):
    assert len(report) == 51
    assert {"narayanan21", "korthikanti22", "nemo 24.07", "nemo 25.11"} <= set(report.source)
    assert {"a100-sxm-80g", "h100-sxm", "b200", "gb200", "gb300"} == set(report.gpu)


def test_in_sample_error(report):
    assert report.error_pct.abs().mean() <= 6.0
    worst = report.loc[report.error_pct.abs().idxmax()]
    assert abs(worst.error_pct) <= 15.0, f"{worst.id}: {worst.error_pct:+.1f} %"


def test_leave_one_model_out_error(report):
    assert report.heldout_error_pct.abs().mean() <= 10.0
    worst = report.loc[report.heldout_error_pct.abs().idxmax()]
    assert abs(worst.heldout_error_pct) <= 25.0, f"{worst.id}: {worst.heldout_error_pct:+.1f} %"


def test_every_published_layout_fits(report):
    assert report.fits.all(), list(report.id[~report.fits])


@pytest.fixture(scope="module")
def mlperf_report(full_report):
    return full_report[full_report.kind == "mlperf"]


def test_every_mlperf_gpt3_submission_is_predicted_to_fit(mlperf_report):
    """Issue 23: the 22 MLPerf Training GPT-3 175B submissions, every knob pinned as submitted
    (LAYER_CUDA_GRAPH rows with their graphs' static buffers), trained to the target: each fits."""
    assert len(mlperf_report) == 22 and set(mlperf_report.gpu) == {"h100-sxm", "b200"}
    assert mlperf_report.fits.all(), list(mlperf_report.id[~mlperf_report.fits])
    assert (mlperf_report.recompute == "none").all() and (mlperf_report.tp_comm_overlap).all()


def test_mlperf_mean_error_meets_the_issue_target(mlperf_report):
    """Issue 23: mean |error| <= 6 % (5.4 % on 2026-11-26); no constant is fitted on these rows."""
    assert mlperf_report.error_pct.abs().mean() <= MLPERF_MEAN
    assert mlperf_report.error_pct.abs().max() <= MLPERF_MAX_REACHED  # regression guard


@pytest.mark.xfail(strict=True, reason="issue 23 target: no MLPerf GPT-3 row worse than 12 %; 13.5 % "
                   "(v3.0 CoreWeave n448, an older release) on 2026-11-26")
def test_mlperf_worst_row_meets_the_issue_target(mlperf_report):
    assert mlperf_report.error_pct.abs().max() <= MLPERF_MAX


def test_mlperf_rows_are_never_fitted(full_report, report):
    """They are predicted with the shipped constants and, held out, with constants refitted on the
    calibration rows only: the dense figures are those of the calibration rows alone."""
    from autoparallel.measured_runs import default_runs
    alone = validate.validate_training(default_runs(), cross=False)
    dense = alone[alone.kind == "dense"].set_index("id").error_pct
    assert (report.set_index("id").error_pct.loc[dense.index] == dense).all()


def test_summary_reports_sources_and_gpus_with_held_out_errors(full_report):
    s = validate.summary(full_report)
    assert list(s.by.unique()) == ["kind", "source", "gpu", "system"]
    assert set(s[s.by == "kind"].group) == {"dense", "moe", "mlperf", "lora", "sft"}
    assert {"heldout_mean_abs_error_pct", "heldout_max_abs_error_pct"} <= set(s.columns)
    assert (s.heldout_mean_abs_error_pct >= 0).all()


def test_held_out_rows_do_not_see_their_own_model(report):
    """A refit without the model changes its prediction: the held-out figure is not in-sample."""
    nemo = report[report.source.str.startswith("nemo")]
    assert (nemo.heldout_predicted != nemo.predicted).all()


# DeepSeek-V3's own run is priced with Megatron's interleaved schedule (vp 2, 120 micro-batches in
# groups of 20: 51 chunk-micro-batches held on the first stage), which holds more activations than
# its DualPipe did: 120 GiB predicted on an 80 GB H800. Listed so that a change that makes it fit,
# or makes another row not fit, is noticed.
KNOWN_NOT_FITTING = {"deepseek-v3-report-h800-2048gpu-fp8-blockwise-tp1pp16cp1vp2ep64-gbs15360"}


def test_every_moe_row_is_predicted_and_its_published_layout_fits(moe_report):
    assert len(moe_report) == 19
    for name in ("deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b", "mixtral-8x22b"):
        assert moe_report.id.str.contains(name).any(), name
    assert set(moe_report.id[~moe_report.fits]) == KNOWN_NOT_FITTING


def test_moe_errors_do_not_regress(moe_report):
    # Figures reached (RESULTS.md, issues 22 and 23): in-sample 18.0 %, held out 20.3 % (19.5 % until
    # issue 23 gave GB300 its 4-GPU trays: Qwen3-30B-A3B's EP 8 on 8 GB300 now spans two trays, and
    # the fold that holds GPT-OSS out refits to other MoE constants; 20.24 % since the parameter
    # all-gather runs one bucket ahead, issue 23 item 5).
    assert moe_report.error_pct.abs().mean() <= 18.5
    assert moe_report.heldout_error_pct.abs().mean() <= 20.4


@pytest.mark.xfail(strict=True, reason="issue 22 target: MoE held-out mean <= 15 %; 20.3 % on 2026-11-25")
def test_moe_leave_one_model_out_target(moe_report):
    assert moe_report.heldout_error_pct.abs().mean() <= 15.0


@pytest.mark.xfail(strict=True, reason="issue 22 target: MoE in-sample mean <= 10 %; 18.0 % on 2026-11-25")
def test_moe_in_sample_target(moe_report):
    assert moe_report.error_pct.abs().mean() <= 10.0


@pytest.mark.xfail(strict=True, reason="issue 22 target: no MoE row worse than 35 %; GPT-OSS-120B on B200 "
                                       "+69.9 % in sample, +64.9 % held out on 2026-11-25")
def test_moe_worst_row_target(moe_report):
    assert moe_report.error_pct.abs().max() <= 35.0 and moe_report.heldout_error_pct.abs().max() <= 35.0


@pytest.mark.xfail(strict=True, reason="issue 22 target: DeepSeek-V3 on 2,048 H800 within 15 % of 1,543 "
                                       "tok/s/GPU and predicted to fit; -25.7 %, 119 GiB on 2026-11-25")
def test_deepseek_v3_own_run_target(moe_report):
    row = moe_report[moe_report.id.str.startswith("deepseek-v3-report")].iloc[0]
    assert abs(row.error_pct) <= 15.0 and row.fits


def test_moe_held_out_rows_do_not_see_their_own_model(moe_report):
    assert (moe_report.heldout_predicted != moe_report.predicted).all()


def test_the_shipped_tie_bands_are_what_validate_computes(full_report):
    """prediction_error.yaml holds today's held-out errors (`validate --tie-bands FILE` rewrites it)."""
    from autoparallel import io
    from autoparallel.resources import SEARCH_SPACES
    shipped = io.read_yaml(SEARCH_SPACES / "prediction_error.yaml")
    assert {k: shipped[k] for k in validate.tie_bands(full_report)} == validate.tie_bands(full_report)


def test_each_family_gets_its_own_tie_band():
    from autoparallel import io
    from autoparallel.report.tables import prediction_error
    error = prediction_error()
    h100, gb300, a100 = (io.load_hardware(g) for g in ("h100-sxm", "gb300", "a100-sxm-80g"))
    assert error.for_hardware(h100).step_time_relative_error == error.by_family["h100-sxm"]["dense"]
    assert error.for_hardware(gb300, moe=True).step_time_relative_error == error.by_family["b200"]["moe"]
    assert "b200 family" in error.for_hardware(gb300, moe=True).source
    # No MoE rows on A100: the pooled MoE band.
    assert error.for_hardware(a100, moe=True).step_time_relative_error == error.moe_step_time_relative_error
    # LoRA runs take their family's LoRA band (MLPerf's Llama-2-70B LoRA rows), else the dense one.
    assert error.for_hardware(h100, lora=True).step_time_relative_error == error.by_family["h100-sxm"]["lora"]
    assert error.for_hardware(a100, lora=True).step_time_relative_error == error.step_time_relative_error


@pytest.fixture(scope="module")
def lora_report(full_report):
    return full_report[(full_report.kind == "lora") & (full_report.source == "mlperflora")]


def test_every_mlperf_lora_submission_is_predicted_to_fit(lora_report):
    """Issue 27: the 66 MLPerf Training Llama-2-70B LoRA submissions (H100, H200; 4 to 1,024 GPUs),
    every knob pinned as submitted, LoRA rank 16 on QKV and projection, packed 8,192-token sequences,
    trained to the target: each fits (the TP1 CP2 H200 ones only with the frozen base in FP8)."""
    assert len(lora_report) == 66 and set(lora_report.gpu) == {"h100-sxm", "h200"}
    assert lora_report.fits.all(), list(lora_report.id[~lora_report.fits])
    assert (lora_report.source == "mlperflora").all() and (lora_report.metric == "iteration_time").all()


def test_mlperf_lora_error_is_no_worse_than_reached(lora_report):
    """In sample and with the constants refitted without the 70B model size (leave-one-model-out:
    the LoRA rows are never fitted, so no fold sees them); the bounds are the figures reached."""
    assert lora_report.error_pct.abs().mean() <= LORA_MEAN
    assert lora_report.heldout_error_pct.abs().mean() <= LORA_HELDOUT_MEAN
    assert lora_report.error_pct.abs().max() <= LORA_MAX
    assert (lora_report.heldout_predicted != lora_report.predicted).all()


def test_mlperf_lora_error_meets_the_target(lora_report):
    """Issue 27: mean |error| <= 10 %, in sample and held out."""
    assert lora_report.error_pct.abs().mean() <= 10.0 and lora_report.heldout_error_pct.abs().mean() <= 10.0


def test_mlperf_rows_are_held_out_by_system_too(full_report):
    """Issue 27: every validation-only row (MLPerf GPT-3 and LoRA, NeMo's fine-tuning table) is also
    predicted with its GPU family refitted without the published rows of its GPU at its node-count
    family; the other rows have no system."""
    mlperf = full_report.source.isin(["mlperf", "mlperflora", "nemoft"])
    assert full_report.heldout_system_error_pct[mlperf].notna().all()
    assert full_report.heldout_system_error_pct[~mlperf].isna().all() and full_report.system[~mlperf].isna().all()
    assert set(full_report.system[full_report.source == "mlperflora"]) == {
        "h100-sxm 1 node", "h100-sxm 2-8 nodes", "h100-sxm 9-64 nodes", "h100-sxm >64 nodes",
        "h200 1 node", "h200 2-8 nodes", "h200 9-64 nodes"}
    lora = full_report[full_report.source == "mlperflora"]
    assert lora.heldout_system_error_pct.abs().mean() <= LORA_BY_SYSTEM_MEAN
    s = validate.summary(full_report)
    assert {"heldout_system_mean_abs_error_pct", "heldout_system_max_abs_error_pct"} <= set(s.columns)


def test_a_system_fold_leaves_out_only_its_gpu_at_its_scale():
    rows = validate.all_runs()
    by_id = {p.id: p for p in rows}
    for family, left_out, predicted in validate._system_folds(rows):
        groups = {validate.system_group(by_id[i]) for i in predicted}
        assert all(validate.system_group(by_id[i]) in groups and not by_id[i].validation_only for i in left_out)
        assert all(by_id[i].validation_only and by_id[i].family == family for i in predicted)


@pytest.fixture(scope="module")
def nemo_finetune_report(full_report):
    return full_report[full_report.source == "nemoft"]


def test_nemos_finetuning_table_is_predicted_never_fitted(nemo_finetune_report, report):
    """Issue 27: NeMo 24.07's SFT and LoRA rows (Llama 2 7B / 13B / 70B on DGX-H100) join validate
    as kinds sft and lora; no fold fits them (the dense figures stay those of the calibration rows)."""
    assert sorted(nemo_finetune_report.kind.value_counts().items()) == [("lora", 3), ("sft", 3)]
    assert (nemo_finetune_report.metric == "tokens_per_s_per_gpu").all()
    assert nemo_finetune_report.error_pct.abs().mean() <= NEMOFT_MEAN
    assert nemo_finetune_report.heldout_error_pct.abs().mean() <= NEMOFT_HELDOUT_MEAN


@pytest.mark.xfail(strict=True, reason="every published layout fits: NeMo's Llama 2 70B SFT on 16 H100 (TP4 PP4 "
                                       "VP20, DP 1) is predicted at 86 GiB on 80 GB on 2026-11-26 (FP32 Adam "
                                       "states of 4.4B parameters a GPU, unsharded at DP 1)")
def test_every_nemo_finetuning_layout_fits(nemo_finetune_report):
    assert nemo_finetune_report.fits.all(), list(nemo_finetune_report.id[~nemo_finetune_report.fits])


@pytest.mark.xfail(strict=True, reason="issue 27 target: fine-tuning rows' mean |error| <= 10 %; NeMo's LoRA "
                                       "rows are 20-28 % slow in sample on 2026-11-26 (packed SQuAD documents "
                                       "priced as one 4,096-token document: length not published)")
def test_nemo_finetuning_rows_meet_the_target(nemo_finetune_report):
    assert nemo_finetune_report.error_pct.abs().mean() <= 10.0
