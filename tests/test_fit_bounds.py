"""Fits that land on a bound are reported (issue 28 item 3): ``costmodel.bounds``, ``calibrate``
(its fit result and ``--json``) and ``serve.fit`` (its warnings and ``--json``)."""

import json

import numpy as np
import pytest

from autoparallel.costmodel import calibrate
from autoparallel.costmodel.bounds import at_bounds
from autoparallel.serve import fit as serve_fit


def test_at_bounds_finds_each_side_in_the_space_the_fit_searches():
    bounds = {"a": (0.1, 0.9), "b": (0.0, 100.0), "c": (1.0, 20.0)}
    hits = at_bounds({"a": 0.9, "b": 0.05, "c": 10.0, "unbounded": 5.0}, bounds, log=False)
    assert [(h.name, h.side, h.bound) for h in hits] == [("a", "upper", 0.9), ("b", "lower", 0.0)]
    # In log space 0.1001 is next to 0.1 and 0.2 is not; in linear space 0.0995 of 100 is next to 0.
    assert [h.name for h in at_bounds({"a": 0.1001}, bounds, log=True)] == ["a"]
    assert at_bounds({"a": 0.2}, bounds, log=True) == []
    assert "a = 0.9 is at its upper bound 0.9" in hits[0].message()


def test_a_least_squares_fit_pushed_past_a_bound_reports_it():
    # The rows want x = 2, the bound stops it at 0.95; y fits inside its bounds.
    result = calibrate._least_squares(["x", "y"], [(0.1, 0.95), (0.1, 10.0)], [0.5, 1.0],
                                      lambda v: np.array([np.log(v["x"] / 2.0), np.log(v["y"] / 3.0)]), 2)
    assert [(h.name, h.side) for h in result.at_bounds] == [("x", "upper")]
    assert result.values["y"] == pytest.approx(3.0, rel=1e-3)


def test_calibrate_json_carries_the_constants_at_a_bound(capsys):
    from autoparallel import cli
    assert cli.main(["calibrate", "--gpu", "a100-sxm-80g", "--dry-run", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["rows"] >= 10 and out["after_mean_abs_error_pct"] <= out["before_mean_abs_error_pct"] + 0.1
    # A100's attention sits at its cap of 0.9 (issue 28): the JSON and the warning say so.
    assert {"name": "attention", "side": "upper", "bound": 0.9} == {k: v for k, v in out["at_bounds"][0].items()
                                                                     if k != "value"}
    assert "warning: attention" in captured.err


@pytest.fixture(scope="module")
def serve_fits():
    """``serve_fit.fit_all`` printing to a recording console (~20 s: once for both tests below):
    the fits and what it printed."""
    from rich.console import Console
    console = Console(record=True, width=200)
    fits = serve_fit.fit_all(console)
    return fits, console.export_text()


def test_serve_fit_warns_and_json_carries_the_bounds(capsys, monkeypatch, serve_fits):
    fits, _ = serve_fits
    monkeypatch.setattr(serve_fit, "fit_all", lambda console=None: fits)
    assert serve_fit.main(["--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"fastertransformer", "tensorrt-llm-0.10", "tensorrt-llm"}
    for name, (eff, _, hits) in fits.items():
        assert out[name]["at_bounds"] == [h.as_dict() for h in hits]
        assert out[name]["constants"]["hbm"] == eff.hbm
    # TensorRT-LLM 0.12: attention at 100 % of peak, overheads and elementwise traffic at zero.
    names = {h["name"] for h in out["tensorrt-llm"]["at_bounds"]}
    assert {"attention", "layer_overhead_us", "pass_overhead_us", "elementwise_bytes_per_token_hidden"} <= names


def test_serve_fit_prints_a_warning_per_constant_at_a_bound(serve_fits):
    fits, text = serve_fits
    assert text.count("warning:") == sum(len(hits) for _, _, hits in fits.values()) > 0
