"""Verdicts inside the search: rejected recipes leave the space, BF16 layers become edge-layer
requirements or an exported layer list, the verdict shows in the table and best.yaml."""

import subprocess
import sys

import pytest

from autoparallel import io
from autoparallel.errors import UserError
from autoparallel.fp8check.search_filter import (OK, OK_BF16, REJECT, apply_to_candidates,
                                                 compress, decide, restrict_space)
from autoparallel.report.tables import markdown_table
from autoparallel.search import run
from autoparallel.space import SearchSpace, generate


def test_decide_maps_proxy_layers_onto_the_model():
    edge = decide("fp8-current", OK_BF16, "ok with BF16 layers [3]", (3,), 4, 80)
    assert edge.status == OK_BF16 and edge.edge_layers == 1 and edge.bf16_layers == ()
    middle = decide("fp8-blockwise", OK_BF16, "ok with BF16 layers [1]", (1,), 4, 80)
    assert middle.edge_layers == 0 and middle.bf16_layers == tuple(range(20, 40))
    assert middle.verdict == "ok with BF16 layers 20-39"
    delayed = decide("fp8-delayed", OK_BF16, "ok with BF16 layers [0]", (0,), 4, 80)
    assert delayed.status == REJECT and "delayed scaling" in delayed.reason
    assert decide("fp8-current", OK, "ok", (), 4, 80).status == OK
    rejected = decide("fp8-current", REJECT, "reject: overflow", (), 4, 80, "overflow 90 %")
    assert rejected.status == REJECT and rejected.reason == "overflow 90 %"
    assert compress((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_restrict_space_drops_rejected_and_adds_needed_edges():
    space = SearchSpace(precision=("bf16", "fp8-delayed", "fp8-current"), fp8_bf16_edge_layers=(0,))
    decisions = {"fp8-delayed": decide("fp8-delayed", REJECT, "reject: x", (), 4, 80, "x"),
                 "fp8-current": decide("fp8-current", OK_BF16, "", (0,), 4, 80)}
    out = restrict_space(space, decisions)
    assert out.precision == ("bf16", "fp8-current") and out.fp8_bf16_edge_layers == (0, 1)
    only = SearchSpace(precision=("fp8-delayed",))
    with pytest.raises(UserError, match="rejected every precision"):
        restrict_space(only, decisions)


def test_rows_below_the_needed_edge_layers_are_rejected_with_a_reason(gpt175b, h100):
    space = io.from_dict(SearchSpace, {"tp": [8], "pp": [8], "vp": [1], "mbs": [1],
                                       "recompute": ["full"], "sp": [True],
                                       "precision": ["bf16", "fp8-current", "fp8-blockwise"],
                                       "fp8_bf16_edge_layers": [0, 1]}, "test")
    decisions = {"fp8-current": decide("fp8-current", OK_BF16, "", (0,), 4, 96),
                 "fp8-blockwise": decide("fp8-blockwise", OK_BF16, "", (2,), 4, 96)}
    cands = apply_to_candidates(generate(gpt175b, h100, 512, 2048, space), decisions)
    current = cands[cands.precision == "fp8-current"]
    assert set(current[current.fp8_bf16_edge_layers == 0].reason) == {
        "fp8-check: fp8-current needs the first/last 1 layer(s) in BF16"}
    assert set(current[current.fp8_bf16_edge_layers == 1].reason) == {""}
    block = cands[cands.precision == "fp8-blockwise"]
    assert set(block.fp8_bf16_layers) == {"48-71"} and (block.reason == "").all()
    assert set(cands[cands.precision == "bf16"].fp8_check) == {"-"}


def test_search_with_decisions_shows_verdict_in_table_and_best_yaml(gpt175b, h100):
    space = io.from_dict(SearchSpace, {"tp": [8], "pp": [8], "vp": [1], "mbs": [1],
                                       "recompute": ["full"], "sp": [True],
                                       "precision": ["fp8-current", "fp8-blockwise"],
                                       "fp8_bf16_edge_layers": [0]}, "test")
    decisions = {"fp8-current": decide("fp8-current", OK_BF16, "", (3,), 4, 96),
                 "fp8-blockwise": decide("fp8-blockwise", OK_BF16, "", (1,), 4, 96)}
    space = restrict_space(space, decisions)
    result = run.search(gpt175b, h100, 512, 2048, space, fp8_decisions=decisions)
    feasible = result.feasible
    assert not feasible.empty
    current = feasible[feasible.precision == "fp8-current"]
    assert (current.fp8_bf16_edge_layers >= 1).all()
    table = markdown_table(result.ranked, 5)
    assert "FP8 check" in table.splitlines()[2] and "ok with BF16" in table
    doc = run.plan_document(gpt175b, h100, feasible.iloc[0])
    block = doc["fp8_check"]
    if feasible.iloc[0].precision == "fp8-current":
        assert block["bf16_edge_layers"] == 1 and "--num-layers-at-start-in-bf16 1" in doc["megatron_args"]
    else:
        assert block["bf16_layers"] == "24-47" and "note" in block
    plain = run.search(gpt175b, h100, 512, 2048, space)
    assert "FP8 check" not in markdown_table(plain.ranked, 5)
    assert "fp8_check" not in run.plan_document(gpt175b, h100, plain.feasible.iloc[0])


def test_search_without_fp8_check_never_imports_torch(tmp_path):
    code = ("import sys; from autoparallel.cli import main; "
            "rc = main(['search', '--model', 'gpt3-5b', '--gpus', '64', '--no-save', '--json', "
            "'--top', '1']); assert rc == 0; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'autoparallel.fp8check.check' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
