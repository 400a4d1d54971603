"""The chunk and step files of a fleet replayed part by part in one process.

A fleet of clusters, or a fleet whose replicas share nothing (engine/fleet_partition.py), is
replayed one part at a time. In one process the parts' recorders write their chunk runs and step
rows straight into the output's files, one part after another, on one writer thread that goes on
encoding a part's last row groups while the next part replays. Each part's rows form the row groups
its own file would hold (its recorder cuts them), with the part's first global replica id added and
chunk runs naming their rows of the merged requests file: the bytes engine/cluster_merge.py writes
when parts replayed in other processes (or on Ray) are merged from their own files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.engine.background_writer import BackgroundWriter
from replay.engine.output_schema import CHUNKS_FILE, CHUNKS_SCHEMA, STEPS_FILE, parquet_write_options


class SharedOutputs:
    """chunks.parquet and steps.parquet in ``outdir``, opened by the first part's recorder (which
    knows the steps schema) and closed by the owner once every part has written."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.writes = BackgroundWriter()
        self.chunk_writer: pq.ParquetWriter | None = None
        self.step_writer: pq.ParquetWriter | None = None

    def writers(self, steps_schema: pa.Schema) -> tuple[pq.ParquetWriter, pq.ParquetWriter]:
        if self.chunk_writer is None or self.step_writer is None:
            self.chunk_writer = pq.ParquetWriter(self.outdir / CHUNKS_FILE, CHUNKS_SCHEMA,
                                                 **parquet_write_options(CHUNKS_SCHEMA))
            self.step_writer = pq.ParquetWriter(self.outdir / STEPS_FILE, steps_schema,
                                                **parquet_write_options(steps_schema))
        elif self.step_writer.schema != steps_schema:
            raise RuntimeError("the parts of one replay write steps of different schemas")
        return self.chunk_writer, self.step_writer

    def close(self) -> None:
        """Wait for every part's rows, then close the files."""
        self.writes.finish()
        for w in (self.chunk_writer, self.step_writer):
            if w is not None:
                w.close()

    def abort(self) -> None:
        """Best effort on the failure path (the output folder is discarded)."""
        try:
            self.writes.finish()
        except BaseException:  # noqa: BLE001 - the failure being handled is the one to report
            pass
        for w in (self.chunk_writer, self.step_writer):
            if w is not None:
                try:
                    w.close()
                except Exception:  # pragma: no cover - best effort on the failure path
                    pass
