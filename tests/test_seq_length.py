"""--seq-length on search and estimate (issue 23 item 6): a training sequence length other than
the preset's changes FLOPs, memory, the CP choices and the export, and nothing else."""

from __future__ import annotations

import json

import pytest

from autoparallel import io
from autoparallel.cli import main
from autoparallel.cli.common import with_seq_length
from autoparallel.errors import UserError
from autoparallel.space import generate, load_space

ESTIMATE = ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "2", "--json"]


def _estimate(capsys, *extra: str) -> dict:
    assert main([*ESTIMATE, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_longer_sequences_cost_more_per_token_and_more_memory(capsys):
    """Doubling s doubles the tokens of a step; attention's s^2 term makes each token dearer and the
    activations of one micro-batch grow with s."""
    short, long = _estimate(capsys), _estimate(capsys, "--seq-length", "16384")
    assert long["step_time_s"] > 2 * short["step_time_s"]
    assert long["tokens_per_s_per_gpu"] < short["tokens_per_s_per_gpu"]
    activations = [r["breakdown"]["memory_gib"]["activations_gib"] for r in (short, long)]
    assert activations[1] == pytest.approx(2 * activations[0], rel=0.05)


def test_the_preset_length_given_changes_nothing(capsys):
    assert _estimate(capsys, "--seq-length", "8192") == _estimate(capsys)


def test_cp_sizes_follow_the_sequence_length():
    """Megatron needs s divisible by 2*cp: 8200 tokens allow cp 2 (4100) but not cp 8."""
    model = with_seq_length(io.load_model("llama3-8b"), 8200)
    space = load_space("training").pinned(tp=1, pp=1, mbs=1)
    out = generate(model, io.load_hardware("h100-sxm"), 64, 64, space)
    reasons = out.groupby("cp").reason.apply(lambda r: (r == "").any())
    assert reasons[2] and not reasons[8]


def test_a_length_past_the_position_range_is_refused():
    with pytest.raises(UserError, match=r"--seq-length 131073 is above llama3.1-8b's max_position_embeddings 131072"):
        with_seq_length(io.load_model("llama3.1-8b"), 131073)


def test_a_model_without_a_position_range_takes_any_length_and_exports_it():
    from autoparallel.report.export import megatron_args
    from autoparallel.specs.plan import Plan
    model = with_seq_length(io.load_model("gpt3-175b"), 4096)
    assert model.seq_length == model.context_length == 4096
    text = " ".join(megatron_args(model, Plan(tp=8, pp=8, dp=1, gbs=8, mbs=1)))
    assert "--seq-length 4096" in text and "--max-position-embeddings 4096" in text

