"""The MLPerf rows set right by their logs or configs (data/mlperf_corrections.yaml, issues 27 and 23)."""

import pandas as pd
import pytest

from autoparallel import mlperf_corrections, resources
from autoparallel.errors import UserError
from autoparallel.measured_runs import read_runs_table

LORA = "mlperf_training_lora_hopper.csv"


def test_every_correction_names_one_published_row():
    frames = [pd.read_csv(resources.data_file(n)) for n in (LORA, "mlperf_training_gpt3.csv")]
    assert mlperf_corrections.unmatched(frames) == []


def test_oracles_h200_row_is_priced_as_its_log_ran_it():
    rows = read_runs_table(resources.data_file(LORA)).set_index("id")
    oracle = rows.loc["mlperflora-v5.0-Oracle-1xBM.GPU.H200.8"]
    assert (oracle.tp, oracle.cp, oracle.sp, oracle.fp8_attention) == (1, 2, 0, 0)
    dell = rows.loc["mlperflora-v5.1-Dell-1xXE9680Lx8H200-SXM-141GB"]
    assert (dell.tp, dell.cp, dell.sp, dell.tp_comm_overlap, dell.fp8_attention) == (2, 1, 1, 0, 1)


def _frame():
    return pd.DataFrame({"round": ["v5.0"], "submitter": ["X"], "system": ["S"], "tp": [4], "sp": [True],
                         "other_knobs": ["LORA_FINETUNE(rank=16); FP8_DPA=1"]})


def test_a_correction_sets_columns_and_knobs():
    entry = {"round": "v5.0", "submitter": "X", "system": "S", "set": {"tp": "4 -> 1", "sp": "True -> False"},
             "knobs": {"FP8_DPA": "1 -> 0"}}
    out = mlperf_corrections.apply(_frame(), [entry])
    assert (out.tp[0], out.sp[0], out.other_knobs[0]) == (1, False, "LORA_FINETUNE(rank=16); FP8_DPA=0")


@pytest.mark.parametrize("change", [{"set": {"tp": "2 -> 1"}}, {"knobs": {"FP8_DPA": "0 -> 1"}}])
def test_a_correction_the_csv_no_longer_needs_fails(change):
    entry = {"round": "v5.0", "submitter": "X", "system": "S", **change}
    with pytest.raises(UserError, match="mlperf_corrections.yaml: v5.0 X S expects"):
        mlperf_corrections.apply(_frame(), [entry])


def test_a_correction_adds_a_knob_the_csv_left_out_and_refuses_one_it_has():
    entry = {"round": "v5.0", "submitter": "X", "system": "S", "knobs": {"FP8_PARAMS": "unset -> True"}}
    out = mlperf_corrections.apply(_frame(), [entry])
    assert out.other_knobs[0] == "LORA_FINETUNE(rank=16); FP8_DPA=1; FP8_PARAMS=True"
    with pytest.raises(UserError, match="expects no FP8_DPA"):
        mlperf_corrections.apply(_frame(), [{**entry, "knobs": {"FP8_DPA": "unset -> 0"}}])


def test_the_gpt3_rows_carry_what_their_configs_state():
    rows = read_runs_table(resources.data_file("mlperf_training_gpt3.csv")).set_index("id")
    assert rows.loc["mlperf-v4.0-NVIDIA-eos-dfw_n1344_ngc24.04_nemo"].fp8_param_gather
    assert not rows.loc["mlperf-v3.1-NVIDIA-eos_n64_ngc23.09_nemo"].fp8_param_gather
