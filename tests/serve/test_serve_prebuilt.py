"""What the serving fits build once and reprice per trial (session 46): the rows' in-flight steady
state (``InflightBatch``) and static batches (``StaticBatch``) up to the constants, and the LOMO
refits ``validate --inference`` shares between its tables (``fit.shared_refits``). Each must give
exactly what a fresh computation gives: bit for bit, under any constants, for the rows it was
built from and no others."""

import dataclasses

import numpy as np
import pytest

from autoparallel.costmodel.inference import (InferenceEfficiency, estimate_static_columns, layout, pass_work,
                                              price_pass, stage_pass)
from autoparallel.costmodel.inflight import InflightBatch, estimate_inflight_columns
from autoparallel.serve import fit as F
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.measured import groups, load_fastertransformer, load_serving_runs, predict, predicted_values


def _trials(engine: str) -> list[InferenceEfficiency]:
    """The shipped constants, then each fitted constant moved alone (a prebuilt part that read one
    would price it stale), then the shipped ones again (nothing carried over between trials)."""
    shipped = efficiency_for(engine)
    keys = dict.fromkeys(F.FIT_KEYS["inflight"] + F.FIT_KEYS["static"])
    moved = [dataclasses.replace(shipped, **{k: float(np.sqrt(F.BOUNDS[k][0] * F.BOUNDS[k][1])
                                                   if F.BOUNDS[k][0] > 0 else F.BOUNDS[k][1] / 3)}) for k in keys]
    moved.append(dataclasses.replace(shipped, p2p_latency_us=300.0))  # not fitted, still priced
    return [shipped, *moved, InferenceEfficiency(), shipped]


def _fresh(measured, eff, g) -> np.ndarray:
    """The published metric of one group priced from scratch (no prebuilt state)."""
    engine = measured.engine
    if engine.batching == "static":
        return estimate_static_columns(g.model, g.hw, eff, g.cols, measured.memory_fraction,
                                       decode_steps=g.decode_steps, microbatching=engine.microbatching,
                                       flash_attention=engine.flash_attention)["latency_s"] * 1e3
    return estimate_inflight_columns(g.model, g.hw, eff, engine, g.cols)["output_tokens_per_s_per_replica"]


@pytest.mark.parametrize("engine", ["fastertransformer", "tensorrt-llm-0.10", "tensorrt-llm"])
def test_prebuilt_groups_price_every_trial_as_a_fresh_computation(engine):
    """The fit's groups are built once and priced under every trial's constants: each trial's
    predictions equal, bit for bit, the cost model's run from scratch on those rows; and every
    constant the engine's fit moves changes them (none is frozen into what is built once)."""
    measured = next(m for m in [load_fastertransformer(), *load_serving_runs()] if m.engine.name == engine)
    rows = measured.predicted_rows
    parts = groups(measured, rows)
    shipped = predicted_values(measured, efficiency_for(engine), parts, len(rows))
    for eff in _trials(engine):
        fresh = np.empty(len(rows))
        for g in groups(measured, rows):
            fresh[g.positions] = _fresh(measured, eff, g)
        prebuilt = predicted_values(measured, eff, parts, len(rows))
        assert prebuilt.tobytes() == fresh.tobytes()
        fitted = F.FIT_KEYS[measured.engine.batching]
        moved = {k for k in fitted if getattr(eff, k) != getattr(efficiency_for(engine), k)}
        assert len(moved) != 1 or not np.array_equal(prebuilt, shipped), moved
    # ``predict`` (the reports' path: every column, not the fit's throughput alone) at the last trial
    assert predict(measured, eff)["predicted"].to_numpy().tobytes() == fresh.tobytes()


def test_an_inflight_batch_reprices_loaded_rows_as_a_fresh_one(llama2, trtllm):
    """Rows under a request rate (the bisection) and saturated ones, priced by one batch under two
    constants in turn, give every output of a batch built for each."""
    from autoparallel import io
    hw = io.load_hardware("h100-sxm")
    cols = {"tp": np.array([2, 4, 8, 8]), "pp": np.array([1, 1, 2, 1]), "max_batch": np.array([64, 256, 256, 1024]),
            "max_num_tokens": np.array([2048, 8192, 4096, 8192]), "input_len": np.array([1000, 128, 2000, 500]),
            "output_len": np.array([200, 1000, 100, 500]), "weight_precision": np.array(["fp8"] * 4),
            "kv_precision": np.array(["fp8", "fp8", "bf16", "fp8"]), "request_rate": np.array([np.nan, 1.0, 0.5, 1e6])}
    batch = InflightBatch(llama2, hw, trtllm, cols)
    for eff in (InferenceEfficiency(), efficiency_for("tensorrt-llm"), InferenceEfficiency()):
        got, want = batch.estimate(eff), InflightBatch(llama2, hw, trtllm, cols).estimate(eff)
        assert got.keys() == want.keys()
        for key in want:
            assert np.asarray(got[key]).tobytes() == np.asarray(want[key]).tobytes(), key
        assert batch.throughput(eff).tobytes() == want["output_tokens_per_s_per_replica"].tobytes()


