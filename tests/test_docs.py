"""The README and docs/ say what the code does today (issues 24 and 28).

- The repository's top level is the design card's: pyproject.toml, autoparallel, kernels,
  search_spaces, tests, results and README.md.
- Every ```sh block a page shows is run, as a user would in a fresh folder of a checkout, in the
  page's order (a search writes the run folder the next block exports), unless the line before it
  is `<!-- not run: reason -->`: a block that installs, needs a GPU, a cluster or minutes, or shows
  placeholders must say so there. A block that is run holds `autoparallel` commands only.
- Every relative link and every repository path a page names (in backticks) exists.
- Every script or test named in the README, docs/ and benchmarks/RESULTS.md exists; RESULTS.md is
  a dated log, so a script deleted since a section was written is allowed only through
  ``ALLOWED_MISSING`` below, and each line naming it says "removed in <commit>".
- The README's first section holds exactly its two commands, the second is what .ci/run runs, and
  its picture of the ranked table is the headline command's real 80-column output.
"""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from autoparallel import resources
from autoparallel.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]
NOT_RUN = re.compile(r"^<!-- not run: (\S.*\S) -->$")

# Paths RESULTS.md names that are not in this repository: each line naming one must carry its
# marker, which says why (RESULTS.md is a dated log: old sections keep the names they used).
ALLOWED_MISSING = {
    "benchmarks/bench_inference.py": "removed in 6e4827b",  # benchmarks/bench_serving.py replaces it
    "benchmarks/bench_calibration_cv.py": "removed in 786b1e2",  # `autoparallel validate` holds out models
    "tests/test_inference.py": "removed in ac59930",  # tests/serve/ replaces it
    "benchmarks/cpp/prepare_dataset.py": "TensorRT-LLM's",  # TensorRT-LLM's own script, not this repository's
}


def _blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """(not-run reason or None, commands) for each ```sh block; `\\` continues a command."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            before = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
            reason = NOT_RUN.match(before)
            end = lines.index("```", i + 1)
            body = "\n".join(lines[i + 1:end]).replace("\\\n", " ")
            out.append((reason.group(1) if reason else None, [c.strip() for c in body.splitlines() if c.strip()]))
            i = end
        i += 1
    return out


def _runnable(path: Path) -> list[str]:
    return [c for reason, commands in _blocks(path.read_text()) if reason is None for c in commands]


def test_the_top_level_is_the_design_cards():
    for name in ("pyproject.toml", "autoparallel", "kernels", "search_spaces", "tests", "results", "README.md"):
        assert (ROOT / name).exists(), name
    assert (ROOT / "kernels").resolve() == resources.KERNELS.resolve()  # one home, inside the package
    assert (ROOT / "search_spaces").resolve() == resources.SEARCH_SPACES.resolve()


def test_the_readme_cites_notes_in_the_repository():
    readme = README.read_text()
    assert "../shared/" not in readme and "docs/design.md" in readme and "docs/run-folders.md" in readme


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_each_block_runs_or_says_why_not(page):
    text = page.read_text()
    for reason, commands in _blocks(text):
        if reason is None:
            for command in commands:
                assert command.startswith("autoparallel "), f"{page.name}: not an autoparallel command, " \
                    f"so mark its block `<!-- not run: reason -->`: {command}"
                assert "<" not in command and "..." not in command, f"{page.name}: a placeholder: {command}"
    assert text.count("<!-- not run:") == sum(r is not None for r, _ in _blocks(text)), \
        f"{page.name}: a `not run` marker that is not right above a ```sh block"


def test_the_docs_run_commands():
    assert sum(len(_runnable(p)) for p in PAGES) >= 20


@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p)],
                         ids=[p.relative_to(ROOT).as_posix() for p in PAGES if _runnable(p)])
def test_the_commands_a_page_shows_run(page, tmp_path, monkeypatch, capsys):
    """In a fresh folder holding the checkout's files (so `tests/fixtures/...` resolves) but its
    own results/ and preset folder, each command in order; globs expand as a shell's would."""
    for entry in ROOT.iterdir():
        if entry.name != "results" and not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv(resources.HOME_ENV, str(tmp_path / "home"))  # `calibrate --as` writes a preset there
    for command in _runnable(page):
        argv = [a for word in shlex.split(command, comments=True)[1:]
                for a in (sorted(glob.glob(word)) or [word] if any(c in word for c in "*?[") else [word])]
        assert main(argv) == 0, f"{page.name}: {command}\n{capsys.readouterr().err}"
        assert capsys.readouterr().out.strip(), f"{page.name}: {command} printed nothing"


def _links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]


