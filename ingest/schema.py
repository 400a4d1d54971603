"""The canonical trace: one Parquet file, one row per request, provenance in key-value metadata.

This module is the contract between ingest (which writes traces) and the engine and reports
(which read them). See docs/trace-schema.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, ValidationError

from replay.base.errors import TraceError
from replay.base.structured import parse_json
from replay.base.version import __version__

from .trace_checks import check_column_types, check_required_values, check_trace_rows

SCHEMA_VERSION = "1"

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


def read_trace(path: str | Path, without: tuple[str, ...] = (), *,
               replayable: bool = False, check_rows: bool = True) -> tuple[pa.Table, TraceMetadata]:
    """Read a whole canonical trace (columns cast to the canonical schema, optional columns kept),
    but for the columns named in ``without`` (which must still be in the file). Every row is checked as
    ``replay ingest`` writes it (``trace_checks.py``); ``replayable=True`` (a replay's reading) also
    refuses rows out of arrival order and hash ids that do not fit ``hash_block_size``, which
    ``replay inspect`` and the reports' trace views tolerate (they order rows and cap hits themselves).
    ``check_rows=False`` skips the row checks (the table is the same): for a reader that only
    fingerprints a trace another command already checked.

    The table's schema keeps the ``replay.*`` metadata, so ``trace_stats`` can find the block size.
    """
    path = Path(path)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowInvalid) as exc:
        raise TraceError(f"cannot read Parquet: {exc}", path=str(path)) from None
    meta = TraceMetadata.from_parquet_metadata(pf.schema_arrow.metadata, path)
    names = pf.schema_arrow.names
    missing = [f.name for f in TRACE_SCHEMA if f.name not in names]
    if missing:
        raise TraceError(f"missing columns {missing}", path=str(path))
    schema = trace_schema_for(optional_columns(names))
    fields = [f for f in schema if f.name not in without]
    check_column_types(pf.schema_arrow, pa.schema(fields), str(path))
    try:
        table = _read_row_groups(pf, [n for n in names if n not in without])
    except (OSError, pa.ArrowException) as exc:  # a damaged data page: the footer alone read fine
        raise TraceError(f"cannot read Parquet data: {exc}", path=str(path)) from None
    check_required_values(table, str(path))
    columns = []
    for f in fields:
        try:
            columns.append(table.column(f.name).cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # e.g. a length beyond int32
            raise TraceError(f"does not fit the canonical {f.type}: {' '.join(str(exc).split())}",
                             path=str(path), field=f.name) from None
    table = pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=meta.to_parquet_metadata()))
    if check_rows:
        check_trace_rows(table, meta.hash_block_size, str(path), replayable=replayable)
    # Decoding and the checks leave freed pages in Arrow's allocator (about as many as the table holds):
    # hand them back, or they stay in the reader's peak memory for the whole command.
    pa.default_memory_pool().release_unused()
    return table, meta


def _read_row_groups(pf: pq.ParquetFile, columns: list[str]) -> pa.Table:
    """The file's columns one row group at a time, as one table of those chunks. Reading the whole
    file at once decodes with scratch of about the table's size again (10 M reuse-heavy rows: 4.2 GB
    peak for a 1.7 GB table; one group at a time 2.2 GB, the same CPU time, less wall time)."""
    if pf.metadata.num_row_groups == 0:
        return pf.read(columns=columns)
    return pa.concat_tables([pf.read_row_group(i, columns=columns) for i in range(pf.metadata.num_row_groups)])


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
