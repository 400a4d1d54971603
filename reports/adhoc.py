"""``replay sql``: a user's query over a run, able to read that run and nothing else, never to write.

DuckDB cannot open an in-memory database read-only, so reading-only is enforced in two layers:
1. the query must be one SELECT statement (DESCRIBE, SUMMARIZE, SHOW and WITH ... SELECT are SELECTs
   to DuckDB); COPY, EXPORT, ATTACH, CREATE, INSERT, INSTALL, LOAD, SET, PRAGMA and EXPLAIN (whose
   ANALYZE form executes its statement) are refused before anything runs;
2. file access is limited to the run's directory and its trace file (``enable_external_access =
   false`` with ``allowed_directories``/``allowed_paths``), extension install/autoload is off, and
   ``lock_configuration`` stops the query from undoing any of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import duckdb
import pandas as pd

from replay.base.duckdb_conn import run_interruptible
from replay.base.errors import ReplayError
from replay.reports.views import Run, query_errors

T = TypeVar("T")
# Rows come back in pieces of this many DuckDB vectors (2,048 rows each): the result is never held
# whole in Python, where DuckDB's memory limit does not reach (a SELECT * of a large run's chunks would
# otherwise pass it several times over).
CHUNK_VECTORS = 64

# Errors in the query itself: no need to look for a damaged file.
_QUERY_MISTAKES = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
                   duckdb.PermissionException, duckdb.ConversionException)

ALLOWED_STATEMENTS = (duckdb.StatementType.SELECT,)
_LOCKDOWN = (
    "SET allowed_directories = {dirs}",
    "SET allowed_paths = {paths}",
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET lock_configuration = true",
)


def _list_literal(items: list[str]) -> str:
    return "[" + ", ".join("'" + s.replace("'", "''") + "'" for s in items) + "]"


def lock_down(run: Run) -> None:
    """After the views exist: the connection may read the run's files and nothing else, for good."""
    dirs = [str(run.outdir.resolve()) + "/"]
    paths = [str(run.trace_path.resolve())] if run.trace_path is not None else []
    for stmt in _LOCKDOWN:
        run.con.execute(stmt.format(dirs=_list_literal(dirs), paths=_list_literal(paths)))


def stream_query(run: Run, query: str, consume: Callable[[Callable[[], pd.DataFrame]], T]) -> T:
    """Run one SELECT over ``run`` (``ReplayError`` for anything else or a failed query) and hand
    ``consume`` a function returning the result's next piece (an empty frame at the end). The query
    and ``consume`` run on a helper thread, so Ctrl-C and SIGTERM stop them at once."""
    if not query.strip():
        raise ReplayError("empty query: give one SELECT statement, e.g. \"SELECT count(*) FROM requests\"")
    try:
        statements = run.con.extract_statements(query)
    except duckdb.Error as exc:
        raise ReplayError(f"query failed: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise ReplayError("empty query (only comments or semicolons): give one SELECT statement")
    if len(statements) > 1:
        raise ReplayError(f"one statement at a time ({len(statements)} given)")
    kind = statements[0].type
    if kind not in ALLOWED_STATEMENTS:
        raise ReplayError(f"only SELECT queries are allowed (replay sql reads the run, never changes it); "
                          f"got {kind.name}")
    lock_down(run)

    def work() -> T:
        run.con.execute(query)
        return consume(lambda: run.con.fetch_df_chunk(CHUNK_VECTORS))

    with query_errors(run):  # other DuckDB errors: a damaged file is named, if there is one
        try:
            return run_interruptible(run.con, work)
        except _QUERY_MISTAKES as exc:
            raise ReplayError(f"query failed: {str(exc).splitlines()[0]}") from None


def read_only_query(run: Run, query: str) -> pd.DataFrame:
    """The whole result of one SELECT over ``run`` as one frame (small results; see ``stream_query``)."""

    def collect(next_piece: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        pieces = [next_piece()]
        while len(pieces[-1]):
            pieces.append(next_piece())
        return pieces[0] if len(pieces) <= 2 else pd.concat(pieces[:-1], ignore_index=True)

    return stream_query(run, query, collect)
