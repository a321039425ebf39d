"""The cost model against published measurements (both runs files, dense and MoE rows apart).

Each row is priced in the variant its source ran (validate's `variant`: the row, then its recipe,
then the source's defaults); a published layout fits only if it fits in that variant.

The issues' targets are held as targets. Dense (issue 11): in-sample mean |error| <= 6 %, no row
worse than 15 %; leave-one-model-out (each model's rows predicted by constants refitted without
them) mean <= 10 %, max <= 25 %. MoE (issue 22): held out <= 15 %, in sample <= 10 %, no row worse
than 35 %, DeepSeek-V3's own run within 15 %. MLPerf GPT-3 (issue 23): mean <= 6 % (met), max <= 12 %.
A target not met is a strict expected failure whose reason quotes today's figure (meeting it turns
the suite red until the test is updated); beside it a regression guard at today's figure (named so),
which is not a target. Every published layout predicted to fit as run; the ones that do not are
findings, each a strict expected failure of its own.
"""

import pytest

from autoparallel import validate

# Today's figures (`autoparallel validate`, rounded to 0.1), quoted by the expected failures'
# reasons and, plus the rounding, the regression guards' bounds: update them here, in one place,
# when the cost model moves.
TODAY = "2026-11-27"
FIGURES = {
    "dense_in_max": 13.0,    # nemo-llama3.1-405b-gb300 fp8-current; 13.4 before Blackwell ran at SMs x max clock (s38h4)
    "dense_in_mean": 3.4,
    "dense_held_mean": 4.8,
    # 8.8 / 10.5 before GPT-OSS's eager expert bias and quick-GEGLU clamp (helper h5-gptoss), the local
    # experts' GEMMs and TE calls (h6-experts) and GPT-OSS's BF16 router, MoE constants refitted;
    # 8.8 / 9.4 before the local experts' GEMMs shared the GPU over TE's 4 compute streams (s36h1).
    # 8.1 / 8.7 before the 1F1B all-to-all overlap's host floor (s37h3: moe_expert_call_s is the host's
    # time per call, the forward's waited for, both passes' under the overlap; refitted 37.8 -> 85.8 us):
    # in sample better, held out worse (Qwen3-30B held out refits 77 us: its B200 mbs 1 row +0.6 -> +16.9).
    # 7.2 / 9.1 before the forward's host calls after the dropless sync (s54h1, refitted 85.4 -> 70.9 us):
    # these 19 rows worse in sample (7.24 -> 8.25), level held out (9.09 -> 9.11); the 182 MoE rows of
    # every kind 13.52 / 13.81 -> 12.86 / 12.94.
    # 8.3 / 9.1 before the session-54 merge's refit (s54h1 + s54h3 RoPE + s54h4 attention + s54h2 CP merges,
    # dense and MoE refitted together): 8.75 / 9.56; the 182 MoE rows 12.49 / 12.58 (benchmarks/RESULTS.md,
    # session 54, lead).
    # 8.8 / 9.6 before moe_act's rerun of the routed activation kernel (s55h2, no refit): 8.75 / 9.56 ->
    # 8.90 / 9.74 (its rows with moe_act, H100 / GB200 GPT-OSS and DeepSeek-V3 GB300, were already slow);
    # the 182 MoE rows 12.49 / 12.58 -> 12.47 / 12.56 (benchmarks/RESULTS.md, session 55, s55h2).
    "moe_in_mean": 8.9,
    "moe_held_mean": 9.75,
    # GiB, the peak with the reserve: 79.5 before the E5M6 attention output (77.5) and the DualPipe
    # end rank's contiguous first stage (73.9: the middle rank, 76.2, is then the fullest); 78.3 at
    # the load imbalance refitted once TE's four compute streams were priced (0.2112 -> 0.2716, s36h1);
    # 78.42 with it refitted 0.2646 -> 0.2758 beside H100's measured attention (s54h4); 78.67 at 0.2828
    # (the session-54 merge's MoE refit)
    "deepseek": 78.7,
}
# Published layouts predicted not to fit in the variant their source ran (TODAY): findings, each
# held as a strict expected failure. The reason gives the peak with the 4 GiB reserve against the
# GPU's memory (the search's share is 1 since 2026-11-27: the reserve is the runtime's headroom,
# hand_set_constants.yaml reserve_gib); "fits the whole GPU" where the peak without the reserve
# is within the GPU's memory.
# None since 2026-11-27 (helper s36h3). The 16 rows listed before missed only the old 0.95 share
# (76 GiB of an 80 GB GPU, 165.3 of GB200's 174) on top of the reserve, and all fit now: NeMo's
# GPT-3 20B (TP2, MBS 2) 79.4 GiB and 175B (TP4 PP8 VP6) 76.7 on H100; the GB200 Llama 3 70B
# (Megatron-FSDP, offload 40: 167.0; 24.07's delayed scaling, MBS 1: 169.8) and Llama 3.1 405B
# (TP4 PP16 VP4: 168.0) rows of NeMo 25.xx and Megatron-Bridge 26.xx; DeepSeek-V3's own run 79.5,
# now 76.2 (a middle rank; the end rank 73.9) with the attention output in the report's E5M6 and
# DualPipe's first stage the model's first four layers (three dense), not the interleaved rank 0's.
NOT_FITTING_AS_RUN: dict[str, str] = {}


def _target(reason: str):
    return pytest.mark.xfail(strict=True, reason=f"{reason} on {TODAY}")


