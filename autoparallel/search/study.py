"""Run, resume and read back an Optuna study that lives in a run folder (or a storage URL).

A study is created once per run folder; its seeds (the grid's best layouts and the published
layout) are enqueued only then. Resuming counts the completed trials and runs the rest. Trials
a killed process left RUNNING are marked FAIL and their parameters enqueued again, so every
layout is completed exactly once. Several local workers share a journal-file storage; Optuna
hands each trial number and each enqueued trial to one worker only; they die with the process
that started them. A study's name is derived from what it searches (``name_for``), so one
storage URL holds the studies of many searches without mixing them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from autoparallel import io
from autoparallel.errors import UserError
from autoparallel.search import sampler
from autoparallel.search.evaluators import Evaluator
from autoparallel.space import SearchSpace
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

Progress = Callable[[int, float | None], None]  # (completed trials, best feasible throughput)


def name_for(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
             objectives: tuple[str, ...]) -> str:
    """``<model>_<gpus>x<gpu>_<digest>``: readable, and different whenever the inputs differ."""
    inputs = {"model": io.to_dict(model), "hardware": io.to_dict(hw), "gpus": gpus, "gbs": gbs,
              "space": io.to_dict(space), "objectives": list(objectives)}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
    return f"{model.name}_{gpus}x{hw.name}_{digest}"


def _name(settings: sampler.StudySettings) -> str:
    return settings.study_name or sampler.STUDY_NAME  # run folders written before names were derived


@contextmanager
def _storage_errors(settings: sampler.StudySettings, run_dir: Path) -> Iterator[None]:
    """Opening a storage: a bad URL, a missing driver, an unreachable server or a corrupt file is
    the user's to fix, in one line."""
    import sqlalchemy.exc
    where = f"--storage {settings.storage}" if settings.storage not in ("", "journal") else f"the study in {run_dir}"
    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as exc:
        first = " ".join(str(exc).split("\n")[0].split())[:200]
        raise UserError(f"cannot open {where}: {first}{_STORAGE_FORMS if where.startswith('--') else ''}") from None


# What --storage takes, said where one cannot be opened ("Could not parse SQLAlchemy URL" names none).
_STORAGE_FORMS = f"; give a database URL (sqlite:///study.db), {sampler.JOURNAL_PREFIX}PATH or journal"


def check_storage(settings: sampler.StudySettings) -> None:
    """Open a storage URL once, before any run folder is made."""
    if settings.storage in ("", "journal"):
        return
    if settings.storage.startswith(sampler.JOURNAL_PREFIX):
        folder = Path(settings.storage[len(sampler.JOURNAL_PREFIX):]).expanduser().parent
        if not folder.is_dir():
            raise UserError(f"cannot open --storage {settings.storage}: the folder {folder} does not exist")
        return
    optuna = sampler._optuna()
    with _storage_errors(settings, Path(".")):
        _racing(lambda: optuna.storages.RDBStorage(settings.storage))


# What a search meets when another one creates the same storage at the same moment: the schema
# half made ("table ... already exists") or the file locked. It opens again after a pause.
RACES = ("already exists", "database is locked", "UNIQUE constraint failed")


def _racing(open_it: Callable, attempts: int = 8):
    """``open_it()``, again after a short pause while it fails as two searches opening one new
    storage at once do (``RACES``)."""
    import sqlalchemy.exc
    for attempt in range(attempts):
        try:
            return open_it()
        except sqlalchemy.exc.OperationalError as exc:
            if attempt == attempts - 1 or not any(r in str(exc) for r in RACES):
                raise
        except sqlalchemy.exc.IntegrityError as exc:
            if attempt == attempts - 1 or not any(r in str(exc) for r in RACES):
                raise
        time.sleep(0.1 * (attempt + 1))


def _open(settings: sampler.StudySettings, run_dir: Path, worker: int = 0, create: bool = True):
    optuna = sampler._optuna()
    directions = [sampler.OBJECTIVES[o][1] for o in settings.objectives]
    with _storage_errors(settings, run_dir):
        url = sampler.storage_url(settings, run_dir)
        # a URL: opened once, patiently (another search may be creating it), for the calls below
        storage = _racing(lambda: optuna.storages.RDBStorage(url)) if isinstance(url, str) else url
        if not create:
            try:
                return optuna.load_study(study_name=_name(settings), storage=storage,
                                         sampler=sampler.make_sampler(settings, worker))
            except KeyError:
                raise UserError(f"{run_dir} holds no Optuna study named {_name(settings)!r}") from None
        return _racing(lambda: optuna.create_study(
            storage=storage, study_name=_name(settings), sampler=sampler.make_sampler(settings, worker),
            directions=directions, load_if_exists=True))


def open_existing(settings: sampler.StudySettings, run_dir: Path):
    """The study of a run folder, for reading or resuming; an error if it was never created."""
    if settings.storage in ("", "journal") or settings.workers > 1:
        stored = [Path(run_dir) / f for f in ("study.db", "study.journal")]
        if not any(f.exists() for f in stored):
            raise UserError(f"{run_dir} has no study.db or study.journal: its study is lost, nothing to "
                            "resume (start the search again)")
        if stored[0].exists():
            _check_tables(stored[0])
    return _open(settings, Path(run_dir), create=False)


