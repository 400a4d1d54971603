"""Open a replay OUTDIR as DuckDB views: ``requests``, ``chunks``, ``steps`` and ``trace``.

Every report, ``replay sql`` and ``replay diff`` go through here, so the views (and the few helper
views the metric queries build on) are defined once. The files are read lazily by DuckDB; nothing is
loaded into memory until a query needs it. chunks.parquet stores runs of chunks (engine/output_schema.py);
the ``chunks`` view expands them, one row per chunk, only for the queries that read it, and the ITL
metrics read ``itl_counts`` (each distinct gap with its count), computed from the runs unexpanded.
An output written before chunk runs (one row per chunk) opens with the same views.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.duckdb_conn import connect, sql_literal
from replay.base.errors import ReplayError, TraceError
from replay.base.parquet_io import damaged_parquet
from replay.base.structured import parse_json
from replay.engine.output_schema import (
    CHUNK_ROWS_SCHEMA,
    CHUNKS_FILE,
    CHUNKS_SCHEMA,
    REQUESTS_FILE,
    REQUESTS_SCHEMA,
    RUN_FILE,
    STEPS_FILE,
    STEPS_SCHEMA,
)
from replay.engine.scaling_output import SCALING_FILE
from replay.ingest.schema import OPTIONAL_SCHEMA, TRACE_SCHEMA, TraceMetadata
from replay.reports.sqlfiles import sql

# The output views; `trace` is added when the run's trace can be found. chunks.parquet is opened as
# `chunk_runs` and expanded by the `chunks` view (open_run).
OUTPUT_VIEWS = {"requests": (REQUESTS_FILE, REQUESTS_SCHEMA), "chunk_runs": (CHUNKS_FILE, CHUNKS_SCHEMA),
                "steps": (STEPS_FILE, STEPS_SCHEMA)}
VIEW_SQL = "CREATE OR REPLACE VIEW {name} AS SELECT {columns} FROM read_parquet({path}{options})"
# A single-engine run has no `replica` column; its views get one, so every query sees a fleet of one.
SINGLE_REPLICA_COLUMN = {"requests": "*, CASE WHEN status = 'rejected' THEN NULL ELSE 0 END::INTEGER AS replica",
                         "steps": "*, 0::INTEGER AS replica"}
LOCAL_TRACE = "trace.parquet"



@dataclass
class Run:
    """One replay output opened for querying."""

    outdir: Path
    info: dict[str, Any]                       # run.json
    con: duckdb.DuckDBPyConnection
    trace_path: Path | None                    # None: the trace view is absent (see notes)
    trace_meta: TraceMetadata | None
    notes: list[str] = field(default_factory=list)  # why something is unavailable

    @property
    def has_prefix_ids(self) -> bool:
        return self.trace_meta is not None and self.trace_meta.hash_block_size is not None

    def query(self, name: str, **params: Any) -> duckdb.DuckDBPyRelation | duckdb.DuckDBPyConnection:
        """Run ``reports/sql/<name>.sql`` with named parameters."""
        return self.con.execute(sql(name), params or None)


def read_run_json(outdir: Path) -> dict[str, Any]:
    path = outdir / RUN_FILE
    if not outdir.is_dir():
        raise ReplayError(f"{outdir}: not a directory (expected a replay output directory)")
    if not path.is_file():
        raise ReplayError(f"{outdir}: not a replay output directory (no {RUN_FILE}); run `replay run` first")
    try:
        info = parse_json(path.read_bytes(), f"{path}: cannot read run info")
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read run info: {exc.strerror}") from None
    if not isinstance(info, dict):
        raise ReplayError(f"{path}: expected a JSON object")
    check_run_info(info, path)
    return info


# run.json's sections and the JSON types the reports read them as: a hand-edited or damaged file is
# refused here, naming the key, instead of failing deep inside a report.
_RUN_INFO_TYPES: dict[str, tuple[type, ...]] = {"config": (dict,), "trace": (dict,), "totals": (dict,),
                                                "warnings": (list,), "replicas": (list,)}
_TRACE_INFO_TYPES: dict[str, tuple[type, ...]] = {"path": (str,), "fingerprint": (str,), "rows": (int,),
                                                  "replayed_rows": (int,)}


_JSON_KIND = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
              bool: "true or false"}


def _json_kind(value: Any) -> str:
    return _JSON_KIND.get(type(value), type(value).__name__)


def check_run_info(info: dict[str, Any], path: Path) -> None:
    """Refuse a run.json section (or trace field) of the wrong JSON type, naming the key."""
    for table, prefix, section in ((_RUN_INFO_TYPES, "", info), (_TRACE_INFO_TYPES, "trace.", info.get("trace"))):
        if not isinstance(section, dict):
            continue
        for key, types in table.items():
            value = section.get(key)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
                raise ReplayError(f"{path}: key '{prefix}{key}' is {_json_kind(value)}, expected "
                                  f"{' or '.join(_JSON_KIND[t] for t in types)} (a damaged run.json: rerun `replay run`)")


def _check_columns(path: Path, schema) -> list[str]:
    """Fail early, naming the file and the column, when an output file is not what we expect;
    returns the file's column names."""
    if not path.is_file():
        raise ReplayError(f"{path}: missing (the replay output is incomplete)")
    try:
        have = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise ReplayError(f"{path}: cannot read Parquet: {exc}") from None
    missing = [f.name for f in schema if f.name not in have.names]
    if missing:
        raise ReplayError(f"{path}: field '{missing[0]}' missing (columns {missing} are required)")
    return have.names