MLPERF_MEAN, MLPERF_MAX = 6.0, 12.0  # issue 23's targets
# 2026-11-26: 10.6 since FP8 delayed scaling's amax all-reduce over TP x DP is priced (v3.0's TE 0.8
# reduced every chunk's amaxes over it; 13.5 before, 17.7 before the parameter all-gather ran one
# bucket ahead).
# 10.0 (v4.1 Oracle 3072 H100) since the as-run refit of the dense constants with TP traffic as
# TransformerEngine overlaps it.
# 10.2 (the same row, -9.99 -> -10.19 %) with H100's attention at cuDNN's measured H200 kernel times (s54h4).
# 10.6 (the same row, -10.58 %) after h100-sxm's dense refit with the p2p CP ring's merge passes (s54h2;
# tp_overlap 0.387 -> 0.278: the CP rows of the fit now cost more without the TP traffic's help).
MLPERF_MAX_REACHED = 10.6
# Issue 27, MLPerf's Llama-2-70B LoRA rows: reached in sample and held out (the target: mean <= 10 %).
# Held out 5.5 % when the dense rows were priced in their best variant; 7.9 % since they are priced
# as run (issue 28 item 4): the refits without the 70B models land on other H100 constants.
# 2026-11-27: 7.1, 7.4, 39.4 (5.0, 7.2, 29.2 before the adapters were priced by the bytes they stream,
# with their own TP collectives and dropout: the old 0.8 %-of-peak adapter GEMMs had masked an
# under-priced rest, most on the short multi-node steps; Oracle's 64 x H200 row is the worst).
# 7.5, 7.7, 35.5 once merged with the as-run dense refit (TP traffic as TE overlaps it) and the memory
# fixes (2026-11-27).
# 6.8, 7.0, 35.5 with the H200 rows' FP8 SwiGLU-input store read from their logs and configs
# (mlperf_corrections.yaml: FP8_ACTIVATION on 24 H200 rows) and a column target's adapter taking TE's
# gathered norm output where userbuffers do not gather it (2026-11-27).
# 5.92, 6.44, 34.2 with the frozen FP8 base transposed for each micro-batch's dgrad, as MLPerf's
# TransformerEngine 1.x runs made it (session 36, s36h4).
# 5.85, 6.34, 34.2 with the FP8 attention and adapter all-to-all that NVIDIA's v4.0 / v4.1 configs
# set through their config_common.sh (mlperf_corrections.yaml) and v4.0's TE 1.6 running CP attention
# in BF16 (measured_runs.MLPERF_TE_RELEASE) (session 36, s36h7).
# 5.77, 6.29, 34.1 with a frozen base's FP8 casts still writing QKV's and FC1's output-gradient
# column-wise copies, as TransformerEngine's LayerNormLinear does (session 40, s40h2).
# 5.67, 6.19, 34.1 with the v4.0 / v4.1 TP4 userbuffers rows' forward reduce-scatters priced as TE's
# pipeline method their conf/tp_overlap yaml sets (tp_overlap_rs_pipeline; session 41, s41h4).
# 5.47, 6.05, 34.6 with the v5.0 / v5.1 TP4 userbuffers rows' too (their own submissions' yaml and
# logs say pipeline) and Red Hat's v4.0 row without userbuffers, as its logs print (session 42, s42h2).
# The max loosened 34.2 -> 34.7: Oracle's 64 x H200 row (TP4 CP2, already the worst) -34.1 -> -34.6 %.
# Held out loosened 6.1 -> 6.15 (s54h2): TE's p2p CP ring's merges priced (layer_time.cp_merge_time) take
# the 66 rows 5.48 -> 5.33 in sample, 6.01 -> 6.11 held out: the held-out refits see the CP rows of the
# calibration sets cost more and fit faster constants for the rest (a refit pressure; not refitted here).
LORA_MEAN, LORA_HELDOUT_MEAN, LORA_MAX = 5.5, 6.15, 34.75
# Held out by system (GPU and node-count family): 9.4 % with the dense rows in their best variant,
# 11.8 % as run (2026-11-26); 8.5 % on 2026-11-27 (adapters priced by their bytes and collectives),
# 8.8 % with the dense refit merged; 7.9 % with the H200 rows' FP8 SwiGLU-input store (2026-11-27);
# 7.11 with the per-micro-batch FP8 transposes (s36h4), 6.85 with the configs' FP8 attention (s36h7),
# 6.76 with the frozen base's output-gradient copies (s40h2); 6.51 with the pipelined forward RS (s41h4);
# 6.22 with it on v5.0 / v5.1 too and Red Hat's v4.0 row without userbuffers (s42h2).
# 6.41 with the p2p CP ring's merges priced (s54h2; loosened 6.3 -> 6.45, the refit pressure above).
LORA_BY_SYSTEM_MEAN = 6.45
# NeMo 24.07's SFT / LoRA table: 16.4, 14.5 on 2026-11-26; 6.6, 9.4 on 2026-11-27 (its SQuAD documents at
# the 200 tokens its own TFLOP/s imply, LoRA adapters by their bytes); its LoRA rows alone 10.2 in sample.
# 8.3, 9.1 (LoRA rows 12.5: -16.0, -11.0, -10.4 %) with the dense refit and memory fixes merged.
# Loosened (session 40, s40h2): 8.43, 9.32 (LoRA rows 12.80: -16.4, -11.3, -10.7 %) once a frozen base's
# casts still write QKV's and FC1's output-gradient column-wise copies, as TE's LayerNormLinear does (the
# 66 MLPerf and 5 Bridge LoRA rows gain, these three lose 0.3 points).
# Held out loosened 9.4 -> 9.65 (s54h2): 9.31 -> 9.63 once the p2p CP ring's merges are priced; in sample
# unchanged (no CP row): the h100 held-out refit sees its CP rows cost more and fits faster constants.
NEMOFT_MEAN, NEMOFT_HELDOUT_MEAN = 8.5, 9.65
NEMOFT_LORA_MEAN = 12.9


@pytest.fixture(scope="module")
def all_rows():
    """``validate.all_runs()``: every row validate prices, read and prepared once for this module
    (~40 s); the tests read them, none changes them."""
    return validate.all_runs()


@pytest.fixture(scope="module")
def full_report(all_rows):
    return validate.validate_training(rows=all_rows)  # what `validate` does: all_runs() handed over


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


def test_in_sample_mean_error(report):
    assert report.error_pct.abs().mean() <= 6.0


def test_in_sample_worst_row_target(report):
    """Issue 11: no dense row worse than 15 % in sample (met since the as-run refit, 2026-11-26)."""
    worst = report.loc[report.error_pct.abs().idxmax()]
    assert abs(worst.error_pct) <= 15.0, f"{worst.id}: {worst.error_pct:+.1f} %"


def test_in_sample_worst_row_regression_guard(report):
    assert report.error_pct.abs().max() <= FIGURES["dense_in_max"] + 0.1


def test_issue23_dense_targets(report):
    """Issue 23: dense in sample <= 4.3 %, leave-one-model-out <= 6.4 % (3.5 and 5.1 on 2026-11-26,
    with the constants refitted as run on TP traffic as TransformerEngine overlaps it)."""
    assert report.error_pct.abs().mean() <= 4.3 and report.heldout_error_pct.abs().mean() <= 6.4
    assert report.error_pct.abs().mean() <= FIGURES["dense_in_mean"] + 0.1  # regression guards
    assert report.heldout_error_pct.abs().mean() <= FIGURES["dense_held_mean"] + 0.1


def test_leave_one_model_out_error(report):
    assert report.heldout_error_pct.abs().mean() <= 10.0
    worst = report.loc[report.heldout_error_pct.abs().idxmax()]
    assert abs(worst.heldout_error_pct) <= 25.0, f"{worst.id}: {worst.heldout_error_pct:+.1f} %"


def test_every_other_published_layout_fits_as_run(full_report):
    """Every published layout but NOT_FITTING_AS_RUN's, the held-out hybrid rows included."""
    fits = full_report.set_index("id").fits
    assert set(NOT_FITTING_AS_RUN) <= set(fits.index)
    others = fits.drop(list(NOT_FITTING_AS_RUN))
    assert others.all(), list(others.index[~others])


