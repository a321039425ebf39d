"""Fit each serving engine's ``InferenceEfficiency`` to its published rows; leave-one-model-out.

Every engine with measured rows gets its own constants (an engine's kernels, launch overheads and
scheduler cost are its own): FasterTransformer on ``inference_runs.csv`` (end-to-end latency),
each TensorRT-LLM release on its in-flight rows of ``serving_runs.csv`` (output tokens/s). The
fit minimises the absolute log error (scipy least squares, soft-L1 loss, bounded) of the rows
on the target GPUs, from its start and from three fixed starts (``extra_starts``), keeping the
lowest; the other GPUs' rows are predicted with those constants and reported.
Leave-one-model-out refits without one model's rows, from the uncalibrated defaults as the
shipped fit does, and predicts them: the error on rows a fit did not see.

    python -m autoparallel.serve.fit             # fit every engine, rewrite the assumptions YAML
    python -m autoparallel.serve.fit --dry-run   # print, do not write
    python -m autoparallel.serve.fit --json      # the fits as JSON, constants on a bound included

A constant the fit leaves on one of its ``BOUNDS`` is warned about (``costmodel.bounds``): it
stands in for a cost the model lacks rather than measuring what its name says.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import sys

import numpy as np
import pandas as pd
from rich.console import Console

from autoparallel.costmodel.bounds import AtBound, at_bounds, warn_at_bounds
from autoparallel.costmodel.inference import InferenceEfficiency
from autoparallel.errors import UserError
from autoparallel.processes import in_processes
from autoparallel.report.run_folder import write_atomic
from autoparallel.serve.assumptions import ASSUMPTIONS, FIT_MARKER, load_assumptions
from autoparallel.serve.measured import (COST_COLUMNS, Measured, groups, load_fastertransformer, load_serving_runs,
                                         predict, predicted_values)

# Not fitted for FT: attention (prompts <= 512 tokens cannot pin it), fp8_gemm_relative (no FP8
# rows), p2p_latency_us (every PP row crosses nodes). In-flight rows are single-node TP groups
# without PP: no inter-node or pipeline constants.
FIT_KEYS = {
    "static": ("hbm", "gemm_max", "gemm_half_gflop", "roofline_sharpness", "layer_overhead_us",
               "pass_overhead_us", "allreduce_latency_us", "internode_allreduce_latency_us",
               "internode_p2p_latency_us", "elementwise_bytes_per_token_hidden", "sampling_ns_per_logit"),
    "inflight": ("hbm", "gemm_max", "gemm_half_gflop", "fp8_gemm_relative", "attention", "roofline_sharpness",
                 "layer_overhead_us", "pass_overhead_us", "allreduce_latency_us",
                 "elementwise_bytes_per_token_hidden", "sampling_ns_per_logit"),
}
BOUNDS = {"hbm": (0.3, 1.0), "gemm_max": (0.2, 1.0), "gemm_half_gflop": (0.01, 100.0),
          "fp8_gemm_relative": (0.3, 1.0), "attention": (0.05, 1.0), "roofline_sharpness": (1.0, 20.0),
          "layer_overhead_us": (0.0, 500.0), "pass_overhead_us": (0.0, 20000.0),
          "allreduce_latency_us": (0.0, 500.0), "internode_allreduce_latency_us": (0.0, 2000.0),
          "internode_p2p_latency_us": (0.0, 5000.0), "elementwise_bytes_per_token_hidden": (0.0, 400.0),
          "sampling_ns_per_logit": (0.0, 50.0)}


def target_gpus() -> tuple[str, ...]:
    return tuple(load_assumptions()["validation"]["serving_runs"]["target_gpus"])


def fit_rows(measured: Measured) -> pd.DataFrame:
    """The rows a fit uses: every predicted row (FT), the target GPUs' rows (in-flight)."""
    rows = measured.predicted_rows
    if measured.engine.batching == "static":
        return rows
    return rows[rows["hardware"].isin(target_gpus())]


