"""Streaming canonical-trace writer: row groups of bounded size, metadata in the footer, atomic.

Batches are buffered up to ``ROW_GROUP_ROWS`` rows and written as one row group, so memory stays
bounded on traces of tens of millions of rows. The caller gives a temp path (see
``replay.base.atomic.atomic_path``): the file appears at its final name only when complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.parquet_io import CHECKSUMS

from .schema import TraceMetadata, trace_schema_for

ROW_GROUP_ROWS = 262_144  # ~2-8 MB per group for traces without long id lists; a throughput/memory trade-off
COMPRESSION = "zstd"


def trace_schema_with(metadata: TraceMetadata, extras: tuple[str, ...] = ()) -> pa.Schema:
    return trace_schema_for(extras).with_metadata(metadata.to_parquet_metadata())


class TraceWriter:
    """Write canonical-schema tables to ``path`` in row groups."""

    def __init__(self, path: str | Path, metadata: TraceMetadata, row_group_rows: int = ROW_GROUP_ROWS,
                 extras: tuple[str, ...] = ()) -> None:
        self.schema = trace_schema_with(metadata, extras)
        self._writer = pq.ParquetWriter(str(path), self.schema, compression=COMPRESSION, **CHECKSUMS)
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._row_group_rows = row_group_rows
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._buffer.append(table.cast(self.schema))
        self._buffered += table.num_rows
        if self._buffered >= self._row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        merged = pa.concat_tables(self._buffer)
        self._writer.write_table(merged, row_group_size=self._row_group_rows)
        self.rows += merged.num_rows
        self._buffer, self._buffered = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


def rows_in_batches(tables: Iterable[pa.Table], rows: int, limit: int | None = None,
                    schema: pa.Schema | None = None) -> Iterator[pa.Table]:
    """``tables`` re-cut into tables of exactly ``rows`` rows (the last may be shorter), each one
    contiguous chunk, stopping after ``limit`` rows: the row groups (and bytes) of a file then do not
    depend on how the rows were produced."""
    buffer: list[pa.Table] = []
    buffered = emitted = 0
    for table in tables:
        if limit is not None:
            table = table.slice(0, max(limit - emitted - buffered, 0))
        if table.num_rows == 0:
            if limit is not None and emitted + buffered >= limit:
                break
            continue
        buffer.append(table)
        buffered += table.num_rows
        while buffered >= rows:
            merged = pa.concat_tables(buffer)
            out, rest = merged.slice(0, rows), merged.slice(rows)
            yield _contiguous(out, schema)
            emitted += rows
            buffer, buffered = ([rest] if rest.num_rows else []), rest.num_rows
    if buffered:
        yield _contiguous(pa.concat_tables(buffer), schema)


def _contiguous(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    if schema is not None:
        table = table.cast(schema)
    return table.combine_chunks()


def write_trace_batches(path: str | Path, tables: Iterable[pa.Table], metadata: TraceMetadata) -> int:
    """Write canonical tables (any sizes) in row groups of exactly ``ROW_GROUP_ROWS`` (caller handles
    atomicity); returns the rows written."""
    from .schema import optional_columns

    writer: TraceWriter | None = None
    for group in rows_in_batches(tables, ROW_GROUP_ROWS):
        if writer is None:
            writer = TraceWriter(path, metadata, extras=optional_columns(group.column_names))
        writer.write(group)
    if writer is None:
        raise ValueError("write_trace_batches: no rows")
    writer.close()
    return writer.rows


def write_trace_table(path: str | Path, table: pa.Table, metadata: TraceMetadata) -> None:
    """Write a whole in-memory canonical table (caller handles atomicity)."""
    from .schema import optional_columns

    writer = TraceWriter(path, metadata, extras=optional_columns(table.column_names))
    for start in range(0, max(table.num_rows, 1), ROW_GROUP_ROWS):
        writer.write(table.slice(start, ROW_GROUP_ROWS))
    writer.close()