@pytest.mark.parametrize("row_id", [pytest.param(i, marks=_target(f"predicted {why} in the variant it ran"))
                                    for i, why in NOT_FITTING_AS_RUN.items()])
def test_published_layout_fits_as_run(full_report, row_id):
    assert full_report.set_index("id").fits[row_id]


def test_the_rows_said_to_fit_the_whole_gpu_do(full_report):
    """The layouts NOT_FITTING_AS_RUN says fit the whole GPU miss only the 4 GiB reserve; the
    others need more than the GPU has, as priced."""
    from autoparallel import io
    rows = full_report.set_index("id")
    for row_id, why in NOT_FITTING_AS_RUN.items():
        hw = io.load_hardware(rows.gpu[row_id])
        assert f"{rows.peak_memory_gib[row_id]:.1f} GiB" in why, (row_id, rows.peak_memory_gib[row_id])
        whole = rows.peak_memory_gib[row_id] - hw.reserve_gib <= hw.memory_gib
        assert whole == ("fits the whole GPU" in why), (row_id, rows.peak_memory_gib[row_id])


def test_every_row_names_the_variant_it_was_priced_in(full_report):
    """NeMo's pre-training rows are priced in the recipe's settings: none of their knobs is the
    best-priced pick (NeMo's fine-tuning table, source nemoft, still searches what its launcher
    scripts leave unstated)."""
    import re
    for _, r in full_report.iterrows():
        origins = re.findall(r"\w+=[^ \[]+\[(\w+)\]", r.variant)
        assert origins and set(origins) <= {"row", "recipe", "default", "searched"}, r.variant
        assert f"mbs={r.mbs}[" in r.variant and f"recompute={r.recompute}[" in r.variant
        if r.source.startswith(("nemo ", "mlperf")):
            assert "searched" not in origins, (r.id, r.variant)


def test_a_recipe_setting_is_the_variant_priced(all_rows):
    """recipe_settings.yaml names published rows only, each with its source, and what it sets is
    what the row is priced in."""
    from autoparallel.measured_runs import predict_row, read_runs, recipe_settings, validation_runs
    recipes = recipe_settings()
    rows, releases = recipes["rows"], recipes["releases"]
    assert set(rows) <= set(read_runs(validation_runs()).id)
    assert all(r.get("source") for r in [*rows.values(), *releases.values()])
    row_id = "nemo-llama3-8b-h100-sxm-8gpu-fp8-current-tp1pp1cp1vp1ep1-mbs1-gbs128-fsdp8"
    assert rows[row_id]["recompute_num_layers"] == 5
    row = next(p for p in all_rows if p.id == row_id)
    assert set(row.candidates.recompute) == {"full"} and set(row.candidates.recompute_num_layers) == {5}
    variant = predict_row(row)["variant"]
    assert "recompute=full[recipe] recompute_layers=5[recipe]" in variant
    assert "fp8_param_gather=on[recipe]" in variant  # its release's FP8 precision config
    assert set(row.candidates.fp8_param_gather) == {True}


def test_a_table_correction_prices_the_recipe_and_fails_on_a_mended_table():
    """recipe_settings.yaml's table_corrections (old -> new): GPT-OSS-120B on B200 (25.11) is priced
    at its recipe's EP 64, not the table's EP 8; an entry whose old value is not the table's fails."""
    from autoparallel import io
    from autoparallel.errors import UserError
    from autoparallel.measured_runs import ASSUMPTIONS, corrected_row, prepare_row, read_runs, recipe_settings
    recipes, runs = recipe_settings(), read_runs().set_index("id", drop=False)
    row = runs.loc["nemo-gpt-oss-120b-b200-64gpu-bf16-tp1pp1cp1vp1ep8-mbs4-gbs512"]
    prepared = prepare_row(row, io.read_yaml(ASSUMPTIONS), recipes)
    assert set(prepared.candidates.ep) == {64} and int(prepared.row["ep"]) == 64
    h100 = prepare_row(runs.loc["nemo-gpt-oss-120b-h100-sxm-64gpu-bf16-tp1pp4cp1vp1ep8-mbs4-gbs512"],
                       io.read_yaml(ASSUMPTIONS), recipes)
    assert set(h100.candidates.mbs) == {1} and h100.origins["mbs"] == "recipe"
    mended = row.copy()
    mended["ep"] = 64
    with pytest.raises(UserError, match="expects ep 8"):
        corrected_row(mended, recipes)


def test_a_release_setting_holds_for_its_precisions_only():
    """NeMo 25.11's FP8 param gather is a setting of its FP8 precision configs: its BF16 rows and the
    24.07 rows run without it."""
    from autoparallel.measured_runs import read_runs, recipe_for, recipe_settings
    recipes, runs = recipe_settings(), read_runs().set_index("id", drop=False)
    fp8 = runs.loc["nemo-llama3.1-405b-gb300-256gpu-fp8-current-tp2pp8cp2vp4ep1-mbs1-gbs1536"]
    bf16 = runs.loc["nemo-gpt-oss-120b-b200-64gpu-bf16-tp1pp1cp1vp1ep8-mbs4-gbs512"]
    old = runs.loc["nemo-gpt3-20b-h100-sxm-64gpu-fp8-delayed-tp2pp1cp1vp1-mbs2-gbs256"]
    assert recipe_for(fp8, recipes)["fp8_param_gather"] is True
    assert "fp8_param_gather" not in recipe_for(bf16, recipes)
    assert recipe_for(old, recipes)["fp8_param_gather"] is False