# The starts a fit tries besides its given one: a scrambled Halton sequence with a fixed seed (the same points
# on every call: they depend on no row, so a LOMO refit's starts never saw its held-out model) in
# each constant's magnitude: log-uniform between the bounds, or over the upper bound's three decades
# below it where the lower bound is 0 (latencies, bytes, ns). Least squares from one start stops in
# the minimum its start lies in (session 41: cold LOMO refits 7 points apart by start); the fit keeps
# the lowest training cost over the starts. A later start replaces the best so far only when its cost
# is lower by more than ``tol`` (relative): closer than that the optimizer cannot tell the two apart,
# and the given start keeps such ties (one minimum reached from two sides is not a new one).
EXTRA_STARTS = 3
START_SEED = 0


def bounds(keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``BOUNDS`` of ``keys`` as (lower, upper) arrays."""
    return np.array([BOUNDS[k][0] for k in keys]), np.array([BOUNDS[k][1] for k in keys])


def magnitude_floor(keys: tuple[str, ...]) -> np.ndarray:
    """Each constant's smallest magnitude of interest: its lower bound, or its upper bound's three
    decades below it where the lower bound is 0 (the range ``extra_starts`` draws from). Least
    squares scales each constant by max(|start|, this): a constant starting at 0 (the default
    ``pass_overhead_us``) moved in steps of 1e-3 us out of a 20 ms range under the former floor of
    1e-3, and the cold refit without Llama-2-70B stopped in a higher minimum (session 42)."""
    lo, hi = bounds(keys)
    return np.where(lo > 0, lo, hi * 1e-3)


def extra_starts(keys: tuple[str, ...], n: int = EXTRA_STARTS, seed: int = START_SEED) -> np.ndarray:
    """``n`` deterministic points inside ``BOUNDS`` for ``keys`` (rows), from no data."""
    from scipy.stats import qmc
    if n <= 0:
        return np.empty((0, len(keys)))
    u = qmc.Halton(d=len(keys), scramble=True, seed=seed).random(n)  # nested: n + 1 starts begin with the n
    lo, hi = magnitude_floor(keys), bounds(keys)[1]
    return np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))


F_SCALE = 0.05  # soft-L1's knee: a log error of 5 %


def log_errors(measured: Measured, rows: pd.DataFrame, eff: InferenceEfficiency, parts=None) -> np.ndarray:
    """log(predicted / measured) of ``rows`` at ``eff``: the fit's residuals (``parts``: ``groups``, when reused)."""
    parts = groups(measured, rows) if parts is None else parts
    return np.log(predicted_values(measured, eff, parts, len(rows)) / rows["measured"].to_numpy(dtype=float))


def training_cost(measured: Measured, rows: pd.DataFrame, eff: InferenceEfficiency) -> float:
    """``fit``'s objective at ``eff`` on ``rows`` (scipy's ``cost``: half the soft-L1 sum of the log errors)."""
    r = log_errors(measured, rows, eff)
    return float(0.5 * F_SCALE ** 2 * np.sum(2 * (np.sqrt(1 + (r / F_SCALE) ** 2) - 1)))


def fit(measured: Measured, rows: pd.DataFrame, start: InferenceEfficiency, tol: float = 1e-4,
        extra: int = EXTRA_STARTS, costs: list | None = None) -> InferenceEfficiency:
    """Least squares from ``start`` and from ``extra`` fixed starts (``extra_starts``); the lowest
    training cost wins. ``tol`` is scipy's ftol and xtol (relative changes that stop it); ``costs``,
    when given a list, gets each start's final cost (the given start's first)."""
    from scipy.optimize import least_squares
    keys = FIT_KEYS[measured.engine.batching]
    lo, hi = bounds(keys)
    parts = groups(measured, rows)
    floor = magnitude_floor(keys)

    def make(x):
        return dataclasses.replace(start, **{k: float(v) for k, v in zip(keys, x)})

    def residuals(x):
        return log_errors(measured, rows, make(x), parts)

    best = None
    for x in [np.array([getattr(start, k) for k in keys], dtype=float), *extra_starts(keys, extra)]:
        x0 = np.clip(x, lo + 1e-9, hi - 1e-9)
        result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), floor),
                               loss="soft_l1", f_scale=F_SCALE, ftol=tol, xtol=tol)
        if costs is not None:
            costs.append(float(result.cost))
        if best is None or result.cost < best.cost * (1 - tol):
            best = result
    return make(best.x)


def fitted_at_bounds(measured: Measured, eff: InferenceEfficiency) -> list[AtBound]:
    """The constants the engine's fit moves that ``eff`` holds on (or next to) a bound."""
    return at_bounds({k: getattr(eff, k) for k in FIT_KEYS[measured.engine.batching]}, BOUNDS, log=False)


