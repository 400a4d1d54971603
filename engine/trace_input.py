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
    values = hashes.flatten().to_numpy(zero_copy_only=False).tolist() if len(hashes) else []
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
    )
