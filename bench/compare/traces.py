"""Trace plumbing for the comparison: give each simulator the same requests in the format it reads.

Ours reads a canonical Parquet trace (or a Mooncake JSONL it ingests itself); AISimulate reads only
Mooncake JSONL. Canonical traces are written out as Mooncake rows (timestamp, input_length,
output_length, hash_ids) in their arrival order. Nothing is copied into the repository: all files go
to a work directory under /tmp.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replay.base.atomic import atomic_path
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata, is_canonical_trace, read_trace

# Mooncake's own block size (the Mooncake trace's documentation): tokens covered by one hash id.
MOONCAKE_BLOCK_SIZE = 512


class TraceInputError(ValueError):
    """A trace the comparison cannot hand to both simulators; the message says why."""


@dataclass
class PreparedTrace:
    """One trace, in the form each side reads, and what was done to get there."""

    ours_path: Path
    peer_path: Path
    peer_block_size: int
    rows: int
    notes: list[str]


def _mooncake_rows_jsonl(path: Path, max_rows: int | None) -> tuple[int, bool]:
    """Count rows and tell whether any row carries fields AISimulate's static replay refuses."""
    rows, sessions = 0, False
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            if not sessions and ('"delay' in line or '"session_id"' in line):
                sessions = True
            rows += 1
            if max_rows is not None and rows >= max_rows:
                break
    return rows, sessions


def _cut_jsonl(src: Path, dst: Path, max_rows: int) -> int:
    """Copy the first ``max_rows`` non-empty rows (Mooncake files are in time order)."""
    written = 0
    with atomic_path(dst) as tmp, src.open(encoding="utf-8") as fin, tmp.open("w", encoding="utf-8") as fout:
        for line in fin:
            if not line.strip():
                continue
            fout.write(line if line.endswith("\n") else line + "\n")
            written += 1
            if written >= max_rows:
                break
    return written


def canonical_to_mooncake(table: pa.Table, meta: TraceMetadata, dst: Path) -> tuple[int, list[str]]:
    """Write a canonical trace as Mooncake JSONL rows in arrival order; return the block size and notes.

    Without hash ids (prefix identity absent) each request gets fresh ids: no reuse on either side,
    which is what our engine does for such a trace as well.
    """
    notes: list[str] = []
    block = meta.hash_block_size or MOONCAKE_BLOCK_SIZE
    if meta.hash_block_size is None:
        notes.append("trace has no hash ids: the peer gets fresh ids per request (no prefix reuse)")
    order = pc.sort_indices(table, sort_keys=[("arrival_ms", "ascending")])
    table = table.take(order)
    arrivals = table.column("arrival_ms").to_pylist()
    inputs = table.column("input_tokens").to_pylist()
    outputs = table.column("output_tokens").to_pylist()
    hashes = table.column("hash_ids").to_pylist()
    next_fresh = 1 << 62  # far above any id a trace uses densely
    with atomic_path(dst) as tmp, tmp.open("w", encoding="utf-8") as out:
        for ts, n_in, n_out, ids in zip(arrivals, inputs, outputs, hashes, strict=True):
            if ids is None:
                count = math.ceil(n_in / block)
                ids = list(range(next_fresh, next_fresh + count))
                next_fresh += count
            out.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                  "hash_ids": ids}, separators=(",", ":")) + "\n")
    return block, notes


def flatten_sessions(table: pa.Table) -> pa.Table:
    """Drop session links so every turn arrives open-loop at its trace timestamp (both sides alike)."""
    nulls = {name: pa.nulls(table.num_rows, TRACE_SCHEMA.field(name).type)
             for name in ("session_id", "parent_id", "turn", "delay_ms")}
    for name, col in nulls.items():
        table = table.set_column(table.schema.get_field_index(name), TRACE_SCHEMA.field(name), col)
    return table


def write_canonical(table: pa.Table, meta: TraceMetadata, dst: Path) -> None:
    schema = TRACE_SCHEMA.with_metadata(meta.to_parquet_metadata())
    with atomic_path(dst) as tmp:
        pq.write_table(table.cast(TRACE_SCHEMA).replace_schema_metadata(schema.metadata), tmp)


