"""One training search from inputs to a ranked frame and a run folder; and reading one back."""

from __future__ import annotations

import os
import shutil
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autoparallel import io, ranges, safefile
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, MEMORY_KEYS, record
from autoparallel.errors import UserError
from autoparallel.report import moe_export, run_folder, tables
from autoparallel.report.export import export_document
from autoparallel.report.time_to_train import TimeToTrain
from autoparallel.search.grid import evaluate
from autoparallel.space import SearchSpace, generate_with_sources, row_to_plan
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


# A grid run folder keeps the best KEEP_FEASIBLE feasible candidates in candidates.csv and one
# row per rejecting rule (its count and one example) in rejections.csv, unless --all-candidates:
# every row of a DeepSeek-V3 / 1024-GPU search is 385 MB of CSV and 20-40 s of writing (issue 24).
KEEP_FEASIBLE = 50_000
REJECTIONS = "rejections.csv"


@dataclass
class SearchResult:
    model: ModelSpec
    hardware: HardwareSpec
    gpus: int
    gbs: int
    space: SearchSpace
    ranked: pd.DataFrame  # every candidate, best first; rank is NA where rejected
    objectives: tuple[str, ...] = ("throughput",)  # two: profiling picks from the Pareto front
    profiled: pd.DataFrame | None = None  # rows `--profile` measured (written as profiled.csv)
    # Loaded from a summarised folder: the rules' counts and examples, and the feasible total.
    rejections: pd.DataFrame | None = None
    feasible_total: int | None = None
    train: TimeToTrain | None = None  # --tokens / --train-days: the time to train beside each layout

    _feasible: tuple[pd.DataFrame, pd.DataFrame] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def feasible(self) -> pd.DataFrame:
        """The fitting rows, best first; filtered once per ``ranked`` frame (millions of rows on
        MoE spaces, read by every table and export of the run)."""
        if self._feasible is None or self._feasible[0] is not self.ranked:
            fits = self.ranked["fits"].to_numpy(dtype=bool)
            n = int(fits.sum())
            # A ranked frame (grid.rank) holds its fitting rows first: then they are its first n
            # rows, a slice that shares the columns (a filter copied 1.7 M rows of 70 columns).
            prefix = fits[:n].all()
            self._feasible = (self.ranked, self.ranked.iloc[:n] if prefix else self.ranked[fits])
        return self._feasible[1]

    def plan(self, rank: int) -> Plan:
        return row_to_plan(self.entry(rank))

    def entry(self, rank: int) -> pd.Series:
        n = len(self.feasible)
        if n == 0:
            raise UserError("this run has no feasible plan to pick a --rank from")
        if not 1 <= rank <= n:
            if self.feasible_total and self.feasible_total > n and rank <= self.feasible_total:
                raise UserError(f"--rank {rank}: this run folder keeps the best {n:,} of {self.feasible_total:,} "
                                "feasible plans; search again with --all-candidates to keep every one")
            raise UserError(f"--rank {rank} is out of range: this run has {n:,} feasible plans (1..{n:,})")
        return self.feasible.iloc[rank - 1]

    def records(self, top: int) -> list[dict]:
        return [record(row_to_plan(row).as_dict(), row) for _, row in self.feasible.head(top).iterrows()]


def default_gbs(model: ModelSpec, gbs: int | None) -> int:
    """``gbs`` if given; else a fine-tuning run's recipe global batch (``Finetune.default_global_batch``:
    fine-tuning takes far smaller batches than the pre-training preset's), else the preset's."""
    if gbs is not None:
        return gbs
    if model.finetune is not None:
        return model.finetune.default_global_batch
    if model.global_batch_size is None:
        raise UserError(f"model {model.name!r} has no global_batch_size; pass --gbs")
    return model.global_batch_size


