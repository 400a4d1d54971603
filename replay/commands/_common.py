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


def os_error_line(exc: OSError) -> str:
    """``<file>: <what the system said>`` (Arrow's I/O errors carry the text only). Failures writing
    an output are named by that output already (replay.base.atomic); this covers the rest."""
    what = exc.strerror or one_line(str(exc)) or type(exc).__name__
    return f"{exc.filename}: {what}" if exc.filename is not None else what


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ReplayError as exc:
        err_console.print(f"[bold red]error:[/] {escape(one_line(str(exc)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except OSError as exc:
        # The system refused (a full disk, a read-only filesystem, a busy mount point, a name too long,
        # no permission): say what and where. Outputs are atomic, so nothing half-written is left.
        err_console.print(f"[bold red]error:[/] {escape(os_error_line(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except RecursionError:
        err_console.print("[bold red]error:[/] an input is nested too deeply to read (JSON or YAML nesting)",
                          highlight=False, soft_wrap=True)
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