_PATH = re.compile(r"(?<![\w./-])((?:\.ci|autoparallel|benchmarks|docs|kernels|results|scripts|search_spaces|tests)"
                   r"/[\w./*-]*[\w*/])")


def _paths(text: str) -> set[str]:
    """Repository paths in `code` spans and code blocks (placeholders and run outputs left out)."""
    code = " ".join(re.findall(r"`([^`]+)`", text))
    return {p.rstrip("/") for p in _PATH.findall(code) if "<" not in p and not re.match(r"results/(?!README)", p)}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_links_and_paths_exist(page):
    text = page.read_text()
    for link in _links(text):
        assert (page.parent / link.split("#")[0]).exists(), f"{page.name}: broken link {link}"
    for path in _paths(text):
        assert glob.glob(str(ROOT / path)), f"{page.name}: no {path} in the repository"


def _named_scripts(text: str) -> set[str]:
    """benchmarks/*.py, tests/**.py and scripts/* paths, and bare bench_*.py / test_*.py names."""
    named = set(re.findall(r"(?<![\w/])((?:benchmarks|tests|scripts)/[\w./*-]*[\w*])", text))
    for bare in re.findall(r"(?<![\w/])((?:bench|test)_\w+\.py)", text):
        if not any(p.endswith("/" + bare) for p in named):
            named.add(bare)
    return named


def _exists(name: str) -> bool:
    if "/" in name:
        return bool(glob.glob(str(ROOT / name)))
    return any(ROOT.glob(f"benchmarks/{name}")) or any(ROOT.glob(f"tests/**/{name}"))


@pytest.mark.parametrize("page", [*PAGES, RESULTS], ids=[p.relative_to(ROOT).as_posix() for p in [*PAGES, RESULTS]])
def test_every_script_named_exists(page):
    text = page.read_text()
    missing = {n for n in _named_scripts(text) if not _exists(n)}
    allowed = set(ALLOWED_MISSING) if page == RESULTS else set()
    assert missing <= allowed, f"{page.name} names scripts that do not exist: {sorted(missing - allowed)}"
    for name in missing:
        for line in text.splitlines():
            if name in line:
                assert ALLOWED_MISSING[name] in line, f"RESULTS.md names {name} without '{ALLOWED_MISSING[name]}': {line}"


def test_the_allow_list_holds_only_what_is_missing():
    for name in ALLOWED_MISSING:
        assert not (ROOT / name).exists(), f"{name} exists again: take it off ALLOWED_MISSING"
        assert name in RESULTS.read_text(), f"{name} is no longer named: take it off ALLOWED_MISSING"


def _section(heading: str) -> str:
    return next(s for s in README.read_text().split("\n## ") if s.startswith(heading))


def test_the_quick_start_is_two_commands_and_ci_runs_the_second():
    blocks = _blocks(_section("Quick start"))
    commands = [c for _, cs in blocks for c in cs]
    assert len(commands) == 2 and all(reason for reason, _ in blocks)
    install, search = commands[0].split(" && ")
    assert install == "pip install -e ." and search.startswith("autoparallel search --model 175b --gpus 1024")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    install, test = commands[1].split(" && ")
    assert install.replace("pip install", "pip install -q") in ci and test in ci


def test_the_picture_of_the_table_is_the_headline_commands_output(tmp_path, monkeypatch, capsys):
    """The ```text block of the README's table section is what the quick start's search prints
    in an 80-column terminal (the timing and the run folder's date vary)."""
    picture = re.search(r"```text\n(.*?)```", _section("The ranked table"), re.S).group(1).splitlines()
    search = [c for _, cs in _blocks(_section("Quick start")) for c in cs][0].split(" && ")[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(shlex.split(search)[1:]) == 0

    def varying(lines):
        return [re.sub(r"in \d+\.\d+ s\)", "in _ s)", re.sub(r"\d{4}-\d\d-\d\d_", "DATE_", s)).rstrip()
                for s in lines]
    assert varying(capsys.readouterr().out.splitlines()) == varying(picture)



def test_the_size_limits_table_is_safefiles():
    """docs/run-folders.md's table of read limits holds each kind of autoparallel/safefile.py, at
    its limit (it once said 4 GiB for a run table, read at most 1 GiB, and left out workload files)."""
    from autoparallel.safefile import LIMITS
    rows = re.findall(r"^\| ([^|`]+?) (?:\([^)]*\) )?\| (\d+ [MG]iB) \|$",
                      (ROOT / "docs" / "run-folders.md").read_text(), re.M)
    shown = {"YAML file" if kind == "YAML" else kind: size for kind, size in rows}
    assert shown == {kind: f"{n // 2**30} GiB" if n % 2**30 == 0 else f"{n // 2**20} MiB" for kind, n in LIMITS.items()}
