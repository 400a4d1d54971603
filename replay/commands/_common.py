"""Shared CLI helpers: turn ReplayError into a clean message and exit code 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from replay.errors import ReplayError

console = Console()
err_console = Console(stderr=True)


def one_line(text: str) -> str:
    """Library messages (pyarrow, DuckDB) can span lines; an error here is one line."""
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ReplayError as exc:
        err_console.print(f"[bold red]error:[/] {escape(one_line(str(exc)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