def search(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
           recompute_num_layers: int | None = None, fp8_decisions: dict | None = None,
           pinned: dict | None = None, progress: typing.Callable[[int, int], None] | None = None) -> SearchResult:
    """Every candidate priced and ranked; a UserError naming what rules them all out if none
    fits (``pinned``: the knobs the user pinned, named first in that message; ``progress(done,
    total)``: rows priced so far)."""
    candidates, sources = generate_with_sources(model, hw, gpus, gbs, space, recompute_num_layers)
    if fp8_decisions:  # verdicts of `fp8-check` (autoparallel.fp8check.search_filter)
        from autoparallel.fp8check.search_filter import apply_to_candidates
        candidates, sources = apply_to_candidates(candidates, fp8_decisions), None  # generate's frame only
    ranked = evaluate(model, hw, candidates, space.memory_fraction, progress, space.cost_settings(), sources)
    result = SearchResult(model, hw, gpus, gbs, space, ranked)
    if result.feasible.empty:
        from autoparallel.search.diagnose import explain, out_of_memory
        memory = out_of_memory(ranked)
        more = None
        if not memory.empty and not fp8_decisions:  # the same search on more GPUs (fp8-check's verdicts are per count)
            more = fewest_gpus_that_fit(model, hw, gpus, gbs, space, recompute_num_layers,
                                        float(memory["peak_memory_gib"].min()), progress)
        raise UserError(explain(ranked, model, hw, gpus, gbs, space, pinned, more))
    return result


FEWEST_GPU_SEARCHES = 4  # at most this many extra searches to name a GPU count (each as long as the first)