def prepare(trace: Path, workdir: Path, *, max_requests: int | None, sessions: str = "refuse") -> PreparedTrace:
    """Make ``trace`` readable by both sides; ``sessions`` is ``refuse`` or ``flatten``.

    AISimulate's static trace replay refuses multi-turn sessions and non-zero delays, so a session
    trace is either refused or flattened to open-loop arrivals for both sides.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if not trace.exists():
        raise TraceInputError(f"{trace}: no such trace file")
    notes: list[str] = []
    if is_canonical_trace(trace):
        table, meta = read_trace(trace)
        has_sessions = table.column("delay_ms").null_count < table.num_rows or (
            table.column("session_id").null_count < table.num_rows)
        ours = trace
        if has_sessions:
            if sessions != "flatten":
                raise TraceInputError(
                    f"{trace}: multi-turn sessions (session_id / delay_ms) cannot be replayed by AISimulate's "
                    "static trace replay; set `sessions: flatten` to replay every turn open-loop on both sides")
            table = flatten_sessions(table)
            ours = workdir / "trace_flat.parquet"
            write_canonical(table, meta, ours)
            notes.append("sessions flattened: every turn arrives at its trace timestamp on both sides")
        if max_requests is not None:
            notes.append(f"peer trace cut to the first {max_requests} rows in arrival order")
            table = table.take(pc.sort_indices(table, sort_keys=[("arrival_ms", "ascending")]))
            table = table.slice(0, max_requests)
        peer = workdir / "peer_trace.jsonl"
        block, more = canonical_to_mooncake(table, meta, peer)
        return PreparedTrace(ours, peer, block, table.num_rows, notes + more)

    if trace.suffix.lower() not in (".jsonl", ".json"):
        raise TraceInputError(f"{trace}: give a canonical Parquet trace or a Mooncake JSONL")
    rows, has_sessions = _mooncake_rows_jsonl(trace, max_requests)
    if has_sessions:
        raise TraceInputError(
            f"{trace}: rows carry session_id / delay: convert it with `replay ingest` and use `sessions: flatten`")
    peer = trace
    if max_requests is not None:
        peer = workdir / "peer_trace.jsonl"
        rows = _cut_jsonl(trace, peer, max_requests)
        notes.append(f"peer trace cut to the first {rows} rows")
    return PreparedTrace(trace, peer, MOONCAKE_BLOCK_SIZE, rows, notes)


def write_reference_trace(dst: Path, *, requests: int, input_tokens: int, output_tokens: int,
                          hash_block_size: int) -> None:
    """The reference workload as a canonical trace: distinct prompts (fresh hash ids per request).

    Arrivals are all 0: the workload runs under closed-loop concurrency, where timestamps are unused.
    """
    per = math.ceil(input_tokens / hash_block_size)
    flat = pa.array(range(requests * per), type=pa.uint64())
    offsets = pa.array([i * per for i in range(requests + 1)], type=pa.int32())
    table = pa.table(
        {
            "request_id": pa.array([f"ref-{i:06d}" for i in range(requests)], pa.string()),
            "arrival_ms": pa.array([0] * requests, pa.int64()),
            "input_tokens": pa.array([input_tokens] * requests, pa.int32()),
            "output_tokens": pa.array([output_tokens] * requests, pa.int32()),
            "hash_ids": pa.ListArray.from_arrays(offsets, flat),
            "session_id": pa.nulls(requests, pa.string()),
            "parent_id": pa.nulls(requests, pa.string()),
            "turn": pa.nulls(requests, pa.int32()),
            "delay_ms": pa.nulls(requests, pa.int64()),
            "priority": pa.nulls(requests, pa.int32()),
        }
    )
    meta = TraceMetadata(
        source_format="synthetic-reference",
        source_file="bench.compare reference workload",
        time_unit="ms",
        hash_block_size=hash_block_size,
        prefix_identity="synthesized",
        notes=f"{requests} requests of {input_tokens}/{output_tokens} tokens, distinct prompts",
    )
    write_canonical(table, meta, dst)
