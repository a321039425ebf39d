"""Optuna search: few, well-spent trials, stored so that a killed search resumes.

For evaluations that cost minutes (profiling jobs) the grid is too expensive; a sampler learns
from each trial. Each knob of the search space with more than one value becomes a categorical
parameter; full recompute's layer fraction is conditional on ``recompute == "full"``. A layout
that breaks a rule or does not fit is a *completed* trial with a violated constraint
(``trial.set_constraint``) and a ``reason`` user attribute, so the sampler learns where the
feasible region ends. Every trial also stores its plan and metrics as user attributes, so the
result tables can be rebuilt from the storage alone.

Optuna is imported inside the functions: the package imports without it, and fails with a clear
message only when a sampler search is asked for.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from autoparallel import io
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, MEMORY_KEYS
from autoparallel.errors import UserError
from autoparallel.search.evaluators import Evaluator
from autoparallel.space import FEATURE_KNOBS, STRUCTURE_KNOBS, SearchSpace, generate
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SAMPLERS = ("tpe", "nsga2", "random", "gp")
OBJECTIVES = {"throughput": ("tokens_per_s_per_gpu", "maximize"), "memory": ("peak_memory_gib", "minimize")}
METRIC_KEYS = ("fits", "peak_memory_gib", "step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
               "mfu", "num_microbatches") + BREAKDOWN_KEYS + MEMORY_KEYS
FRACTION_PARAM = "full_recompute_fraction"
STUDY_NAME = "autoparallel"


@dataclass(frozen=True)
class StudySettings:
    sampler: str = "tpe"
    trials: int = 200
    objectives: tuple[str, ...] = ("throughput",)
    seed: int | None = 0
    storage: str = ""  # URL; '' = SQLite in the run folder; 'journal' = a journal file there
    workers: int = 1
    seeds_from_grid: int = 5  # best grid layouts enqueued first (0: none)
    published_seeds: bool = True

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise UserError(f"unknown sampler {self.sampler!r}; valid: {', '.join(SAMPLERS)}")
        bad = [o for o in self.objectives if o not in OBJECTIVES]
        if bad or not self.objectives or len(set(self.objectives)) != len(self.objectives):
            raise UserError(f"bad --objectives {','.join(self.objectives)!r}; valid: throughput or throughput,memory")
        if self.trials < 1 or self.workers < 1:
            raise UserError(f"--trials and --workers must be positive, got {self.trials} and {self.workers}")


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UserError("the optuna strategy needs Optuna: pip install 'autoparallel[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def storage_url(settings: StudySettings, run_dir: Path):
    """The storage a study lives in: a URL, or a journal file (several local workers)."""
    optuna = _optuna()
    if settings.storage == "journal" or (not settings.storage and settings.workers > 1):
        from optuna.storages.journal import JournalFileBackend
        return optuna.storages.JournalStorage(JournalFileBackend(str(run_dir / "study.journal")))
    if settings.storage:
        return settings.storage
    return _sqlite(optuna, run_dir / "study.db")


def _sqlite(optuna, path: Path):
    """SQLite in write-ahead-log mode: a killed process loses nothing committed, and each trial
    costs a few SQL round trips instead of a full fsync (2-3x faster here)."""
    import sqlalchemy

    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 60}})

    def pragmas(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
    sqlalchemy.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()  # reconnect so every connection gets the pragmas
    return storage


def _base_sampler(name: str, seed: int | None):
    optuna = _optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def make_sampler(settings: StudySettings, worker: int = 0):
    """The chosen sampler; with a seed and one worker, reseeded before every trial from the number
    of completed trials, so that a resumed study proposes exactly what an uninterrupted one would
    have (a sampler's only state is its random generator; the rest it reads from the storage)."""
    if settings.seed is None or settings.workers > 1:
        return _base_sampler(settings.sampler, None if settings.seed is None else settings.seed + worker)
    return _reseeded(settings.sampler, settings.seed)


def _reseeded(name: str, seed: int):
    optuna = _optuna()

    class ReseededSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._inner = _base_sampler(name, seed)

        def before_trial(self, study, trial) -> None:
            done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            self._inner = _base_sampler(name, seed * 1_000_003 + done)
            self._inner.before_trial(study, trial)

        def infer_relative_search_space(self, study, trial):
            return self._inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self._inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self._inner.sample_independent(study, trial, param_name, param_distribution)

        def after_trial(self, study, trial, state, values) -> None:
            self._inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self._inner.reseed_rng()

    return ReseededSampler()


def searched_knobs(space: SearchSpace) -> dict[str, tuple]:
    """The knobs with more than one value: the parameters of the study."""
    return {k: tuple(getattr(space, k)) for k in STRUCTURE_KNOBS + FEATURE_KNOBS if len(getattr(space, k)) > 1}


def suggest(trial, space: SearchSpace) -> dict[str, Any]:
    params = {k: trial.suggest_categorical(k, list(v)) for k, v in searched_knobs(space).items()}
    recompute = params.get("recompute", space.recompute[0])
    if recompute == "full" and len(space.full_recompute_fractions) > 1:
        params[FRACTION_PARAM] = trial.suggest_categorical(FRACTION_PARAM, list(space.full_recompute_fractions))
    return params


FEATURE_COLUMNS = ("sp", "recompute", "distributed_optimizer", "overlap_grad_reduce", "tp_comm_overlap",
                   "grad_reduce_in_fp32", "precision", "fp8_bf16_edge_layers", "flash_attention")


def _norm(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class CandidateIndex:
    """The space's candidates, generated and checked once, looked up by a trial's parameters.

    Validity rules run vectorised over the whole space (a fraction of a second); a trial then
    costs a dictionary lookup plus one evaluation.
    """

    def __init__(self, model: ModelSpec, hw, gpus: int, gbs: int, space: SearchSpace):
        self.model = model
        self.frame = generate(model, hw, gpus, gbs, space)
        self.space = self._prune(space)
        full = self.frame[list(STRUCTURE_KNOBS)].notna().all(axis=1) & self.frame[list(FEATURE_COLUMNS)].notna().all(axis=1)
        structure_only = self.frame[list(FEATURE_COLUMNS)].isna().all(axis=1)
        keys = list(STRUCTURE_KNOBS) + list(FEATURE_COLUMNS) + ["recompute_num_layers"]
        self.full = self._index(self.frame[full], keys)
        self.structures = self._index(self.frame[structure_only], list(STRUCTURE_KNOBS))
        self.features = self._index(self.frame[~full & ~structure_only], list(FEATURE_COLUMNS))

    def _prune(self, space: SearchSpace) -> SearchSpace:
        """The space without values no valid layout uses (ep>1 for a dense model, tp beyond the
        NVLink domain, ...): the hard rules prune before the sampler spends a trial on them."""
        valid = self.frame[self.frame["reason"] == ""]
        if valid.empty:
            return space
        columns = {"overlap_dp_comm": "overlap_grad_reduce"}
        kept = {}
        for knob in STRUCTURE_KNOBS + FEATURE_KNOBS:
            used = {_norm(v) for v in valid[columns.get(knob, knob)].unique()}
            values = tuple(v for v in getattr(space, knob) if _norm(v) in used)
            if knob == "sp" and not values:
                values = (False,)
            kept[knob] = values or getattr(space, knob)
        return dataclasses.replace(space, **kept)

    @staticmethod
    def _index(frame: pd.DataFrame, keys: list[str]) -> dict[tuple, int]:
        values = zip(*(frame[k].tolist() for k in keys))
        return {tuple(_norm(v) for v in row): i for row, i in zip(values, frame.index)}

    def values(self, params: dict) -> dict[str, Any]:
        """Every Plan knob the trial sets: its parameters, the space's fixed values elsewhere."""
        out = {k: getattr(self.space, k)[0] for k in STRUCTURE_KNOBS + FEATURE_KNOBS}
        out.update({k: v for k, v in params.items() if k != FRACTION_PARAM})
        out["overlap_grad_reduce"] = out.pop("overlap_dp_comm")
        if out["tp"] == 1:
            out["sp"] = False  # Megatron turns SP off at tp=1; the grid does the same
            out["tp_comm_overlap"] = False
        chunk = self.model.num_layers / (out["pp"] * out["vp"])
        layers = 0
        if out["recompute"] == "full" and chunk.is_integer():
            fraction = params.get(FRACTION_PARAM, self.space.full_recompute_fractions[0])
            layers = max(1, math.ceil(fraction * chunk))
            layers = 0 if layers >= chunk else layers
        out["recompute_num_layers"] = layers
        return out

    def lookup(self, params: dict) -> pd.DataFrame:
        v = self.values(params)
        key = tuple(_norm(v[k]) for k in list(STRUCTURE_KNOBS) + list(FEATURE_COLUMNS) + ["recompute_num_layers"])
        index = self.full.get(key)
        if index is None:
            index = self.structures.get(key[:len(STRUCTURE_KNOBS)])
        if index is None:
            index = self.features.get(key[len(STRUCTURE_KNOBS):-1])
        if index is None:
            raise KeyError(f"no candidate for {v}")
        return self.frame.loc[[index]].reset_index(drop=True)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def make_objective(index: CandidateIndex, hw, evaluator: Evaluator, objectives: tuple[str, ...]) -> Callable:
    """The trial function: look the layout up, evaluate it once (repeats reuse the result)."""
    space = index.space
    seen: dict[tuple, pd.Series] = {}

    def objective(trial):
        params = suggest(trial, space)
        key = tuple(sorted(params.items()))
        if key not in seen:
            seen[key] = evaluator.evaluate(index.lookup(params)).iloc[0]
        row = seen[key]
        trial.set_user_attr("reason", row["reason"])
        trial.set_user_attr("plan", {k: _plain(row[k]) for k in Plan.field_names()})
        trial.set_user_attr("metrics", {k: _plain(row[k]) for k in METRIC_KEYS if k in row})
        oom = row["reason"].startswith("out of memory")
        limit = space.memory_fraction * hw.memory_gib
        violation = 0.0 if row["fits"] else (row["peak_memory_gib"] - limit if oom else 1.0)
        trial.set_constraint("feasible", float(violation))
        values = []
        for name in objectives:
            metric, direction = OBJECTIVES[name]
            value = _plain(row.get(metric))
            values.append(value if value is not None else (0.0 if direction == "maximize" else 1e6))
        return values[0] if len(values) == 1 else tuple(values)
    return objective


def published_layouts(model: ModelSpec, gpus: int) -> list[dict]:
    path = io.SEARCH_SPACES / "published_layouts.yaml"
    entries = io.read_yaml(path).get(model.name, []) if path.exists() else []
    return [{k: v for k, v in e.items() if k != "gpus"} for e in entries if e.get("gpus") == gpus]


def seed_params(model: ModelSpec, ranked: pd.DataFrame, space: SearchSpace, top: int) -> list[dict]:
    """The parameters of the ``top`` best grid layouts, for enqueueing."""
    knobs = searched_knobs(space)
    fractions = space.full_recompute_fractions
    out = []
    for _, row in ranked[ranked["fits"]].head(top).iterrows():
        params = {k: _plain(row[k]) for k in knobs}
        if row["recompute"] == "full" and len(fractions) > 1:
            chunk = model.num_layers // (int(row["pp"]) * int(row["vp"]))
            share = (row["recompute_num_layers"] or chunk) / chunk
            params[FRACTION_PARAM] = min(fractions, key=lambda f: abs(f - share))
        out.append(params)
    return out


def trials_frame(study) -> pd.DataFrame:
    """Every completed trial as a candidates row (plan, metrics, reason, trial number)."""
    optuna = _optuna()
    rows = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "plan" not in t.user_attrs:
            continue
        rows.append({"trial": t.number, **t.user_attrs["plan"], **t.user_attrs["metrics"],
                     "reason": t.user_attrs.get("reason", "")})
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["fits"] = frame["reason"].eq("")
        # A sampler proposes a good layout many times; the tables list each layout once.
        frame = frame.drop_duplicates(subset=[c for c in Plan.field_names() if c in frame], keep="first")
    return frame
