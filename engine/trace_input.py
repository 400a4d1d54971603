"""The canonical trace as flat columns the engine can index cheaply (no per-row objects up front)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.engine.page_release import ConsumedPrefix
from replay.engine.trace_ids import chained_ids, scan_ids, shared_lead


class StringColumn:
    """A non-null string column kept as Arrow keeps it (UTF-8 bytes and offsets, about 12 bytes a
    short id) instead of one Python str per row (about 65): a str is made only for a row asked for
    (a request when it arrives, a router's key, an error message). 32-bit offsets (what the output
    files store, so they take the column as it is) unless its bytes pass 2 GB."""

    __slots__ = ("arrow", "_data", "_offsets")

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(column, pa.ChunkedArray):
            try:
                arr = column.combine_chunks()
            except (pa.ArrowInvalid, OverflowError):  # more than 2 GB of text in 32-bit offsets
                arr = column.cast(pa.large_string()).combine_chunks()
        else:
            arr = column
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = arr.cast(pa.string())
        if arr.null_count:
            raise ValueError("StringColumn holds non-null strings only")
        self.arrow = arr
        _, offsets, data = arr.buffers()
        dtype = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        self._offsets = np.frombuffer(offsets, dtype=dtype)[arr.offset:arr.offset + len(arr) + 1]
        self._data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> str:
        off = self._offsets
        return self._data[off[i]:off[i + 1]].tobytes().decode("utf-8")


class CodedStrings:
    """A nullable string column as codes into its distinct values: a session id repeats along its
    session's turns, so 4 bytes a row plus each session once, where a list of Python objects took
    8 bytes a row when null and about 70 when not (10 M rows: 40 MB against 80 to 700 MB)."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list[str]) -> None:
        self.codes = codes  # int32, -1 for null
        self.values = values

    @classmethod
    def from_list(cls, items: list[str | None]) -> CodedStrings:
        index: dict[str, int] = {}
        codes = np.array([-1 if s is None else index.setdefault(s, len(index)) for s in items], dtype=np.int32)
        return cls(codes, list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> str | None:
        c = self.codes[i]
        return None if c < 0 else self.values[c]

    def any(self) -> bool:
        """Whether any row holds a value."""
        return bool(len(self.codes)) and bool((self.codes >= 0).any())

    def arrow(self, rows: np.ndarray) -> pa.Array:
        """Rows ``rows`` as an Arrow string array (nulls where null)."""
        codes = self.codes[rows]
        if not self.values:
            return pa.nulls(len(codes), pa.string())
        dictionary = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(self.values, pa.string()))
        return dictionary.cast(pa.string())


class _CodedStringsBuilder:
    """``CodedStrings`` filled piece by piece: each piece's values coded against the distinct ones
    so far. No codes array until the first value (a trace without sessions: one -1 seen n times)."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.codes: np.ndarray | None = None
        self.index: dict[str, int] = {}

    def put(self, lo: int, column: pa.ChunkedArray) -> None:
        for chunk in column.chunks:
            if chunk.null_count < len(chunk):
                if self.codes is None:
                    self.codes = np.full(self.num_rows, -1, dtype=np.int32)
                encoded = chunk.dictionary_encode()
                local = np.array([self.index.setdefault(v, len(self.index)) for v in encoded.dictionary.to_pylist()],
                                 dtype=np.int32)
                idx = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
                valid = np.asarray(chunk.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                self.codes[lo:lo + len(chunk)] = np.where(valid, local[idx], -1)
            lo += len(chunk)

    def finish(self) -> CodedStrings:
        codes = self.codes if self.codes is not None else np.broadcast_to(np.int32(-1), (self.num_rows,))
        return CodedStrings(codes, list(self.index))


def sessions_of(column: CodedStrings | list[str | None], rows: np.ndarray) -> tuple[list[int], list[str]]:
    """(positions in ``rows`` of the rows with a session, their session ids), in order: no per-row
    work for the rows without one (every row of a trace without sessions)."""
    if isinstance(column, CodedStrings):
        codes = column.codes[rows]
        positions = np.flatnonzero(codes >= 0)
        return positions.tolist(), [column.values[c] for c in codes[positions].tolist()]
    pairs = [(pos, column[int(i)]) for pos, i in enumerate(rows.tolist()) if column[int(i)] is not None]
    return [pos for pos, _ in pairs], [sid for _, sid in pairs]


def session_array(column: CodedStrings | list[str | None], rows: np.ndarray) -> pa.Array:
    """The session ids of ``rows`` as an Arrow string array (what requests.parquet stores)."""
    if isinstance(column, CodedStrings):
        return column.arrow(rows)
    return pa.array([column[int(i)] for i in rows], pa.string())


def string_array(column: StringColumn | list[str]) -> pa.Array:
    """A trace's string column as an Arrow string array (what the output files store)."""
    if isinstance(column, StringColumn):
        return column.arrow if pa.types.is_string(column.arrow.type) else column.arrow.cast(pa.string())
    return pa.array(column, pa.string())