# The tables of an Optuna SQLite study that hold its trials. Optuna creates missing tables when it
# opens a storage, so a dropped one would silently lose every trial: it is refused instead.
STUDY_TABLES = ("studies", "study_directions", "trials", "trial_params", "trial_values")


def _check_tables(path: Path) -> None:
    """A UserError naming ``path`` if a study table is gone or a completed trial lost its
    values; a file that is no database is left to Optuna's own error."""
    import sqlite3
    from contextlib import closing
    try:
        # immutable: no -shm/-wal files made beside a closed study (a killed one keeps its -wal)
        wal = path.with_name(path.name + "-wal").exists()
        with closing(sqlite3.connect(f"file:{path}?mode=ro{'' if wal else '&immutable=1'}", uri=True)) as db:
            tables = {row[0] for row in db.execute("select name from sqlite_master where type='table'")}
            missing = [t for t in STUDY_TABLES if t not in tables]
            lost = 0 if missing else db.execute(
                "select count(*) from trials t where t.state = 'COMPLETE' and not exists "
                "(select 1 from trial_values v where v.trial_id = t.trial_id)").fetchone()[0]
    except sqlite3.Error:
        return
    if missing:
        raise UserError(f"{path} is damaged: it has no table {', '.join(missing)} (start the search again)")
    if lost:
        from autoparallel.words import plural
        raise UserError(f"{path} is damaged: {plural(lost, 'completed trial')} {'has' if lost == 1 else 'have'} "
                        "no values (start the search again)")


def close(study) -> None:
    """Close the storage's connections (before its folder is renamed)."""
    backend = getattr(study._storage, "_backend", study._storage)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.dispose()


class _Interrupts:
    """Ctrl-C and SIGTERM held back while a study opens and runs its trials: the running trial
    finishes, the study stops (``study.stop`` from the ``stop`` callback), and the signal is
    delivered on leaving the block, where the caller's handler runs (the CLI's: KeyboardInterrupt).
    An interrupt in the middle of Optuna's bookkeeping breaks it (optuna 5.0 raises
    UnboundLocalError), and one during a lazy import leaves a half-imported SQLAlchemy module
    behind for the code that keeps the study. A second signal interrupts at once (``again``;
    otherwise it is ignored)."""

    def __init__(self, signals: tuple[int, ...], again: bool = True) -> None:
        self.signals, self.again, self.asked, self._previous = signals, again, 0, {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._ask) for s in self.signals}
        return self

    def _ask(self, signum, _frame) -> None:
        if self.asked and self.again:
            raise KeyboardInterrupt
        self.asked = signum

    def stop(self, study, _trial) -> None:
        if self.asked:
            study.stop()

    def __exit__(self, kind, *_) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self.asked and kind is None:
            signal.raise_signal(self.asked)


def completed(study) -> int:
    optuna = sampler._optuna()
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def best_throughput(study) -> float | None:
    frame = sampler.trials_frame(study)
    if frame.empty or not frame["fits"].any():
        return None
    return float(frame.loc[frame["fits"], "tokens_per_s_per_gpu"].max())


def _requeue_stale(study, shared: bool) -> int:
    """Trials left RUNNING by a killed process: mark FAIL and enqueue them again: an enqueued
    seed with its fixed layout; a sampled trial only in a shared study. A study of its own
    re-proposes a sampled trial anyway (its sampler is reseeded from the count of completed trials),
    and re-queuing one killed while its parameters were being suggested would fix some of them and
    shift the sampler's draws: the resumed study would diverge from an uninterrupted one.

    A study in its run folder is this process's alone (the folder is locked), so every RUNNING
    trial in it is stale. A ``shared`` study (a ``--storage`` URL) may have live trials of other
    searches: only a trial whose owner (``_owned``) is a dead process of this machine is stale,
    or one without an owner started more than ``UNOWNED_GRACE_S`` ago; another machine's trials
    are left to it. Failing a live trial made its search crash ("Cannot tell a FAIL trial")."""
    optuna = sampler._optuna()
    stale = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
             if not shared or _is_stale(t)]
    requeued = 0
    for t in stale:
        try:
            study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # its owner finished it, or another search failed it
            continue
        fixed = t.system_attrs.get("fixed_params")
        if fixed or shared:
            study.enqueue_trial(fixed or t.params, skip_if_exists=False)
            requeued += 1
    return requeued


OWNER_ATTR = "owner"  # host:pid of the process that runs a trial
UNOWNED_GRACE_S = 600.0


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owned(objective: Callable) -> Callable:
    """The objective, first recording which process runs the trial (``_requeue_stale``)."""
    def run(trial):
        trial.set_user_attr(OWNER_ATTR, _owner())
        return objective(trial)
    return run