def _is_replayed_trace(path: Path, recorded: str) -> bool:
    """Whether the trace at ``path`` has the content fingerprint ``replay run`` recorded
    (ingest/fingerprint.py; read a piece at a time)."""
    from replay.ingest.fingerprint import same_trace

    return same_trace(path, recorded)  # hands Arrow's pages back before the report's queries


def _find_trace(outdir: Path, info: dict[str, Any], notes: list[str]) -> Path | None:
    """The trace this run replayed: ``trace.path``, else ``OUTDIR/trace.parquet`` (a copied OUTDIR),
    accepted only when its content fingerprint is the one run.json recorded."""
    trace = info.get("trace") or {}
    recorded = trace.get("fingerprint")
    candidates = []
    if trace.get("path"):
        candidates.append(Path(trace["path"]))
    candidates.append(outdir / LOCAL_TRACE)
    differing = []
    for path in dict.fromkeys(candidates):
        if not path.is_file():
            continue
        if not recorded:
            notes.append(f"run.json records no trace fingerprint: the trace at {path} is used unverified")
            return path
        if _is_replayed_trace(path, recorded):
            return path
        differing.append(str(path))
    if differing:
        notes.append(f"the trace at {' and '.join(differing)} is not the one replayed (its fingerprint differs from "
                     "run.json's): the `trace` view and the infinite-cache reuse are unavailable")
        return None
    notes.append(f"trace not found at {trace.get('path') or '(run.json has no trace.path)'}: "
                 "the `trace` view and the infinite-cache reuse are unavailable")
    return None


