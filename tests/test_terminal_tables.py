"""The ranked tables as a person sees them (issue 24): the real CLI in a real terminal (tmux) at
80, 120 and 200 columns; the captured screen must show every layout value and measure of the top
rows in full, drop low-priority columns whole (naming them), and keep the legend to three lines.

tmux runs on its own socket in a temporary folder, so that no other tmux server of the machine is
touched and nothing is left behind. Without
tmux (and no way to install it) these tests skip, saying so; .ci/run installs it.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from autoparallel import io
from autoparallel.report import tables
from autoparallel.search import run as runs
from autoparallel.serve import report as serve_report
from autoparallel.serve import search as serve
from autoparallel.serve.assumptions import load_engine
from autoparallel.serve.space import load_space as load_serve_space
from autoparallel.space import load_space

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (80, 120, 200)
SEARCH = ["search", "--model", "llama3-70b", "--gpus", "64", "--no-save", "--top", "20"]
INFER = ["infer", "--model", "llama3-70b", "--gpus", "8", "--max-latency-ms", "50", "--no-save", "--top", "5"]
TOP = 5

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it with apt-get)")


def screen(argv: list[str], width: int, height: int = 80, python: list[str] | None = None) -> str:
    """What a ``width``-column terminal shows after running ``autoparallel argv`` in it (or, given
    ``python``, ``python *python``: a script that prints what a test already holds)."""
    folder = Path(tempfile.mkdtemp(prefix="ap-tmux-"))  # the server's socket, removed with it
    socket, done = folder / "socket", f"done-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-S", str(socket), "-f", os.devnull]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = shlex.join([sys.executable, *(python or ["-m", "autoparallel", *argv])])
    # The pane stays open after the command (sleep) so that it can be captured, then goes with the server.
    shell = f"cd {shlex.quote(str(ROOT))} && {command}; tmux -S {shlex.quote(str(socket))} wait-for -S {done}; sleep 60"
    try:
        subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", str(height), shell], env=env, check=True)
        subprocess.run([*tmux, "wait-for", done], timeout=120, check=True)
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "0"], capture_output=True, text=True,
                              check=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _contains_in_order(tokens: list[str], wanted: list[str]) -> bool:
    it = iter(tokens)
    return all(any(t == w for t in it) for w in wanted)


def _row_line(text: str, cells: list[str]) -> str:
    """The screen line that shows ``cells`` (the first being the rank) as whole words, in order."""
    lines = [line for line in text.splitlines() if line.split()[:1] == cells[:1]
             and _contains_in_order(line.split(), cells)]
    assert lines, f"row {cells} not shown in full on:\n{text}"
    return lines[0]


KEPT = ["#", "TP", "PP", "VP", "CP", "EP", "DP", "MBS", "SP", "mem GiB", "step s", "tok/s/GPU", "MFU", "tie"]


def _every_row(text: str) -> dict[str, str]:
    """The kept columns that went, each with the value every row holds: "every row: EP 1, SP yes"
    (and "every row is a tie": the tie mark, yes)."""
    joined = " ".join(line.strip() for line in text.splitlines())
    found = re.search(r"every row: ([^;]*)", joined)
    shared = dict(item.rsplit(" ", 1) for item in found[1].split(", ")) if found else {}
    return shared | ({"tie": "yes"} if "every row is a tie" in joined else {})


@pytest.fixture(scope="module")
def expected_search():
    model, hw = io.load_model("llama3-70b"), io.load_hardware("h100-sxm")
    result = runs.search(model, hw, 64, model.global_batch_size, load_space())
    columns = tables._columns(result.ranked)
    rows = tables.ranked_rows(result.ranked, 20, hw)
    kept = [i for i, c in enumerate(columns) if not c.drop]
    assert [columns[i].header for i in kept] == KEPT
    return [[row[i] for i in kept] for row in rows[:TOP]], [c.header for c in columns]


@pytest.mark.parametrize("width", WIDTHS)
def test_search_table_in_a_terminal(width, expected_search):
    rows, headers = expected_search
    text = screen(SEARCH, width)
    assert "…" not in text and "Traceback" not in text
    assert "candidate layouts" not in text  # the progress bar is gone once the table is there
    # a kept column goes only where every row holds its value (the precision needs the room), named with it
    shared = {h: v for h, v in _every_row(text).items() if h in KEPT}
    assert all(row[KEPT.index(h)] == v for h, v in shared.items() for row in rows), shared
    for cells in rows:
        _row_line(text, [c for h, c in zip(KEPT, cells) if h not in shared])
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["#", "TP", "PP"])
    end = next(i for i in range(head + 2, len(lines)) if not lines[i].split()[:1] or not lines[i].split()[0].isdigit())
    # "top 20 of N feasible" over fewer rows read as a miscount: the title says how many layouts they are
    counts = re.search(r"top 20 of [\d,]+ feasible candidates in (\d+) layouts", " ".join(lines[:head]))
    assert counts and int(counts[1]) == end - head - 2 < 20, lines[:head]
    tail = [line for line in lines[end:] if line.strip()]
    legend = [line for line in tail if line.startswith(("tie:", "MFU:", "one row per layout"))]
    note = " ".join(line for line in tail if line not in legend)
    shown = lines[head].split()
    if width < 200:  # narrower than the whole table: columns went, and the note under it says which
        gone = note.partition("--wide adds ")[2].split(", ")
        assert gone and all(h in headers for h in gone) and "other" in gone
        assert not {"differs", "other", "FP8 util"} <= set(shown)
    else:
        assert not note and {"precision", "differs", "other"} <= set(shown)
    assert 1 <= len(legend) <= 3 and "--explain" in legend[-1]


def test_narrower_terminals_drop_more_columns_never_a_kept_one(expected_search):
    """... but one that every row shares, named with its value under the table."""
    texts = {w: screen(SEARCH, w) for w in (80, 120)}
    shown = {w: next(line for line in text.splitlines() if line.split()[:2] == ["#", "TP"])
             for w, text in texts.items()}
    assert len(shown[80]) < len(shown[120])
    layout = ["#", "TP", "PP", "VP", "CP", "EP", "DP", "MBS", "SP"]
    assert shown[120].split()[:9] == layout and not _every_row(texts[120])
    assert [h for h in shown[80].split() if h in layout] == [h for h in layout if h not in _every_row(texts[80])]


@pytest.mark.parametrize("width", (80, 120))
def test_infer_table_in_a_terminal(width):
    model, hw = io.load_model("llama3-70b"), io.load_hardware("h100-sxm")
    request = serve.Request(2048, 256, max_tpot_ms=50.0)
    result = serve.search(model, hw, 8, request, load_serve_space("inference"), load_engine("tensorrt-llm"))
    columns = serve_report._columns(result.feasible)
    kept = [i for i, c in enumerate(columns) if not c.drop]
    text = screen(INFER, width)
    assert "…" not in text
    for row in serve_report.rows(result.feasible, TOP, columns):
        _row_line(text, [row[i] for i in kept])


def _cells(text: str, headers: tuple[str, ...]) -> tuple[dict[str, str] | None, list[str]]:
    """Each row's cell in the first of the text columns ``headers`` the screen shows, by its rank
    (None where it shows none), and the lines under the table. A text cell starts where its header
    does (headers hold spaces: "mem GiB")."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["#", "TP", "PP"])
    found = [m for h in headers if (m := re.search(rf"(?<!\S){re.escape(h)}(?!\S)", lines[head]))]
    cells, end = {}, head + 2
    while lines[end].split()[:1] and lines[end].split()[0].isdigit():
        cells[lines[end].split()[0]] = lines[end][found[0].start():].split()[0] if found else ""
        end += 1
    column = found[0] if found else None
    return (cells if column is not None else None), [line.rstrip() for line in lines[end:] if line.strip()]