def _is_stale(trial) -> bool:
    owner = trial.user_attrs.get(OWNER_ATTR)
    if owner is None:
        started = trial.datetime_start
        return started is None or (datetime.datetime.now() - started).total_seconds() > UNOWNED_GRACE_S
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def run(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
        settings: sampler.StudySettings, evaluator: Evaluator, run_dir: Path,
        seeds: list[dict] | None = None, progress: Progress | None = None,
        tree: sampler.LayoutTree | None = None):
    """Create (``seeds`` given) or resume (``seeds`` None: the study must exist) the study in
    ``run_dir`` and complete ``settings.trials`` trials.

    ``seeds``: layouts (knob -> value, possibly partial) enqueued first on a fresh study.
    """
    with _Interrupts((signal.SIGINT, signal.SIGTERM)) as interrupts:
        study = _open(settings, run_dir) if seeds is not None else open_existing(settings, run_dir)
        try:
            if not interrupts.asked:
                _complete(study, model, hw, gpus, gbs, space, settings, evaluator, run_dir, seeds, progress,
                          tree, interrupts)
        except json.JSONDecodeError as exc:  # a journal cut mid-record (disk full, kill -9)
            close(study)
            raise UserError(f"the study of {run_dir} is damaged (its journal breaks off: {exc}); "
                            "start a new search") from None
        except BaseException:  # no connection left open on a folder about to be renamed
            close(study)
            raise
        if interrupts.asked:
            close(study)
    return study


def _complete(study, model, hw, gpus, gbs, space, settings, evaluator, run_dir, seeds, progress, tree,
              interrupts: _Interrupts) -> None:
    optuna = sampler._optuna()
    tree = tree or sampler.LayoutTree(model, hw, gpus, gbs, space)
    if len(study.get_trials(deepcopy=False)) == 0:
        for layout in seeds or []:
            params = tree.params_for(layout)
            if params is not None:
                study.enqueue_trial(params, skip_if_exists=True)
    else:
        _requeue_stale(study, shared=settings.storage not in ("", "journal"))
    objective = _owned(sampler.make_objective(tree, hw, evaluator, settings.objectives, space.memory_fraction))
    limit = optuna.study.MaxTrialsCallback(settings.trials, states=(optuna.trial.TrialState.COMPLETE,))
    if completed(study) >= settings.trials:
        return
    if progress:  # the trials start: the bar counts them from here
        progress(completed(study), best_throughput(study))

    if settings.workers == 1:
        best = [best_throughput(study)]

        def report(s, trial):
            metrics = trial.user_attrs.get("metrics", {})
            if trial.user_attrs.get("reason") == "" and (best[0] is None or metrics["tokens_per_s_per_gpu"] > best[0]):
                best[0] = metrics["tokens_per_s_per_gpu"]
            if progress:
                progress(completed(s), best[0])
        study.optimize(objective, n_trials=settings.trials - completed(study),
                       callbacks=[limit, report, interrupts.stop])
        return

    parent = os.getpid()

    def work(index: int) -> None:
        from autoparallel.children import die_with_parent
        die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler, inherited by fork
        mine = _open(settings, run_dir, worker=index + 1)
        # The parent's terminate(): stop cleanly. A SIGTERM to the whole process group comes
        # before the parent's; the second must not interrupt Optuna's journal lock (a traceback
        # per worker), and the parent kills a worker that does not stop within STOP_GRACE_S.
        with _Interrupts((signal.SIGTERM,), again=False) as terminate:
            mine.optimize(objective, n_trials=settings.trials, callbacks=[limit, terminate.stop])

    ctx = multiprocessing.get_context("fork")
    workers = []
    try:
        for i in range(worker_count(settings.workers, settings.trials - completed(study))):
            if interrupts.asked:
                break
            workers.append(ctx.Process(target=work, args=(i,), daemon=True))
            workers[-1].start()
        while any(w.is_alive() for w in workers) and not interrupts.asked:
            time.sleep(0.2)
            if progress:
                progress(completed(study), best_throughput(study))
    finally:
        _stop(workers)


# Trials of the cost model are CPU-bound: more processes than this many per core only add
# start-up time, memory and lock contention on the study (a profiling trial waits on its job,
# where a few per core still help).
WORKERS_PER_CORE = 4
STOP_GRACE_S = 3.0  # a terminated worker finishes its trial (milliseconds for the cost model)


def worker_count(asked: int, trials_left: int) -> int:
    """``--workers`` capped at the trials left and ``WORKERS_PER_CORE`` per core, said on stderr
    when capped."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    count = max(1, min(asked, trials_left, WORKERS_PER_CORE * cores))
    if count < asked:
        from autoparallel.ranges import warn
        from autoparallel.words import plural
        why = (f"{plural(trials_left, 'trial')} left" if count == max(1, trials_left)
               else f"{WORKERS_PER_CORE} per core on {plural(cores, 'core')}")
        warn(f"--workers {asked} capped at {count} ({why})")
    return count


def _stop(workers: list) -> None:
    """Terminate the workers, give them ``STOP_GRACE_S`` in all to finish their trial, then kill
    the rest: a signalled search ends within seconds whatever the number of workers."""
    for w in workers:
        if w.is_alive():
            w.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.join(timeout=max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join()
