"""Run, resume and read back an Optuna study that lives in a run folder.

A study is created once per run folder; its seeds (the grid's best layouts and the published
layout) are enqueued only then. Resuming counts the completed trials and runs the rest. Trials
a killed process left RUNNING are marked FAIL and their parameters enqueued again, so every
layout is completed exactly once. Several local workers share a journal-file storage; Optuna
hands each trial number and each enqueued trial to one worker only.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

from autoparallel.errors import UserError
from autoparallel.search import sampler
from autoparallel.search.evaluators import Evaluator
from autoparallel.space import SearchSpace
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

Progress = Callable[[int, float | None], None]  # (completed trials, best feasible throughput)


def _open(settings: sampler.StudySettings, run_dir: Path, worker: int = 0):
    optuna = sampler._optuna()
    directions = [sampler.OBJECTIVES[o][1] for o in settings.objectives]
    return optuna.create_study(storage=sampler.storage_url(settings, run_dir), study_name=sampler.STUDY_NAME,
                               sampler=sampler.make_sampler(settings, worker), directions=directions,
                               load_if_exists=True)


def open_existing(settings: sampler.StudySettings, run_dir: Path):
    """The study of a run folder, for reading; an error if it was never created."""
    optuna = sampler._optuna()
    try:
        return optuna.load_study(study_name=sampler.STUDY_NAME, storage=sampler.storage_url(settings, run_dir))
    except KeyError:
        raise UserError(f"{run_dir} holds no Optuna study") from None


def completed(study) -> int:
    optuna = sampler._optuna()
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def best_throughput(study) -> float | None:
    frame = sampler.trials_frame(study)
    if frame.empty or not frame["fits"].any():
        return None
    return float(frame.loc[frame["fits"], "tokens_per_s_per_gpu"].max())


def _requeue_stale(study) -> int:
    """Trials left RUNNING by a killed process: mark FAIL, enqueue their parameters again."""
    optuna = sampler._optuna()
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
    return len(stale)


def run(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
        settings: sampler.StudySettings, evaluator: Evaluator, run_dir: Path,
        seeds: list[dict] | None = None, progress: Progress | None = None):
    """Create or resume the study in ``run_dir`` and complete ``settings.trials`` trials.

    ``seeds``: layouts (knob -> value, possibly partial) enqueued first on a fresh study.
    """
    optuna = sampler._optuna()
    study = _open(settings, run_dir)
    tree = sampler.LayoutTree(model, hw, gpus, gbs, space)
    if len(study.get_trials(deepcopy=False)) == 0:
        for layout in seeds or []:
            params = tree.params_for(layout)
            if params is not None:
                study.enqueue_trial(params, skip_if_exists=True)
    else:
        _requeue_stale(study)
    objective = sampler.make_objective(tree, hw, evaluator, settings.objectives, space.memory_fraction)
    limit = optuna.study.MaxTrialsCallback(settings.trials, states=(optuna.trial.TrialState.COMPLETE,))
    if completed(study) >= settings.trials:
        return study

    if settings.workers == 1:
        best = [best_throughput(study)]

        def report(s, trial):
            metrics = trial.user_attrs.get("metrics", {})
            if trial.user_attrs.get("reason") == "" and (best[0] is None or metrics["tokens_per_s_per_gpu"] > best[0]):
                best[0] = metrics["tokens_per_s_per_gpu"]
            if progress:
                progress(completed(s), best[0])
        study.optimize(objective, n_trials=settings.trials - completed(study), callbacks=[limit, report])
        return study

    def work(index: int) -> None:
        mine = _open(settings, run_dir, worker=index + 1)
        mine.optimize(objective, n_trials=settings.trials, callbacks=[limit])

    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=work, args=(i,), daemon=True) for i in range(settings.workers)]
    for w in workers:
        w.start()
    try:
        while any(w.is_alive() for w in workers):
            time.sleep(0.5)
            if progress:
                progress(completed(study), best_throughput(study))
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join()
    return study