def _precisions(text: str) -> tuple[dict[str, str], str]:
    """Each row's precision cell by its rank, and the lines under the table, as a screen shows them."""
    cells, under = _cells(text, ("precision", "prec"))
    assert cells is not None, f"no precision column:\n{text}"
    return cells, " ".join(under)


@pytest.mark.parametrize("argv", [["--model", "175b", "--gpus", "1024"], ["--model", "deepseek-v3", "--gpus", "1024"],
                                  ["--model", "llama3.1-70b", "--gpus", "64"]])
def test_the_precision_stays_at_80_columns_where_rows_differ_in_it(argv):
    """At 80 columns the precision went first of the layout's columns, so an FP8-delayed row read
    like an FP8-blockwise one: where rows differ in it, it stays (a column every row shares goes
    first, into the note), as a code where its name does not fit, the note saying what each means.
    The note keeps each of its parts on one line where it fits on one (the 175B note ended "var," /
    "differs, other"), and a tie mark that went says "every row is a tie", not "tie yes" (session 52)."""
    wide_text, narrow_text = (screen(["search", *argv, "--no-save"], w) for w in (200, 80))
    wide, _ = _precisions(wide_text)
    assert len(set(wide.values())) > 1, wide  # the rows differ in it
    narrow, under = _precisions(narrow_text)
    names = {code: name for name, code in tables.PRECISION_CODES}
    assert {rank: names.get(cell, cell) for rank, cell in narrow.items()} == wide
    for code in set(narrow.values()) & set(names):
        assert f"{code} = {names[code]}" in under, under
    assert "--wide adds precision" not in under
    lines = _cells(narrow_text, ())[1]
    note = [line for line in lines if not line.startswith(("tie:", "MFU:", "one row per layout"))]
    assert note and all(len(line) <= 80 for line in note), note
    for part in " ".join(note).split("; "):
        assert len(part) > 80 or any(part.rstrip(";") in line for line in note), (part, note)
    ties, _ = _cells(narrow_text, ("tie",))
    assert "tie yes" not in under
    if ties is None:  # it went: every row is a tie, and the note says so in words
        assert set(_cells(wide_text, ("tie",))[0].values()) == {"yes"} and "every row is a tie" in under, under


