"""MLPerf Training's Llama 3.1 405B / 8B pre-training rows (autoparallel/data/mlperf_training_llama31.csv):
written by scripts/mlperf_pretrain_rows.py from the results mirrors, loaded validation-only, every settled
layout a fitting candidate of the default search space."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from autoparallel import measured_runs, resources, validate
from autoparallel.costmodel.candidates import DP_BUCKET_SIZE_COLUMN, DP_MAX_CTAS_COLUMN
from autoparallel.measured_runs import load_runs, predict_row, read_runs_table

ROOT = Path(__file__).resolve().parents[1]
CSV = "mlperf_training_llama31.csv"
MIRRORS = ("/work/.mirror/mlcommons+training_results_v5.0/repo", "/work/.mirror/mlcommons+training_results_v5.1/repo")
# In-sample mean |error| reached on 2026-11-29 (regression guards, not targets: no constant is fitted on these rows).
MEAN_REACHED = {"mlperf-llama3.1-405b": 9.2, "mlperf-llama3.1-8b": 9.0}  # 8B: 17.1 before the DP CTA cap (s54h5)


@pytest.fixture(scope="module")
def raw():
    return pd.read_csv(resources.data_file(CSV))


@pytest.fixture(scope="module")
def runs():
    return read_runs_table(resources.data_file(CSV), measured_runs.RUN_COLUMNS)


@pytest.fixture(scope="module")
def prepared():
    return load_runs([resources.data_file(CSV)])


@pytest.fixture(scope="module")
def predicted(prepared):
    return pd.DataFrame([predict_row(p) for p in prepared])


def test_the_csv_has_the_gpt3_rows_columns_and_only_nvidia_gpus(raw):
    gpt3 = pd.read_csv(resources.data_file("mlperf_training_gpt3.csv"), nrows=0)
    assert list(raw.columns) == list(gpt3.columns)
    assert set(raw.model) == {"llama3.1-405b", "llama3.1-8b"} and (raw.seq_length == 8192).all()
    assert set(raw.gpu) <= {"h100-sxm", "h200", "b200", "b300", "gb200", "gb300"}
    assert set(raw["round"]) == {"v5.0", "v5.1"}
    assert raw.source.str.contains(r"training_results_v5\.[01]@[0-9a-f]{40} ").all()
    assert raw.source.str.contains(" log:").all() and raw.source.str.contains(" system:").all()
    assert not raw.duplicated(["round", "submitter", "system", "model"]).any()


def test_a_settled_row_states_its_config_and_layout_and_an_unsettled_one_why(raw):
    settled = raw.precision.notna()
    assert raw.loc[settled, "source"].str.contains(" config:").all()
    assert raw.loc[settled, ["tp", "pp", "vp", "cp", "micro_batch_size"]].notna().all().all()
    assert raw.loc[~settled, "other_knobs"].str.match(r"^(AMBIGUOUS_CONFIG\(|NO_CONFIG)").all()
    # GBS = MINIBS x DP: the batch a layout's data-parallel replicas take is a whole number of micro-batches.
    s = raw[settled]
    dp = s.gpus // (s.tp * s.pp * s.cp)
    assert ((s.global_batch_size % (dp * s.micro_batch_size)) == 0).all()


def test_unsettled_rows_are_skipped_with_their_reason(raw, runs, prepared, capsys):
    """The rows whose config could not be settled (``skip_reason``) are left out and named in one
    warning, grouped by reason, not one warning a row the user cannot act on; a bad measurement in
    the user's own CSV still gets its own (tests/test_bad_inputs.py)."""
    ids = {p.id for p in prepared}
    unsettled = raw[raw.precision.isna()]
    assert len(unsettled) >= 2 and len(ids) == len(raw) - len(unsettled)
    left_out = runs[runs["skip_reason"] != ""]
    assert set(left_out["id"]) == {_id(r) for _, r in unsettled.iterrows()}
    assert set(left_out["skip_reason"]) == set(measured_runs.MLPERF_UNSETTLED.values())
    load_runs([resources.data_file(CSV)])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("autoparallel: warning: runs CSV rows left out, ")
    for reason, ids in left_out.groupby("skip_reason", sort=False)["id"]:
        assert f"{reason}: {', '.join(ids)}" in warnings[0]


def test_the_rows_are_validation_only_kinds_of_their_own(prepared):
    assert {p.kind for p in prepared} == set(validate.MLPERF_LLAMA_KINDS)
    assert len({p.id for p in prepared}) == len(prepared)  # NVIDIA's v5.1 systems ran both models
    assert all(p.validation_only for p in prepared)
    assert CSV in measured_runs.VALIDATION_ONLY_RUNS
    assert all(Path(f).name != CSV for f in measured_runs.default_runs())  # never fitted


