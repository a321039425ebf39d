"""Optuna search: constraints, storage, resume after a kill, parallel workers, reports."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna", reason="the optuna extra is not installed")

from autoparallel import io  # noqa: E402
from autoparallel.cli import main  # noqa: E402
from autoparallel.search import run, sampler, study  # noqa: E402
from autoparallel.space import load_space  # noqa: E402

SMALL = ["--model", "llama2-7b", "--gpus", "8", "--strategy", "optuna", "--precision", "fp8-delayed",
         "--grid-seeds", "0"]


@pytest.fixture(scope="module")
def llama():
    return io.load_model("llama2-7b"), io.load_hardware("h100-sxm"), load_space()


def test_layout_tree_reaches_exactly_the_valid_layouts(llama):
    model, hw, space = llama
    tree = sampler.LayoutTree(model, hw, 8, 128, space)
    grid = run.search(model, hw, 8, 128, space)
    valid = grid.ranked[grid.ranked["reason"].eq("") | grid.ranked["reason"].str.startswith("out of memory")]
    leaves = []

    def collect(node, depth):
        if depth == len(sampler.TREE_KNOBS):
            leaves.append(node)
            return
        for child in node.values():
            collect(child, depth + 1)
    collect(tree.root, 0)
    assert len(leaves) == len(set(leaves)) == len(valid)
    assert (tree.frame.loc[leaves, "reason"] == "").all()


def test_params_for_a_grid_row_reach_that_row(llama):
    model, hw, space = llama
    tree = sampler.LayoutTree(model, hw, 8, 128, space)
    for _, row in run.search(model, hw, 8, 128, space).feasible.head(10).iterrows():
        params = tree.params_for(row.to_dict())
        index = tree.walk(lambda knob, name, choices: params[name])
        chosen = tree.row(index).iloc[0]
        assert all(sampler._norm(chosen[k]) == sampler._norm(row[k]) for k in sampler.TREE_KNOBS)
    assert tree.params_for({"tp": 3}) is None


def test_infeasible_trials_complete_with_a_violated_constraint(llama, tmp_path):
    model, hw, space = llama
    settings = sampler.StudySettings(trials=40, seeds_from_grid=0, seed=3)
    result, run_dir = run.optuna_search(model, hw, 8, 128, space, settings, tmp_path, ["test"])
    s = run.open_study(run_dir)
    trials = s.get_trials(deepcopy=False)
    assert len(trials) == 40 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    bad = [t for t in trials if t.user_attrs["reason"]]
    good = [t for t in trials if not t.user_attrs["reason"]]
    assert bad and good
    assert all(t.user_attrs["reason"].startswith("out of memory") for t in bad)  # rules pruned the rest
    assert all(t.constraints["feasible"] > 0 for t in bad) and all(t.constraints["feasible"] <= 0 for t in good)
    assert s.best_trial.user_attrs["reason"] == ""
    assert (run_dir / "study.db").exists() and (run_dir / "best.yaml").exists()
    assert result.feasible["tokens_per_s_per_gpu"].iloc[0] == pytest.approx(
        s.best_trial.user_attrs["metrics"]["tokens_per_s_per_gpu"])


def test_grid_seeds_and_published_layout_are_tried_first(llama, tmp_path):
    model, hw, space = llama
    settings = sampler.StudySettings(trials=8, seeds_from_grid=3, seed=0)
    result, run_dir = run.optuna_search(model, hw, 8, 128, space, settings, tmp_path, ["test"])
    first = run.open_study(run_dir).get_trials(deepcopy=False)[:4]
    grid_best = run.search(model, hw, 8, 128, space).feasible.iloc[0]
    assert first[0].user_attrs["metrics"]["tokens_per_s_per_gpu"] == pytest.approx(grid_best["tokens_per_s_per_gpu"])
    assert first[3].params["tp"] == 1 and first[3].params["mbs"] == 1  # NeMo's llama2-7b layout


def test_two_objectives_give_a_pareto_front(llama, tmp_path):
    model, hw, space = llama
    settings = sampler.StudySettings(sampler="nsga2", trials=30, objectives=("throughput", "memory"),
                                     seeds_from_grid=0)
    dense = space.pinned(cp=1, pp=1, precision="fp8-delayed")  # mostly valid layouts
    _, run_dir = run.optuna_search(model, hw, 8, 128, dense, settings, tmp_path, ["test"])
    front = run.open_study(run_dir).best_trials
    assert front and all(t.user_attrs["reason"] == "" for t in front)


def test_killed_search_resumes_to_the_same_best(tmp_path, completed_trials):
    trials = 60
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel.cli", "search", *SMALL, "--trials", str(trials),
                             "--results", str(killed_root), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    db = None
    while time.time() < deadline:
        dbs = list(killed_root.glob(".partial-*/*/study.db"))  # a run folder is staged until it ends
        if dbs and completed_trials(dbs[0]) >= 15:
            db = dbs[0]
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert db is not None, "the search never reached 15 trials"
    assert completed_trials(db) < trials
    assert main(["search", "--resume", str(db.parent), "--json"]) == 0
    (run_dir,) = killed_root.iterdir()  # the resumed study is published, its staging folder gone
    assert not run_dir.name.startswith(".")
    db = run_dir / "study.db"
    with sqlite3.connect(db) as c:
        states = dict(c.execute("select state, count(*) from trials group by state").fetchall())
        numbers = [n for (n,) in c.execute("select number from trials")]
    assert states.get("COMPLETE") == trials and "RUNNING" not in states
    assert len(numbers) == len(set(numbers))
    assert main(["search", *SMALL, "--trials", str(trials), "--results", str(clean_root), "--json"]) == 0
    resumed = run.load(run_dir).feasible.iloc[0]
    clean_dir = next(clean_root.iterdir())
    clean = run.load(clean_dir).feasible.iloc[0]
    assert resumed["tokens_per_s_per_gpu"] == pytest.approx(clean["tokens_per_s_per_gpu"])
    # The sampler is reseeded from the count of completed trials: the resumed study proposed
    # exactly the layouts the uninterrupted one did.
    with sqlite3.connect(db) as a, sqlite3.connect(clean_dir / "study.db") as b:
        query = ("select t.number, p.param_name, p.param_value from trials t join trial_params p "
                 "on t.trial_id = p.trial_id where t.state = 'COMPLETE'")
        completed_a = sorted(r[1:] for r in a.execute(query))
        completed_b = sorted(r[1:] for r in b.execute(query))
    assert completed_a == completed_b


def test_parallel_workers_complete_each_trial_once(llama, tmp_path):
    model, hw, space = llama
    settings = sampler.StudySettings(trials=24, workers=2, seeds_from_grid=4, seed=1)
    _, run_dir = run.optuna_search(model, hw, 8, 128, space, settings, tmp_path, ["test"])
    assert (run_dir / "study.journal").exists()
    trials = run.open_study(run_dir).get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 24 <= len(complete) <= 24 + settings.workers - 1  # the cap is checked after each trial
    assert len({t.number for t in trials}) == len(trials)
    enqueued = [tuple(sorted(t.system_attrs["fixed_params"].items())) for t in trials
                if t.system_attrs.get("fixed_params")]
    assert len(enqueued) == 5 == len(set(enqueued))  # 4 grid seeds + NeMo's layout, each run once


def test_report_renders_html_with_plots(tmp_path):
    assert main(["search", "--model", "llama2-7b", "--gpus", "8", "--results", str(tmp_path)]) == 0
    run_dir = next(tmp_path.iterdir())
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "<table>" in page


def test_resume_of_a_grid_run_is_refused(tmp_path):
    assert main(["search", "--model", "llama2-7b", "--gpus", "8", "--results", str(tmp_path)]) == 0
    assert main(["search", "--resume", str(next(tmp_path.iterdir()))]) == 2


def test_pareto_front_is_non_dominated():
    import numpy as np

    from autoparallel.report.plots import pareto_front
    memory = np.array([10, 20, 15, 30, 25])
    throughput = np.array([1.0, 3.0, 2.0, 2.5, 4.0])
    assert list(pareto_front(memory, throughput)) == [0, 2, 1, 4]


def test_the_layout_tree_turns_every_plan_knob():
    from autoparallel.search.sampler import DERIVED, TREE_KNOBS
    from autoparallel.specs.plan import Plan
    assert sorted(TREE_KNOBS + DERIVED) == sorted(Plan.field_names())


def test_a_killed_trial_is_requeued_only_where_the_sampler_would_not_propose_it_again():
    """A stale sampled trial (here killed after one of its parameters) is failed, not re-queued:
    re-queuing its partial parameters would shift the reseeded sampler's draws. A stale seed (an
    enqueued layout) is queued again with its whole layout; in a shared study every stale trial is."""
    import optuna
    states = optuna.trial.TrialState
    own = optuna.create_study()
    own.ask().suggest_int("tp", 1, 8)  # RUNNING, one parameter of several suggested
    own.enqueue_trial({"tp": 2, "pp": 4})
    seed = own.ask()
    assert seed.params == {} and study._requeue_stale(own, shared=False) == 1
    waiting = own.get_trials(states=(states.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"tp": 2, "pp": 4}]
    assert len(own.get_trials(states=(states.FAIL,))) == 2
    shared = optuna.create_study()
    shared.ask().suggest_int("tp", 1, 8)
    assert study._requeue_stale(shared, shared=False) == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = shared.ask()
    killed.suggest_int("tp", 1, 8)
    killed.set_user_attr(study.OWNER_ATTR, f"{socket.gethostname()}:{dead.pid}")
    assert study._requeue_stale(shared, shared=True) == 1


def test_the_bar_says_the_grid_is_priced_before_it_counts_trials(monkeypatch):
    """A sampler search's bar read 'trials 0/8' while it first priced the whole grid for its seed
    layouts (a minute for a large model): until the trials start it says what runs, with no count."""
    from contextlib import contextmanager

    from autoparallel.cli import common
    shown = []  # (description, total) of the bar, each time it changes

    class Bar:
        def update(self, task, completed=None, total=None, description=None):
            shown.append((description, total))

    @contextmanager
    def progress_bar(description, total):
        shown.append((description, total))
        yield Bar(), 0
    grid = run.search
    during_grid = []
    monkeypatch.setattr(common, "progress_bar", progress_bar)
    monkeypatch.setattr(run, "search", lambda *a, **k: during_grid.append(shown[-1]) or grid(*a, **k))
    argv = ["search", "--model", "llama2-7b", "--gpus", "8", "--strategy", "optuna", "--trials", "4", "--no-save"]
    assert main([*argv, "--grid-seeds", "2"]) == 0
    assert during_grid == [("pricing the grid for the 2 best layouts (the first trials)", None)]
    assert shown[1] == ("trials", 4) and shown[-1][1] == 4
    shown.clear()
    assert main([*argv, "--grid-seeds", "0"]) == 0
    assert shown[0] == ("starting the study", None) and shown[1] == ("trials", 4)


def test_a_study_that_fits_nothing_where_the_grid_does_advises_more_trials(capsys):
    """The other side of naming a GPU count (session 52): where no trial of a sampler search fits in
    memory but layouts of the grid fit on the GPUs asked, the CLI keeps the "more --trials" advice
    and names no count. Llama 2 7B on 4 GPUs, 2 trials: the first seed whose study fits nothing."""
    argv = ["search", "--model", "llama2-7b", "--gpus", "4", "--no-save", "--json", "--top", "1"]
    for seed in range(8):
        if main([*argv, "--strategy", "optuna", "--grid-seeds", "0", "--trials", "2", "--seed", str(seed)]) == 2:
            break
        capsys.readouterr()
    else:
        pytest.fail("every study of 2 trials, seeds 0-7, found a layout that fits")
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message == ("autoparallel: error: none of the 2 layouts the study tried is feasible (2 x out of memory); "
                       "search again with more --trials or with --strategy grid (every layout priced)")
    assert main(argv) == 0  # the grid has a layout that fits on these 4 GPUs
    assert json.loads(capsys.readouterr().out)[0]["fits"]


@pytest.mark.parametrize("save", [True, False])
def test_a_study_with_no_feasible_layout_names_no_folder_to_resume(tmp_path, save):
    """A study whose trials all ran out of memory said "run more trials with `autoparallel search
    --resume <dir>`": the dir was the staging folder (removed right after) or --no-save's temporary
    one, and a study that ran all its trials takes no more (--trials has no effect with --resume).
    Where no layout of the grid fits either, it names the GPU count at which layouts do (session 52)."""
    from autoparallel.errors import UserError
    model, hw = io.load_model("gpt3-175b"), io.load_hardware("h100-sxm")
    settings = sampler.StudySettings(trials=3, seeds_from_grid=0, seed=0)
    with pytest.raises(UserError, match=r"none of the 3 layouts the study tried is feasible \(3 x out of memory\), "
                                        r"and no layout of the grid fits on 8 x h100-sxm; layouts fit on 64 GPUs "
                                        r"\(32 still need [\d.]+ GiB\): search --gpus 64$") as caught:
        run.optuna_search(model, hw, 8, 2048, load_space(), settings, tmp_path if save else None, ["test"])
    assert "--resume" not in str(caught.value) and str(tmp_path) not in str(caught.value)
    assert not list(tmp_path.iterdir())  # no folder left behind that the message could have meant
