"""DuckDB connections with a memory budget: past it DuckDB spills to a private temp directory instead
of growing, so a report, a diff or ``replay inspect`` on a million-request run stays under 2 GB.

DuckDB's default budget is 80% of the machine's memory, and with no temp directory set it would spill
into ``.tmp`` under the user's working directory. Each connection gets its own directory from
``tempfile.mkdtemp``; DuckDB creates and deletes the ``spill`` folder inside it, and the empty parent
is removed when the connection is garbage collected (or at exit).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import duckdb

# DuckDB's own allocations (hash tables, sorts, temp tables) per database. 1 GB leaves room for Python,
# pyarrow and matplotlib under the 2 GB target of issue 16 (bench/bench_memory.py measures it); the
# queries that exceed it (the ITL samples of a 1 M-request run) spill to disk instead of failing.
MEMORY_LIMIT_MB = 1024


def connect(memory_limit_mb: int = MEMORY_LIMIT_MB, *, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB database that spills past ``memory_limit_mb`` to its own temp directory."""
    parent = tempfile.mkdtemp(prefix="replay-duckdb-")
    config: dict[str, object] = {"memory_limit": f"{int(memory_limit_mb)}MB",
                                 "temp_directory": str(Path(parent) / "spill")}
    if threads is not None:
        config["threads"] = int(threads)
    try:
        con = duckdb.connect(config=config)
    except BaseException:
        shutil.rmtree(parent, ignore_errors=True)
        raise
    weakref.finalize(con, shutil.rmtree, parent, True)
    con.execute("SET enable_progress_bar = false")  # a long (spilling) query must not draw on our stdout
    return con
