"""The MLPerf rows set right by their logs or configs (data/mlperf_corrections.yaml, issues 27 and 23)."""

import pandas as pd
import pytest

from autoparallel import mlperf_corrections, resources
from autoparallel.errors import UserError
from autoparallel.measured_runs import predict_row, read_runs_table

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



def test_red_hats_v40_row_ran_without_userbuffers_as_its_logs_print():
    """Its ten result logs print ub_tp_comm_overlap: false; the CSV had read True from a borrowed
    same-layout config. Without userbuffers there is no pipelined forward reduce-scatter either."""
    rows = read_runs_table(resources.data_file(LORA)).set_index("id")
    red_hat = rows.loc["mlperflora-v4.0-Red_Hat-AS-8125GS-TNHR-RHEL9.4"]
    assert (red_hat.tp, red_hat.cp, red_hat.tp_comm_overlap, red_hat.tp_overlap_rs_pipeline) == (4, 1, 0, 0)

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


def test_the_lora_rows_carry_fp8_attention_and_the_adapter_all_to_all_their_configs_set(mlperf_lora_runs):
    """Issue 27: NVIDIA's v4.0 / v4.1 system configs source a config_common.sh (FP8_DPA=1, LORA_A2A=1)
    that the CSV did not read; the corrections reach the priced rows and the variant they are priced in."""
    rows = read_runs_table(resources.data_file(LORA)).set_index("id")
    eos = rows.loc["mlperflora-v4.0-NVIDIA-eos_ngc24.04_nemo"]
    assert (eos.fp8_attention, eos.lora_a2a) == (1, 1)
    assert rows.loc["mlperflora-v4.0-NVIDIA-h200_ngc24.04_nemo"].fp8_attention == 1
    assert rows.loc["mlperflora-v4.0-Supermicro-AS-8125GS-TNHR_8_H100-SXM-80GB"].fp8_attention == 1
    # v4.1's own configs turn FP8 attention off at CP 2 (FP8_DPA=0 after config_common.sh).
    assert rows.loc["mlperflora-v4.1-NVIDIA-eos_n8_ngc24.09_nemo"].fp8_attention == 0
    assert (rows.lora_a2a == 1).all(), list(rows.index[rows.lora_a2a != 1])
    runs = {r.id: r for r in mlperf_lora_runs}
    assert all(r.model.finetune.lora_a2a for r in runs.values())
    assert "fp8_attention=on[row]" in predict_row(runs["mlperflora-v4.0-NVIDIA-eos_ngc24.04_nemo"])["variant"]


def test_v40s_transformer_engine_runs_context_parallel_attention_in_bf16():
    """TE 1.6 (every v4.0 LoRA image) has no FP8 context-parallel attention: the v4.0 rows at CP 2
    whose configs set FP8_DPA=1 are priced with BF16 attention; CP 1 rows keep FP8 attention."""
    frame = pd.read_csv(resources.data_file(LORA))
    rows = read_runs_table(resources.data_file(LORA)).set_index("id")
    for system in ("eos_n8_ngc24.04_nemo", "eos_n128_ngc24.04_nemo", "SYS-421GE-TNHR2-LCC-8"):
        row = rows[rows.index.str.endswith(system) & rows.index.str.startswith("mlperflora-v4.0-")].iloc[0]
        assert (row.cp, row.fp8_attention) == (2, 0)
    stated = frame[(frame["round"] == "v4.0") & (frame.cp > 1) & frame.other_knobs.str.contains("FP8_DPA=1")]
    assert len(stated) == 2  # HPE n2 and Supermicro's 64 GPUs state it in the CSV itself
