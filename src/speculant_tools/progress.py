"""A rich progress bar on stderr for the importers' ``progress(description, done, total)``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from speculant_tools.importers.checkpoint import Progress as ProgressCallback


@contextmanager
def import_progress(title: str) -> Iterator[ProgressCallback]:
    """Yields the callback the importers take; one bar, redrawn per call."""
    console = Console(stderr=True, soft_wrap=True)
    console.print(escape(title), highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("reading", total=None)

        def report(description: str, completed: int, total: int) -> None:
            bar.update(task, description=escape(description), completed=completed,
                       total=total)

        yield report