def test_the_benchmark_architectures(prepared):
    """405B with the Mixtral 8x22B tokenizer's 32,000 entries (the reference's Model details), 8B with
    Llama 3.1's 128,256; untied, no dropout; 8,192 tokens."""
    models = {p.row["model"]: p.model for p in prepared}
    big, small = models["llama3.1-405b"], models["llama3.1-8b"]
    assert (big.num_layers, big.hidden_size, big.vocab_size, big.num_query_groups) == (126, 16384, 32000, 8)
    assert (small.num_layers, small.hidden_size, small.vocab_size) == (32, 4096, 128256)
    assert not big.tie_embeddings and not small.tie_embeddings
    assert big.hidden_dropout == big.attention_dropout == small.hidden_dropout == 0.0


def _id(r) -> str:
    return f"mlperfllama-{r['model'].removeprefix('llama3.1-')}-{r['round']}-{r['submitter']}-{r['system']}"


def test_the_configs_knobs_reach_the_candidates(raw, prepared):
    """FULL_CUDA_GRAPH -> full-iteration graph, MCORE_CUDA_GRAPH alone -> per layer; FP8 attention only where
    FP8_DPA is on and NVTE_DPA_FP8_RECIPE is not F16; TP-only amax reduction only under delayed scaling;
    FP8 parameter gather under either of the configs' names; NeMo's ASYM_PP split."""
    stated = {_id(r): str(r["other_knobs"]) for _, r in raw.iterrows()}
    seen = set()
    for p in prepared:
        knobs, c = stated[p.id], p.candidates.iloc[0]
        graph = ("full_iteration" if "FULL_CUDA_GRAPH=1" in knobs
                 else "layer" if "MCORE_CUDA_GRAPH=1" in knobs else "none")
        assert c["cuda_graph"] == graph, p.id
        assert bool(c["fp8_attention"]) == ("FP8_DPA=1" in knobs and "NVTE_DPA_FP8_RECIPE=F16" not in knobs), p.id
        assert bool(c["tp_only_amax_red"]) == (c["precision"] == "fp8-delayed"), p.id
        assert bool(c["fp8_param_gather"]) == ("FP8_PARAM_GATHER=1" in knobs or "FP8_PARAMS=1" in knobs), p.id
        if "ASYM_PP_EMBED=1" in knobs:
            assert c["account_for_embedding_in_pipeline_split"] and c["account_for_loss_in_pipeline_split"], p.id
        seen |= {graph, c["precision"], ("fp8_attention", bool(c["fp8_attention"]))}
    assert {"full_iteration", "layer", "none", "fp8-delayed", "fp8-current", "nvfp4",
            ("fp8_attention", True)} <= seen


def test_the_dp_communicators_run_on_the_configs_8_ctas(prepared):
    """Every Llama 3.1 implementation caps the DP communicators at 8 CTAs (conf/nccl/custom_communicator_cta.yaml
    through NCCL_CFG_PATH; ``measured_runs.MLPERF_DP_MAX_CTAS``): each row's candidates carry the cap."""
    for p in prepared:
        assert {float(v) for v in p.cols[DP_MAX_CTAS_COLUMN]} == {8.0}, p.id


def test_the_8b_rows_carry_their_configs_gradient_bucket(prepared):
    """The 8B implementation's bucket_size (conf/custom.yaml: BUCKET_SIZE, default 134217728 parameters;
    the GB200 / GB300 configs 768000000; ``measured_runs.MLPERF_DP_BUCKET_SIZE``) on each 8B row's
    candidates; the 405B rows state none (Megatron's default, ``dataparallel.bucket_params``)."""
    seen = set()
    for p in prepared:
        stated = {float(v) for v in p.cols.get(DP_BUCKET_SIZE_COLUMN, ["nan"])}
        if "-8b-" not in p.id:
            assert DP_BUCKET_SIZE_COLUMN not in p.cols, p.id
            continue
        want = 768000000.0 if str(p.row["gpu"]) in ("gb200", "gb300") else 134217728.0
        assert stated == {want}, p.id
        seen.add(want)
    assert seen == {768000000.0, 134217728.0}