def refit_without(measured: Measured, model: str, start: InferenceEfficiency | None = None,
                  tol: float = 1e-4) -> InferenceEfficiency:
    """The engine's constants fitted on its fit rows without ``model``'s, from ``start``.

    The default start is the uncalibrated ``InferenceEfficiency()``, where the shipped fit starts
    too: a start at the fit that saw every row would carry what ``model``'s rows taught it into
    the refit (the held-out error would read low, as training's refits from ``uncalibrated`` avoid).
    Inside ``shared_refits`` each refit is fitted once.
    """
    if _REFITS is None:
        return _refit(measured, model, start, tol)
    key = _refit_key(measured, model, start, tol)
    if key not in _REFITS:
        _REFITS[key] = _refit(measured, model, start, tol)
    return _REFITS[key]


def _refit(measured: Measured, model: str, start: InferenceEfficiency | None, tol: float) -> InferenceEfficiency:
    train = fit_rows(measured)
    return fit(measured, train[train["model"] != model], start or InferenceEfficiency(), tol)


#: ``refit_without``'s fits by ``_refit_key`` while ``shared_refits`` is open (None: closed).
_REFITS: dict | None = None


@contextlib.contextmanager
def shared_refits():
    """Within: each ``refit_without`` fit is made once and reused (``validate --inference`` refits
    TensorRT-LLM without Llama-2-70B for its LOMO table and again for MLPerf's LOMO rows).

    Why scoped, not for the process's life: the key holds every input the fit reads except the
    cost model's code, which a caller may patch between two reports (the what-if benchmarks do);
    one ``validate`` run prices every fit with one cost model."""
    global _REFITS
    outer, _REFITS = _REFITS, ({} if _REFITS is None else _REFITS)
    try:
        yield
    finally:
        _REFITS = outer


def _refit_key(measured: Measured, model: str, start: InferenceEfficiency | None, tol: float) -> tuple:
    """Everything ``refit_without`` reads but the cost model's code: the engine and how its rows
    are read, the fit rows' content without ``model``'s (the columns ``groups`` and ``log_errors``
    read; the GPUs by preset name), their model shapes, the start, ``tol`` and the fit's own settings."""
    train = fit_rows(measured)
    rows = train[train["model"] != model]
    columns = ["model", "hardware", *COST_COLUMNS, "measured"]
    return (measured.engine, measured.metric, measured.memory_fraction, measured.decode_steps_is_output_len,
            rows[columns].to_csv(index=False), tuple(repr(measured.models[m]) for m in rows["model"].unique()),
            start or InferenceEfficiency(), tol, EXTRA_STARTS, START_SEED, F_SCALE,
            FIT_KEYS[measured.engine.batching], tuple(sorted(BOUNDS.items())))


def _remember(measured: Measured, model: str, start: InferenceEfficiency | None, tol: float,
              eff: InferenceEfficiency) -> None:
    """Keep ``refit_without``'s ``eff`` (made in another process) while ``shared_refits`` is open."""
    if _REFITS is not None:
        _REFITS[_refit_key(measured, model, start, tol)] = eff


def _held_out_errors(measured: Measured, name: str, start: InferenceEfficiency | None,
                     tol: float) -> tuple[pd.Series, InferenceEfficiency]:
    """One LOMO fold: ``name``'s rows' ``error_pct`` with the constants ``refit_without`` them, and
    those constants."""
    rows = measured.predicted_rows
    eff = refit_without(measured, name, start, tol)
    return predict(measured, eff, rows[rows["model"] == name])["error_pct"], eff


def leave_one_model_out(measured: Measured, progress=None, start: InferenceEfficiency | None = None,
                        tol: float = 1e-4, workers: int | None = 1) -> pd.Series:
    """Every predicted row, predicted by a fit that saw none of its model's rows (column ``lomo_pct``);
    each refit is ``refit_without`` from ``start`` (default: cold, the uncalibrated constants), the
    refits in ``workers`` processes (``in_processes``; default one: here)."""
    rows = measured.predicted_rows
    train = fit_rows(measured)
    out = pd.Series(np.nan, index=rows.index)
    names = list(rows["model"].unique())
    refitted = [name for name in names if (train["model"] != name).any()]
    for _ in range(len(names) - len(refitted)):  # a model whose rows are all the fit has: nothing to refit
        if progress is not None:
            progress()
    for name, (errors, eff) in zip(refitted, in_processes(_held_out_errors, [(measured, name, start, tol)
                                                                            for name in refitted], workers, progress)):
        out[rows[rows["model"] == name].index] = errors
        _remember(measured, name, start, tol, eff)
    return out.rename("lomo_pct")