def test_pass_work_reads_no_constant(llama2):
    """``pass_work`` runs on a layout without constants (``eff`` None: any read raises), and
    ``price_pass`` of it is ``stage_pass``."""
    from autoparallel import io
    hw = io.load_hardware("h200")
    eff = efficiency_for("tensorrt-llm")
    args = ([1, 2, 8], [1, 1, 2], ["fp8", "bf16", "fp8"], ["fp8", "bf16", "bf16"])
    tokens = np.array([1.0, 512.0, 8192.0])
    shape = (tokens, tokens / 4, tokens * 1e9, tokens * 1e6)
    work = pass_work(layout(llama2, hw, None, *args), *shape)
    priced, direct = price_pass(eff, work), stage_pass(layout(llama2, hw, eff, *args), *shape)
    assert all(priced[k].tobytes() == direct[k].tobytes() for k in direct)


def _stub_fits(monkeypatch) -> list:
    """``fit.fit`` replaced by a recorder whose every call returns constants of its own (in this
    process); ``sampling_ns_per_logit``: the rows it saw (in any process)."""
    calls = []

    def recording_fit(measured, rows, start, tol=1e-4):
        calls.append((measured.engine.name, frozenset(rows["model"]), start, tol))
        return dataclasses.replace(start, layer_overhead_us=float(len(calls)), sampling_ns_per_logit=float(len(rows)))
    monkeypatch.setattr(F, "fit", recording_fit)
    return calls


def test_shared_refits_fit_each_input_once_and_no_other(monkeypatch):
    """Inside ``shared_refits`` a refit of the same inputs is the first one's; any input changed (the
    held-out model, the start, ``tol``, a measured figure, another engine) refits. Outside, and after
    the scope closes, nothing is kept."""
    calls = _stub_fits(monkeypatch)
    m10, m12 = (next(m for m in load_serving_runs() if m.engine.name == name)
                for name in ("tensorrt-llm-0.10", "tensorrt-llm"))
    with F.shared_refits():
        first = F.refit_without(m12, "Llama-2-70B")
        assert F.refit_without(m12, "Llama-2-70B") is first and len(calls) == 1
        again = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm")
        assert F.refit_without(again, "Llama-2-70B") is first  # loaded again: the same content
        F.refit_without(m12, "Llama-3-70B")
        F.refit_without(m12, "Llama-2-70B", start=efficiency_for("tensorrt-llm"))
        F.refit_without(m12, "Llama-2-70B", tol=1e-3)
        F.refit_without(m10, "Llama-2-70B")
        changed = dataclasses.replace(m12, frame=m12.frame.copy())
        row = F.fit_rows(changed).index[0]
        changed.frame.loc[row, "measured"] *= 1.01
        F.refit_without(changed, "Llama-2-70B")
        assert len(calls) == 6
    F.refit_without(m12, "Llama-2-70B")
    assert len(calls) == 7 and F._REFITS is None


def test_lomo_refits_made_in_workers_are_shared(monkeypatch):
    """``leave_one_model_out``'s refits, made in worker processes, are kept in the parent: MLPerf's
    LOMO refit of TensorRT-LLM without Llama-2-70B is then the table's, not a second fit."""
    from autoparallel.serve import mlperf
    _stub_fits(monkeypatch)
    m12 = next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm")
    train = F.fit_rows(m12)
    with F.shared_refits():
        F.leave_one_model_out(m12, workers=2)
        monkeypatch.setattr(F, "_refit", lambda *a: pytest.fail("refitted"))
        eff = mlperf.lomo_efficiency("Llama-2-70B")
    assert eff.sampling_ns_per_logit == (train["model"] != "Llama-2-70B").sum()
