"""The canonical trace as flat columns the engine can index cheaply (no per-row objects up front)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass
class TraceArrays:
    request_id: list[str]
    arrival_ms: np.ndarray  # int64
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    hash_offsets: np.ndarray  # int64, len n + 1; row i's ids are hash_values[off[i]:off[i+1]]
    hash_values: list[int]  # Python ints (uint64 values, never truncated)
    session_id: list[str | None]
    turn: np.ndarray  # int64, -1 when null
    delay_ms: np.ndarray  # float64, nan when null
    priority: np.ndarray  # int64, 0 when null
    hash_block_size: int | None
    shared_lead: np.ndarray  # int64: how many leading ids of the row occur in another row too

    def __len__(self) -> int:
        return len(self.request_id)


def trace_arrays(table: pa.Table, hash_block_size: int | None) -> TraceArrays:
    def ints(name: str, fill: int) -> np.ndarray:
        col = table.column(name)
        return col.fill_null(fill).to_numpy().astype(np.int64) if col.null_count else col.to_numpy().astype(np.int64)

    hashes = table.column("hash_ids").combine_chunks()
    if isinstance(hashes, pa.ChunkedArray):  # empty table
        hashes = pa.array([], type=pa.list_(pa.uint64()))
    offsets = hashes.offsets.to_numpy().astype(np.int64)
    flat = hashes.flatten().to_numpy(zero_copy_only=False) if len(hashes) else np.zeros(0, np.uint64)
    values = flat.tolist()
    base = int(offsets[0]) if len(offsets) else 0
    offsets = offsets - base
    delay = table.column("delay_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    return TraceArrays(
        request_id=table.column("request_id").to_pylist(),
        arrival_ms=ints("arrival_ms", 0),
        input_tokens=ints("input_tokens", 0),
        output_tokens=ints("output_tokens", 0),
        hash_offsets=offsets,
        hash_values=values,
        session_id=table.column("session_id").to_pylist(),
        turn=ints("turn", -1),
        delay_ms=delay,
        priority=ints("priority", 0),
        hash_block_size=hash_block_size,
        shared_lead=shared_lead(flat, offsets),
    )


def shared_lead(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the number of leading hash ids that also occur in some other row.

    Ids are chained, so another request can only ever hit this row's blocks inside that leading
    run (its prefix walk stops at the first id it does not share). The engine registers the blocks
    beyond it in the prefix cache only if their owner is preempted (engine/kv_cache_manager.py).
    An id repeated inside one row counts as shared: conservative, never a lost hit.
    """
    n = len(offsets) - 1
    lead = np.zeros(max(n, 0), dtype=np.int64)
    if n <= 0 or not len(flat):
        return lead
    _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    private_at = np.where(counts[inverse] > 1, len(flat), np.arange(len(flat)))
    starts, ends = offsets[:-1], offsets[1:]
    rows = np.flatnonzero(ends > starts)
    if len(rows):
        first_private = np.minimum.reduceat(private_at, starts[rows])
        lead[rows] = np.minimum(first_private, ends[rows]) - starts[rows]
    return lead