def in_sample_and_lomo(measured: Measured, eff: InferenceEfficiency, progress=None, cross: bool = True,
                       workers: int | None = 1) -> pd.DataFrame:
    """The predicted rows with ``error_pct`` and (``cross``; NaN otherwise) ``lomo_pct`` (its refits in
    ``workers`` processes)."""
    report = predict(measured, eff)
    report["lomo_pct"] = leave_one_model_out(measured, progress, workers=workers) if cross else float("nan")
    report["engine"] = measured.engine.name
    report["fitted_on"] = report.index.isin(fit_rows(measured).index)
    return report


def all_measured() -> list[Measured]:
    return [load_fastertransformer(), *load_serving_runs()]


def fit_all(console: Console | None = None) -> dict[str, tuple[InferenceEfficiency, pd.DataFrame, list[AtBound]]]:
    """Every engine's fit from the class defaults (the same command gives the same fit), its
    rows' predictions and its constants on a bound."""
    out = {}
    for measured in all_measured():
        rows = fit_rows(measured)
        eff = fit(measured, rows, InferenceEfficiency())
        report = predict(measured, eff, rows)
        hits = fitted_at_bounds(measured, eff)
        out[measured.engine.name] = (eff, report, hits)
        if console is not None:
            err = report["error_pct"].abs()
            console.print(f"{measured.engine.name}: {len(rows)} rows, mean |error| {err.mean():.1f} %, "
                          f"max {err.max():.1f} %")
            warn_at_bounds(console, hits)
    return out


def write_fits(fits: dict[str, tuple[InferenceEfficiency, pd.DataFrame, list[AtBound]]]) -> None:
    """Replace the fitted block (after FIT_MARKER) at the end of the assumptions YAML."""
    text = ASSUMPTIONS.read_text()
    head = text.split(FIT_MARKER)[0].rstrip("\n")
    lines = [FIT_MARKER,
             f"# {dt.date.today().isoformat()}; reproduce: python -m autoparallel.serve.fit",
             "efficiency:"]
    for name, (eff, report, _) in fits.items():
        err = report["error_pct"].abs()
        gpus = ", ".join(sorted(report["hardware"].unique()))
        lines.append(f"  {name}:  # {len(report)} rows ({gpus}): mean |error| {err.mean():.1f} %, max {err.max():.1f} %")
        lines += [f"    {f.name}: {round(getattr(eff, f.name), 4)}" for f in dataclasses.fields(eff)]
    write_atomic(ASSUMPTIONS, head + "\n\n" + "\n".join(lines) + "\n")


def fits_json(fits: dict[str, tuple[InferenceEfficiency, pd.DataFrame, list[AtBound]]]) -> dict:
    """Per engine: its constants, rows, mean / max |error| % and constants on a bound."""
    return {name: {"constants": dataclasses.asdict(eff), "rows": len(report),
                   "mean_abs_error_pct": float(report["error_pct"].abs().mean()),
                   "max_abs_error_pct": float(report["error_pct"].abs().max()),
                   "at_bounds": [hit.as_dict() for hit in hits]}
            for name, (eff, report, hits) in fits.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoparallel.serve.fit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a flag only as spelled whole, as the CLI's
    p.add_argument("--dry-run", action="store_true", help="print the fits, do not write the YAML")
    p.add_argument("--json", action="store_true", help="print the fits as JSON (the rest goes to stderr)")
    args = p.parse_args(argv)
    console = Console(stderr=args.json)
    try:
        fits = fit_all(console)
        for name, (eff, _, _) in fits.items():
            console.print(name, {f.name: round(getattr(eff, f.name), 4) for f in dataclasses.fields(eff)})
        if args.json:
            import json
            print(json.dumps(fits_json(fits), indent=1))
        if not args.dry_run:
            write_fits(fits)
            console.print(f"wrote {ASSUMPTIONS}")
    except UserError as exc:
        print(f"autoparallel: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
