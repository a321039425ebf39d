"""The repository as its design card lays it out, and the docs that say so (issue 24): the top
level holds pyproject.toml, autoparallel, kernels, search_spaces, tests, results and README.md;
the commands the contributor notes show run as shown; the README cites notes a reader has."""

import shlex
from pathlib import Path

import pytest

from autoparallel import resources
from autoparallel.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]


def _commands() -> list[tuple[str, str]]:
    """(file, command) for every indented `autoparallel ...` line without a placeholder."""
    out = []
    for path in DOCS:
        for line in path.read_text().splitlines():
            text = line.strip()
            if line.startswith("    autoparallel ") and not any(c in text for c in "<|") and "RUN_DIR" not in text:
                out.append((path.name, text))
    return out


def test_the_top_level_is_the_design_cards():
    for name in ("pyproject.toml", "autoparallel", "kernels", "search_spaces", "tests", "results", "README.md"):
        assert (ROOT / name).exists(), name
    assert (ROOT / "kernels").resolve() == resources.KERNELS.resolve()  # one home, inside the package
    assert (ROOT / "search_spaces").resolve() == resources.SEARCH_SPACES.resolve()


def test_the_readme_cites_notes_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "../shared/" not in readme and "docs/design.md" in readme and "results/README.md" in readme


def test_the_docs_show_commands():
    assert len(_commands()) >= 5


@pytest.mark.parametrize("where, command", _commands(), ids=[c for _, c in _commands()])
def test_each_command_the_docs_show_runs(where, command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # paths in the docs are the checkout's
    before = set(ROOT.iterdir())
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    assert set(ROOT.iterdir()) == before  # nothing written into the checkout