@pytest.mark.skipif(not all(Path(m).is_dir() for m in MIRRORS), reason="needs the MLCommons results mirrors")
def test_every_llama31_submission_sets_the_cap_the_rows_carry(raw):
    """The cap read from the sources: each settled row's config directory sets NCCL_CFG_PATH to the YAML
    (its config_common.sh), and every copy of the YAML in those rounds' Llama 3.1 trees caps dp and dp_cp at 8."""
    for mirror in MIRRORS:
        files = subprocess.run(["git", "-C", mirror, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True,
                               text=True, check=True).stdout.splitlines()
        yamls = [f for f in files
                 if f.endswith("nccl/custom_communicator_cta.yaml") and ("llama31_" in f or "llama3_8b" in f)]
        assert yamls
        for f in yamls:
            text = subprocess.run(["git", "-C", mirror, "show", f"HEAD:{f}"], capture_output=True, text=True,
                                  check=True).stdout
            caps = re.findall(r"^(dp|dp_cp):\n(?:  .*\n)*?  max_ctas: (\d+)", text, flags=re.M)
            assert sorted(caps) == [("dp", "8"), ("dp_cp", "8")], f
    for _, r in raw[raw.precision.notna()].iterrows():
        config = re.search(r" config:(\S+)", r["source"]).group(1)
        mirror = MIRRORS[r["round"] == "v5.1"]
        # A config in a system folder sources the implementation's common file (the row's BORROWED_SOURCED).
        borrowed = re.search(r"BORROWED_SOURCED=config_common\.sh\(from (\S+?)\)", str(r["other_knobs"]))
        common = borrowed.group(1) if borrowed else f"{config.rsplit('/', 1)[0]}/config_common.sh"
        text = subprocess.run(["git", "-C", mirror, "show", f"HEAD:{common}"], capture_output=True, text=True,
                              check=True).stdout
        assert 'NCCL_CFG_PATH="/workspace/llm/conf/nccl/custom_communicator_cta.yaml"' in text, common


@pytest.mark.parametrize("row", [r for _, r in read_runs_table(resources.data_file(CSV), measured_runs.RUN_COLUMNS)
                                 .iterrows() if not r["skip_reason"]], ids=lambda r: r["id"])
def test_every_submitted_layout_is_a_fitting_candidate_of_the_default_space(row):
    from test_published_layouts import STATED, _check
    knobs = {k: v for k, v in measured_runs._pins(row).items() if k in STATED} | {"gbs": row["gbs"]}
    _check(measured_runs.model_from_row(row), str(row["gpu"]), int(row["num_gpus"]), knobs)


def test_every_submission_is_predicted_to_fit_as_run(predicted):
    """Every knob pinned as submitted (full-iteration graphs' static buffers, FP8 parameters): each fits."""
    assert predicted.fits.all(), list(predicted.id[~predicted.fits])
    assert (predicted.metric == "iteration_time").all()


def test_the_error_is_no_worse_than_reached(predicted):
    for kind, bound in MEAN_REACHED.items():
        assert predicted[predicted.kind == kind].error_pct.abs().mean() <= bound, kind


def test_validate_summarizes_them_apart_per_model_and_gpu(predicted):
    report = predicted.assign(heldout_error_pct=predicted.error_pct)
    groups = validate.summary(report)
    llama = groups[groups.by == "mlperf-llama gpu"]
    assert set(llama.group) == {f"{k.removeprefix('mlperf-llama3.1-')} {g}"
                                for k, g in zip(predicted.kind, predicted.gpu)}
    assert groups[groups.by == "gpu"].empty and groups[groups.by == "source"].empty  # held apart
    assert validate.held_apart(report).all() and llama.rows.sum() == len(predicted)


@pytest.mark.skipif(not all(Path(m).is_dir() for m in MIRRORS), reason="needs the MLCommons results mirrors")
def test_the_extractor_rewrites_the_shipped_csv(tmp_path):
    out = tmp_path / CSV
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "mlperf_pretrain_rows.py"), "--out", str(out)],
                          capture_output=True, text=True, check=True)
    assert out.read_bytes() == resources.data_file(CSV).read_bytes()
    assert "6 AMD results skipped" in done.stdout


def test_nvfp4_rows_run_fp8_attention_at_the_fp8_rate_with_an_fp8_output(prepared):
    """The 8B FP4 configs' FP8_DPA beside NVFP4 Linear layers (TransformerEngine's own FP8 current-scaling
    attention recipe): attention at the FP8 rate, its output kept in FP8 (1 B), not at NVFP4's 0.5625 B."""
    import numpy as np
    from autoparallel.costmodel import layer_time, memory
    from autoparallel.costmodel.candidates import NVFP4_ELEMENT_BYTES, candidates
    p = next(p for p in prepared if p.candidates.iloc[0]["precision"] == "nvfp4" and p.candidates.iloc[0]["fp8_attention"])
    cols = {k: v[:1] for k, v in p.cols.items()}
    on = candidates(p.model, p.hardware, cols)
    off = candidates(p.model, p.hardware, {**cols, "fp8_attention": np.array([False])})
    assert layer_time.attention_time(on)[0] < layer_time.attention_time(off)[0]
    fraction = on.quantized_fraction
    assert on.attention_output_bytes[0] == pytest.approx(memory.gemm_input_bytes(fraction, 1.0)[0])
    assert on.attention_output_bytes[0] != pytest.approx(memory.gemm_input_bytes(fraction, NVFP4_ELEMENT_BYTES)[0])
