"""The canonical trace: one Parquet file, one row per request, provenance in key-value metadata.

This module is the contract between ingest (which writes traces) and the engine and reports
(which read them). See docs/trace-schema.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, ValidationError

from replay.base.errors import TraceError
from replay.base.structured import parse_json
from replay.base.version import __version__

from .trace_checks import TraceRowChecker, check_column_types

SCHEMA_VERSION = "1"
# Tokens per hash id at most: the engine keeps a token's offset inside a trace block in 24 bits
# (engine/block_keys.py); real traces use 16 to 512.
MAX_HASH_BLOCK_SIZE = (1 << 24) - 1

TRACE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arrival_ms", pa.int64(), nullable=False),
        pa.field("input_tokens", pa.int32(), nullable=False),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("hash_ids", pa.list_(pa.uint64()), nullable=True),
        pa.field("session_id", pa.string(), nullable=True),
        pa.field("parent_id", pa.string(), nullable=True),
        pa.field("turn", pa.int32(), nullable=True),
        pa.field("delay_ms", pa.int64(), nullable=True),
        pa.field("priority", pa.int32(), nullable=True),
    ]
)

# Optional columns, kept from the source when it has them (never estimated): what a server measured
# for the request (``measured_*``, client-side times in ms as the benchmark tools report them) and
# labels to group reports by. A trace holds the core columns above plus any subset of these, in
# this order; the engine ignores them, ``replay validate`` compares predictions against them.
MEASURED_FIELDS = [
    pa.field("measured_ttft_ms", pa.float64(), nullable=True),
    pa.field("measured_e2e_ms", pa.float64(), nullable=True),
    pa.field("measured_tpot_ms", pa.float64(), nullable=True),   # (e2e - ttft) / (output_tokens - 1)
    pa.field("measured_itl_ms", pa.list_(pa.float64()), nullable=True),  # every inter-token/chunk gap
    pa.field("measured_itl_mean_ms", pa.float64(), nullable=True),
    pa.field("measured_cached_tokens", pa.int32(), nullable=True),  # prompt tokens served from a prefix cache
    pa.field("measured_draft_tokens", pa.int32(), nullable=True),   # speculative draft tokens proposed
    pa.field("measured_accepted_tokens", pa.int32(), nullable=True),  # draft tokens accepted
    # server-side phases as vLLM's request spans report them (gen_ai.latency.*): waiting in the
    # scheduler queue, first scheduling to first token, first token to last token
    pa.field("measured_queue_ms", pa.float64(), nullable=True),
    pa.field("measured_prefill_ms", pa.float64(), nullable=True),
    pa.field("measured_decode_ms", pa.float64(), nullable=True),
]
LABEL_FIELDS = [
    pa.field("model", pa.string(), nullable=True),
    pa.field("tenant", pa.string(), nullable=True),
    pa.field("request_type", pa.string(), nullable=True),
    # the benchmark run (load level) a request belongs to when one file holds several, e.g. a
    # GuideLLM sweep's "constant@4.00": select it with --by / --where source_run=...
    pa.field("source_run", pa.string(), nullable=True),
]
OPTIONAL_SCHEMA = pa.schema(MEASURED_FIELDS + LABEL_FIELDS)
MEASURED_COLUMNS = tuple(f.name for f in MEASURED_FIELDS)
LABEL_COLUMNS = tuple(f.name for f in LABEL_FIELDS) + ("priority",)


def trace_schema_for(extras: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """The core schema plus the named optional columns, in canonical order."""
    wanted = set(extras)
    unknown = wanted - set(OPTIONAL_SCHEMA.names)
    if unknown:
        raise ValueError(f"unknown optional trace columns {sorted(unknown)}")
    return pa.schema(list(TRACE_SCHEMA) + [f for f in OPTIONAL_SCHEMA if f.name in wanted])


def optional_columns(names: list[str]) -> tuple[str, ...]:
    """The optional canonical columns among ``names``, in canonical order."""
    have = set(names)
    return tuple(n for n in OPTIONAL_SCHEMA.names if n in have)


PrefixIdentity = Literal["real", "synthesized", "absent"]

METADATA_PREFIX = "replay."


class TraceMetadata(BaseModel):
    """Provenance of a canonical trace, stored as Parquet key-value metadata (``replay.*`` keys)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA_VERSION
    source_format: str
    source_file: str
    source_sha256: str | None = None
    time_unit: str
    start_time: str | None = None  # absolute ISO-8601 start time of the trace, when the source has it
    arrival_offset_ms: int | None = None  # source time (ms, source clock) of arrival_ms 0: every trace is rebased
    hash_block_size: int | None = None  # tokens per hash id; None when there are no hash ids
    prefix_identity: PrefixIdentity
    tokenizer: str | None = None
    tool_version: str = __version__
    notes: str | None = None
    # How the source run was driven and served (benchmark load mode, rate, concurrency, model...),
    # when the source says: ``replay validate`` states where a replay differs from it.
    source_run: dict | None = None
    timestamps: Literal["recorded", "absent"] = "recorded"  # absent: arrivals are 0, replay with a load mode

    def to_parquet_metadata(self) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for key, value in self.model_dump().items():
            out[(METADATA_PREFIX + key).encode()] = json.dumps(value).encode()
        return out

    @classmethod
    def from_parquet_metadata(cls, meta: dict[bytes, bytes] | None, path: str | Path = "") -> TraceMetadata:
        meta = meta or {}
        values = {}
        for raw_key, raw_value in meta.items():
            key = raw_key.decode("utf-8", "replace")
            if key.startswith(METADATA_PREFIX):
                values[key[len(METADATA_PREFIX):]] = parse_json(raw_value, f"{path}: metadata key {key}", TraceError)
        if "source_format" not in values:
            raise TraceError(
                "not a canonical trace (no replay.* metadata); convert it with `replay ingest` first",
                path=str(path),
            )
        known = set(cls.model_fields)
        try:
            return cls(**{k: v for k, v in values.items() if k in known})
        except ValidationError as exc:
            bad = "; ".join(f"{METADATA_PREFIX}{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise TraceError(f"invalid trace metadata: {bad}", path=str(path)) from None


def read_trace_metadata(path: str | Path) -> TraceMetadata:
    return TraceMetadata.from_parquet_metadata(pq.read_schema(path).metadata, path)


PIECE_ROWS = 131_072  # rows a TraceReader piece holds (about 22 MB of reuse-heavy rows)


class TraceReader:
    """A canonical Parquet trace read a piece at a time: each piece cast to the canonical
    schema and checked as ``replay ingest`` writes rows (``trace_checks.py``), so that a reader
    that keeps something smaller than the table (the engine's columns, a fingerprint) never holds
    the whole table. ``read_trace`` is this reader's pieces put together.

    ``without``: columns not read (they must still be in the file). ``replayable=True`` (a replay's
    reading) also refuses rows out of arrival order and hash ids that do not fit ``hash_block_size``,
    which ``replay inspect`` and the reports' trace views tolerate (they order rows and cap hits
    themselves). ``check_rows=False`` skips the row checks (the pieces are the same): for a reader
    that only fingerprints a trace another command already checked."""

    def __init__(self, path: str | Path, without: tuple[str, ...] = (), *,
                 replayable: bool = False, check_rows: bool = True) -> None:
        self.path = Path(path)
        try:
            # Read in a stream of 1 MB buffers (not each row group's column chunks at once): at 10 M
            # reuse-heavy rows in row groups of 1 M, reading peaks at 0.3 GB instead of 0.9 GB, and is faster.
            self._file = pq.ParquetFile(self.path, page_checksum_verification=True, buffer_size=1 << 20,
                                        pre_buffer=False)
        except (OSError, pa.ArrowInvalid) as exc:
            raise TraceError(f"cannot read Parquet: {exc}", path=str(self.path)) from None
        file_schema = self._file.schema_arrow
        self.meta = TraceMetadata.from_parquet_metadata(file_schema.metadata, self.path)
        names = file_schema.names
        missing = [f.name for f in TRACE_SCHEMA if f.name not in names]
        if missing:
            raise TraceError(f"missing columns {missing}", path=str(self.path))
        fields = [f for f in trace_schema_for(optional_columns(names)) if f.name not in without]
        # The schema keeps the ``replay.*`` metadata, so ``trace_stats`` can find the block size.
        self.schema = pa.schema(fields, metadata=self.meta.to_parquet_metadata())
        check_column_types(file_schema, self.schema, str(self.path))
        self._columns = [n for n in names if n not in without]
        self.replayable, self.check_rows = replayable, check_rows

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    def hash_id_bound(self) -> int:
        """At least the number of hash ids in the file (the Parquet footer's value count of the id
        column, where an empty or null list counts one): room to collect them without growing."""
        md = self._file.metadata
        leaf = [j for j in range(md.num_columns) if md.schema.column(j).path.split(".")[0] == "hash_ids"]
        return sum(md.row_group(g).column(j).num_values for g in range(md.num_row_groups) for j in leaf)

    def pieces(self) -> Iterator[pa.Table]:
        """The trace's rows, ``PIECE_ROWS`` at a time, cast and checked. Only pieces that pass are
        yielded: once a row is refused, the rest are read to count the rows refused likewise, and
        the error (naming the first offending row) is raised at the end. A trace of no rows is one
        empty piece."""
        path = str(self.path)
        checker = TraceRowChecker(self.meta.hash_block_size, path, replayable=self.replayable) if self.check_rows else None
        batches = self._file.iter_batches(batch_size=PIECE_ROWS, columns=self._columns)
        empty = True
        while True:
            try:
                raw = next(batches)
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as exc:  # a damaged data page: the footer alone read fine
                raise TraceError(f"cannot read Parquet data: {exc}", path=path) from None
            columns = []
            for f in self.schema:
                try:
                    columns.append(raw.column(f.name).cast(f.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # e.g. a length beyond int32
                    raise TraceError(f"does not fit the canonical {f.type}: {' '.join(str(exc).split())}",
                                     path=path, field=f.name) from None
            del raw
            piece = pa.Table.from_arrays(columns, schema=self.schema)
            del columns
            if checker is not None:
                checker.check(piece)
            if checker is None or not checker.failed:
                empty = False
                yield piece
            del piece
        if checker is not None:
            checker.finish()
        if empty:
            yield self.schema.empty_table()


def read_trace(path: str | Path, without: tuple[str, ...] = (), *,
               replayable: bool = False, check_rows: bool = True) -> tuple[pa.Table, TraceMetadata]:
    """Read a whole canonical trace (columns cast to the canonical schema, optional columns kept),
    but for the columns named in ``without``; ``TraceReader`` says what is checked. A piece at a
    time: reading the whole file at once decodes with scratch of about the table's size again
    (10 M reuse-heavy rows: 4.2 GB peak for a 1.7 GB table)."""
    reader = TraceReader(path, without, replayable=replayable, check_rows=check_rows)
    table = pa.concat_tables(list(reader.pieces()))
    # Decoding and the checks leave freed pages in Arrow's allocator (about as many as the table holds):
    # hand them back, or they stay in the reader's peak memory for the whole command.
    pa.default_memory_pool().release_unused()
    return table, reader.meta


def is_canonical_trace(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix.lower() != ".parquet":
        return False
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:
        return False
    # Our metadata key marks a canonical trace; whether the rest holds up, read_trace says in full.
    return (METADATA_PREFIX + "source_format").encode() in metadata
