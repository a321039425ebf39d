"""MLPerf Training's Llama-2-70B LoRA submissions on Blackwell (v5.0 and v5.1, B200 / B300 / GB200 /
GB300): the rows scripts/mlperf_lora_rows.py writes (autoparallel/data/mlperf_training_lora_blackwell.csv),
how validate reads them (kind lora-blackwell, held apart), and that the search offers each layout.

Their errors in validate's report are pinned in tests/test_validate.py (the full report is computed
there once)."""

from __future__ import annotations

import argparse
import os

import pandas as pd
import pytest

from autoparallel import io, resources, validate
from autoparallel.cli.common import with_seq_length
from autoparallel.cli.finetune import with_finetune
from autoparallel.measured_runs import VALIDATION_ONLY_RUNS, load_runs, predict_row, read_runs_table
from autoparallel.search import run as runs
from autoparallel.space import load_space

BLACKWELL = "mlperf_training_lora_blackwell.csv"


@pytest.fixture(scope="module")
def raw():
    return pd.read_csv(resources.data_file(BLACKWELL))


@pytest.fixture(scope="module")
def rows():
    return read_runs_table(resources.data_file(BLACKWELL)).set_index("id")


@pytest.fixture(scope="module")
def prepared():
    return load_runs([resources.data_file(BLACKWELL)])