def open_run(outdir: str | Path, con: duckdb.DuckDBPyConnection | None = None) -> Run:
    """Check the OUTDIR and create its views on a fresh (``replay.base.duckdb_conn.connect``: memory-limited,
    spilling) or given in-memory DuckDB connection."""
    outdir = Path(outdir)
    info = read_run_json(outdir)
    con = con if con is not None else connect()
    chunk_rows = _chunk_rows(outdir / CHUNKS_FILE)
    file_columns: dict[str, list[str]] = {}  # each output view's file columns, read once
    for name, (filename, schema) in OUTPUT_VIEWS.items():
        path = outdir / filename
        if name == "chunk_runs" and chunk_rows:
            _check_columns(path, CHUNK_ROWS_SCHEMA)  # written before chunk runs: one row per chunk
            why = damaged_parquet(path)
            if why is not None:
                raise ReplayError(f"{path}: damaged Parquet file, cannot read its data ({why})")
            con.execute(VIEW_SQL.format(name="chunks", columns="*", path=sql_literal(path.resolve()), options=""))
            continue
        names = file_columns[name] = _check_columns(path, schema)
        why = damaged_parquet(path)  # DuckDB does not check page checksums: changed bytes would read as numbers
        if why is not None:
            raise ReplayError(f"{path}: damaged Parquet file, cannot read its data ({why})")
        columns = SINGLE_REPLICA_COLUMN.get(name, "*") if "replica" not in names else "*"
        con.execute(VIEW_SQL.format(name=name, columns=columns, path=sql_literal(path.resolve()), options=""))
    scaling = outdir / SCALING_FILE  # an autoscaled run's decisions (engine/scaling_output.py)
    if scaling.is_file():
        con.execute(VIEW_SQL.format(name="scaling", columns="*", path=sql_literal(scaling.resolve()), options=""))
    if chunk_rows:
        con.execute("CREATE OR REPLACE VIEW itl_counts AS " + sql("itl_counts_rows"))
    else:
        requests = sql_literal((outdir / REQUESTS_FILE).resolve())
        con.execute("CREATE OR REPLACE VIEW request_rows AS SELECT file_row_number::INTEGER AS request, "
                    f"request_id, status FROM read_parquet({requests}, file_row_number = true)")
        # Each step's end; in a disaggregated fleet only the decode pool's steps (replica numbered
        # within the pool) emit output chunks.
        decode_only = " WHERE pool = 'decode'" if "pool" in file_columns["steps"] else ""
        con.execute("CREATE OR REPLACE VIEW step_ends AS SELECT replica, step, start_ms + duration_ms AS end_ms "
                    "FROM steps" + decode_only)
        con.execute("CREATE OR REPLACE VIEW chunks AS " + sql("chunks"))
        con.execute("CREATE OR REPLACE VIEW itl_counts AS " + sql("itl_counts"))
    notes: list[str] = []
    trace_path = _find_trace(outdir, info, notes)
    meta = None
    if trace_path is not None:
        try:
            meta = TraceMetadata.from_parquet_metadata(pq.read_schema(trace_path).metadata, trace_path)
        except TraceError:
            raise
        except Exception as exc:
            raise TraceError(f"cannot read the run's trace: {exc}", path=str(trace_path)) from None
        # What was measured and the labels ride along, when the trace has them (ingested logs).
        present = set(_check_columns(trace_path, TRACE_SCHEMA))
        columns = ", ".join(TRACE_SCHEMA.names + [n for n in OPTIONAL_SCHEMA.names if n in present])
        lit = sql_literal(trace_path.resolve())
        # A run limited by load.max_requests (or load.window) replayed some of the trace's rows: the trace views
        # (and so the infinite-cache ideal) cover exactly those.
        t = info.get("trace") or {}
        replayed, rows = t.get("replayed_rows"), t.get("rows")
        first = int(t.get("first_replayed_row") or 0)  # load.window: a slice from this row (rows are by arrival)
        where = (f" WHERE file_row_number >= {first} AND file_row_number < {first + int(replayed)}"
                 if replayed is not None and rows is not None and int(replayed) < int(rows) else "")
        con.execute(VIEW_SQL.format(name="trace", columns=columns, path=lit,
                                    options=", file_row_number = true") + where)
        con.execute(VIEW_SQL.format(name="trace_rows", columns=columns + ", file_row_number AS trace_row",
                                    path=lit, options=", file_row_number = true") + where)
        block = int(meta.hash_block_size) if meta.hash_block_size is not None else "NULL"
        con.execute(f"CREATE OR REPLACE VIEW trace_meta AS SELECT {block}::BIGINT AS hash_block_size")
        if meta.hash_block_size is None:
            notes.append(f"the trace has no prefix identity ({meta.prefix_identity}): "
                         "infinite-cache reuse is unknown, not zero")
    # The fleet's replicas are the ones requests finish on: a disaggregated run's decode pool.
    where = " WHERE pool = 'decode'" if "pool" in file_columns["steps"] else ""
    con.execute(f"CREATE OR REPLACE VIEW fleet_steps AS SELECT * FROM steps{where}")
    # The prefix cache each request's prompt was looked up in: its replica's, or in a disaggregated
    # fleet its prefill replica's (a prompt prefilled on its decode replica: that one's).
    cache = ("CASE WHEN prefill_replica IS NOT NULL THEN 'prefill ' || prefill_replica ELSE 'decode ' || replica END"
             if "prefill_replica" in file_columns["requests"] else "replica::VARCHAR")
    con.execute(f"CREATE OR REPLACE VIEW request_caches AS SELECT request_id, {cache} AS cache FROM requests "
                "WHERE replica IS NOT NULL")
    con.execute("CREATE OR REPLACE VIEW run_window AS " + sql("run_window"))
    # One row per ITL sample, for ad hoc queries: the reports read itl_counts.
    con.execute("CREATE OR REPLACE VIEW itl_gaps AS SELECT c.itl_ms FROM itl_counts AS c, range(c.n)")
    return Run(outdir=outdir, info=info, con=con, trace_path=trace_path, trace_meta=meta, notes=notes)


def read_chunks(outdir: str | Path) -> pa.Table:
    """Every output chunk of a run (the ``chunks`` view: request_id, time_ms, tokens) as an Arrow table,
    in time order (ties: request_id). One row per chunk: meant for small runs and notebooks."""
    run = open_run(outdir)
    try:
        with query_errors(run):
            return run.con.sql("SELECT * FROM chunks ORDER BY time_ms, request_id").to_arrow_table()
    finally:
        run.con.close()


def _chunk_rows(path: Path) -> bool:
    """True for a chunks.parquet of one row per chunk (written before chunk runs)."""
    try:
        return "time_ms" in pq.read_schema(path).names
    except Exception:  # missing or unreadable: _check_columns names the problem
        return False


@contextlib.contextmanager
def query_errors(run: Run) -> Iterator[None]:
    """A DuckDB failure while reading the run becomes one line naming the damaged file when there is one."""
    try:
        yield
    except duckdb.Error as exc:
        files = [run.outdir / f for f, _ in OUTPUT_VIEWS.values()] + ([run.trace_path] if run.trace_path else [])
        for path in files:
            why = damaged_parquet(path)
            if why is not None:
                raise ReplayError(f"{path}: damaged Parquet file, cannot read its data ({why})") from None
        raise ReplayError(f"{run.outdir}: query failed: {' '.join(str(exc).split())}") from None


def build_trace_ideal(run: Run, *, empty: bool = False) -> bool:
    """Materialize ``trace_ideal`` (per-row infinite-cache hits); False (and an empty table) when it
    cannot be known or is not wanted, so the by-turn query still runs."""
    if empty or run.trace_path is None or not run.has_prefix_ids:
        run.con.execute("CREATE OR REPLACE TEMP TABLE trace_ideal (request_id VARCHAR, turn INTEGER, "
                        "input_tokens INTEGER, ideal_hit_tokens BIGINT)")
        return False
    run.con.execute(sql("trace_ideal"))
    return True
