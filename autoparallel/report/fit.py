"""Tables that read at any terminal width (issue 24).

A person reads the ranked tables in terminals from 80 columns up, and in logs. Rich's own answer
to a table wider than the screen is to squeeze every column, so the layout values a user needs
became zero-width and the measures "…", while free-text columns kept their room. Here each
column says whether it may go: the kept ones (layout, measures, tie mark) are never shrunk,
wrapped or cut; the others are dropped whole, lowest priority first, until the table fits, and
one line under the table names what went and how to see it. A droppable column that tells two
shown rows apart (two serving layouts alike but for their token budget) goes only after every
other droppable one, and if it must go, the line says that rows alike differ in it. Piped output
gets a sane width (``COLUMNS`` or ``PIPE_WIDTH``), not one line as long as the widest table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 100  # columns of a table written to a pipe or file when COLUMNS does not say
GAP = 2  # spaces between two columns (padding (0, 1), collapsed)


@dataclass(frozen=True)
class Column:
    """One table column: the frame column it shows, its header and value format (a format string
    or a function), and when it goes: ``drop`` 0 = never; otherwise the higher, the sooner it is
    dropped to fit. ``knob``: the column says what the row is (a layout value or setting), not
    how it does; rows that differ in their knob columns must not look alike (``fit``)."""

    key: str
    header: str
    fmt: str | Callable[[object], str] = "{}"
    drop: float = 0
    knob: bool = False
    # A knob column that must stay where rows differ in it (the precision: FP8 or BF16): its short
    # header and codes for long values ((value, code) pairs), which it takes where the table is too
    # narrow for it whole, a column that every row shares going first (``narrowed``).
    short: str = ""
    codes: tuple[tuple[str, str], ...] = ()
    # What the note says where the column went and every row holds ``value``, as (value, words) pairs,
    # where "every row: <header> <value>" would read as code: "tie yes" for "every row is a tie".
    alike: tuple[tuple[str, str], ...] = ()


# A cell that reads as a number, right-aligned so that its digits line up: "1,905", "85.1%",
# "+2", "-7.0", "6.95e-04", "1.23M", "$4.5K", "2.3x". Anything else is text, left-aligned.
NUMBER = re.compile(r"\$?[+-]?\d[\d,]*(\.\d+)?(e[+-]?\d+)?[%xKMBT]?")
MISSING = ("", "-")


def justify(column: Column, rows: Sequence[Sequence[str]], i: int) -> str:
    """"right" for a column of numbers, "left" for one of text (names, precisions, yes/- marks),
    read from the cells that hold a value; a column without any goes by its format (a number
    format: right)."""
    values = [r[i] for r in rows if r[i] not in MISSING]
    if not values:
        return "left" if column.fmt == "{}" else "right"
    return "right" if all(NUMBER.fullmatch(v) for v in values) else "left"


def output_width(console: Console) -> int:
    """The terminal's width; for pipes and files ``COLUMNS`` when set, else ``PIPE_WIDTH``."""
    if console.is_terminal:
        return console.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def _natural_widths(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([cell_len(c.header)] + [cell_len(r[i]) for r in rows]) for i, c in enumerate(columns)]


def table_width(widths: Sequence[int]) -> int:
    return sum(widths) + GAP * max(len(widths) - 1, 0)


def constant(rows: Sequence[Sequence[str]], i: int) -> bool:
    """Whether column ``i`` holds one value in every row (of two or more)."""
    return len(rows) > 1 and len({r[i] for r in rows}) == 1


def _kinds(rows: Sequence[Sequence[str]], indices: Sequence[int]) -> int:
    """How many different rows there are in the columns ``indices``."""
    return len({tuple(r[i] for i in indices) for r in rows})