def fewest_gpus_that_fit(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
                         recompute_num_layers: int | None, need_gib: float | None, progress=None):
    """A count of ``gpus`` x 2, x 4, ... at which the same search finds a layout that fits, the
    fewest such where the searches reach half of it (``diagnose.MoreGpus``); None where no count is
    reached in ``FEWEST_GPU_SEARCHES`` searches or one has no valid layout (the global batch cannot
    be split that far, a pinned knob...).

    ``need_gib``: the least need at ``gpus`` (None: unknown, as after a sampler search, so ``gpus``
    is searched first: where a layout fits there, ``gpus`` is the count). Model state
    sharded over the GPUs is most of a need that large, so the first count tried is ``gpus`` times the
    power of two that covers the need over the limit; the count half as large is then searched too, so
    that the one named is the fewest."""
    import math

    from autoparallel.search.diagnose import MoreGpus, out_of_memory
    # GiB, the least need of a count (0: a layout fits; None: none is valid)
    needs = {} if need_gib is None else {gpus: need_gib}

    def need(count: int) -> float | None:
        if count not in needs:
            candidates, sources = generate_with_sources(model, hw, count, gbs, space, recompute_num_layers)
            ranked = evaluate(model, hw, candidates, space.memory_fraction, progress, space.cost_settings(), sources)
            memory = out_of_memory(ranked)
            needs[count] = (0.0 if ranked["fits"].astype(bool).any() else
                            None if memory.empty else float(memory["peak_memory_gib"].min()))
        return needs[count]

    if need(gpus) is None:
        return None
    if need(gpus) == 0:  # searched here (need_gib None): layouts fit on the count asked
        return MoreGpus(gpus, None)
    count = gpus * 2 ** max(1, math.ceil(math.log2(need(gpus) / (space.memory_fraction * hw.memory_gib))))
    while len(needs) <= FEWEST_GPU_SEARCHES:
        if need(count) is None:
            return None
        if need(count) > 0:
            count *= 2
            continue
        if count // 2 not in needs and len(needs) > FEWEST_GPU_SEARCHES:
            return MoreGpus(count, None)  # layouts fit there; whether on half as many is not searched
        if need(count // 2) == 0:
            count //= 2
            continue
        return MoreGpus(count, need(count // 2))
    return None


def save(result: SearchResult, root: Path, command: list[str], top_md: int = 50,
         all_candidates: bool = False) -> Path:
    """The run folder of a finished grid search, complete or (on any failure) absent; every
    candidate in candidates.csv with ``all_candidates``, else the best feasible ones and the
    rejections summarised per rule (``KEEP_FEASIBLE``, ``REJECTIONS``)."""
    def make(staging: Path) -> Path:
        run_dir = run_folder.new_run_dir(staging, result.model.name, result.gpus, result.hardware.name)
        write_manifest(run_dir, result.model, result.hardware, result.gpus, result.gbs, result.space, command,
                       {"strategy": "grid", "candidates": len(result.ranked),
                        "feasible": int(result.ranked["fits"].sum()),
                        "candidates_file": "all" if all_candidates else "feasible",
                        **({"time_to_train": result.train.settings()} if result.train else {})})
        write_tables(result, run_dir, top_md, summarise=not all_candidates)
        return run_dir
    return run_folder.staged(root, make)


def write_manifest(run_dir: Path, model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int,
                   space: SearchSpace, command: list[str], extra: dict) -> None:
    run_folder.write_yaml(run_dir / run_folder.MANIFEST, run_folder.manifest(command, {
        "kind": "training", "model": io.to_dict(model), "hardware": io.to_dict(hw),
        "gpus": gpus, "gbs": gbs, "space": io.to_dict(space), **extra}))


def write_tables(result: SearchResult, run_dir: Path, top_md: int = 50, summarise: bool = False) -> None:
    """ranked.md, best.yaml and candidates.csv of a finished search (best.yaml only if one fits),
    after profiled.csv when it was profiled: a sampler run's tables are rebuilt from the study
    plus that file (``finish_study``), so it must never lag behind the tables."""
    if result.profiled is not None:
        run_folder.write_csv(run_dir / run_folder.PROFILED, result.profiled)
    title = f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}"
    run_folder.write_atomic(run_dir / run_folder.RANKED, f"# {title}\n\n" + tables.markdown_table(
        result.ranked, top_md, result.hardware, result.space.memory_fraction, result.feasible_total,
        train=result.train, model=result.model))
    if not result.feasible.empty:
        write_best(run_dir, result.model, result.hardware, result.entry(1), title)
    rows = result.ranked
    if summarise:  # the best feasible rows, and one row per rejecting rule
        rows = result.feasible.head(KEEP_FEASIBLE)
        run_folder.write_csv(run_dir / REJECTIONS, tables.rejection_examples(result.ranked))
    run_folder.write_csv(run_dir / run_folder.CANDIDATES, rows)
    run_folder.write_parquet(run_dir / run_folder.CANDIDATES_PARQUET, rows)


def plan_document(model: ModelSpec, hw: HardwareSpec, row: pd.Series) -> dict:
    """best.yaml's content for one ranked row; metrics rounded as candidates.csv rounds them,
    so exporting from a saved run reproduces the file written at search time."""
    plan = row_to_plan(row)
    rounded = {k: round(v, run_folder.FLOAT_DIGITS) if isinstance(v, float) else v for k, v in row.items()}
    metrics = record(plan.as_dict(), rounded)
    metrics.pop("config")
    doc = export_document(model, plan, metrics, hw.gpus_per_node)
    if (te := moe_export.te_min_version(model, plan)) is not None:
        doc["transformer_engine_min_version"] = te
    if "fp8_check" in row:  # the search ran with --fp8-check
        from autoparallel.fp8check.search_filter import document
        if (fp8 := document(row)) is not None:
            doc["fp8_check"] = fp8
    return doc


def write_best(run_dir: Path, model: ModelSpec, hw: HardwareSpec, row: pd.Series, title: str) -> None:
    """best.yaml and train.sh (the launch script) of the rank-1 plan; no train.sh for LoRA or FP8
    attention, which Megatron-LM's pretrain_gpt.py cannot run (``export --format nemo2`` writes
    their recipe)."""
    run_folder.write_yaml(run_dir / run_folder.BEST, plan_document(model, hw, row))
    from autoparallel.costmodel.finetune import is_lora
    from autoparallel.report.shared import hybrid_unsupported, megatron_unsupported
    if is_lora(model) or megatron_unsupported(row_to_plan(row)) or hybrid_unsupported(model):
        return
    run_folder.write_atomic(run_dir / run_folder.TRAIN_SCRIPT, launch_script(model, hw, row, title))


def launch_script(model: ModelSpec, hw: HardwareSpec, row: pd.Series, title: str) -> str:
    """train.sh for one ranked row, headed by what was predicted for it."""
    from autoparallel.report.launch import train_script
    plan = row_to_plan(row)
    layout = f"TP{plan.tp} PP{plan.pp} VP{plan.vp} CP{plan.cp} DP{plan.dp} MBS{plan.mbs} {plan.precision}"
    predicted = (f"predicted {row['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, {row['step_time_s']:.2f} s/step, "
                 f"{row['peak_memory_gib']:.1f} GiB")
    return train_script(model, plan, hw, f"{title}: {layout}; {predicted}")


MANIFEST_INPUTS = ("model", "hardware", "gpus", "gbs", "space")


# Where the report of a run folder that `report` / `export` do not read already is.
OTHER_KINDS_REPORT = {
    "inference": "its ranked.md and candidates.csv are its report (`autoparallel infer` printed them)",
    "fp8-check": "its verdicts.md, stats.csv and plots are its report (`autoparallel fp8-check` wrote them)"}


def load_inputs(run_dir: Path) -> tuple[dict, ModelSpec, HardwareSpec, SearchSpace]:
    """The manifest's inputs of a training run folder, as specs."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / run_folder.MANIFEST
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run folder ({'a file' if run_dir.exists() else 'no such folder'})")
    if not manifest_path.is_file():
        raise UserError(f"{run_dir} is not a run folder (no {run_folder.MANIFEST})")
    inputs = io.read_yaml(manifest_path).get("inputs")
    if isinstance(inputs, dict) and inputs.get("kind", "training") != "training":
        kind = inputs["kind"]
        raise UserError(f"{run_dir} is a run folder of `{kind}`, not of a training search; "
                        f"{OTHER_KINDS_REPORT.get(kind, 'its own files are its report')}")
    missing = [k for k in MANIFEST_INPUTS if not isinstance(inputs, dict) or k not in inputs]
    if missing:
        raise UserError(f"{manifest_path}: not a search's manifest (no inputs {', '.join(missing)})")
    for key in ("gpus", "gbs"):
        if isinstance(inputs[key], bool) or not isinstance(inputs[key], int) or inputs[key] < 1:
            raise UserError(f"{manifest_path}: inputs.{key} must be a positive integer, got {inputs[key]!r}")
    for key in ("model", "hardware", "space"):
        if not isinstance(inputs[key], dict):
            raise UserError(f"{manifest_path}: inputs.{key} must be a mapping, got {inputs[key]!r}")
    model = io.from_dict(ModelSpec, inputs["model"], str(manifest_path))
    hw = io.from_dict(HardwareSpec, inputs["hardware"], str(manifest_path))
    space = io.from_dict(SearchSpace, inputs["space"], str(manifest_path))
    return inputs, model, hw, space


def load(run_dir: Path) -> SearchResult:
    """A saved run, for export and reports."""
    run_dir = Path(run_dir)
    inputs, model, hw, space = load_inputs(run_dir)
    if not (run_dir / run_folder.CANDIDATES).exists():
        raise UserError(f"{run_dir} has no {run_folder.CANDIDATES} yet (an interrupted sampler run? "
                        "use `autoparallel search --resume` or `autoparallel report`)")
    ranked = read_table(run_dir / run_folder.CANDIDATES, ("rank",))
    result = SearchResult(model, hw, int(inputs["gpus"]), int(inputs["gbs"]), space, ranked)
    if (run_dir / REJECTIONS).exists():  # a summarised folder (older ones hold every row)
        result.rejections = read_table(run_dir / REJECTIONS)
        result.feasible_total = int(inputs.get("feasible", len(result.feasible)))
    if inputs.get("time_to_train"):
        result.train = TimeToTrain(result.gpus, **inputs["time_to_train"])
    return result


TABLE_COLUMNS = ("fits", "reason")


def read_table(path: Path, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A candidates-like CSV as written (with ``columns`` besides the plan's): CSV turns '' into
    NaN, the tables want '' back."""
    text = ("reason", "measurement_error", "measured_device") + tuple(
        name for name, kind in typing.get_type_hints(Plan).items() if kind is str)
    try:
        with safefile.open_capped(path, "run table") as f:
            frame = pd.read_csv(f, low_memory=False, dtype=dict.fromkeys(text, str))
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty (an interrupted run? run the search again)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path} is not a candidates table: {' '.join(str(exc).split())[:200]}") from None
    missing = [c for c in columns + TABLE_COLUMNS + Plan.field_names()[:4] if c not in frame]
    if missing:
        raise UserError(f"{path} is not a candidates table (no column {', '.join(missing)})")
    frame["fits"] = frame["fits"].astype(str).str.lower().eq("true")
    for col in text:
        if col in frame:
            frame[col] = frame[col].fillna("")
    ranges.first_damage(frame[frame["reason"] == ""], path, STORED_POSITIVE, BREAKDOWN_KEYS + MEMORY_KEYS,
                        [c for c in frame if c.startswith("measured_") and c not in text])
    return frame


# The metrics every priced candidate has: a damaged table is refused, not exported.
STORED_POSITIVE = ("step_time_s", "tokens_per_s_per_gpu", "peak_memory_gib")


# --- sampler (Optuna) searches ------------------------------------------------------------------

def optuna_search(model: ModelSpec, hw: HardwareSpec, gpus: int, gbs: int, space: SearchSpace,
                  settings, root: Path | None, command: list[str], progress=None) -> tuple[SearchResult, Path | None]:
    """A sampler search whose study lives in its run folder, so that it can be resumed.

    Everything that can be refused (no valid layout, a bad storage URL) is refused before a
    folder exists. The folder is built in staging and published when the study ends, or when it
    is interrupted after its first completed trial (then as a resumable study; KeyboardInterrupt
    goes on up, naming the folder). ``root`` None (``--no-save``): the study lives in a temporary
    folder that is deleted.
    """
    import dataclasses
    import tempfile

    from autoparallel.search import sampler, study
    from autoparallel.search.evaluators import CostModelEvaluator
    tree = sampler.LayoutTree(model, hw, gpus, gbs, space)
    seeds = sampler.published_layouts(model, gpus, hw.name) if settings.published_seeds else []
    if settings.seeds_from_grid:
        best = search(model, hw, gpus, gbs, space).feasible.head(settings.seeds_from_grid)
        seeds = [row.to_dict() for _, row in best.iterrows()] + seeds
    if not settings.study_name:
        settings = dataclasses.replace(settings, study_name=study.name_for(model, hw, gpus, gbs, space,
                                                                           settings.objectives))
    study.check_storage(settings)
    evaluator = CostModelEvaluator(model, hw, space.memory_fraction, settings=space.cost_settings())

    def run_in(run_dir: Path) -> SearchResult:
        s = study.run(model, hw, gpus, gbs, space, settings, evaluator, run_dir, seeds, progress, tree)
        return _finish(s, model, hw, gpus, gbs, space, run_dir, settings.objectives, more_gpus=True)

    if root is None:
        with tempfile.TemporaryDirectory(prefix="autoparallel-study-") as tmp:
            return run_in(Path(tmp)), None
    staging = run_folder.make_staging(root)
    try:
        run_dir = run_folder.new_run_dir(staging, model.name, gpus, hw.name)
        with run_folder.locked(run_dir):
            write_manifest(run_dir, model, hw, gpus, gbs, space, command,
                           {"strategy": "optuna", "study": io.to_dict(settings)})
            try:
                result = run_in(run_dir)
            except KeyboardInterrupt:
                _keep_interrupted(run_dir, settings, model, hw, gpus, gbs, space)
                raise
            return result, run_folder.publish(run_dir)
    except OSError as exc:
        raise UserError(f"cannot write a run folder in {root}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _finish(s, model, hw, gpus, gbs, space, run_dir: Path, objectives, keep_profiled: bool = True,
            more_gpus: bool = False) -> SearchResult:
    """finish_study, then the storage closed (its folder may be renamed next)."""
    from autoparallel.search import study
    try:
        return finish_study(s, model, hw, gpus, gbs, space, run_dir, objectives, keep_profiled, more_gpus)
    finally:
        study.close(s)


def _keep_interrupted(run_dir: Path, settings, model, hw, gpus, gbs, space) -> None:
    """An interrupted study with completed trials: its tables written and its folder published,
    then KeyboardInterrupt saying how to resume it. Without a completed trial there is nothing to
    keep (the caller removes the staging folder)."""
    from autoparallel.search import study
    try:
        s = study.open_existing(settings, run_dir)
    except UserError:  # interrupted before the study was created
        return
    done = study.completed(s)
    if done == 0:
        study.close(s)
        return
    try:
        _finish(s, model, hw, gpus, gbs, space, run_dir, settings.objectives)
    except UserError:
        pass  # none of the completed trials is feasible: the tables say so
    final = run_folder.publish(run_dir)
    raise KeyboardInterrupt(f"kept {done} of {settings.trials} trials in {final}; continue with "
                            f"`autoparallel search --resume {final}`")


def resume(run_dir: Path, progress=None, keep_profiled: bool = True) -> tuple[SearchResult, Path]:
    """Continue the interrupted sampler search of ``run_dir`` without re-running finished trials;
    returns the result and the run folder (a search killed in staging is published now).

    ``keep_profiled``: put an earlier ``--profile``'s measurements back into the tables (they
    stay true of their layouts); False when the caller profiles the new top-k instead.
    """
    from autoparallel.search import study
    from autoparallel.search.evaluators import CostModelEvaluator
    run_dir = Path(run_dir)
    inputs, model, hw, space = load_inputs(run_dir)
    if inputs.get("strategy") != "optuna":
        if keep_profiled:
            raise UserError(f"{run_dir} is a grid search: there is nothing to resume (run it again, or profile "
                            "its best layouts with --profile job)")
        return _unprofiled(load(run_dir)), run_dir
    settings = _study_settings(inputs, run_dir)
    gpus, gbs = int(inputs["gpus"]), int(inputs["gbs"])
    evaluator = CostModelEvaluator(model, hw, space.memory_fraction, settings=space.cost_settings())
    with run_folder.locked(run_dir, "--resume"):
        try:
            s = study.run(model, hw, gpus, gbs, space, settings, evaluator, run_dir, None, progress)
        except KeyboardInterrupt:
            _keep_interrupted(run_dir, settings, model, hw, gpus, gbs, space)
            raise
        result = _finish(s, model, hw, gpus, gbs, space, run_dir, settings.objectives, keep_profiled)
        return result, run_folder.publish(run_dir)


def _unprofiled(result: SearchResult) -> SearchResult:
    """A saved grid run without an earlier ``--profile``'s measurements, ranked by prediction
    again (the caller profiles its top-k afresh)."""
    from autoparallel.search.grid import rank
    measured = [c for c in result.ranked if c.startswith("measured_") or c == "measurement_error"]
    result.ranked = rank(result.ranked.drop(columns=measured + ["rank"], errors="ignore"))
    return result


def open_study(run_dir: Path):
    """The Optuna study of a sampler run folder (its storage and name read from the manifest)."""
    from autoparallel.search import study
    inputs = load_inputs(run_dir)[0]
    return study.open_existing(_study_settings(inputs, Path(run_dir)), Path(run_dir))


def _study_settings(inputs: dict, run_dir: Path):
    from autoparallel.search import sampler
    if not isinstance(inputs.get("study"), dict):
        raise UserError(f"{run_dir / run_folder.MANIFEST}: an optuna run's manifest needs its study settings")
    return io.from_dict(sampler.StudySettings, inputs["study"], str(run_dir / run_folder.MANIFEST))


def finish_study(s, model, hw, gpus, gbs, space, run_dir: Path, objectives: tuple[str, ...],
                 keep_profiled: bool = True, more_gpus: bool = False) -> SearchResult:
    """The study's tables, written to ``run_dir`` (with profiled.csv merged back if asked).
    ``more_gpus``: where no trial fits in memory, the grid is priced to name the GPU count at which
    layouts fit, as grid search's message does (``fewest_gpus_that_fit``)."""
    from autoparallel.search import sampler
    from autoparallel.search.grid import rank
    frame = sampler.trials_frame(s)
    if frame.empty:
        raise UserError(f"the study in {run_dir} has no completed trial")
    result = SearchResult(model, hw, gpus, gbs, space, rank(frame), objectives)
    if keep_profiled:
        _merge_profiled(result, run_dir)
    write_tables(result, run_dir)
    if result.feasible.empty:
        top = "; ".join(f"{n} x {r}" for r, n in tables.rejection_summary(result.ranked).head(3).items())
        # Not `--resume` (it named a staging folder removed right after, or the temporary one of --no-save,
        # and a study that ran all its trials takes no more: --trials has no effect with --resume).
        tried = f"none of the {len(frame)} layouts the study tried is feasible ({top})"
        from autoparallel.search.diagnose import fits_on, out_of_memory
        more = (fewest_gpus_that_fit(model, hw, gpus, gbs, space, None, None)
                if more_gpus and not out_of_memory(result.ranked).empty else None)
        if more is not None and more.gpus > gpus:
            raise UserError(f"{tried}, and no layout of the grid fits on {gpus} x {hw.name}; "
                            + fits_on(more, "layouts fit", "search"))
        raise UserError(f"{tried}; search again with more --trials or with --strategy grid (every layout priced)")
    return result


def _merge_profiled(result: SearchResult, run_dir: Path) -> None:
    """A sampler run's measurements (profiled.csv) back into its tables, matched by trial number:
    the study is the record of a sampler run, but finished trials are read-only, so what
    ``--profile`` measured lives beside it."""
    from autoparallel.search import measured
    path = Path(run_dir) / run_folder.PROFILED
    if not path.exists():
        return
    saved = read_table(path)
    label = pd.Series(result.ranked.index, index=result.ranked["trial"])
    saved = saved[saved["trial"].isin(label.index)]
    saved.index = label.loc[saved["trial"]].to_numpy()
    result.profiled = saved
    result.ranked = measured.merge(result.ranked, saved)


def report(run_dir: Path) -> tuple[SearchResult, typing.Callable[[], Path]]:
    """The run's result for the terminal table (from the study storage for sampler runs, from
    candidates.csv for grid runs, whose CSV is the record itself), and the function that re-renders
    ranked.md and writes report.html (its path). The table needs no write: a run folder that
    cannot be written (a teammate's, a read-only mount) still gets it printed, the refusal to
    write after it; a sampler run's there is read from the tables its search wrote, since opening
    its study writes to the study."""
    from autoparallel.report import html
    run_dir = Path(run_dir)
    inputs, model, hw, space = load_inputs(run_dir)
    sampler = inputs.get("strategy") == "optuna" and os.access(run_dir, os.W_OK | os.X_OK)
    if sampler:
        from autoparallel.search import study
        settings = _study_settings(inputs, run_dir)
        with run_folder.locked(run_dir, "report"):
            s = study.open_existing(settings, run_dir)
            result = _finish(s, model, hw, int(inputs["gpus"]), int(inputs["gbs"]), space, run_dir,
                             settings.objectives)  # its tables written too
    else:
        result = load(run_dir)
    title = f"{model.name} on {result.gpus} x {hw.name}, gbs {result.gbs}"

    def write() -> Path:
        path = run_dir / "report.html"
        run_folder.write_atomic(path, html.render(result.ranked, title, space.memory_fraction * hw.memory_gib, hw,
                                                  result.rejections, result.feasible_total))
        if not sampler:
            run_folder.write_atomic(run_dir / run_folder.RANKED, f"# {title}\n\n" + tables.markdown_table(
                result.ranked, 50, hw, space.memory_fraction, result.feasible_total, result.train, model))
        return path
    return result, write
