"""Merge the clusters' output folders into one (engine/cluster_run.py replays them).

- ``requests.parquet``: every cluster's rows, back in trace order (the order of a fleet's file);
- every other Parquet file (steps, chunks): the clusters' rows one cluster after another, streamed
  a row group at a time;
- a ``replica`` column gets the cluster's first global replica id added, so replica ids run
  0..replicas-1 across the fleet (cluster c holds c * replicas/clusters onwards).

The merge reads only the folders, in cluster order, so a local run and a Ray run of the same
clusters write the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replay.engine.output_schema import CHUNKS_FILE, REQUESTS_FILE, REQUESTS_ROW_GROUP, parquet_write_options


def cluster_files(folder: Path) -> list[str]:
    """The Parquet outputs a cluster's folder holds."""
    return sorted(p.name for p in folder.glob("*.parquet"))


def _offset_replicas(table: pa.Table | pa.RecordBatch, offset: int):
    """``table`` with ``offset`` added to its replica column (nulls stay null)."""
    if not offset or "replica" not in table.schema.names:
        return table
    i = table.schema.get_field_index("replica")
    col = table.column(i)
    shifted = pc.add(col, pa.scalar(offset, col.type)).cast(col.type)
    return table.set_column(i, table.schema.field(i), shifted)


# Parts whose requests files are read side by side (one open file each); beyond, one at a time.
_STREAMED_PARTS = 64


class _RowStream:
    """A requests file read front to back, a given number of rows at a time."""

    def __init__(self, path: Path, offset: int, read_rows: int) -> None:
        self._batches = pq.ParquetFile(path).iter_batches(batch_size=read_rows)
        self._offset = offset
        self._held: pa.Table | None = None

    def take(self, n: int) -> pa.Table | None:
        """The next ``n`` rows (None for none)."""
        if n == 0:
            return None
        while self._held is None or self._held.num_rows < n:
            batch = next(self._batches)
            table = _offset_replicas(pa.Table.from_batches([batch]), self._offset)
            self._held = table if self._held is None else pa.concat_tables([self._held, table])
        out, self._held = self._held.slice(0, n), self._held.slice(n)
        return out


def merge_requests(folders: list[Path], rows: list[np.ndarray], offsets: list[int], dst: Path) -> None:
    """The clusters' requests files as one, in trace order (``rows``: each file's trace rows, which
    it holds in trace order), a row group at a time, reading every part side by side about a row
    group in all, so memory holds a few row groups rather than the whole table. Beyond
    ``_STREAMED_PARTS`` parts (open files, and a read size too small to be worth it) the whole table
    is read a file at a time and reordered at once; the bytes are the same."""
    if len(folders) > _STREAMED_PARTS:
        tables = [_offset_replicas(pq.read_table(f / REQUESTS_FILE), off) for f, off in zip(folders, offsets)]
        table = pa.concat_tables(tables)
        del tables
        table = table.take(pa.array(np.argsort(np.concatenate(rows), kind="stable")))
        pq.write_table(table, dst / REQUESTS_FILE, row_group_size=REQUESTS_ROW_GROUP,
                       **parquet_write_options(table.schema))
        return
    part_of = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    order = np.argsort(np.concatenate(rows), kind="stable")
    read_rows = max(1024, REQUESTS_ROW_GROUP // max(len(folders), 1))
    streams = [_RowStream(f / REQUESTS_FILE, off, read_rows) for f, off in zip(folders, offsets)]
    writer = None
    try:
        for lo in range(0, len(order), REQUESTS_ROW_GROUP):
            parts = part_of[order[lo:lo + REQUESTS_ROW_GROUP]]
            counts = np.bincount(parts, minlength=len(rows))
            pieces = [t for p, n in enumerate(counts.tolist()) if (t := streams[p].take(n)) is not None]
            group = pa.concat_tables(pieces)
            # The group's rows come part after part; each part's in trace order, as the output wants.
            start = np.concatenate([[0], np.cumsum(counts)[:-1]])
            rank = np.empty(len(parts), dtype=np.int64)
            for p, n in enumerate(counts.tolist()):
                rank[parts == p] = np.arange(n)
            group = group.take(pa.array(start[parts] + rank))
            if writer is None:
                writer = pq.ParquetWriter(dst / REQUESTS_FILE, group.schema, **parquet_write_options(group.schema))
            writer.write_table(group, row_group_size=REQUESTS_ROW_GROUP)
            del group, pieces
            pa.default_memory_pool().release_unused()
        if writer is None:  # no request at all: the schema of the parts' (empty) files
            schema = pq.read_schema(folders[0] / REQUESTS_FILE)
            pq.write_table(schema.empty_table(), dst / REQUESTS_FILE, **parquet_write_options(schema))
    finally:
        if writer is not None:
            writer.close()


def merge_rows(folders: list[Path], name: str, offsets: list[int], dst: Path,
               request_rows: np.ndarray | None = None) -> None:
    """One Parquet output, the clusters' rows one cluster after another, streamed a row group at a
    time, each kept whole (the row groups of parts written in one process straight into the output:
    engine/shared_outputs.py). ``request_rows`` (chunks.parquet): every replayed trace row,
    ascending; a cluster's chunk runs name their request by trace row, the merged file by its
    position there (its row in the merged requests file)."""
    writer = None
    try:
        for folder, off in zip(folders, offsets):
            src = pq.ParquetFile(folder / name)
            if writer is None:
                writer = pq.ParquetWriter(dst / name, src.schema_arrow, **parquet_write_options(src.schema_arrow))
            for g in range(src.num_row_groups):
                table = src.read_row_group(g)
                if request_rows is not None:
                    i = table.schema.get_field_index("request")
                    mapped = np.searchsorted(request_rows, table.column(i).to_numpy()).astype(np.int32)
                    table = table.set_column(i, table.schema.field(i), pa.array(mapped))
                table = _offset_replicas(table, off)
                writer.write_table(table, row_group_size=max(table.num_rows, 1))
    finally:
        if writer is not None:
            writer.close()


def merge_outputs(folders: list[Path], rows: list[np.ndarray], offsets: list[int], dst: Path) -> None:
    """Every output file of the clusters' folders, merged into ``dst``."""
    merge_requests(folders, rows, offsets, dst)
    for name in cluster_files(folders[0]):
        if name != REQUESTS_FILE:
            merge_rows(folders, name, offsets, dst,
                       np.sort(np.concatenate(rows)) if name == CHUNKS_FILE else None)