def _tells_apart(columns: Sequence[Column], rows: Sequence[Sequence[str]], shown: Sequence[int], i: int) -> bool:
    """Whether hiding column ``i`` would make two rows look alike in the knob columns ``shown``."""
    knobs = [j for j in shown if columns[j].knob]
    return i in knobs and _kinds(rows, [j for j in knobs if j != i]) < _kinds(rows, knobs)


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None,
        constant_first: bool = False) -> list[int]:
    """Indices of the columns to show within ``width`` (None: all of them): droppable columns
    go whole, highest ``drop`` first and the rightmost of equals first, but a knob column that
    tells shown rows apart only after all the others; kept columns always stay, even when they
    alone are wider than ``width``. ``constant_first``: a droppable column with one value in
    every row goes before the others (its value is in the note under the table)."""
    widths = _natural_widths(columns, rows)
    shown = list(range(len(columns)))
    if width is None:
        return shown
    order = sorted((i for i, c in enumerate(columns) if c.drop),
                   key=lambda i: (not (constant_first and constant(rows, i)), -columns[i].drop, -i))
    deferred = []
    for i in order:
        if table_width([widths[j] for j in shown]) <= width:
            return shown
        if _tells_apart(columns, rows, shown, i):
            deferred.append(i)
        else:
            shown.remove(i)
    for i in deferred:  # too wide still: these go too, and the note says what they told apart
        if table_width([widths[j] for j in shown]) <= width:
            break
        shown.remove(i)
    return shown


def narrowed(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None,
             constant_first: bool = False) -> tuple[list[Column], list[list[str]], list[int]]:
    """``fit``, but a column with ``codes`` that rows differ in stays where it can: where its name
    does not fit it takes its codes (short header), and if that is not enough, columns that every
    row shares go first, kept ones too (their value is in the note: "every row: EP 1"), layout knobs
    before the others. Returns the columns and rows (a coded column with its short header and
    codes) and the indices shown."""
    shown = fit(columns, rows, width, constant_first)
    telling = [i for i, c in enumerate(columns) if c.codes and i not in shown and not constant(rows, i)]
    if not telling:
        return list(columns), [list(r) for r in rows], shown
    spare = {i: 0.5 if c.knob else 0.25 for i, c in enumerate(columns)  # before a kept column, after the rest
             if not c.drop and constant(rows, i)}
    staying = [replace(c, drop=0, header=c.short or c.header) if i in telling else
               replace(c, drop=spare[i]) if i in spare else c for i, c in enumerate(columns)]
    codes = {i: dict(columns[i].codes) for i in telling}
    coded = [[codes[i].get(v, v) if i in codes else v for i, v in enumerate(r)] for r in rows]
    keep = fit(staying, coded, width, constant_first)
    widths = _natural_widths(staying, coded)
    if table_width([widths[j] for j in keep]) > width:
        return list(columns), [list(r) for r in rows], shown  # too wide even so: it goes as before
    return [replace(c, drop=columns[i].drop) for i, c in enumerate(staying)], coded, keep


def code_key(columns: Sequence[Column], rows: Sequence[Sequence[str]], shown: Sequence[int]) -> str | None:
    """What the codes a shown column took stand for: "prec: fp8d = fp8-delayed, fp8b = fp8-blockwise"."""
    keys = []
    for i in shown:
        used = {r[i] for r in rows}
        pairs = [f"{code} = {value}" for value, code in columns[i].codes if code in used and columns[i].short
                 and columns[i].header == columns[i].short]
        keys += [f"{columns[i].header}: {', '.join(pairs)}"] if pairs else []
    return "; ".join(keys) or None


def dropped_note(columns: Sequence[Column], shown: Sequence[int], where: str,
                 rows: Sequence[Sequence[str]] | None = None, constants: bool = True,
                 adds: str = "--wide adds") -> str | None:
    """The one line under a narrowed table: which columns are not shown and how to see them
    (``adds``: the command's way, "--wide adds" where it has that flag); with ``rows``, the hidden
    knob columns in which rows that look alike differ and (``constants``) a dropped column with
    one value in every row, named with its value, as a kept column or a coded one always is
    ("every row: EP 1, precision bf16"); and what the codes of a coded column stand for."""
    gone = [i for i in range(len(columns)) if i not in shown]
    key = code_key(columns, rows, shown) if rows is not None else None
    if not gone:
        return f"{key}{where}" if key else None
    same = [i for i in gone if rows is not None and constant(rows, i)
            and (constants or not columns[i].drop or columns[i].codes)]
    varying = [columns[i].header for i in gone if i not in same]
    worded = {i: dict(columns[i].alike)[rows[0][i]] for i in same if rows[0][i] in dict(columns[i].alike)}
    plain = [i for i in same if i not in worded]
    parts = [f"every row: {', '.join(f'{columns[i].header} {rows[0][i]}' for i in plain)}"] if plain else []
    parts += worded.values()
    parts += [key] if key else []
    if rows is not None:
        knobs = [j for j in shown if columns[j].knob]
        apart = [columns[i].header for i in gone if columns[i].knob and _kinds(rows, [*knobs, i]) > _kinds(rows, knobs)]
        parts += [f"rows alike here differ in {', '.join(apart)}"] if apart else []
    parts += [f"{adds} {', '.join(varying)}"] if varying else []
    return "; ".join(parts) + where