def test_validate_reports_the_variant_in_json_and_table(full_report, monkeypatch, capsys):
    import json
    from autoparallel import cli
    monkeypatch.setattr(validate, "validate_training",
                        lambda runs=None, cross=True, progress=None, rows=None: full_report)
    monkeypatch.setattr(validate, "all_runs", lambda runs=None: [])  # the report above is what is printed
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["validate", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(r["variant"] for r in rows)
    assert cli.main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "variant" in out and "offload=95[recipe]" in out


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
    """Issue 23: mean |error| <= 6 % (3.9 % on 2026-11-26, 4.7 % before the v4.x rows stated FP8_PARAMS);
    no constant is fitted on these rows."""
    assert mlperf_report.error_pct.abs().mean() <= MLPERF_MEAN
    assert mlperf_report.error_pct.abs().max() <= MLPERF_MAX_REACHED  # regression guard


def test_mlperf_worst_row_meets_the_issue_target(mlperf_report):
    """Issue 23: no row worse than 12 % in sample (10.0 %, v4.1 Oracle 3072 H100, on 2026-11-26)."""
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
    assert list(s.by.unique()) == ["kind", "source", "gpu", "system", "hybrid gpu", "dsv4 gpu", "lora-blackwell gpu",
                                   "mlperf-llama gpu", "amd gpu"]
    assert set(s[s.by == "kind"].group) == {"dense", "moe", "mlperf", "lora", "sft", "dense-newer", "moe-newer",
                                            "sft-newer", "lora-newer", "hybrid-newer", "dsv4-newer", "lora-blackwell",
                                            "mlperf-llama3.1-405b", "mlperf-llama3.1-8b", "lora-amd"}
    assert set(s[s.by == "amd gpu"].group) == {"mi300x", "mi325x", "mi350x", "mi355x"}
    assert not {"mi300x", "mi325x", "mi350x", "mi355x"} & set(s[s.by == "gpu"].group)  # held apart
    assert {"heldout_mean_abs_error_pct", "heldout_max_abs_error_pct"} <= set(s.columns)
    assert (s.heldout_mean_abs_error_pct >= 0).all()


def test_held_out_rows_do_not_see_their_own_model(report):
    """A refit without the model changes its prediction: the held-out figure is not in-sample."""
    nemo = report[report.source.str.startswith("nemo")]
    assert (nemo.heldout_predicted != nemo.predicted).all()


def test_every_moe_row_is_predicted(moe_report):
    assert len(moe_report) == 19
    for name in ("deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b", "mixtral-8x22b"):
        assert moe_report.id.str.contains(name).any(), name


def test_moe_errors_regression_guard(moe_report):
    assert moe_report.error_pct.abs().mean() <= FIGURES["moe_in_mean"] + 0.1
    assert moe_report.heldout_error_pct.abs().mean() <= FIGURES["moe_held_mean"] + 0.1


def test_moe_leave_one_model_out_target(moe_report):
    """Issue 22: MoE held-out mean <= 15 % over the 19 fitted MoE rows (met 2026-11-27: 12.9 %)."""
    assert moe_report.heldout_error_pct.abs().mean() <= 15.0


def test_moe_in_sample_target(moe_report):
    """Issue 22: MoE in-sample mean <= 10 % (met 2026-11-27: 9.3 %, NCCL's all-to-all priced per peer)."""
    assert moe_report.error_pct.abs().mean() <= 10.0


def test_moe_worst_row_target(moe_report):
    """Issue 22: no fitted MoE row worse than 35 %, in sample or held out (met 2026-11-27: GPT-OSS-120B
    on 64 GB300, +26.9 / +31.8 %, once NCCL's all-to-all pays its latency per peer)."""
    assert moe_report.error_pct.abs().max() <= 35.0 and moe_report.heldout_error_pct.abs().max() <= 35.0


def _deepseek_v3_own_run(moe_report):
    return moe_report[moe_report.id.str.startswith("deepseek-v3-report")].iloc[0]


def test_deepseek_v3_own_run_speed_target(moe_report):
    """Issue 22: DeepSeek-V3 on 2,048 H800 within 15 % of 1,543 tok/s/GPU (met 2026-11-27: -8.7 %,
    once its FP8 dispatch is priced: -18.7 % with BF16 tokens, the all-to-all then longer than the
    computation DualPipe hides it behind)."""
    assert abs(_deepseek_v3_own_run(moe_report).error_pct) <= 15.0


def test_deepseek_v3_own_run_fits_target(moe_report):
    """Issue 22: DeepSeek-V3's own layout on 2,048 H800 predicted to fit (met 2026-11-27: 78.3 GiB
    with the reserve within the 79.65 GiB the driver gives of the 80 GB GPU, once the search's headroom is the reserve alone, the
    attention output is cached in E5M6 as the report states and DualPipe's stages are contiguous;
    79.5 against 76 allowed before)."""
    row = _deepseek_v3_own_run(moe_report)
    assert row.fits and row.peak_memory_gib <= FIGURES["deepseek"] + 0.1


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


# MLPerf's LoRA submissions on Blackwell (mlperf_training_lora_blackwell.csv, kind lora-blackwell, never
# fitted, held apart): 58 rows, mean |error| 11.7 % in sample with CP priced as the p2p ring; 7.98 % in
# sample, 7.81 % held out (leave-one-model-out), 7.95 % by system, max 29.9 % (Nebius's v5.1 B200 CP4 NVFP4
# row) with TE's all-to-all CP their train.py runs and their DP overlap off (session 50, s50h1). Reached
# figures, a regression guard.
BLACKWELL_LORA_MEAN, BLACKWELL_LORA_HELDOUT_MEAN, BLACKWELL_LORA_BY_SYSTEM_MEAN, BLACKWELL_LORA_MAX = 8.0, 7.9, 8.0, 30.0


def test_every_mlperf_lora_blackwell_submission_fits_and_errs_no_more_than_reached(full_report):
    """The 58 Blackwell rows, each layout pinned as its config ran it: every one fits, in a group of its
    own per GPU (``lora-blackwell gpu``), its mean |error| no worse than reached."""
    rows = full_report[full_report.kind == "lora-blackwell"]
    assert len(rows) == 58 and set(rows.gpu) == {"b200", "b300", "gb200", "gb300"}
    assert rows.fits.all(), list(rows.id[~rows.fits])
    assert (rows.source == "mlperflora").all() and (rows.metric == "iteration_time").all()
    assert rows.error_pct.abs().mean() <= BLACKWELL_LORA_MEAN
    assert rows.heldout_error_pct.abs().mean() <= BLACKWELL_LORA_HELDOUT_MEAN
    assert rows.heldout_system_error_pct.abs().mean() <= BLACKWELL_LORA_BY_SYSTEM_MEAN
    assert rows.error_pct.abs().max() <= BLACKWELL_LORA_MAX
    groups = validate.summary(full_report)
    per_gpu = groups[groups.by == "lora-blackwell gpu"]
    assert set(per_gpu.group) == {"b200", "b300", "gb200", "gb300"} and per_gpu.rows.sum() == 58
    # The fitted and newer rows' per-GPU groups hold none of them.
    gpu = groups[groups.by == "gpu"].set_index("group").rows
    others = full_report[~validate.held_apart(full_report)].gpu.value_counts()
    assert all(gpu[g] == others[g] for g in ("b200", "b300", "gb200", "gb300"))


def test_mlperf_lora_error_meets_the_target(lora_report):
    """Issue 27: mean |error| <= 10 %, in sample and held out."""
    assert lora_report.error_pct.abs().mean() <= 10.0 and lora_report.heldout_error_pct.abs().mean() <= 10.0


# NVIDIA's runs newer than the fit (issue 22 item 5): Megatron-Bridge's 26.02-26.08 summaries and
# Megatron-LM's DeepSeek-V3 GB200 guide (autoparallel/data/training_runs_newer.csv), never fitted.
NEWER = "training_runs_newer.csv"
NEWER_SOURCES = {"bridge 26.02", "bridge 26.02.01", "bridge 26.04", "bridge 26.04.01", "bridge 26.06",
                 "bridge 26.06.01", "bridge 26.08", "megatron"}
# The 107 newer MoE rows all fit as their recipes ran them (2026-11-27, recipe_settings.yaml): the fullest
# is DeepSeek-V3 on GB300 at mbs 2 (PP2 VP8 EP32, recompute mla_up_proj), 223.8 GiB of 277.55 (268 before 2026-11-27).
KNOWN_NEWER_NOT_FITTING = {i for i in NOT_FITTING_AS_RUN if i.startswith("bridge-")}
# Reached 2026-11-26 (in sample, held out): dense 8.15 / 14.16 %, MoE 23.10 / 24.72 % (dense held out
# 9.61 % before the dense rows were priced as run: the refits without a model now land elsewhere);
# MoE 24.16 / 24.63 % since 2026-11-27 (per-local-expert cost, MoE constants refitted on the rows
# priced as their recipes ran).
# 2026-11-27 merged: dense 13.64 / 14.58 % (the b200 family's as-run refit, three constants on a bound,
# prices the newer GB300 rows slow: bridge-26.02.01 70B MXFP8 on GB300 -48 %), MoE 25.37 / 27.65 %.
# 2026-11-27 (issue 22, per-peer all-to-all and its MoE refit): MoE 26.45 / 28.23 % -- worse: the refit's
# grouped_gemm_max 0.646 -> 0.708 speeds up the newer GPT-OSS EP64 rows, which the space prices with
# the flex dispatcher (no per-peer latency) and which were already +69..+199 % too fast.
# 2026-11-27 (DeepSeek-V3's FP8 dispatch, MoE refit): MoE 26.62 / 28.46 %; 23.71 / 25.43 % once the
# 26.02 GPT-OSS rows are priced as Megatron-Bridge v0.3.0 ran them (alltoall, no 1F1B overlap:
# recipe_settings.yaml), not at the fastest dispatcher.
# 2026-11-27 (helper h1-dense-recipes): dense 10.61 / 11.38 % -> 8.70 / 8.90 % once every dense row is
# priced as Megatron-Bridge v0.3.0-v0.5.0's V2 presets ran it (recipe_settings.yaml: no recompute, the
# presets' CPU offload, TP overlap, no CUDA graphs; four 26.02.01 layouts corrected to the recipe's);
# nine of them are then predicted over the 0.95 share (NOT_FITTING_AS_RUN).
# 2026-11-27 (helper h2-moe-recipes): MoE 18.02 / 19.80 % once every newer MoE row is priced as its
# Megatron-Bridge recipe ran it (dispatcher, 1F1B all-to-all overlap, recompute, full-iteration CUDA graphs,
# pipeline layouts, DeepSeek's BF16 moments, Kimi's FP8 parameters off: recipe_settings.yaml), not at the
# fastest variant that fits (23.76 / 25.54 %).
# 2026-11-27 (helper h6-experts): MoE 17.00 / 17.15 % once each local expert's GEMMs are priced at the
# dense GEMM efficiency of their own size with a fixed cost per TransformerEngine call per expert
# (layer_time.moe_expert_calls), the MoE constants refitted.
# 2026-11-27 (helper h5-gptoss): MoE 18.02 / 19.80 % -> 14.05 / 15.12 % once GPT-OSS's experts pay
# Megatron-Core's eager FC2 bias and quick-GEGLU clamp (layer_time.expert_bias_time, glu_clamp_time).
# Both merged with GPT-OSS's router in BF16 (as Megatron-Bridge's GPTOSSProvider runs it), MoE constants
# refitted: 14.64 / 14.87 %.
# 2026-11-27 (session 36, s36h2): the MXFP8 dot-product attention of Megatron-Bridge's full-iteration
# MoE recipes (Qwen3, DeepSeek-V3 on GB300, GPT-OSS) priced (fp8_attention under mxfp8): 13.79 / 14.02 %.
# 2026-11-27 (session 36, s36h1): TE's GroupedLinear runs up to four local experts' GEMMs side by side
# (layer_time.concurrent_experts), MoE constants refitted; merged with s36h2: 13.36 / 13.74 %.
# 2026-11-27 (session 36, s36h6): the fused CuTe-DSL grouped MLP of the v0.5.0+ recipes
# (layer_time.fused_grouped_mlp_calls) and HybridEP's 32 SMs: 12.71 / 13.06 %.
# 2026-11-27 (session 36, s36h8): Megatron-Core's paged stashing of the fused MLP's saved tensors
# under the recipes' full-iteration graph (layer_time.paged_stash_time): 11.66 / 11.99 %.
# 2026-11-27 (session 37, s37h3): the host floor of the 1F1B all-to-all overlap (layer_time.combined_host_stall),
# the per-expert calls' host time waited for in the forward only (moe_expert_calls), MoE constants refitted:
# 10.67 / 10.85 % (Qwen3-235B B300 PP8 VP4 EP8 +37.0 / +39.4 -> +12.7 / +14.7).
# 2026-11-27 (session 38, s38h1): the flex dispatchers hand GPT-OSS's eager expert-bias step FP32
# probabilities (layer_time.fp32_expert_probs): 10.09 / 10.27 % (GPT-OSS B200 / B300 EP8 HybridEP BF16,
# GB200 26.04 HybridEP, B300 MXFP8 26.06 -5 to -9 points; MoE rows over 35 % 6 -> 4).
# 2026-11-27 (session 38, s38h7): cuDNN's MXFP8 attention at the BF16 kernel's time per score at head
# dimension 128 (layer_time.MXFP8_ATTENTION_HEAD_DIM): 9.82 / 10.02 % (Qwen3-30B fused GB300 / B300
# +15.9..+21.4 -> +0.8..+4.6; DeepSeek-V3 and Qwen3-235B GB300 fused -1..-5 -> -8..-11).
# 2026-11-29 (session 50, s50h6): the NVFP4 GEMMs held to the measured 1.81x FP8 (gemm.fp4_tflops, from
# TransformerEngine's B300 GEMM table): dense-newer 7.97 / 8.05 -> 9.00 / 9.30 %, its 9 GB300 NVFP4 rows
# +8.3 -> -15.5 % too fast (their FP8 / MXFP8 siblings -10 %: the gap NVFP4 - FP8 +18 -> -6 points);
# all 54 NVFP4 rows 18.7 / 17.0 -> 16.7 / 15.5 %; no other row moved.
# 2026-11-29 (session 53, s53h7): the b200 family's attention core at cuDNN's measured B200 time per score
# (b200.yaml measured_attention_ps_per_score), the b200 and MoE constants refitted: dense-newer 9.00 / 9.30 ->
# 8.66 / 9.43 % (held out 0.13 worse; every fitted group's held-out figure better, all 534 rows 9.66 -> 9.43).
# 2026-11-29 (session 54, s54h1): the MoE forward's host calls after the dropless sync, MoE constants refitted:
# moe-newer 9.77 / 9.94 -> 10.37 / 10.36 % (worse: DeepSeek-V3 / Qwen3 alltoall and DeepEP rows slower), against
# hybrid-newer 22.48 / 22.49 -> 18.59 / 18.60 % and the 182 MoE rows 13.52 / 13.81 -> 12.86 / 12.94 %.
# 2026-11-29 (session 54, s54h4): the attention core at cuDNN's measured time per score by sequence length (b200.yaml
# B200 table less its host floor, h100-sxm.yaml H200 table), b200 / h100-sxm / MoE constants refitted: moe-newer
# 9.77 / 9.94 -> 9.96 / 10.09 % (all 534 rows held out 9.42 -> 9.21; benchmarks/RESULTS.md).
# Session 54's merge (both, refitted together): moe-newer 10.34 / 10.34 %, against the 182 MoE rows 13.52 / 13.81
# -> 12.49 / 12.58 and all 534 rows 9.31 / 9.42 -> 8.23 / 8.53 (benchmarks/RESULTS.md, session 54, lead).
# 2026-11-30 (session 56, s56h3): the 26.06.01 container's regressed dGLU bias-gradient loop (cudnn-frontend
# issue 256, layer_time.dglu_dbias_regression_time) on its two GPT-OSS rows: moe-newer 10.34 / 10.34 -> 9.87 / 9.86 %.
NEWER_REACHED = {"dense-newer": (9.0, 9.45), "moe-newer": (9.9, 9.9)}


@pytest.fixture(scope="module")
def newer_report(full_report):
    return full_report[full_report.kind.isin(["dense-newer", "moe-newer"])]


def test_the_newer_moe_rows_are_priced_as_their_recipes_ran(newer_report):
    """Issue 22 item 5: every Megatron-Bridge MoE row of the newer summaries has its recipe's entry in
    recipe_settings.yaml and no knob left to the search (the fastest variant is not what NVIDIA ran)."""
    from autoparallel.measured_runs import recipe_settings
    entries = recipe_settings()["rows"]
    moe = newer_report[(newer_report.kind == "moe-newer") & newer_report.source.str.startswith("bridge ")]
    assert len(moe) == 107
    assert set(moe.id) <= set(entries), sorted(set(moe.id) - set(entries))
    searched = moe[moe.variant.str.contains(r"\[searched\]")]
    assert searched.empty, list(zip(searched.id, searched.variant))


def test_the_megatron_guide_row_is_read_in_model_tflops(newer_report):
    guide = newer_report[newer_report.source == "megatron"].iloc[0]
    assert guide.metric == "model_tflops" and guide.measured == 970.01


def test_the_newer_published_layouts_fit(newer_report):
    assert set(newer_report.id[~newer_report.fits]) == KNOWN_NEWER_NOT_FITTING


def test_validation_only_rows_stay_out_of_the_moe_refits(monkeypatch):
    """A held-out MoE fold refits on the other models' calibration rows only."""
    from types import SimpleNamespace

    from autoparallel import io
    from autoparallel.costmodel import calibrate
    seen = []
    monkeypatch.setattr(calibrate, "fit_moe", lambda rows: (seen.extend(r.id for r in rows), ({},))[1])
    monkeypatch.setattr(calibrate, "uncalibrated_moe", lambda efficiency: efficiency)
    monkeypatch.setattr(validate, "predict_row", lambda p, efficiency: {"id": p.id})
    b200 = io.load_hardware("b200")
    row = lambda i, group, only: SimpleNamespace(  # noqa: E731
        id=i, model=SimpleNamespace(is_moe=True), model_group=group, validation_only=only, hardware=b200)
    rows = [row("fitted", "a", False), row("newer", "a", True), row("held", "b", False), row("held-newer", "b", True)]
    assert set(validate._refit_moe_and_predict(rows, "b")) == {"held", "held-newer"}
    assert seen == ["fitted"]


def test_moe_held_out_target_with_the_newer_rows(full_report):
    """Issue 22: MoE held-out mean <= 15 % over every MoE row, the newer ones included (met 2026-11-27,
    helper h5-gptoss: 14.2 % over 127 rows, 18.4 % before GPT-OSS's eager expert bias and quick-GEGLU
    clamp were priced)."""
    moe = full_report[full_report.kind.isin(["moe", "moe-newer"])]
    assert moe.heldout_error_pct.abs().mean() <= 15.0


@pytest.mark.xfail(strict=True, reason="issue 22 target: no MoE row worse than 35 %; the worst of the 108 "
                                       "newer ones is GPT-OSS-120B on 64 B300 at EP64 over 8 nodes (26.02, "
                                       "BF16, alltoall): +41.6 % in sample, +37.9 % held out on 2026-11-30 "
                                       "(the 26.06.01 GB200 row, +46.9 %, is +20.1 % with its container's "
                                       "cudnn-frontend regression priced)")
def test_no_newer_moe_row_worse_than_35_percent(newer_report):
    moe = newer_report[newer_report.kind == "moe-newer"]
    assert moe.error_pct.abs().max() <= 35.0 and moe.heldout_error_pct.abs().max() <= 35.0


def test_mlperf_rows_are_held_out_by_system_too(full_report):
    """Issue 27: every validation-only row (MLPerf GPT-3, LoRA and Llama 3.1, NeMo's fine-tuning table) is also
    predicted with its GPU family refitted without the published rows of its GPU at its node-count
    family; the other rows have no system."""
    mlperf = full_report.source.isin(["mlperf", "mlperflora", "nemoft", "mlperfllama"])
    assert full_report.heldout_system_error_pct[mlperf].notna().all()
    assert full_report.heldout_system_error_pct[~mlperf].isna().all() and full_report.system[~mlperf].isna().all()
    hopper = (full_report.source == "mlperflora") & (full_report.kind == "lora")
    assert set(full_report.system[hopper]) == {
        "h100-sxm 1 node", "h100-sxm 2-8 nodes", "h100-sxm 9-64 nodes", "h100-sxm >64 nodes",
        "h200 1 node", "h200 2-8 nodes", "h200 9-64 nodes"}
    assert set(full_report.system[full_report.kind == "lora-blackwell"]) >= {"b200 1 node", "gb200 9-64 nodes"}
    assert set(full_report.system[full_report.kind == "lora-amd"]) == {  # mlperf_training_lora_amd.csv
        "mi300x 1 node", "mi300x 2-8 nodes", "mi325x 1 node", "mi325x 2-8 nodes", "mi350x 1 node", "mi355x 1 node"}
    lora = full_report[hopper]
    assert lora.heldout_system_error_pct.abs().mean() <= LORA_BY_SYSTEM_MEAN
    s = validate.summary(full_report)
    assert {"heldout_system_mean_abs_error_pct", "heldout_system_max_abs_error_pct"} <= set(s.columns)


def test_a_system_fold_leaves_out_only_its_gpu_at_its_scale(all_rows):
    rows = all_rows
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


def test_nemo_finetuning_rows_meet_the_target(nemo_finetune_report):
    """Issue 27: the fine-tuning rows' mean |error| <= 10 %, in sample and held out."""
    assert nemo_finetune_report.error_pct.abs().mean() <= 10.0
    assert nemo_finetune_report.heldout_error_pct.abs().mean() <= 10.0


def test_nemo_lora_rows_are_no_worse_than_reached(nemo_finetune_report):
    lora = nemo_finetune_report[nemo_finetune_report.kind == "lora"]
    assert lora.error_pct.abs().mean() <= NEMOFT_LORA_MEAN


@pytest.mark.xfail(strict=True, reason="issue 27 target: fine-tuning rows' mean |error| <= 10 %; NeMo 24.07's "
                                       "three LoRA rows alone are 12.8 % in sample on 2026-11-27 (-16.4, -11.3, "
                                       "-10.7 %: predicted slow; its SFT rows 4.1 %)")
def test_nemo_lora_rows_meet_the_target(nemo_finetune_report):
    lora = nemo_finetune_report[nemo_finetune_report.kind == "lora"]
    assert lora.error_pct.abs().mean() <= 10.0


# Megatron-Bridge's newer fine-tuning tables (issue 27): 26.06's Llama 3 70B SFT and LoRA runs on GB300,
# GB200 and H100 (autoparallel/data/finetune_runs_newer.csv, written by scripts/newer_finetune_runs.py
# from the 067f987df0 summaries and Bridge v0.5.0's performance scripts), never fitted.
NEWER_FINETUNE = "finetune_runs_newer.csv"
# Reached 2026-11-27 (mean |error| %, in sample and held out): SFT 12.78 / 8.21, LoRA 8.18 / 9.73; plus the
# rounding. The MXFP8 rows are predicted faster than the FP8 ones, measured slower (SFT on GB200 +24.7 %).
# Merged with the dense refit and memory fixes: SFT 8.84 / 8.20, LoRA 9.66 / 8.27; with Blackwell at SMs x
# max SM clock (s38h4): SFT 7.51 / 7.87, LoRA 8.20 / 7.62; LoRA 7.92 / 7.34 with the frozen base's
# output-gradient copies as TE's LayerNormLinear writes them (s40h2).
NEWER_FINETUNE_REACHED = {"sft-newer": (7.6, 7.9), "lora-newer": (8.0, 7.4)}


@pytest.fixture(scope="module")
def newer_finetune_report(full_report):
    return full_report[full_report.kind.isin(["sft-newer", "lora-newer"])]


# Each validation-only table of newer runs: its row kinds (with counts), sources and GPUs.
NEWER_TABLES = {
    NEWER: ({"moe-newer": 108, "dense-newer": 61}, NEWER_SOURCES, {"gb300", "gb200", "b300", "b200", "h100-sxm"}),
    NEWER_FINETUNE: ({"sft-newer": 5, "lora-newer": 5}, {"bridge 26.06"}, {"gb300", "gb200", "h100-sxm"}),
    # The Nemotron 3 hybrid Mamba-Transformer runs (session 48): held out, summarized apart.
    "training_runs_hybrid.csv": ({"hybrid-newer": 53}, {f"bridge {r}" for r in ("26.02.01", "26.04", "26.04.01",
                                                                              "26.06", "26.06.01", "26.08")},
                                 {"gb300", "gb200", "b300", "b200", "h100-sxm"}),
    # DeepSeek-V4 Flash's two 26.08 runs (session 49): held out, summarized apart.
    "training_runs_dsv4.csv": ({"dsv4-newer": 2}, {"bridge 26.08"}, {"gb300", "gb200"}),
}


@pytest.mark.parametrize("table", list(NEWER_TABLES))
def test_a_newer_table_loads_and_every_row_is_priced(full_report, table):
    from autoparallel import resources
    from autoparallel.measured_runs import RUN_COLUMNS, VALIDATION_ONLY_RUNS, read_runs_table
    kinds, sources, gpus = NEWER_TABLES[table]
    assert table in VALIDATION_ONLY_RUNS
    frame = read_runs_table(resources.data_file(table), RUN_COLUMNS)
    assert frame.id.is_unique
    rows = full_report[full_report.kind.isin(kinds)]
    assert sorted(rows.id) == sorted(frame.id)  # none skipped
    assert rows.kind.value_counts().to_dict() == kinds
    assert set(rows.source) == sources and set(rows.gpu) == gpus


def test_the_newer_finetuning_rows_cite_their_release(newer_finetune_report):
    from autoparallel import resources
    from autoparallel.measured_runs import RUN_COLUMNS, read_runs_table
    frame = read_runs_table(resources.data_file(NEWER_FINETUNE), RUN_COLUMNS)
    assert (newer_finetune_report.metric == "tokens_per_s_per_gpu").all()
    # Every setting cites the Bridge release that ran it; the unstated dataset is said so.
    assert frame.notes.str.contains("Megatron-Bridge fcbb603110:").all()
    assert frame.notes.str.contains("dataset not stated by the summary").all()


def test_the_newer_finetuning_layouts_fit_as_run(newer_finetune_report):
    assert newer_finetune_report.fits.all(), list(newer_finetune_report.id[~newer_finetune_report.fits])


def test_the_newer_finetuning_rows_are_never_fitted(newer_finetune_report):
    """Held out by model like every row (a refit without the 70B models); no fit sees them, so no
    system fold either (as the other newer rows)."""
    assert newer_finetune_report.heldout_system_error_pct.isna().all()
    assert (newer_finetune_report.heldout_predicted != newer_finetune_report.predicted).all()


@pytest.mark.parametrize("kind", [*NEWER_REACHED, *NEWER_FINETUNE_REACHED])
def test_newer_errors_do_not_regress(full_report, kind):
    """Regression guards at the figures reached (not targets; RESULTS.md, issues 22 item 5 and 27):
    mean |error| in sample and held out."""
    rows = full_report[full_report.kind == kind]
    mean, held = {**NEWER_REACHED, **NEWER_FINETUNE_REACHED}[kind]
    assert len(rows) and rows.error_pct.abs().mean() <= mean and rows.heldout_error_pct.abs().mean() <= held


def test_newer_lora_rows_meet_the_target(newer_finetune_report):
    """Issue 27: the fine-tuning rows' mean |error| <= 10 %, in sample and held out."""
    lora = newer_finetune_report[newer_finetune_report.kind == "lora-newer"]
    assert lora.error_pct.abs().mean() <= 10.0 and lora.heldout_error_pct.abs().mean() <= 10.0


def test_newer_sft_rows_meet_the_target(newer_finetune_report):
    """Issue 27: met 2026-11-27 once merged (8.8 % in sample, 8.2 % held out; 12.8 % before)."""
    sft = newer_finetune_report[newer_finetune_report.kind == "sft-newer"]
    assert sft.error_pct.abs().mean() <= 10.0 and sft.heldout_error_pct.abs().mean() <= 10.0


@pytest.mark.parametrize("cross", [True, False])
def test_the_cli_reads_the_runs_once_under_a_live_display(cross, monkeypatch):
    """`validate` read and priced the 343 published rows twice (all_runs for the bar's fold count, then
    again in validate_training: 50 s each on a loaded 2-core machine), both times with a blank terminal:
    now once, under the progress display, and handed to validate_training."""
    import types

    from autoparallel.cli import validate as cli_validate
    from autoparallel.cli.common import console
    monkeypatch.setattr(console, "_force_terminal", True)  # off a terminal no bar (and no live display) is drawn
    reads = []

    def all_runs(runs=None):
        reads.append(bool(console._live_stack))
        return ["row"]

    def validate_training(runs=None, cross=True, progress=None, rows=None):
        rows = all_runs(runs) if rows is None else rows
        return rows
    fake = types.SimpleNamespace(all_runs=all_runs, validate_training=validate_training,
                                 cross_validation_folds=lambda rows: 3)
    assert cli_validate._training_report(fake, None, cross=cross, quiet=False) == ["row"]
    assert reads == [True]


def test_the_report_reads_at_80_columns():
    """At 80 columns the per-row table cut every id to 'bridge…' and stacked each variant 9 lines high
    (1,900 lines for 343 runs): now each run is its id, whole, and a line of figures."""
    import io as stdio

    import pandas as pd
    from rich.console import Console
    long_id = "bridge-26.04.01-qwen3-235b-a22b-h100-sxm-256gpu-fp8-current-tp2pp8cp1vp4ep32-mbs1-gbs8192"
    common = {"fits": True, "variant": "mbs=1[row] recompute=none[recipe] " * 6, "model": "m", "mbs": 1}
    report = pd.DataFrame([
        {**common, "id": long_id, "kind": "moe-newer", "source": "bridge 26.04.01", "gpu": "h100-sxm",
         "metric": "tokens_per_s_per_gpu", "measured": 1712.0, "predicted": 1692.23, "error_pct": -1.15,
         "peak_memory_gib": 53.1, "heldout_error_pct": 7.23, "system": None, "heldout_system_error_pct": None},
        {**common, "id": "mlperf-v3.0-NVIDIA-dgxh100_n64_nemo", "kind": "mlperf", "source": "mlperf",
         "gpu": "h100-sxm", "metric": "iteration_time", "measured": 12.0887, "predicted": 11.62,
         "error_pct": -3.84, "peak_memory_gib": 55.3, "heldout_error_pct": -2.76, "system": "h100-sxm 9-64 nodes",
         "heldout_system_error_pct": -4.16}])
    buffer = stdio.StringIO()
    validate.print_report(report, Console(file=buffer, width=80))
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in buffer.getvalue()
    assert long_id in "".join(lines) and "mlperf-v3.0-NVIDIA-dgxh100_n64_nemo" in lines
    # Folded after a '-', not at the 80th character ('...-tp2pp8cp1vp4ep32-mbs1-g' / 'bs8192' before session 46).
    assert "bridge-26.04.01-qwen3-235b-a22b-h100-sxm-256gpu-fp8-current-tp2pp8cp1vp4ep32-" in lines
    assert "mbs1-gbs8192" in lines
    assert any(line.split()[:5] == ["step", "s", "12.09", "11.62", "-3.8"] for line in lines)
    assert len(lines) < 60


@pytest.mark.parametrize("columns, widest", [("80", 80), (None, 200)])
def test_validate_in_a_pipe_takes_the_width_columns_asks_for(tmp_path, columns, widest):
    """Piped, the report is one line per run (never cut) unless ``COLUMNS`` asks for a width: then it
    reads at that width (each run's id on its own line)."""
    import os
    import subprocess
    import sys
    from autoparallel import resources
    lines = resources.data_file("training_runs.csv").read_text().splitlines()
    runs = tmp_path / "two_runs.csv"
    runs.write_text("\n".join(lines[:3]) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    out = subprocess.run([sys.executable, "-m", "autoparallel", "validate", "--runs", str(runs),
                          "--no-cross-validation"], env=env, capture_output=True, text=True, check=True).stdout
    width = max(len(line) for line in out.splitlines())
    assert width <= widest if columns else width > widest


SUMMARY_SCRIPT = ("import sys, pandas; from autoparallel import validate; from autoparallel.cli.common import console; "
                  "validate._print_summary(pandas.read_pickle(sys.argv[1]), console, True, True)")


@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux is not installed")
def test_the_summary_keeps_every_figure_whole_in_an_80_column_terminal(full_report, tmp_path):
    """At 80 columns the summary's "by" column (18 wide) left each figure 3 characters: 27.0 printed
    '27…', 'mlperf-llama3.1-405b' was cut and 'all fit' read 'y…'. Each group's line must show its
    name and every figure whole (the report rendered by the CLI's console in a real terminal, tmux)."""
    from test_terminal_tables import screen
    full_report.to_pickle(tmp_path / "report.pkl")
    text = screen([], 80, height=120, python=["-c", SUMMARY_SCRIPT, str(tmp_path / "report.pkl")])
    lines = text.splitlines()
    assert "…" not in text and "Traceback" not in text and max(map(len, lines)) <= 80
    shown = [line.split() for line in lines]
    for _, r in validate.summary(full_report).iterrows():
        figures = [r[k] for k in ("mean_abs_error_pct", "max_abs_error_pct", "heldout_mean_abs_error_pct",
                                  "heldout_max_abs_error_pct", "heldout_system_mean_abs_error_pct",
                                  "heldout_system_max_abs_error_pct")]
        cells = [*str(r["group"]).split(), str(r["rows"]), *(f"{f:.1f}" for f in figures if f == f),
                 "yes" if r["all_fit"] else "no"]
        assert cells in shown, f"{r['by']} {r['group']}: {cells} not shown whole on:\n{text}"
