"""One rich progress bar for a whole sweep or plan: configs done of total, running, failed, ETA."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RichProgress:
    """Implements runner.Progress; use as a context manager."""

    def __init__(self, console: Console, label: str = "sweep") -> None:
        self._bar = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("configs · {task.fields[running]} running · {task.fields[failed]} failed"
                                        " · {task.fields[reused]} reused"),
                             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                             console=console, transient=True)
        self._task = self._bar.add_task(label, total=0, running=0, failed=0, reused=0)
        self._failed = self._reused = 0

    def __enter__(self) -> RichProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def add_total(self, n: int) -> None:
        total = self._bar.tasks[0].total or 0
        self._bar.update(self._task, total=total + n)

    def advance(self, record: dict[str, Any], reused: bool) -> None:
        self._failed += record.get("error") is not None
        self._reused += reused
        self._bar.update(self._task, advance=1, failed=self._failed, reused=self._reused)

    def running(self, n: int) -> None:
        self._bar.update(self._task, running=n)