def print_table(console: Console, title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                legend: Sequence[str] = (), wide: bool = False, where: str = "",
                constant_first: bool = False, adds: str = "--wide adds") -> list[int]:
    """Print ``rows`` under ``title`` with the columns that fit (all of them with ``wide``), the
    dropped-columns line and ``legend``; returns the indices of the columns shown. ``where``
    completes the hint (e.g. "; all in the run folder's ranked.md"). ``constant_first``: see
    ``fit`` (the serving tables: a column every row shares goes before one that tells rows apart).
    ``adds``: how the note says where the dropped columns are (a command without --wide says its own)."""
    width = output_width(console)
    columns, rows, shown = narrowed(columns, rows, None if wide else width, constant_first)
    widths = _natural_widths([columns[i] for i in shown], [[r[i] for i in shown] for r in rows])
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  header_style="bold")
    for i in shown:
        table.add_column(columns[i].header, justify=justify(columns[i], rows, i), no_wrap=True)
    for r in rows:
        table.add_row(*(Text(r[i]) for i in shown))
    needed = table_width(widths)
    out = console
    if needed > console.width:  # kept columns wider than the screen: lines run on, values stay whole
        out = Console(file=console.file, width=needed, force_terminal=console.is_terminal,
                      color_system=console.color_system)
    for line in title_lines(title, width) if title else ():
        console.print(Text(line), width=width)
    out.print(table)
    note = dropped_note(columns, shown, where, rows, constants=constant_first, adds=adds)
    # The note breaks between its phrases ("fp8c =" / "fp8-current" read as two); the legend's prose
    # wraps at the width, as a terminal would.
    for line in (note_lines(note, width) if note else []) + list(legend):
        console.print(Text(line), width=width)
    return shown


def title_lines(title: str, width: int) -> list[str]:
    """``title``, its closing parenthetical ("(147,021 candidates in 0.59 s)") on a line of its own
    when the whole does not fit in ``width`` (on the last line where that still has room), and the
    rest broken between phrases where still too wide: rich would break it anywhere, "in 0.25" / "s)"
    or "p99 TTFT <=" / "2000 ms"."""
    if cell_len(title) <= width:
        return [title]
    head, sep, tail = title.rpartition(" (")
    if not (sep and title.endswith(")")):
        return phrase_lines(title, width)
    lines = phrase_lines(head, width)
    if len(lines) > 1 and cell_len(f"{lines[-1]} ({tail}") <= width:  # "(LOMO)" alone on a line read as lost
        return lines[:-1] + [f"{lines[-1]} ({tail}"]
    return lines + [f"({tail}"]


def note_lines(note: str, width: int) -> list[str]:
    """The note under a table in lines of at most ``width``, as few as breaking it between any of its
    phrases takes (``phrase_lines``), and of those the layout that keeps the most of its parts
    ("every row: SP yes", "prec: fp8d = fp8-delayed, ...", "--wide adds ...") whole on a line: broken
    at any phrase, the 175B note ended "var," / "differs, other", one list read as two. Each part
    either goes on after the line before, broken between its phrases, or starts a line."""
    parts = _top_level_split(note, ";")
    best: tuple[int, int, list[str]] | None = None
    for mask in range(2 ** len(parts)):  # bit k: part k goes on after the line before where it does not fit
        lines: list[str] = []
        for k, part in enumerate(parts):
            if lines and (cell_len(f"{lines[-1]} {part}") <= width or mask >> k & 1):
                lines[-1:] = phrase_lines(f"{lines[-1]} {part}", width)
            else:
                lines += phrase_lines(part, width)
        broken = sum(not any(part in line for line in lines) for part in parts)
        if best is None or (len(lines), broken) < best[:2]:
            best = (len(lines), broken, lines)
    return best[2]


