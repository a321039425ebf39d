"""AMD Instinct presets (mi300x, mi325x, mi350x, mi355x) and MLPerf's LoRA rows on them
(mlperf_training_lora_amd.csv): the Infinity Fabric mesh as the collectives see it, the rows read as
the Hopper rows are, predicted and never fitted, and every published layout offered by the search."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoparallel import io, resources
from autoparallel.cli.common import with_seq_length
from autoparallel.cli.finetune import with_finetune
from autoparallel.costmodel import comm, dispatch
from autoparallel.measured_runs import VALIDATION_ONLY_RUNS, default_runs, read_runs_table
from autoparallel.search import run as runs
from autoparallel.space import load_space

AMD = ("mi300x", "mi325x", "mi350x", "mi355x")
CSV = "mlperf_training_lora_amd.csv"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def amd_rows():
    """The CSV as written (MLPerf's columns, not the runs table ``read_runs_table`` makes of it)."""
    return pd.read_csv(resources.data_file(CSV))


@pytest.fixture(scope="module")
def amd_report():
    """validate's in-sample rows of the AMD CSV alone (no refit: none of them is ever fitted)."""
    from autoparallel import validate
    from autoparallel.measured_runs import load_runs
    return validate.validate_training(rows=load_runs([resources.data_file(CSV)]), cross=False)


@pytest.mark.parametrize("name", AMD)
def test_each_preset_is_an_amd_mesh_priced_with_hoppers_constants(name):
    hw = io.load_hardware(name)
    assert hw.vendor == "amd" and hw.scale_up_mesh and hw.scale_up_domain == "8-GPU xGMI domain"
    assert hw.efficiency_from == "h100-sxm" and hw.efficiency == io.load_hardware("h100-sxm").efficiency
    assert hw.fp8_tflops == pytest.approx(2 * hw.bf16_tflops, rel=1e-3)  # dense, FP8 twice BF16
    assert hw.fp4_tflops is None and not hw.mxfp8  # no NVFP4 / TE MX recipe on ROCm
    # CDNA 3 at the sustained FP8 GEMM rate measured against the H100 (tests/test_gpu_speed.py); CDNA 4,
    # with no measurement read against a reference: the datasheet peaks as they stand
    assert (hw.clock_speed < 0.9) if name in ("mi300x", "mi325x") else (hw.clock_speed == 1.0)
    assert "ASSUMPTION" in (resources.SEARCH_SPACES / "hardware" / f"{name}.yaml").read_text()


def test_cdna3_and_cdna4_peaks_are_cus_times_flop_per_clock_times_clock():
    # 304 CUs x 4,096 FP8 FLOP/clk x 2.1 GHz; 256 CUs x 8,192 x 2.4 / 2.2 GHz
    assert io.load_hardware("mi300x").fp8_tflops == pytest.approx(304 * 4096 * 2.1e9 / 1e12, rel=1e-4)
    assert io.load_hardware("mi355x").fp8_tflops == pytest.approx(256 * 8192 * 2.4e9 / 1e12, rel=1e-4)
    assert io.load_hardware("mi350x").fp8_tflops == pytest.approx(256 * 8192 * 2.2e9 / 1e12, rel=1e-4)
    assert [io.load_hardware(n).memory_gib for n in AMD] == [192, 256, 288, 288]


def test_a_mesh_collective_gets_only_the_links_to_its_members():
    """On xGMI a group of n GPUs of the 8-GPU domain reaches n - 1 links of 7; through NVSwitch every
    group reaches the GPU's whole link."""
    mi, h100 = io.load_hardware("mi300x"), io.load_hardware("h100-sxm")
    link = 64e9  # 128 GB/s per link both ways
    assert comm.scale_up_bandwidth(mi, 8) == pytest.approx(7 * link)
    assert comm.scale_up_bandwidth(mi, 2) == pytest.approx(link)
    assert comm.scale_up_bandwidth(mi) == pytest.approx(link)  # a pipeline send: one link
    assert comm.scale_up_bandwidth(h100, 2) == comm.scale_up_bandwidth(h100, 8) == 450e9
    nbytes = 1e9
    # ring reduce-scatter: (n-1)/n of the buffer over (n-1) links = S / (n x link): TP2 pays 4x TP8's time
    t2, t8 = (comm.reduce_scatter_time(mi, nbytes, n, n) for n in (2, 8))
    lat = mi.nvlink_latency_us * 1e-6
    assert (t2 - lat) / (t8 - lat) == pytest.approx(4.0)
    assert comm.p2p_time(mi, nbytes, True) == pytest.approx(nbytes / (link * mi.efficiency.nvlink) + lat)
    # an all-to-all inside the domain: each GPU sends (ep-1)/ep of its bytes, one link per peer
    a2a = dispatch.alltoall_time(mi, nbytes, np.array([4.0]), 1)
    assert a2a[0] == pytest.approx(nbytes / 4 / (link * mi.efficiency.alltoall) + 3 * lat)


def test_the_amd_csv_has_the_hopper_csvs_columns_and_consistent_figures(amd_rows):
    with resources.data_file("mlperf_training_lora_hopper.csv").open() as f:
        hopper = next(csv.reader(f))
    with resources.data_file(CSV).open() as f:
        assert next(csv.reader(f)) == hopper
    assert len(amd_rows) == 28 and set(amd_rows.gpu) == set(AMD)
    assert (amd_rows.model == "llama2-70b-lora").all() and (amd_rows.precision == "fp8-delayed").all()
    tokens = amd_rows.global_batch_size * amd_rows.seq_length / amd_rows.step_time_s / amd_rows.gpus
    assert np.allclose(tokens, amd_rows.tokens_per_s_per_gpu, rtol=1e-3)
    assert amd_rows.how_measured.str.startswith("GBS / mean tracked_stats throughput").all()
    assert amd_rows.source.str.contains(r"@[0-9a-f]{40} config:.* log:.*result_.*\.txt system:").all()
    # every MI300X row (and MangoBoost's 2-node MI325X) recomputes 21 layers in full, as its config sets
    full = amd_rows[amd_rows.recompute == "full"]
    assert set(full.gpu) == {"mi300x", "mi325x"} and full.other_knobs.str.contains("ACG=full; ACM=block; ACL=21").all()
    assert (amd_rows[amd_rows.gpu == "mi300x"].recompute == "full").all()


MIRRORS = [Path(f"/work/.mirror/mlcommons+training_results_{r}/repo") for r in ("v5.0", "v5.1")]


@pytest.mark.skipif(not all(m.is_dir() for m in MIRRORS),  # the script reads both rounds
                    reason="no mirror of both mlcommons/training_results_v5.0 and v5.1 to re-read")
def test_the_script_rewrites_the_csv_byte_for_byte(tmp_path):
    out = tmp_path / CSV
    subprocess.run([sys.executable, str(ROOT / "scripts" / "mlperf_lora_amd_rows.py"), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == resources.data_file(CSV).read_bytes()


def test_the_amd_rows_are_validated_never_fitted_as_their_own_kind(amd_report):
    assert CSV in VALIDATION_ONLY_RUNS and all(CSV != p.name for p in default_runs())
    assert set(amd_report.kind) == {"lora-amd"} and set(amd_report.source) == {"mlperflora"}
    assert amd_report.fits.all()
    from autoparallel import validate
    summary = validate.summary(amd_report)
    assert set(summary.loc[summary.by == "amd gpu", "group"]) == set(AMD)
    assert not {"source", "gpu"} & set(summary.by)  # held apart: no Hopper group moves


def test_every_amd_row_is_priced_in_the_layout_it_ran(amd_report, amd_rows):
    rows = amd_rows.assign(id="mlperflora-" + amd_rows["round"] + "-" + amd_rows.submitter + "-" + amd_rows.system)
    priced = amd_report.set_index("id").loc[rows.id]
    assert len(priced) == len(rows) == len(amd_report)
    assert (priced.recompute.to_numpy() == rows.recompute.to_numpy()).all()
    assert (priced.loc[rows.id[rows.recompute == "full"], "recompute_num_layers"] == 21).all()
    assert (priced.mbs == 1).all()


def _mlperf_lora_search(gpu: str, gpus: int):
    """search --model llama2-70b --gpus N --gpu GPU --finetune lora --lora-rank 16 --lora-targets
    linear_qkv,linear_proj --lora-dropout 0.1 --lora-a2a --packed-sequence --seq-length 8192 --gbs 8:
    the default search space, MLPerf's LoRA settings."""
    flags = argparse.Namespace(finetune="lora", lora_rank=16, lora_targets=("linear_qkv", "linear_proj"),
                               lora_dropout=0.1, lora_a2a=True, fp8_transpose_per_microbatch=None,
                               packed_sequence=True, document_tokens=None)
    model = with_finetune(with_seq_length(io.load_model("llama2-70b"), 8192), flags)
    return runs.search(model, io.load_hardware(gpu), gpus, 8, load_space("training"))


def _published_layouts():
    rows = read_runs_table(resources.data_file(CSV))
    return sorted({(r.gpu, int(r.num_gpus), int(r.tp), int(r.pp), int(r.cp), int(r.mbs)) for r in rows.itertuples()})


@pytest.mark.parametrize("gpu, gpus, tp, pp, cp, mbs", _published_layouts())
def test_every_published_amd_layout_is_offered_as_fitting(gpu, gpus, tp, pp, cp, mbs):
    feasible = _mlperf_lora_search(gpu, gpus).feasible
    match = feasible[(feasible.tp == tp) & (feasible.pp == pp) & (feasible.cp == cp) & (feasible.mbs == mbs)
                     & (feasible.precision == "fp8-delayed")]
    assert not match.empty, f"{gpu} x{gpus}: TP{tp} PP{pp} CP{cp} MBS{mbs} is not offered as fitting"


def test_the_mi355x_search_ranks_amds_layout_first():
    """The MI355X submissions' TP1 PP1 CP1 DP8 (every one of them) is the search's best layout."""
    best = _mlperf_lora_search("mi355x", 8).feasible.iloc[0]
    assert (best.tp, best.pp, best.cp, best.mbs) == (1, 1, 1, 1)


def test_the_cli_search_on_mi355x_offers_amds_layout(capsys):
    from autoparallel.cli import main
    main(["search", "--model", "llama2-70b", "--gpus", "8", "--gpu", "mi355x", "--finetune", "lora",
               "--seq-length", "8192", "--no-save", "--json", "--top", "2000"])
    import json
    ranked = json.loads(capsys.readouterr().out)
    layouts = [(r["config"]["tp"], r["config"]["pp"], r["config"]["cp"], r["config"]["mbs"]) for r in ranked]
    assert (1, 1, 1, 1) in layouts and len(layouts) > 100


def test_mesh_presets_need_two_gpus():
    mi = io.load_hardware("mi300x")
    with pytest.raises(ValueError, match="mesh joins at least 2 GPUs"):
        dataclasses.replace(mi, nvlink_domain=1)


def test_the_amd_rows_leave_every_nvidia_familys_tie_band_alone():
    """The AMD rows price with h100-sxm's constants; their errors are not that family's band."""
    from autoparallel import validate
    report = pd.DataFrame({"gpu": ["h100-sxm", "h100-sxm", "mi300x"], "kind": ["dense", "lora", "lora-amd"],
                           "heldout_error_pct": [5.0, 6.0, -35.0]})
    bands = validate.tie_bands(report)
    assert bands["by_family"] == {"h100-sxm": {"dense": 0.05, "dense_rows": 1, "lora": 0.06, "lora_rows": 1}}
    assert bands["step_time_relative_error"] == 0.05
    assert bands["by_vendor"] == {"amd": {"error": 0.35, "rows": 1}}  # the AMD rows' own band


def test_a_search_on_an_amd_gpu_takes_the_amd_rows_band_not_hoppers():
    """An AMD GPU prices with h100-sxm's constants, but its tie band is the held-out error of the AMD rows
    (prediction_error.yaml's by_vendor), for any model; an NVIDIA GPU of that family keeps its own."""
    from autoparallel.report.tables import prediction_error
    shipped = prediction_error()
    amd = shipped.by_vendor["amd"]
    for name in AMD:
        band = shipped.for_model(io.load_hardware(name), io.load_model("llama3-8b"))
        assert band.step_time_relative_error == amd["error"] and "amd" in band.source
    h100 = shipped.for_model(io.load_hardware("h100-sxm"), io.load_model("llama3-8b"))
    assert h100.step_time_relative_error == shipped.by_family["h100-sxm"]["dense"] != amd["error"]
