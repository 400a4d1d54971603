"""DuckDB connections with a memory budget: past it DuckDB spills to a private temp directory instead
of growing, so a report, a diff or `replay sql` on a million-request run stays under 2 GB.

DuckDB's default budget is 80% of the machine's memory, and with no temp directory set it would spill
into ``.tmp`` under the user's working directory. Each connection names its own directory under the
system temp dir (process id and a random suffix); DuckDB creates it only if a query spills and deletes
it when the connection closes, so nothing is left behind unless the process is killed mid-spill.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb

# DuckDB's own allocations (hash tables, sorts, temp tables) per database. 1 GB leaves room for Python,
# pyarrow and matplotlib under the 2 GB memory target (bench/bench_memory.py measures it); the
# queries that exceed it (the ITL samples of a 1 M-request run) spill to disk instead of failing.
MEMORY_LIMIT_MB = 1024


def spill_directory() -> Path:
    """A fresh, not yet existing directory name under the system temp dir."""
    return Path(tempfile.gettempdir()) / f"replay-duckdb-{os.getpid()}-{secrets.token_hex(6)}"


def connect(memory_limit_mb: int = MEMORY_LIMIT_MB, *, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB database that spills past ``memory_limit_mb`` to its own temp directory."""
    config: dict[str, object] = {"memory_limit": f"{int(memory_limit_mb)}MB",
                                 "temp_directory": str(spill_directory())}
    if threads is not None:
        config["threads"] = int(threads)
    con = duckdb.connect(config=config)
    con.execute("SET enable_progress_bar = false")  # a long (spilling) query must not draw on our stdout
    return con


T = TypeVar("T")


def run_interruptible(con: duckdb.DuckDBPyConnection, work: Callable[[], T]) -> T:
    """``work()`` (DuckDB calls on ``con``) on a helper thread, the main thread waiting for it.

    A query runs inside DuckDB's C++ code, where Python's signal handlers cannot run until it returns:
    Ctrl-C and SIGTERM would wait for the whole query. The main thread stays in Python here, so the
    CLI's handlers run at once; the query is then cancelled (``con.interrupt()``) before the exit goes on.
    """
    outcome: dict[str, object] = {}
    done = threading.Event()  # waited on instead of Thread.join, which a signal can leave returning early

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the main thread as is
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="duckdb-query", daemon=True).start()
    try:
        while not done.wait(0.05):
            pass
    except BaseException:
        con.interrupt()
        done.wait(30.0)
        raise
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def sql_literal(value: str | Path) -> str:
    """A string or path as a DuckDB SQL string literal (quotes doubled), for the paths views read."""
    return "'" + str(value).replace("'", "''") + "'"