def _top_level_split(text: str, marks: str) -> list[str]:
    """``text`` split after each of ``marks`` that a space follows outside parentheses, the mark kept."""
    phrases, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch in marks and depth == 0 and text[i + 1:i + 2] == " ":
            phrases.append(text[start:i + 1])
            start = i + 2
    return phrases + [text[start:]]


def phrase_lines(text: str, width: int, lead: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` broken only after a comma, semicolon or colon outside
    parentheses ("tok/s (in sample, LOMO)" stays whole); a phrase wider than ``width`` starts a line
    and breaks between its words, never before a "%" ("49.7" / "%" read as two figures) or inside a
    layout string or a figure with its unit (``_words``). ``lead``
    ("autoparallel: error:") starts the first line and the first phrase goes on after it, at its words
    where it does not fit there, so that the lead never stands alone."""
    phrases = _top_level_split(text, ",;:")
    lines: list[str] = [lead] if lead else []
    for k, phrase in enumerate(phrases):
        after_lead = bool(lead) and k == 0
        if lines and cell_len(f"{lines[-1]} {phrase}") <= width:
            lines[-1] = f"{lines[-1]} {phrase}"
        elif cell_len(phrase) <= width and not after_lead:
            lines.append(phrase)
        else:
            if not after_lead:
                lines.append("")
            for word in _words(phrase, width):
                if lines[-1] and cell_len(f"{lines[-1]} {word}") > width:
                    lines.append("")
                lines[-1] = f"{lines[-1]} {word}".lstrip(" ")
    return lines


# Where a phrase breaks at its words, a layout string ("TP8 PP16 CP1 DP1") and a figure with its unit
# ("325.2 GiB", "49.7 %") stay one word: "(TP8 PP1 CP1" / "DP1: 325.2" read as two layouts.
_LAYOUT_PART = re.compile(r"\(?[A-Z]{2,4}\d+")
_UNIT = re.compile(r"(?:%|[KMGT]i?B|ms|s)[,;:)]*")


def _words(phrase: str, width: int | None = None) -> list[str]:
    """``phrase``'s words for a break, a layout string or a figure and its unit being one word, and
    a parenthetical that fits in ``width`` one word too: "(2 cores x" / "4, 24 GiB at ...)" read
    as two figures, where the phrase before it could have broken at its "("."""
    words: list[str] = []
    for word in phrase.split(" "):
        last = words[-1].rsplit(" ", 1)[-1] if words else ""
        layout = _LAYOUT_PART.fullmatch(last) and _LAYOUT_PART.match(word) and not word.startswith("(")
        if words and (layout or word.startswith("%") or (last[-1:].isdigit() and _UNIT.fullmatch(word))):
            words[-1] = f"{words[-1]} {word}"
        else:
            words.append(word)
    return _parentheticals(words, width) if width else words


def _parentheticals(words: list[str], width: int) -> list[str]:
    """``words`` with each run from an opening "(" to its closing ")" made one word where it fits in
    ``width`` (a longer one keeps its words, to break between)."""
    out: list[str] = []
    start = depth = 0
    for word in words:
        if depth == 0:
            start = len(out)
        out.append(word)
        depth += word.count("(") - word.count(")")
        if depth <= 0:
            depth = 0
            group = " ".join(out[start:])
            if len(out) - start > 1 and group.startswith("(") and cell_len(group) <= width:
                out[start:] = [group]
    return out


def for_stderr(message: str) -> str:
    """``message`` (one line) as stderr shows it: on a terminal, broken between its phrases at the
    terminal's width, where the terminal itself cut it at its last column ("layouts fit on 6" /
    "4 GPUs"); to a pipe or a log, one line, so that grep finds it whole."""
    import shutil
    import sys
    if not sys.stderr.isatty():
        return message
    lead, sep, rest = message.partition(": error: ") if ": error: " in message else message.partition(": warning: ")
    if not sep:
        return "\n".join(phrase_lines(message, shutil.get_terminal_size().columns))
    return "\n".join(phrase_lines(rest, shutil.get_terminal_size().columns, lead=f"{lead}{sep.rstrip()}"))


def cell(value, fmt: str | Callable[[object], str]) -> str:
    """A value as its column formats it; missing (None, NaN) as '-', booleans as yes/-."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "yes" if value else "-"
    try:
        return fmt(value) if callable(fmt) else fmt.format(value)
    except (ValueError, TypeError):
        return str(value)
