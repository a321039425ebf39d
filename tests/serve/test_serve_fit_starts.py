"""The serving fit does not depend on its start (session 41): least squares from one start stopped
in the minimum its start lay in, and a held-out figure moved by up to 7 points with the start. The
fit now also tries fixed starts that depend on no row and keeps the lowest training cost."""

import numpy as np
import pytest

from autoparallel.costmodel.inference import InferenceEfficiency
from autoparallel.serve import fit as F
from autoparallel.serve.measured import load_serving_runs
from autoparallel.serve.validate import efficiency_for


def test_extra_starts_are_fixed_points_inside_the_bounds():
    for keys in F.FIT_KEYS.values():
        a, b = F.extra_starts(keys), F.extra_starts(keys)
        assert a.shape == (F.EXTRA_STARTS, len(keys)) and np.array_equal(a, b)  # no data, no clock: the same
        lo, hi = (np.array([F.BOUNDS[k][i] for k in keys]) for i in (0, 1))
        assert ((a > lo) & (a < hi)).all()
        assert np.array_equal(F.extra_starts(keys, F.EXTRA_STARTS + 1)[:F.EXTRA_STARTS], a)  # nested


@pytest.mark.slow
def test_fit_does_not_depend_on_its_start():
    """TensorRT-LLM 0.10 without Falcon-180B's rows (a LOMO refit): from the uncalibrated constants
    one least-squares run stops at a training cost ~19 % above the one from the shipped constants
    (0.855 vs 0.718; 0.12's Falcon-180B refit, the case first pinned here, stopped ~25 % apart until
    the one-GPU KV pool of session 41 moved its minima together); the multi-start fit reaches the
    same cost from either start."""
    m = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm-0.10")
    train = F.fit_rows(m)
    rows = train[train["model"] != "Falcon-180B"]
    starts = (InferenceEfficiency(), efficiency_for("tensorrt-llm-0.10"))
    single = [F.training_cost(m, rows, F.fit(m, rows, s, extra=0)) for s in starts]
    assert abs(single[0] - single[1]) > 0.1 * min(single)  # the problem this guards: one start, two minima
    multi = [F.training_cost(m, rows, F.fit(m, rows, s)) for s in starts]
    assert multi[0] == pytest.approx(multi[1], rel=1e-3)
    assert max(multi) <= min(single) * (1 + 1e-3)


def test_a_constant_starting_at_zero_is_scaled_by_its_bounds():
    """The scale least squares steps each constant by is max(|start|, ``magnitude_floor``): the lower
    bound, or the upper bound's three decades below it where that is 0 (``pass_overhead_us``: 20 us,
    not the former 1e-3 us for a 20 ms range)."""
    keys = F.FIT_KEYS["inflight"]
    floor = dict(zip(keys, F.magnitude_floor(keys)))
    assert floor["pass_overhead_us"] == pytest.approx(20.0) and floor["hbm"] == F.BOUNDS["hbm"][0]
    assert (F.extra_starts(keys) >= F.magnitude_floor(keys)).all()


@pytest.mark.slow
def test_the_cold_mlperf_refit_reaches_the_lower_minimum_from_its_own_start():
    """TensorRT-LLM 0.12 without Llama-2-70B (MLPerf's LOMO refit): one least-squares run from the
    uncalibrated constants stopped at a training cost of 0.2849 with the 1e-3 scale floor (the
    minimum s41h1 found); scaled by the bounds it reaches 0.2767, the fixed starts' lowest."""
    m = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm")
    train = F.fit_rows(m)
    rows = train[train["model"] != "Llama-2-70B"]
    costs = []
    F.fit(m, rows, InferenceEfficiency(), costs=costs)
    assert costs[0] == pytest.approx(0.2767, abs=2e-4)
    assert costs[0] <= min(costs) * (1 + 1e-3)
