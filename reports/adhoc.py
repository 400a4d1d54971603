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

import duckdb
import pandas as pd

from replay.base.errors import ReplayError
from replay.reports.views import Run, query_errors

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


def read_only_query(run: Run, query: str) -> pd.DataFrame:
    """The result of one SELECT over ``run`` (``ReplayError`` for anything else or a failed query)."""
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
    with query_errors(run):  # other DuckDB errors: a damaged file is named, if there is one
        try:
            return run.con.execute(query).df()
        except _QUERY_MISTAKES as exc:
            raise ReplayError(f"query failed: {str(exc).splitlines()[0]}") from None