@dataclass
class TraceArrays:
    request_id: StringColumn | list[str]
    arrival_ms: np.ndarray  # int64
    input_tokens: np.ndarray  # int32, as the canonical schema stores them
    output_tokens: np.ndarray  # int32
    hash_offsets: np.ndarray  # int64, len n + 1; row i's ids are hash_values[off[i]:off[i+1]]
    # Every row's ids back to back, uint32 when every id fits (4 bytes an id), else uint64 (a Python
    # int list took about 30); a request takes its own ids as Python ints when it arrives
    # (engine/fleet.py, make_request)
    hash_values: np.ndarray
    session_id: CodedStrings | list[str | None]
    turn: np.ndarray  # int32, -1 when null
    delay_ms: np.ndarray  # float64, nan when null
    priority: np.ndarray  # int32, 0 when null
    hash_block_size: int | None
    shared_lead: np.ndarray  # int32: leading ids of the row up to the last one another row has too
    rechained: bool = False  # the trace's ids were not chained and were made so (chained_ids)
    ids_released_row: int = 0  # the ids of rows before this one were handed back (release_ids_before)
    _consumed: list[ConsumedPrefix] | None = None

    def __len__(self) -> int:
        return len(self.request_id)

    def release_ids_before(self, row: int) -> None:
        """Hand back the memory of the hash ids, id offsets and shared leads of rows before ``row``:
        a replay that has made every such row into a request (or passed it by) never reads them
        again (engine/page_release.py). ``ids_released_row`` marks them unreadable."""
        if row <= self.ids_released_row:
            return
        if self._consumed is None:
            self._consumed = [ConsumedPrefix(self.hash_values), ConsumedPrefix(self.hash_offsets),
                              ConsumedPrefix(self.shared_lead)]
        ids, offsets, leads = self._consumed
        ids.release_before(int(self.hash_offsets[row]))
        offsets.release_before(row)
        leads.release_before(row)
        self.ids_released_row = row


class _NullableColumn:
    """A nullable column that costs no memory while every row is null (as turn, priority and delay
    are in a trace without sessions): the array is made at the first value; until then, and if
    none comes, it is one null value seen ``num_rows`` times (a read-only broadcast view)."""

    def __init__(self, num_rows: int, dtype: type, null: float) -> None:
        self.num_rows, self.dtype, self.null = num_rows, dtype, null
        self.values: np.ndarray | None = None

    def put(self, lo: int, column: pa.ChunkedArray) -> None:
        if column.null_count == len(column):
            return
        if self.values is None:
            self.values = np.full(self.num_rows, self.null, dtype=self.dtype)
        arrow_type = pa.float64() if np.dtype(self.dtype).kind == "f" else pa.from_numpy_dtype(self.dtype)
        self.values[lo:lo + len(column)] = column.cast(arrow_type).fill_null(self.null).to_numpy()

    def finish(self) -> np.ndarray:
        if self.values is not None:
            return self.values
        return np.broadcast_to(np.array(self.null, dtype=self.dtype), (self.num_rows,))