KNOB_HEADERS = ("TP", "PP", "EP", "replicas", "batch", "max tokens", "weights", "KV")


def test_no_two_pareto_rows_look_alike_at_80_columns():
    """`infer` at 80 columns showed Pareto rows that read the same (TP8 PP1, 1 replica, batch 1, twice,
    with different TTFTs): 'max tokens', which told them apart, went before the end-to-end latency."""
    text = screen(["infer", "--model", "llama3.1-70b", "--gpus", "8", "--no-save"], 80)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Pareto front")) + 1
    knobs = [h for h in KNOB_HEADERS if f" {h} " in f" {lines[head]} "]
    assert "max tokens" in knobs, lines[head]
    rows = []
    for line in lines[head + 2:]:
        if not line.split() or not line.split()[0].isdigit():
            break
        cells = line.split()
        rows.append(tuple(cells[1:1 + len(knobs)]))  # the knob columns come right after the rank
    assert len(rows) > 5 and len(set(rows)) == len(rows), rows
    assert "rows alike here differ" not in text and "Traceback" not in text


ESTIMATES = {  # (argv, the title's phrases, each of which must stay on one line)
    "qwen3-235b-b200": (["estimate", "--model", "qwen3-235b", "--gpus", "256", "--gpu", "b200", "--tp", "2", "--pp", "8",
                         "--ep", "32", "--vp", "4", "--precision", "mxfp8"],
                        ["qwen3-235b-a22b on 256 x b200:", "TP2 PP8 VP4 CP1 DP16 EP32 ETP1", "MBS1 GBS8192", "seq 4096",
                         "mxfp8", "recompute=none"]),
    "dsv4-pro-modules": (["estimate", "--model", "dsv4-pro", "--gpus", "1024", "--gpu", "gb300", "--tp", "1", "--pp", "8",
                          "--ep", "64", "--recompute", "selective", "--recompute-modules", "mla_up_proj mhc"],
                         ["deepseek-v4-pro on 1024 x gb300:", "TP1 PP8 VP1 CP1 DP128 EP64 ETP1", "MBS1 GBS4096",
                          "seq 4096", "bf16", "recompute=selective (mla_up_proj mhc)"]),
}


@pytest.mark.parametrize("case", ESTIMATES)
def test_the_estimate_title_breaks_between_phrases_at_80_columns(case):
    """`estimate`'s title (81-90 characters) was left to the terminal's word wrap, which broke it
    mid-phrase ('... GBS8192 seq' / '4096 mxfp8 ...'): now it breaks between phrases only."""
    argv, phrases = ESTIMATES[case]
    lines = screen(argv, 80).splitlines()
    title = [line.strip() for line in lines[:lines.index(next(line for line in lines if line.startswith("┌")))]]
    assert " ".join(title) == " ".join(phrases), title
    for phrase in phrases:
        assert any(phrase in line for line in title), f"{phrase!r} broken over two lines: {title}"


