"""The canonical trace as flat columns the engine can index cheaply (no per-row objects up front)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.engine.trace_ids import chained_ids, scan_ids, shared_lead


class StringColumn:
    """A non-null string column kept as Arrow keeps it (UTF-8 bytes and offsets, about 12 bytes a
    short id) instead of one Python str per row (about 65): a str is made only for a row asked for
    (a request when it arrives, a router's key, an error message)."""

    __slots__ = ("arrow", "_data", "_offsets")

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        arr = arr.cast(pa.large_string())
        if arr.null_count:
            raise ValueError("StringColumn holds non-null strings only")
        self.arrow = arr
        _, offsets, data = arr.buffers()
        self._offsets = np.frombuffer(offsets, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
        self._data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> str:
        off = self._offsets
        return self._data[off[i]:off[i + 1]].tobytes().decode("utf-8")


def string_array(column: StringColumn | list[str]) -> pa.Array:
    """A trace's string column as an Arrow string array (what the output files store)."""
    if isinstance(column, StringColumn):
        return column.arrow.cast(pa.string())
    return pa.array(column, pa.string())


@dataclass
class TraceArrays:
    request_id: StringColumn | list[str]
    arrival_ms: np.ndarray  # int64
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    hash_offsets: np.ndarray  # int64, len n + 1; row i's ids are hash_values[off[i]:off[i+1]]
    # Every row's ids back to back, uint32 when every id fits (4 bytes an id), else uint64 (a Python
    # int list took about 30); a request takes its own ids as Python ints when it arrives
    # (engine/fleet.py, make_request)
    hash_values: np.ndarray
    session_id: list[str | None]
    turn: np.ndarray  # int32, -1 when null
    delay_ms: np.ndarray  # float64, nan when null
    priority: np.ndarray  # int32, 0 when null
    hash_block_size: int | None
    shared_lead: np.ndarray  # int32: leading ids of the row up to the last one another row has too
    rechained: bool = False  # the trace's ids were not chained and were made so (chained_ids)

    def __len__(self) -> int:
        return len(self.request_id)


def _flat_ids(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, ids) of a list<uint64> column, chunk by chunk into one array: no combined Arrow
    copy of the column on the way. The ids are uint32 when they all fit (half the memory: 10 M
    reuse-heavy rows hold 154 M ids)."""
    chunks = [c for c in column.chunks if len(c)]
    lengths = [c.offsets.to_numpy() for c in chunks]
    total = sum(int(o[-1] - o[0]) for o in lengths)
    flats = [c.flatten() for c in chunks]  # the ids of each chunk's rows only (a slice's own)
    top = max((int(pc.max(f).as_py() or 0) for f in flats if len(f)), default=0)
    values = np.empty(total, dtype=np.uint32 if top < 2**32 else np.uint64)
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    row = pos = 0
    for c, o, f in zip(chunks, lengths, flats):
        k = len(f)
        values[pos:pos + k] = f.to_numpy(zero_copy_only=False)
        offsets[row + 1:row + len(c) + 1] = o[1:] - o[0] + pos
        row += len(c)
        pos += k
    return offsets, values


def trace_arrays(table: pa.Table, hash_block_size: int | None) -> TraceArrays:
    def ints(name: str, fill: int, dtype: type = np.int64) -> np.ndarray:
        col = table.column(name)
        return (col.fill_null(fill) if col.null_count else col).to_numpy().astype(dtype)

    offsets, flat = _flat_ids(table.column("hash_ids"))
    scan = scan_ids(flat, offsets)
    rechained = not scan.chained
    if rechained:
        flat = chained_ids(flat, offsets)
        flat = flat.astype(np.uint32) if not len(flat) or int(flat.max()) < 2**32 else flat
        scan = scan_ids(flat, offsets, check_chained=False)
    delay = table.column("delay_ms").to_numpy().astype(np.float64)
    return TraceArrays(
        request_id=StringColumn(table.column("request_id")),
        arrival_ms=ints("arrival_ms", 0),
        input_tokens=ints("input_tokens", 0),
        output_tokens=ints("output_tokens", 0),
        hash_offsets=offsets,
        hash_values=flat,
        session_id=table.column("session_id").to_pylist(),
        turn=ints("turn", -1, np.int32),
        delay_ms=delay,
        priority=ints("priority", 0, np.int32),
        hash_block_size=hash_block_size,
        shared_lead=shared_lead(flat, offsets, scan.shared),
        rechained=rechained,
    )