class TraceArraysBuilder:
    """The engine's columns filled piece by piece (a Parquet file's pieces, or a whole table), so
    a replay of a canonical file never holds the trace's Arrow table beside them (at
    10 M reuse-heavy rows the table is 1.7 GB, the columns 1.4 GB). The hash ids go into one array
    sized up front (``id_bound``: at least the number of ids), uint32 while every id fits (half the
    memory of uint64: 10 M reuse-heavy rows hold 154 M ids)."""

    def __init__(self, num_rows: int, hash_block_size: int | None, id_bound: int) -> None:
        self.num_rows, self.hash_block_size = num_rows, hash_block_size
        self._arrival = np.empty(num_rows, dtype=np.int64)
        self._input = np.empty(num_rows, dtype=np.int32)  # the canonical schema's int32 (not widened:
        self._output = np.empty(num_rows, dtype=np.int32)  # 80 MB at 10 M rows)
        self._turn = _NullableColumn(num_rows, np.int32, -1)
        self._priority = _NullableColumn(num_rows, np.int32, 0)
        self._delay = _NullableColumn(num_rows, np.float64, np.nan)
        self._offsets = np.zeros(num_rows + 1, dtype=np.int64)
        self._ids = np.empty(id_bound, dtype=np.uint32)
        self._request_ids: list[pa.Array] = []
        self._sessions = _CodedStringsBuilder(num_rows)
        self._row = 0
        self._pos = 0  # hash ids filled

    def add(self, table: pa.Table) -> None:
        """The trace's next ``table.num_rows`` rows (cast to the canonical schema)."""
        lo, hi = self._row, self._row + table.num_rows
        if hi > self.num_rows:
            raise ValueError(f"more rows than the {self.num_rows:,} announced")

        def ints(name: str, fill: int) -> np.ndarray:
            col = table.column(name)
            return (col.fill_null(fill) if col.null_count else col).to_numpy()

        self._arrival[lo:hi] = ints("arrival_ms", 0)
        self._input[lo:hi] = ints("input_tokens", 0)
        self._output[lo:hi] = ints("output_tokens", 0)
        self._turn.put(lo, table.column("turn"))
        self._priority.put(lo, table.column("priority"))
        self._delay.put(lo, table.column("delay_ms"))  # nulls are NaN
        self._request_ids.extend(table.column("request_id").chunks)
        self._sessions.put(lo, table.column("session_id"))
        row = lo
        for chunk in table.column("hash_ids").chunks:  # a chunk's own ids: no combined copy of the column
            if not len(chunk):
                continue
            ids = chunk.flatten()
            offsets = chunk.offsets.to_numpy()
            self._put_ids(ids)
            self._offsets[row + 1:row + len(chunk) + 1] = offsets[1:] - offsets[0] + self._pos
            self._pos += len(ids)
            row += len(chunk)
        self._offsets[row + 1:hi + 1] = self._pos  # rows of an empty table chunk: none
        self._row = hi

    def _put_ids(self, ids: pa.Array) -> None:
        need = self._pos + len(ids)
        wide = len(ids) and self._ids.dtype == np.uint32 and int(pc.max(ids).as_py() or 0) >= 2**32
        if need > len(self._ids) or wide:
            grown = np.empty(max(need, len(self._ids)), dtype=np.uint64 if wide else self._ids.dtype)
            grown[:self._pos] = self._ids[:self._pos]
            self._ids = grown
        self._ids[self._pos:need] = ids.to_numpy(zero_copy_only=False)

    def finish(self) -> TraceArrays:
        if self._row != self.num_rows:
            raise ValueError(f"{self._row:,} rows of the {self.num_rows:,} announced")
        offsets, flat = self._offsets, self._ids[:self._pos]
        scan = scan_ids(flat, offsets)
        rechained = not scan.chained
        if rechained:
            flat = chained_ids(flat, offsets)
            flat = flat.astype(np.uint32) if not len(flat) or int(flat.max()) < 2**32 else flat
            scan = scan_ids(flat, offsets, check_chained=False)
        request_ids = pa.chunked_array(self._request_ids, pa.string())
        self._request_ids = []
        return TraceArrays(
            request_id=StringColumn(request_ids),
            arrival_ms=self._arrival,
            input_tokens=self._input,
            output_tokens=self._output,
            hash_offsets=offsets,
            hash_values=flat,
            session_id=self._sessions.finish(),
            turn=self._turn.finish(),
            delay_ms=self._delay.finish(),
            priority=self._priority.finish(),
            hash_block_size=self.hash_block_size,
            shared_lead=shared_lead(flat, offsets, scan.shared),
            rechained=rechained,
        )


def trace_arrays(table: pa.Table, hash_block_size: int | None) -> TraceArrays:
    """The engine's columns of a canonical table in memory."""
    ids = table.column("hash_ids")
    bound = sum(int(c.offsets[-1].as_py() - c.offsets[0].as_py()) for c in ids.chunks if len(c))
    builder = TraceArraysBuilder(table.num_rows, hash_block_size, bound)
    builder.add(table)
    return builder.finish()
