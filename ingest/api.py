"""Public ingest API: ``convert`` (file -> canonical Parquet), ``load_trace`` and ``trace_stats``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.atomic import atomic_path, refuse_inputs
from replay.base.errors import TraceError
from replay.base.files import require_regular_file

from .columns import ms_to_iso
from .detect import make_reader
from .options import IngestOptions, OnError
from .pipeline import Progress, canonical_batches, no_rows_error, resolve_lines, skipped_text, sort_by_arrival
from .readers.base import Reader, ReaderInfo
from .readers.decoding import read_errors
from .rejections import remove_stale_side_file, side_file_path, write_side_file
from .reuse import NullHashIdError
from .schema import TraceMetadata, is_canonical_trace, read_trace
from .stats import parquet_ids, trace_stats
from .writer import TraceWriter, trace_schema_with, write_trace_table

__all__ = ["IngestResult", "convert", "load_trace", "inspect_trace", "trace_stats", "file_sha256"]

# Columns ``replay inspect`` never looks at; hash_ids is streamed from the file instead (at a million requests:
# 82 M ids of a 10 M-row trace read at once, and numbered, peaked at 6 GB).
_NOT_INSPECTED = ("request_id", "hash_ids", "parent_id", "turn", "delay_ms")


@dataclass
class IngestResult:
    """What an ingest did: counts, where rejected rows went, and the trace provenance."""

    rows_written: int
    rows_rejected: int
    rows_resorted: int
    rows_dropped: int
    side_file: Path | None
    metadata: TraceMetadata
    dest: Path | None = None
    warnings: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # source records that are not requests, by reason


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _options(**kw) -> IngestOptions:
    return IngestOptions(**{k: v for k, v in kw.items() if v is not None})


def _metadata(path: Path, info: ReaderInfo, progress: Progress, sha: str, shift: int = 0) -> TraceMetadata:
    start = None
    if info.wallclock and progress.base_ms is not None:
        start = ms_to_iso(progress.base_ms + shift)
    notes = list(info.notes)
    if progress.sessions_derived:
        notes.append("sessions: turn and parent_id filled in file order where the source omits them")
    return TraceMetadata(
        source_format=info.source_format,
        source_file=path.name,
        source_sha256=sha,
        time_unit=info.time_unit,
        start_time=start,
        arrival_offset_ms=None if progress.base_ms is None else progress.base_ms + shift,
        hash_block_size=info.hash_block_size,
        prefix_identity=info.prefix_identity,  # type: ignore[arg-type]
        tokenizer=info.tokenizer,
        notes="; ".join(notes) or None,
        source_run=info.source_run,
        timestamps="absent" if info.no_timestamps else "recorded",
    )


def _warnings(progress: Progress, skipped: dict[str, int] | None = None,
              from_reader: list[str] | None = None) -> list[str]:
    out = list(from_reader or [])  # what the reader found about the file as a whole comes first
    if skipped_text(skipped or {}):
        out.append(skipped_text(skipped or {}))
    if progress.rows_out_of_order:
        out.append(f"{progress.rows_out_of_order} row(s) were out of time order; the trace was sorted by arrival")
    if progress.rows_dropped:
        out.append(f"{progress.rows_dropped} failed row(s) (zero output tokens) dropped by --drop-failed")
    if progress.rejections:
        out.append(f"{len(progress.rejections)} row(s) rejected")
    return out


def _open(source: Path, opts: IngestOptions) -> tuple[Reader, ReaderInfo]:
    require_regular_file(source, "trace file")
    with read_errors(source):
        reader = make_reader(source, opts)
        return reader, reader.info()


def convert(source: str | Path, dest: str | Path, *, format: str | None = None, block_size: int | None = None,
            on_error: OnError = "fail", time_unit: str | None = None, mapping: dict[str, str] | None = None,
            tokenizer: str | None = None, drop_failed: bool = False,
            where: dict[str, str] | None = None) -> IngestResult:
    """Ingest ``source`` (any supported format) into the canonical Parquet trace ``dest``.

    With ``on_error='fail'`` the first problem raises ``TraceError`` and nothing is written; with
    ``'skip'`` the good rows are written and the rejected ones listed in ``<dest>.rejected.jsonl``.
    """
    source, dest = Path(source), Path(dest)
    opts = _options(format=format, block_size=block_size, on_error=on_error, time_unit=time_unit,
                    mapping=mapping, tokenizer=tokenizer, drop_failed=drop_failed, where=where)
    side = side_file_path(dest)
    refuse_inputs(side, [source])
    reader, info = _open(source, opts)
    sha = file_sha256(source)
    progress = Progress()
    with atomic_path(dest, inputs=[source]) as tmp:
        writer: TraceWriter | None = None
        try:
            for batch in canonical_batches(reader, info, opts, progress):
                if writer is None:
                    writer = TraceWriter(tmp, _metadata(source, info, progress, sha), extras=info.extra_columns)
                writer.write(batch)
        finally:
            if writer is not None:
                writer.close()
        if progress.rejections:
            with read_errors(source):
                resolve_lines(reader, progress.rejections)
            write_side_file(side, progress.rejections)
        if writer is None:
            raise no_rows_error(reader, progress, side if progress.rejections else None)
        meta = _metadata(source, info, progress, sha)
        if progress.rows_out_of_order:
            table = pq.read_table(tmp)
            table, shift = sort_by_arrival(table)
            meta = _metadata(source, info, progress, sha, shift)
            write_trace_table(tmp, table, meta)
    if not progress.rejections:
        remove_stale_side_file(side)  # an earlier ingest's rejects would now describe rows we kept
    return IngestResult(
        rows_written=progress.rows_good,
        rows_rejected=len(progress.rejections),
        rows_resorted=progress.rows_out_of_order,
        rows_dropped=progress.rows_dropped,
        side_file=side if progress.rejections else None,
        metadata=meta,
        dest=dest,
        warnings=_warnings(progress, reader.skipped, reader.warnings),
        skipped=dict(reader.skipped),
    )


def load_trace(path: str | Path, *, format: str | None = None, block_size: int | None = None,
               on_error: OnError = "fail", time_unit: str | None = None, mapping: dict[str, str] | None = None,
               tokenizer: str | None = None, drop_failed: bool = False,
               where: dict[str, str] | None = None) -> tuple[pa.Table, TraceMetadata]:
    """A canonical trace in memory: read it if ``path`` is one, else ingest the file in memory.

    The returned table carries the ``replay.*`` metadata in its schema (so ``trace_stats`` knows the
    block size). With ``on_error='skip'`` rejected rows are left out (nothing is written to disk).
    """
    path = require_regular_file(path, "trace file")
    if format in (None, "canonical") and is_canonical_trace(path):
        return read_trace(path)
    opts = _options(format=format, block_size=block_size, on_error=on_error, time_unit=time_unit,
                    mapping=mapping, tokenizer=tokenizer, drop_failed=drop_failed, where=where)
    reader, info = _open(path, opts)
    progress = Progress()
    batches = list(canonical_batches(reader, info, opts, progress))
    if not batches:
        raise no_rows_error(reader, progress)
    table = pa.concat_tables(batches)
    shift = 0
    if progress.rows_out_of_order:
        table, shift = sort_by_arrival(table)
    meta = _metadata(path, info, progress, file_sha256(path), shift)
    return table.cast(trace_schema_with(meta, info.extra_columns)), meta



def inspect_trace(path: str | Path, lru_blocks: tuple[int, ...] | list[int] = (), *, format: str | None = None,
                  block_size: int | None = None, time_unit: str | None = None, mapping: dict[str, str] | None = None,
                  drop_failed: bool = False) -> tuple[dict, pa.Table, TraceMetadata]:
    """``trace_stats`` of any trace file, with the table it was computed from (for the measured and
    label lines) and the trace's metadata. A canonical Parquet file is read without the columns
    inspect ignores and its hash ids are streamed, so memory stays bounded at 10 M rows."""
    path = require_regular_file(path, "trace file")
    try:
        if format in (None, "canonical") and is_canonical_trace(path):
            table, meta = read_trace(path, without=_NOT_INSPECTED)
            try:
                return trace_stats(table, lru_blocks, hash_ids=parquet_ids(path)), table, meta
            except (OSError, pa.ArrowException) as exc:  # a data page of hash_ids that does not decode
                raise TraceError(f"cannot read Parquet data: {exc}", path=str(path)) from None
        table, meta = load_trace(path, format=format, block_size=block_size, time_unit=time_unit,
                                 mapping=mapping, drop_failed=drop_failed)
        return trace_stats(table, lru_blocks), table, meta
    except NullHashIdError as exc:
        raise TraceError(str(exc), path=str(path), field="hash_ids") from None