def test_the_file_holds_every_blackwell_submission_in_the_hopper_files_columns(raw):
    """58 systems of v5.0 and v5.1 (the 59th, Dell's v5.1 2xXE9685L, has no log blob in the results
    mirror; 29 AMD systems skipped), every Blackwell GPU, each row citing its config, log and system."""
    hopper = pd.read_csv(resources.data_file("mlperf_training_lora_hopper.csv"), nrows=0)
    assert list(raw.columns) == list(hopper.columns)
    assert len(raw) == 58 and set(raw.gpu) == {"b200", "b300", "gb200", "gb300"}
    assert set(raw["round"]) == {"v5.0", "v5.1"} and not raw.duplicated(["round", "submitter", "system"]).any()
    assert raw.source.str.fullmatch(r"github\.com/mlcommons/training_results_v5\.[01]@[0-9a-f]{40} "
                                    r"config:\S+\.sh log:\S+result_\d+\.txt system:\S+\.json").all()
    assert (raw.model == "llama2-70b-lora").all() and (raw.seq_length == 8192).all()
    assert set(raw.precision) == {"fp8-delayed", "nvfp4"}
    # GBS = MINIBS x GPUs / (TP x PP x CP) with MINIBS = MBS x gradient accumulation.
    assert ((raw.gpus // (raw.tp * raw.pp * raw.cp)) <= raw.global_batch_size).all()
    assert raw.how_measured.str.startswith("median over").all()


def test_rows_layouts_match_the_configs_they_ran(raw):
    """Read by hand from the configs: NVIDIA's v5.1 GB200 8-GPU row ran config_GB200_2x4x2xtp1pp1cp2_fp4.sh
    (CP2, MINIBS 2: GBS 8 with 2 micro-batches, NVFP4 until step 350, full-iteration CUDA graph), its
    v5.0 72-GPU row config_GB200_18x4x1xtp1pp1cp8.sh (CP8, GBS 9, MCore's per-layer graphs), Dell's
    v5.0 GB200 rows no config of their own (same layout as NVIDIA's, CP from the log's batch)."""
    by = raw.set_index(raw["round"] + " " + raw.submitter + " " + raw.system)
    fp4 = by.loc["v5.1 NVIDIA tyche_ngpu8_ngc25.09_nemo"]
    assert (fp4.gpu, fp4.gpus, fp4.tp, fp4.cp, fp4.global_batch_size, fp4.precision) == ("gb200", 8, 1, 2, 8, "nvfp4")
    assert "config_GB200_2x4x2xtp1pp1cp2_fp4.sh" in fp4.source
    assert "HEALING_ITER=350" in fp4.other_knobs and "CUDA_GRAPH_SCOPE=full_iteration" in fp4.other_knobs
    cp8 = by.loc["v5.0 NVIDIA tyche_ngpu72_ngc25.04_nemo"]
    assert (cp8.gpus, cp8.tp, cp8.cp, cp8.global_batch_size, cp8.precision) == (72, 1, 8, 9, "fp8-delayed")
    assert "MCORE_CUDA_GRAPH=1" in cp8.other_knobs and "CUDA_GRAPH_SCOPE" not in cp8.other_knobs
    assert "FP8_PARAMS=True" in cp8.other_knobs and "CP_COMM_TYPE=a2a" in cp8.other_knobs
    dell = by.loc["v5.0 Dell 8xXE9712x4GB200"]
    assert (dell.gpus, dell.cp, dell.global_batch_size) == (32, 4, 8) and "same-layout config" in dell.other_knobs
    # Every Blackwell config of both rounds is TP1 PP1 MBS1 without SP: the batch is data parallel x CP.
    assert (raw.tp == 1).all() and (raw.pp == 1).all() and (raw.micro_batch_size == 1).all() and not raw.sp.any()


def test_the_config_reader_follows_sources_and_nemos_defaults(script_module):
    """scripts/mlperf_lora_rows.py's shell reader on a two-file folder: the config's ``source`` of
    config_common.sh read first, ``${VAR:-default}`` substituted, NeMo's GBS formula applied."""
    module = script_module("mlperf_lora_rows")

    class Files:
        files = ["S/benchmarks/llama2_70b_lora/impl/config_common.sh", "S/benchmarks/llama2_70b_lora/impl/config_X.sh"]
        file_set = set(files)
        texts = {files[0]: "export FP8=True\nexport FP8_DPA=1 # on\nexport TP=1\nexport CP=1\n",
                 files[1]: ("source $(dirname ${BASH_SOURCE[0]})/config_common.sh\nexport MINIBS=2\n"
                            "export CP=${CP_OVERRIDE:-2}\nexport DGXNNODES=2\nexport DGXNGPU=4\n"
                            "export WALLTIME=$((5 + 10))\n")}

        def show(self, path):
            return self.texts.get(path)
    env = module.shell_env(Files(), Files.files[1])
    assert (env["FP8_DPA"], env["CP"], env["WALLTIME"]) == ("1", "2", "15")
    lay = module.layout(env)
    assert (lay["gpus"], lay["cp"], lay["gbs"], lay["ga"], lay["fp8_dpa"], lay["fp4"]) == (8, 2, 8, 2, True, False)


@pytest.mark.skipif(not all(os.path.isdir(d) for d in (
    "/work/.mirror/mlcommons+training_results_v5.0/repo", "/work/.mirror/mlcommons+training_results_v5.1/repo")),
    reason="the MLCommons results mirrors are not on this machine")
def test_the_script_rewrites_the_shipped_file_byte_for_byte(tmp_path, script_module):
    out = tmp_path / BLACKWELL
    script_module("mlperf_lora_rows").main(["--out", str(out)])
    assert out.read_bytes() == resources.data_file(BLACKWELL).read_bytes()


def test_validate_reads_them_as_run_held_apart_and_never_fitted(rows, prepared):
    assert BLACKWELL in VALIDATION_ONLY_RUNS
    assert len(prepared) == 58 and {p.kind for p in prepared} == {"lora-blackwell"}
    assert all(p.validation_only and p.family == "b200" for p in prepared)
    assert "lora-blackwell" in validate.HELD_APART_KINDS
    # The FP4 rows stay NVFP4 with their FP8 (delayed-scaling) attention; the CUDA graphs and TE's
    # all-to-all CP as the configs state them.
    fp4 = rows.loc["mlperflora-v5.1-NVIDIA-tyche_ngpu8_ngc25.09_nemo"]
    assert (fp4.precision, fp4.fp8_attention, fp4.cuda_graph, fp4.cp_comm_type) == ("nvfp4", 1, "full_iteration", "a2a")
    v50 = rows.loc["mlperflora-v5.0-NVIDIA-tyche_ngpu72_ngc25.04_nemo"]
    assert (v50.precision, v50.cuda_graph, v50.cp, v50.fp8_param_gather) == ("fp8-delayed", "layer", 8, 1)
    assert (rows.precision == "nvfp4").sum() == 7
    # Their conf runs no DP overlap (ddp overlap_grad_reduce / overlap_param_gather False, set by no
    # config); the Hopper rows' NeMo 1 distributed Adam overlaps, as before.
    assert (rows.overlap_grad_reduce == 0).all() and (rows.overlap_param_gather == 0).all()
    hopper = read_runs_table(resources.data_file("mlperf_training_lora_hopper.csv"))
    assert (hopper.overlap_grad_reduce == 1).all() and hopper.overlap_param_gather.isna().all()


def test_every_row_is_predicted_to_fit(prepared):
    report = pd.DataFrame([predict_row(p) for p in prepared])
    assert report.fits.all(), list(report.id[~report.fits])
    assert (report.metric == "iteration_time").all()


def _lora_model():
    flags = argparse.Namespace(finetune="lora", lora_rank=16, lora_targets=("linear_qkv", "linear_proj"),
                               lora_dropout=0.1, lora_a2a=True, fp8_transpose_per_microbatch=None,
                               packed_sequence=True, document_tokens=None)
    return with_finetune(with_seq_length(io.load_model("llama2-70b"), 8192), flags)


def test_every_published_layout_is_a_fitting_candidate_of_the_default_search_space(raw):
    """Each distinct layout (GPU, GPUs, GBS, TP, PP, CP, MBS, precision) is one the default training
    space holds, and the search over that space, pinned to it (recompute none, as every row ran),
    offers it as fitting (without the CUDA graphs and FP8 attention the default space does not offer)."""
    default = load_space("training")
    model = _lora_model()
    layouts = raw[["gpu", "gpus", "global_batch_size", "tp", "pp", "cp", "micro_batch_size", "precision"]]
    for gpu, gpus, gbs, tp, pp, cp, mbs, precision in layouts.drop_duplicates().itertuples(index=False):
        assert tp in default.tp and pp in default.pp and cp in default.cp and mbs in default.mbs
        assert precision in default.precision and "none" in default.recompute
        space = default.pinned(tp=int(tp), pp=int(pp), cp=int(cp), mbs=int(mbs), precision=precision, recompute="none")
        result = runs.search(model, io.load_hardware(gpu), int(gpus), int(gbs), space)
        assert not result.feasible.empty, (gpu, gpus, gbs, tp, cp, precision, result.ranked.reason.unique())


def test_the_summary_reports_them_per_gpu_of_their_own():
    """A kind of their own and one group per GPU ("lora-blackwell gpu"), out of the per-source,
    per-GPU and per-system groups that describe the fitted rows."""
    report = pd.DataFrame({"id": ["a", "b", "c"], "kind": ["lora", "lora-blackwell", "lora-blackwell"],
                           "source": ["mlperflora"] * 3, "gpu": ["h100-sxm", "gb200", "b200"],
                           "error_pct": [1.0, -10.0, 20.0], "fits": [True] * 3})
    s = validate.summary(report).set_index(["by", "group"])
    assert s.loc[("kind", "lora-blackwell"), "rows"] == 2
    assert s.loc[("lora-blackwell gpu", "gb200"), "mean_abs_error_pct"] == 10.0
    assert s.loc[("source", "mlperflora"), "rows"] == 1 and ("gpu", "gb200") not in s.index


def test_a_lora_search_on_blackwell_takes_the_blackwell_lora_band():
    """Once prediction_error.yaml holds the b200 family's lora-blackwell band (validate --tie-bands),
    a LoRA search on any Blackwell GPU ranks with it; Hopper keeps its lora band, dense runs theirs."""
    from autoparallel.report.tables import PredictionError
    error = PredictionError(0.05, "test", by_family={"b200": {"dense": 0.04, "dense_rows": 9, "lora-blackwell": 0.078,
                                                              "lora-blackwell_rows": 58},
                                                     "h100-sxm": {"lora": 0.06, "lora_rows": 40}})
    gb300, h100 = io.load_hardware("gb300"), io.load_hardware("h100-sxm")
    assert error.for_hardware(gb300, lora=True).step_time_relative_error == 0.078
    assert "58 lora-blackwell rows of the b200 family" in error.for_hardware(gb300, lora=True).source
    assert error.for_hardware(gb300).step_time_relative_error == 0.04
    assert error.for_hardware(h100, lora=True).step_time_relative_error == 0.06