@pytest.mark.parametrize("argv, start", [
    (["search", "--model", "175b", "--gpus", "8", "--no-save"], "autoparallel: error: no layout of gpt3-175b fits"),
    (["runs", "results/2026-11-29_gpt3-175b_1024xh100-sxm"], "autoparallel: error: runs: argument ACTION"),
    (["estimate", "--model", "175b", "--gpus", "8"], "autoparallel: error: estimate needs at least")])
def test_an_error_breaks_between_words_on_a_terminal_and_stays_one_line_in_a_pipe(argv, start):
    """A terminal cut the one-line error at its 80th column, "layouts fit on 6" / "4 GPUs", "(ch" /
    "oose from 'import')": on a terminal it breaks between phrases (words where a phrase is wider),
    in a pipe it stays one line. The second is argparse's (a bad argument), the first the command's."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    piped = subprocess.run([sys.executable, "-m", "autoparallel", *argv], env=env, capture_output=True, text=True)
    (message,) = piped.stderr.splitlines()
    assert piped.returncode == 2 and message.startswith(start) and len(message) > 80
    lines = [line.rstrip() for line in screen(argv, 80).splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if line.startswith("autoparallel: error:"))
    shown = lines[first:]
    assert len(shown) > 1 and " ".join(shown) == message  # every break at a space: no word or figure cut
    assert shown[0].startswith(start)  # "autoparallel: error:" never alone on its line
    for layout in re.findall(r"TP\d+ PP\d+ CP\d+ DP\d+", message):  # "(TP8 PP1 CP1" / "DP1:" read as two
        assert any(layout in line for line in shown), shown


def test_runs_import_breaks_its_lines_between_phrases_at_80_columns(tmp_path):
    """Each log's line (~150 characters) was left to the terminal, which broke "35.9" / "GiB max
    allocated" and the layout "TP2 PP2" / "VP4 CP1" (session 53): now between phrases; in a pipe,
    one line still."""
    # relative to the checkout (both runs start there): an absolute path can be wider than the
    # terminal by itself, where it is broken inside its name wherever the checkout lies
    log = "tests/fixtures/runlogs/megatron_tp2_pp2_vp4_sp_selective_fp8.log"
    argv = ["runs", "import", log, "--gpu", "h100-sxm", "--runs", str(tmp_path / "runs.csv")]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    piped = subprocess.run([sys.executable, "-m", "autoparallel", *argv], env=env, capture_output=True, text=True,
                           cwd=ROOT)
    line = piped.stdout.splitlines()[0]
    assert piped.returncode == 0 and line.startswith("read ") and len(line) > 80
    (tmp_path / "runs.csv").unlink()
    lines = [x.rstrip() for x in screen(argv, 80).splitlines() if x.strip()]
    shown = lines[:next(i for i, x in enumerate(lines) if x.startswith("1 new row"))]
    assert " ".join(shown) == line and all(len(x) <= 80 for x in shown)
    for phrase in ("16 x h100-sxm,", "TP2 PP2 VP4 CP1 MBS1 GBS128 fp8-delayed recompute=selective;",
                   "6.452 s per iteration,", "35.9 GiB max allocated"):
        assert any(phrase in x for x in shown), shown


def test_calibrate_s_wrote_line_keeps_its_parenthetical_whole_at_80_columns(tmp_path, monkeypatch):
    """`calibrate --as NAME` ended with "wrote PATH (use it with --gpu NAME)", left to the terminal's
    word wrap: "(use it" / "with --gpu NAME)" (session 55); now broken before the "(", one line in a pipe."""
    runs = tmp_path / "runs.csv"
    assert subprocess.run([sys.executable, "-m", "autoparallel", "runs", "import",
                           *sorted(str(p) for p in (ROOT / "tests/fixtures/runlogs").glob("megatron_*.log")),
                           "--gpu", "h100-sxm", "--runs", str(runs)], cwd=ROOT, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0
    name = "my-cluster-with-a-longer-name"  # "wrote <home>/hardware/NAME.yaml (use it with --gpu NAME)" > 80
    # a short home: a path wider than the terminal by itself is broken inside its name
    home = Path(tempfile.mkdtemp(prefix="ap-"))
    monkeypatch.setenv("AUTOPARALLEL_HOME", str(home))  # screen() passes the environment on
    argv = ["calibrate", "--runs", str(runs), "--gpu", "h100-sxm", "--as", name]
    try:
        lines = [x.rstrip() for x in screen(argv, 80).splitlines() if x.strip()]
    finally:
        shutil.rmtree(home)
    said = lines[next(i for i, x in enumerate(lines) if x.startswith("wrote ")):]
    assert said == [f"wrote {home / 'hardware' / name}.yaml", f"(use it with --gpu {name})"], said


def test_the_simulated_table_s_legend_breaks_between_its_parts_at_80_columns():
    """infer's traffic-simulation legend was one line left to the terminal: "(server: the largest
    whose bounds" / "hold); TTFT / TPOT in" (session 53); each part is now whole on its line."""
    argv = ["infer", "--model", "llama3.1-8b", "--gpus", "1", "--scenario", "offline", "--requests", "50", "--no-save"]
    lines = [line.rstrip() for line in screen(argv, 80).splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("req/s:"))
    legend = " ".join(lines[start:start + 2])
    for part in ("(server: the largest rate whose bounds hold)", "TTFT / TPOT in ms;",
                 "tok/s/GPU: output tokens/s per GPU sustained"):
        assert any(part in line for line in lines[start:start + 2]), lines[start:]
    assert legend.startswith("req/s:")


