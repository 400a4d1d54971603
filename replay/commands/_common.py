"""Shared CLI helpers: turn ReplayError into a clean message and exit code 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from replay.base.errors import ReplayError

console = Console()
err_console = Console(stderr=True)


def one_line(text: str) -> str:
    """Library messages (pyarrow, DuckDB) can span lines; an error here is one line."""
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


def _is_duckdb_out_of_memory(exc: BaseException) -> bool:
    """DuckDB's OutOfMemoryException, without importing DuckDB in every command."""
    kind = type(exc)
    return kind.__name__ == "OutOfMemoryException" and kind.__module__.lstrip("_").startswith("duckdb")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ReplayError as exc:
        err_console.print(f"[bold red]error:[/] {escape(one_line(str(exc)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except Exception as exc:
        if not _is_duckdb_out_of_memory(exc):
            raise
        # Queries run under a memory limit and spill to a temp directory (replay/base/duckdb_conn.py); one
        # that cannot spill, or a full disk, ends here: say so in one line, not a traceback.
        first = one_line(str(exc)).split("Possible solutions")[0].strip()
        err_console.print(f"[bold red]error:[/] DuckDB ran out of memory: {escape(first)} (its limit and spill "
                          "directory are set in replay/base/duckdb_conn.py; check free space in the temp directory)",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
