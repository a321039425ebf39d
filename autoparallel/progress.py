"""The progress bars of every command: what it does, a bar, how far along it is, time elapsed.

Rich's stock columns lie on a bar whose total is unknown (a phase that reads files, or a fit
that runs until it converges): ``MofNCompleteColumn`` prints "0/?" and ``TimeRemainingColumn``
"-:--:--". Here such a bar pulses and shows only the elapsed time; the count appears once the
total is known. Off a terminal nothing is drawn: rich's bar, even a transient one, leaves an
empty line in a pipe or a file when it stops.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text


class CountColumn(ProgressColumn):
    """"done/total" when the total is known, with thousands separators ("131,072/1,529,808");
    nothing while it is not (no "0/?")."""

    def render(self, task) -> Text:
        if task.total is None:
            return Text("")
        total = f"{int(task.total):,}"
        return Text(f"{int(task.completed):>{len(total)},}/{total}", style="progress.download")


def transient_progress(console: Console) -> Progress:
    """A bar that goes when it is done: description, bar (a pulse while the total is unknown),
    count, elapsed time; nothing at all when ``console`` is not a terminal."""
    return Progress(TextColumn("{task.description}"), BarColumn(), CountColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)
