"""`autoparallel fp8-check` and `search --fp8-check` from the command line (tiny settings)."""

import json

import pytest
import yaml

pytest.importorskip("torch")

from autoparallel.cli import main  # noqa: E402


def test_fp8_check_command_writes_folder_and_json(tiny_yaml, tmp_path, capsys):
    rc = main(["fp8-check", "--model", "gpt3-175b", "--settings", str(tiny_yaml), "--steps", "12",
               "--recipes", "fp8-current", "--results", str(tmp_path), "--json", "--no-plots"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["proxy"] == "gpt3-175b-proxy" and [v["recipe"] for v in out["verdicts"]] == ["fp8-current"]
    assert out["verdicts"][0]["verdict"] == "ok"
    run_dir = tmp_path / out["run_dir"].split("/")[-1]
    manifest = yaml.safe_load((run_dir / "manifest.yaml").read_text())
    assert manifest["inputs"]["settings"]["run"]["steps"] == 12
    assert manifest["inputs"]["proxy"]["activation"] == "gelu"
    assert (run_dir / "stats.csv").exists() and not (run_dir / "loss_curves.png").exists()


def test_fp8_check_refuses_unknown_recipe(capsys):
    assert main(["fp8-check", "--model", "gpt3-175b", "--recipes", "mxfp4", "--no-save"]) == 2
    assert "cannot be checked" in capsys.readouterr().err


def test_search_with_fp8_check(tiny_yaml, tmp_path, capsys):
    rc = main(["search", "--model", "gpt3-5b", "--gpus", "64", "--tp", "4", "--pp", "2",
               "--fp8-check", "--fp8-check-settings", str(tiny_yaml), "--fp8-check-steps", "12",
               "--precision", "fp8-current", "--results", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "fp8-check folder" in out and "FP8 check" in out
    search_dir = next(p for p in tmp_path.iterdir() if p.is_dir() and "fp8check" not in p.name)
    best = yaml.safe_load((search_dir / "best.yaml").read_text())
    assert best["plan"]["precision"] == "fp8-current" and best["fp8_check"]["verdict"] == "ok"
    assert "FP8 check" in (search_dir / "ranked.md").read_text()


def test_the_verdict_table_reads_at_80_columns(monkeypatch):
    """At 80 columns rich cut the recipes to 'fp8-del…' and the worst layers to 'layers.0…': now the
    recipes, losses, gaps and verdicts are a table and each recipe's worst layers are lines below it."""
    import io as stdio
    import types

    from rich.console import Console

    from autoparallel.fp8check import report
    worst = {"worst_underflow": "layers.0.self_attention.linear_qkv grad_output 0.061 %",
             "worst_overflow": "layers.3.mlp.linear_fc2 input 0.008 %",
             "worst_mse": "layers.2.mlp.linear_fc1 input 6.95e-04"}
    rows = [{"recipe": name, "final_loss": 3.79, "loss_gap_pct": -0.01, "verdict": "ok", **worst}
            for name in ("fp8-delayed", "fp8-blockwise")]
    monkeypatch.setattr(report, "verdict_rows", lambda result: rows)
    result = types.SimpleNamespace(
        model=types.SimpleNamespace(name="cpu-small"), proxy=types.SimpleNamespace(num_layers=4, hidden_size=128),
        settings=types.SimpleNamespace(run=types.SimpleNamespace(steps=20, final_window=5)), seconds=32.0,
        bf16=types.SimpleNamespace(final_loss=lambda window: 3.79), verdicts={})
    buffer = stdio.StringIO()
    report.print_check(result, Console(file=buffer, width=80))
    text = buffer.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    assert "fp8-delayed" in text and "fp8-blockwise" in text and all(w in text for w in worst.values())
    # the title is one line above the table, not centred over two at the table's width
    assert text.startswith("fp8-check of cpu-small on its proxy (4 layers, hidden 128, 20 steps, 32 s)\n")


def test_the_training_runs_under_a_progress_display(monkeypatch):
    """Each proxy run trains for a minute or more (200 steps) between two progress lines: a spinner with
    the elapsed time now runs the whole check (a pulsing bar since session 48), and the lines still print
    above it."""
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.fp8check import check, command
    console, seen = Console(file=stdio.StringIO(), force_terminal=True), []

    def run_check(model, settings, progress=None):
        seen.append(bool(console._live_stack))
        progress("fp8-delayed: ok")
        return "result"
    monkeypatch.setattr(check, "run_check", run_check)
    result, run_dir = command.check_and_save(io.load_model("cpu-small"), command.load_settings(), None, [], console)
    assert (result, run_dir, seen) == ("result", None, [True]) and not console._live_stack
    assert "fp8-check: fp8-delayed: ok" in console.file.getvalue()


def test_the_training_in_a_pipe_prints_its_lines_and_no_bar(monkeypatch):
    """fp8-check built its own spinner outside autoparallel/progress.py, drawn even off a terminal:
    `fp8-check | cat` began with the bar's empty line (session 48). Now only the lines come out."""
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.fp8check import check, command
    console, seen = Console(file=stdio.StringIO(), width=80), []

    def run_check(model, settings, progress=None):
        seen.append(bool(console._live_stack))
        progress("fp8-delayed: ok")
        return "result"
    monkeypatch.setattr(check, "run_check", run_check)
    assert not console.is_terminal
    command.check_and_save(io.load_model("cpu-small"), command.load_settings(), None, [], console)
    assert seen == [False] and console.file.getvalue() == "fp8-check: fp8-delayed: ok\n"
