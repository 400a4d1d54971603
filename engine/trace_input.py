"""The canonical trace as flat columns the engine can index cheaply (no per-row objects up front)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


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
    # uint64, every row's ids back to back: 8 bytes an id (a Python int list took about 30); a request
    # takes its own ids as Python ints when it arrives (engine/fleet.py, make_request)
    hash_values: np.ndarray
    session_id: list[str | None]
    turn: np.ndarray  # int64, -1 when null
    delay_ms: np.ndarray  # float64, nan when null
    priority: np.ndarray  # int64, 0 when null
    hash_block_size: int | None
    shared_lead: np.ndarray  # int64: leading ids of the row up to the last one another row has too
    rechained: bool = False  # the trace's ids were not chained and were made so (chained_ids)

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
    base = int(offsets[0]) if len(offsets) else 0
    offsets = offsets - base
    rechained = not is_chained(flat, offsets)
    if rechained:
        flat = chained_ids(flat, offsets)
    values = np.ascontiguousarray(flat, dtype=np.uint64)
    delay = table.column("delay_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    return TraceArrays(
        request_id=StringColumn(table.column("request_id")),
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
        rechained=rechained,
    )


# Ids per pass of the whole-trace id checks below: they group equal ids by sorting, and a pass sorts
# only the ids of one value class, so their scratch memory stays near 50 bytes times this, not times
# the trace's ids (1 M reuse-heavy requests hold 15 M ids: one sort of all of them took 0.6 GB).
_IDS_PER_PASS = 1 << 20


def _row_starts(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """True at each id that starts its row."""
    first = np.zeros(len(flat), dtype=bool)
    first[offsets[:-1][offsets[:-1] < offsets[1:]]] = True
    return first


def _id_classes(flat: np.ndarray) -> Iterator[np.ndarray]:
    """Positions of the ids, in classes by id value (equal ids always share a class), each class about
    ``_IDS_PER_PASS`` ids, ascending positions within a class."""
    parts = max(1, -(-len(flat) // _IDS_PER_PASS))
    if parts == 1:
        yield np.arange(len(flat))
        return
    cls = np.empty(len(flat), dtype=np.uint16)
    for i in range(0, len(flat), _IDS_PER_PASS):  # sliced: no id-sized temporary of 8 bytes an id
        cls[i:i + _IDS_PER_PASS] = flat[i:i + _IDS_PER_PASS] % np.uint64(parts)
    for p in range(parts):
        yield np.flatnonzero(cls == p)


def is_chained(flat: np.ndarray, offsets: np.ndarray) -> bool:
    """True when every id always follows the same id (or always starts a row): then an id names
    its whole prefix, as a vLLM block hash does, and shared ids of a row form a leading run."""
    if not len(flat):
        return True
    first = _row_starts(flat, offsets)
    for pos in _id_classes(flat):
        starts = first[pos]
        prev = np.where(starts, np.uint64(0), flat[pos - 1])  # position 0 always starts a row
        ids = flat[pos]
        order = np.lexsort((starts, prev, ids))
        ids, prevs, firsts = ids[order], prev[order], starts[order]
        same_id = ids[1:] == ids[:-1]
        if np.any(same_id & ((prevs[1:] != prevs[:-1]) | (firsts[1:] != firsts[:-1]))):
            return False
    return True


def chained_ids(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Ids that name whole prefixes: position i of a row gets one id per distinct (prefix id,
    trace id) pair, the way vLLM chains block hashes (H(parent, block)). Used only for traces
    whose ids are not chained already (per-block content hashes, an id repeated in a row):
    without it a block would match another prompt's block after a different prefix."""
    out = np.empty(len(flat), dtype=np.uint64)
    canon: dict[tuple[int, int], int] = {}
    values = flat.tolist()
    for r in range(len(offsets) - 1):
        prev = 0
        for i in range(int(offsets[r]), int(offsets[r + 1])):
            key = (prev, values[i])
            c = canon.get(key)
            if c is None:
                c = len(canon) + 1
                canon[key] = c
            out[i] = prev = c
    return out


def shared_lead(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the number of leading hash ids up to the last one that also occurs in another row.

    Another request can only ever hit this row's blocks named by ids it holds too, so blocks past
    that run are findable by their owner alone; the engine registers them in the prefix cache only
    if their owner is preempted (engine/kv_cache_manager.py). With chained ids the shared ids are a
    leading run anyway; counting up to the last shared one makes no assumption about it. An id
    repeated inside one row counts as shared: conservative, never a lost hit.
    """
    n = len(offsets) - 1
    lead = np.zeros(max(n, 0), dtype=np.int64)
    if n <= 0 or not len(flat):
        return lead
    shared = np.zeros(len(flat), dtype=bool)
    for pos in _id_classes(flat):
        _, inverse, counts = np.unique(flat[pos], return_inverse=True, return_counts=True)
        shared[pos[counts[inverse] > 1]] = True
    # A row's lead ends at its last shared id: the last shared position before the row's end, unless
    # that is before the row's start. Rows in blocks of about _IDS_PER_PASS ids, for the positions.
    starts, ends = offsets[:-1], offsets[1:]
    r0 = 0
    while r0 < n:
        r1 = max(r0 + 1, int(np.searchsorted(starts, starts[r0] + _IDS_PER_PASS, side="right")))
        base = int(starts[r0])
        shared_pos = np.flatnonzero(shared[base:int(ends[r1 - 1])]) + base
        if len(shared_pos):
            k = np.searchsorted(shared_pos, ends[r0:r1]) - 1
            last = shared_pos[np.maximum(k, 0)]
            has = (k >= 0) & (last >= starts[r0:r1])
            lead[r0:r1][has] = (last - starts[r0:r1] + 1)[has]
        r0 = r1
    return lead


def shared_lead_within(flat: np.ndarray, offsets: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``shared_lead`` where only rows of the same group count as others: with replicas known in
    advance (a router whose choice depends on the row alone, or round robin over open-loop
    arrivals), a request can only hit the cache of its own replica, so ids shared with rows served
    elsewhere name blocks nobody here can look up. Rows of group -1 (never replayed) share nothing.
    """
    n = len(offsets) - 1
    lead = np.zeros(max(n, 0), dtype=np.int64)
    if n <= 0 or not len(flat):
        return lead
    lengths = np.diff(offsets)
    for g in np.unique(groups[groups >= 0]).tolist():
        rows = np.flatnonzero(groups == g)
        sub = flat[np.repeat(groups == g, lengths)]
        sub_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths[rows], out=sub_offsets[1:])
        lead[rows] = shared_lead(sub, sub_offsets)
    return lead
