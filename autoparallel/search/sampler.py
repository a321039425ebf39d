"""Optuna search: few, well-spent trials, stored so that a killed search resumes.

For evaluations that cost minutes (profiling jobs) the grid is too expensive; a sampler learns
from each trial. The hard rules prune first: a trial chooses its knobs one after another among
the values that still lead to a valid layout (``LayoutTree``), so no trial is spent on a layout
that breaks a rule. A layout that does not fit in memory is a *completed* trial with a violated
constraint (``trial.set_constraint``, the GiB over the limit) and a ``reason`` user attribute, so
the sampler learns where the feasible region ends. Every trial also stores its plan and metrics as user attributes, so the
result tables can be rebuilt from the storage alone.

Optuna is imported inside the functions: the package imports without it, and fails with a clear
message only when a sampler search is asked for.
"""

from __future__ import annotations

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
from autoparallel.space import SearchSpace, generate
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SAMPLERS = ("tpe", "nsga2", "random", "gp")
OBJECTIVES = {"throughput": ("tokens_per_s_per_gpu", "maximize"), "memory": ("peak_memory_gib", "minimize")}
METRIC_KEYS = ("fits", "peak_memory_gib", "step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
               "mfu", "precision_utilization", "num_microbatches") + BREAKDOWN_KEYS + MEMORY_KEYS
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
    study_name: str = ""  # derived from the inputs (``study.name_for``); '' in older run folders

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise UserError(f"unknown sampler {self.sampler!r}; valid: {', '.join(SAMPLERS)}")
        bad = [o for o in self.objectives if o not in OBJECTIVES]
        if bad or not self.objectives or len(set(self.objectives)) != len(self.objectives):
            raise UserError(f"bad --objectives {','.join(self.objectives)!r}; valid: throughput or throughput,memory")
        if self.trials < 1 or self.workers < 1:
            raise UserError(f"--trials and --workers must be positive, got {self.trials} and {self.workers}")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise UserError(f"--seed must be in 0..{2**32 - 1} (numpy's seed range), got {self.seed}")


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UserError("the optuna strategy needs Optuna: pip install 'autoparallel[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial re-raises; its log would repeat it
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


JOURNAL_PREFIX = "journal:"  # --storage journal:PATH: a journal file outside the run folder


def storage_url(settings: StudySettings, run_dir: Path):
    """The storage a study lives in: a URL, or a journal file (several local workers)."""
    optuna = _optuna()
    if settings.storage.startswith(JOURNAL_PREFIX):  # a journal file several searches share
        from optuna.storages.journal import JournalFileBackend
        path = Path(settings.storage[len(JOURNAL_PREFIX):]).expanduser()
        if not path.parent.is_dir():
            raise ValueError(f"the folder {path.parent} does not exist")
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
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
        # Independent TPE: on the 175B space it reached the optimum's basin as often as the
        # multivariate variant and ran 3-5x faster per trial (benchmarks/RESULTS.md).
        return optuna.samplers.TPESampler(seed=seed)
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
            self._inner = _base_sampler(name, (seed * 1_000_003 + done) % 2**32)  # numpy's seed range
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


# The order in which a trial chooses knobs: structure first, so each later choice is among the
# values that still lead to a valid layout.
# Every Plan field but the derived ones (dp from the GPU count, gbs given, the param gather overlap
# turned with the grad reduce overlap, the flex backend), so that no two layouts share a path.
TREE_KNOBS = ("tp", "pp", "vp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
              "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
              "pipeline_model_parallel_layout", "cp", "cp_comm_type", "ep", "etp",
              "mbs", "sp", "tp_comm_overlap", "overlap_moe_expert_parallel_comm",
              "moe_token_dispatcher_type", "recompute", "recompute_num_layers", "recompute_modules", "cpu_offloading_num_layers", "fsdp",
              "precision", "fp8_bf16_edge_layers", "distributed_optimizer", "overlap_grad_reduce",
              "grad_reduce_in_fp32", "flash_attention", "fp8_param_gather", "precision_aware_optimizer", "cuda_graph",
              "moe_shared_expert_overlap", "fp8_attention", "tp_only_amax_red", "activation_func_fp8_input_store",
              "param_remainders", "cross_entropy_loss_fusion", "cutedsl_fused_grouped_mlp",
              "tp_overlap_rs_pipeline", "lora_input_regather")
# The flex dispatcher's backend follows from the EP group and the hardware (space.flex_backend).
DERIVED = ("dp", "gbs", "overlap_param_gather", "moe_flex_dispatcher_backend")


def _norm(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class LayoutTree:
    """The space's valid layouts as a tree with one knob per level.

    A trial walks it from the root, choosing at each level among the values that still lead to a
    valid layout, so the sampler never spends a trial on a layout that breaks a rule (the rules ran
    once, vectorised, when the candidates were generated). A level with one value is no parameter;
    a knob whose choices depend on earlier ones (pp given tp, say) is named by its choice set,
    ``pp[1|2|4|8]``, so trials that face the same choices share statistics.
    """

    def __init__(self, model: ModelSpec, hw, gpus: int, gbs: int, space: SearchSpace):
        self.frame = generate(model, hw, gpus, gbs, space)
        valid = self.frame[self.frame["reason"] == ""]
        if valid.empty:
            from autoparallel.search.diagnose import explain
            raise UserError(explain(self.frame, model, hw, gpus, gbs, space))
        self.root: dict = {}
        columns = [valid[k].tolist() for k in TREE_KNOBS]
        for index, values in zip(valid.index, zip(*columns)):
            node = self.root
            for value in values[:-1]:
                node = node.setdefault(_norm(value), {})
            node[_norm(values[-1])] = index
        self.full_choices = {k: tuple(sorted({_norm(v) for v in valid[k].unique()}, key=_order))
                             for k in TREE_KNOBS}

    def _name(self, knob: str, choices: tuple) -> str:
        if choices == self.full_choices[knob]:
            return knob
        return f"{knob}[{'|'.join(str(c) for c in choices)}]"

    def walk(self, choose: Callable[[str, str, tuple], Any]) -> int:
        """Descend to a leaf, calling ``choose(knob, param name, choices)`` where there is a choice."""
        node: Any = self.root
        for knob in TREE_KNOBS:
            choices = tuple(sorted(node, key=_order))
            value = choices[0] if len(choices) == 1 else choose(knob, self._name(knob, choices), choices)
            node = node[value]
        return node

    def suggest(self, trial) -> int:
        """The row index of the layout a trial chooses."""
        return self.walk(lambda _knob, name, choices: trial.suggest_categorical(name, list(choices)))

    def params_for(self, layout: dict) -> dict | None:
        """Trial parameters reaching the first valid layout that has ``layout``'s knob values
        (knobs it leaves out take the first value that stays valid); None if no layout matches."""
        params: dict = {}

        def choose(knob, name, choices):
            wanted = _norm(layout[knob]) if knob in layout else None
            value = wanted if wanted in choices else None
            if value is None and knob in layout:
                raise LookupError(knob)
            value = choices[0] if value is None else value
            params[name] = value
            return value
        try:
            self.walk(choose)
        except LookupError:
            return None
        return params

    def row(self, index: int) -> pd.DataFrame:
        return self.frame.loc[[index]].reset_index(drop=True)


def _order(value: Any) -> tuple:
    """Sort key that orders numbers, booleans and strings without comparing across types."""
    return (type(value).__name__, value)


def make_objective(tree: LayoutTree, hw, evaluator: Evaluator, objectives: tuple[str, ...],
                   memory_fraction: float) -> Callable:
    """The trial function: choose a layout, evaluate it once (a repeat reuses the result)."""
    seen: dict[int, pd.Series] = {}

    def objective(trial):
        index = tree.suggest(trial)
        if index not in seen:
            seen[index] = evaluator.evaluate(tree.row(index)).iloc[0]
        row = seen[index]
        trial.set_user_attr("reason", row["reason"])
        trial.set_user_attr("plan", {k: _plain(row[k]) for k in Plan.field_names()})
        trial.set_user_attr("metrics", {k: _plain(row[k]) for k in METRIC_KEYS if k in row})
        limit = memory_fraction * hw.memory_gib
        violation = 0.0 if row["fits"] else max(float(row["peak_memory_gib"]) - limit, 1e-3)
        trial.set_constraint("feasible", violation)
        values = []
        for name in objectives:
            metric, direction = OBJECTIVES[name]
            value = _plain(row.get(metric))
            values.append(value if value is not None else (0.0 if direction == "maximize" else 1e6))
        return values[0] if len(values) == 1 else tuple(values)
    return objective


# Where NVIDIA's layouts are kept: the measured ones (performance summaries), then the recipes' for a GPU
# with no published run yet (Megatron-Bridge's VR200 recipes).
LAYOUT_FILES = ("published_layouts.yaml", "recipe_layouts.yaml")


def published_layouts(model: ModelSpec, gpus: int, gpu: str) -> list[dict]:
    """The layouts NVIDIA published for this model on this many GPUs of this type (their knobs), measured
    or set by a performance recipe (``LAYOUT_FILES``); an entry stating its ``seq_length`` only at that
    sequence length."""
    entries = []
    for name in LAYOUT_FILES:
        path = io.SEARCH_SPACES / name
        entries += io.read_yaml(path).get(model.name, []) if path.exists() else []
    # An entry stating a seq_length (a long-context fine-tuning recipe) seeds only a search at that length.
    return [{k: v for k, v in e.items() if k not in ("gpus", "gpu", "gbs", "seq_length")} for e in entries
            if e.get("gpus") == gpus and e.get("gpu", gpu) == gpu
            and e.get("seq_length", model.seq_length) == model.seq_length]


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