def _piped(argv: list[str], **environ: str) -> subprocess.CompletedProcess:
    """``autoparallel argv`` with its output to a pipe (COLUMNS unset unless given)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | environ
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "autoparallel", *argv], env=env, capture_output=True, text=True)


def test_the_time_to_train_line_breaks_between_phrases_at_80_columns():
    """search's time-to-train line went to the legend's word wrap, which broke it "$5.35M at" /
    "$2.5/GPU-h" (session 53): now between its phrases, each whole on a line."""
    argv = ["search", "--model", "llama3-70b", "--gpus", "1024", "--tokens", "15T", "--gpu-hour-cost", "2.5",
            "--no-save", "--top", "5"]
    piped = _piped(argv, COLUMNS="400")
    (summary,) = [line for line in piped.stdout.splitlines() if line.startswith("rank 1: ")]
    assert piped.returncode == 0 and len(summary) > 80, summary
    lines = [line.rstrip() for line in screen(argv, 80).splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("rank 1: "))
    shown = lines[start:next(i for i in range(start, len(lines)) if lines[i].startswith("tie:"))]
    assert len(shown) > 1 and " ".join(shown) == summary and all(len(x) <= 80 for x in shown), shown
    for phrase in re.split(r"(?<=[,:]) ", summary):  # "rank 1:", "... GPUs:", "2.9M GPU-hours,", "$7.25M at $2.5/GPU-h"
        assert any(phrase in line for line in shown), f"{phrase!r} broken over two lines: {shown}"


def test_a_parenthetical_of_an_error_stays_whole_on_its_line_at_80_columns(tmp_path):
    """`profile` of a job larger than the machine broke "(2 cores x" / "4, 24 GiB at 0.5 GiB a rank);"
    (session 53): a parenthetical that fits on a line is now one, the line before it broken at its
    "(" (the CPU's or GPUs' count varies by machine; the parentheticals are whatever it says)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 1\npp: 1\ndp: 4096\ngbs: 4096\nmbs: 1\n")
    argv = ["profile", "--model", "cpu-small", "--plan", str(plan)]
    piped = _piped(argv)
    (message,) = piped.stderr.splitlines()
    assert piped.returncode == 2 and "a job of 4096 ranks is larger than" in message, message
    parentheticals = re.findall(r"\([^()]*\)", message)
    assert parentheticals and all(len(p) <= 80 for p in parentheticals), parentheticals
    lines = [line.rstrip() for line in screen(argv, 80).splitlines() if line.strip()]
    shown = lines[next(i for i, line in enumerate(lines) if line.startswith("autoparallel: error:")):]
    assert " ".join(shown) == message and all(len(x) <= 80 for x in shown), shown
    for p in parentheticals:
        assert any(p in line for line in shown), f"{p!r} broken over two lines: {shown}"
