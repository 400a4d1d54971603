"""The content fingerprint of a canonical trace: equal fingerprints mean the same trace.

``replay run`` records it in run.json; the reports find the replayed trace by it, ``replay diff``
refuses two runs of different traces by it, and a sweep keys its results by it. It is the SHA-256
of the canonical table (schema without metadata, then the rows) as an Arrow IPC stream of record
batches of ``WINDOW_ROWS`` rows, so it is the same however the table is chunked, and can be taken
piece by piece (a file read a piece at a time) without holding the table: a 10 M-row trace is 1.7 GB.

Fingerprints written before this scheme are one record batch of the whole table, with no
``v2:`` prefix (``legacy_fingerprint``): a report of such a run checks its trace that way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from .schema import TraceReader

WINDOW_ROWS = 65_536
PREFIX = "v2:"


class _HashSink:
    """A file for Arrow's IPC writer whose bytes go straight into a hash (no copy in memory)."""

    closed = False

    def __init__(self, h: Any) -> None:  # a hashlib hash object
        self.h = h

    def write(self, data) -> int:
        self.h.update(data)
        return len(data)

    def flush(self) -> None:
        pass


class TraceFingerprint:
    """The fingerprint of a canonical table fed to ``add`` piece by piece, in row order."""

    def __init__(self, schema: pa.Schema) -> None:
        self._hash = hashlib.sha256()
        self._schema = schema.remove_metadata()
        self._writer = pa.ipc.new_stream(pa.PythonFile(_HashSink(self._hash), mode="w"), self._schema)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self._pending.append(table.replace_schema_metadata(None))
            self._pending_rows += table.num_rows
        while self._pending_rows >= WINDOW_ROWS:
            self._write(WINDOW_ROWS)

    def _write(self, rows: int) -> None:
        held = pa.concat_tables(self._pending)  # zero-copy: the pieces' chunks side by side
        window = held.slice(0, rows)
        # Fresh buffers: a zero-copy slice is written to IPC with its parent's longer buffers, so
        # the bytes would depend on how the rows were chunked. Concatenation always copies.
        columns = [pa.concat_arrays([*col.chunks, pa.array([], col.type)]) for col in window.columns]
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self._schema))
        rest = held.slice(rows)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows -= rows

    def hexdigest(self) -> str:
        """The fingerprint (call once, after the last piece)."""
        if self._pending_rows:
            self._write(self._pending_rows)
        self._writer.close()
        return PREFIX + self._hash.hexdigest()


def trace_fingerprint(table: pa.Table) -> str:
    """The fingerprint of a canonical table in memory."""
    fp = TraceFingerprint(table.schema)
    fp.add(table)
    return fp.hexdigest()


def file_fingerprint(path: str | Path) -> str:
    """The fingerprint of a canonical Parquet trace, read a piece at a time (unchecked: the
    fingerprint is over the canonical table, which the row checks do not change; a trace whose
    fingerprint matches a run's is the one that run checked)."""
    reader = TraceReader(path, check_rows=False)
    fp = TraceFingerprint(reader.schema)
    for piece in reader.pieces():
        fp.add(piece)
    pa.default_memory_pool().release_unused()  # the pieces' pages, handed back before what follows
    return fp.hexdigest()


def legacy_fingerprint(path: str | Path) -> str:
    """A fingerprint as runs recorded it before ``v2:``: the whole table as one record batch (holds
    the table and one combined copy of it; only for checking an older run's trace)."""
    table = pa.concat_tables(list(TraceReader(path, check_rows=False).pieces()))
    h = hashlib.sha256()
    with pa.ipc.new_stream(pa.PythonFile(_HashSink(h), mode="w"), table.schema.remove_metadata()) as writer:
        writer.write_table(table.combine_chunks())
    del table
    pa.default_memory_pool().release_unused()
    return h.hexdigest()


def same_trace(path: str | Path, recorded: str) -> bool:
    """Whether the trace at ``path`` is the one whose fingerprint a run recorded (either scheme)."""
    if recorded.startswith(PREFIX):
        return file_fingerprint(path) == recorded
    return legacy_fingerprint(path) == recorded
