"""The MLPerf rows set right by their logs (data/mlperf_log_corrections.yaml, issue 27)."""

import pandas as pd
import pytest

from autoparallel import log_corrections, resources
from autoparallel.errors import UserError
from autoparallel.measured_runs import read_runs_table

LORA = "mlperf_training_lora_hopper.csv"


def test_every_correction_names_one_published_row():
    frames = [pd.read_csv(resources.data_file(n)) for n in (LORA, "mlperf_training_gpt3.csv")]
    assert log_corrections.unmatched(frames) == []


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
    out = log_corrections.apply(_frame(), [entry])
    assert (out.tp[0], out.sp[0], out.other_knobs[0]) == (1, False, "LORA_FINETUNE(rank=16); FP8_DPA=0")


@pytest.mark.parametrize("change", [{"set": {"tp": "2 -> 1"}}, {"knobs": {"FP8_DPA": "0 -> 1"}}])
def test_a_correction_the_csv_no_longer_needs_fails(change):
    entry = {"round": "v5.0", "submitter": "X", "system": "S", **change}
    with pytest.raises(UserError, match="mlperf_log_corrections.yaml: v5.0 X S expects"):
        log_corrections.apply(_frame(), [entry])
