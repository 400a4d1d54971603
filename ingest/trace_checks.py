"""A canonical trace read from disk is checked as strictly as ``replay ingest`` writes one.

``replay run`` (and every command reading a canonical Parquet) may be handed a file that another
tool wrote, or one that was edited: the engine assumes what ``ingest`` guarantees (no nulls in the
core columns, positive lengths, arrivals in [0, 2^42] ms and in order, unique request ids, hash ids
that fit ``hash_block_size``), so each of those is checked here, once, vectorised over each row
group's columns (the uniqueness of request ids over the whole trace), and the first offending row
is named (1-based row, its request id, the field, how many more rows the same rule refuses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.base.errors import TraceError

# Times stay exact in the engine's float64 millisecond clock at microsecond resolution up to 2^42 ms
# (float64 spacing there is 2^-10 ms < 1 us; 139 years). Every real clock in ms is below it (Unix epoch
# ms in 2026: 1.8e12); a larger value is a wrong unit or corrupt (e.g. 1e18). Traces are also rebased
# to their first arrival, so the engine's times are small whatever the source clock.
MAX_TIME_MS = 2**42

# The integer columns and the checks ingest applies to them: (field, lowest allowed, what it is).
_POSITIVE = (("input_tokens", "input tokens (the prompt length)"), ("output_tokens", "output tokens"))
_REQUIRED = ("request_id", "arrival_ms", "input_tokens", "output_tokens")


def _kind_ok(field: pa.Field, have: pa.DataType) -> bool:
    """Whether a file's column type carries the canonical field's values without reinterpretation:
    integers for integers, floats or integers for floats, text for text, lists of those for lists."""
    want = field.type
    if pa.types.is_dictionary(have):
        have = have.value_type
    if pa.types.is_null(have):
        return field.nullable
    if pa.types.is_integer(want):
        return pa.types.is_integer(have)
    if pa.types.is_floating(want):
        return pa.types.is_integer(have) or pa.types.is_floating(have)
    if pa.types.is_string(want):
        return pa.types.is_string(have) or pa.types.is_large_string(have)
    if pa.types.is_list(want):
        if not (pa.types.is_list(have) or pa.types.is_large_list(have)):
            return False
        return _kind_ok(pa.field("item", want.value_type), have.value_type)
    return have == want


def check_column_types(file_schema: pa.Schema, wanted: pa.Schema, path: str) -> None:
    """Refuse a column whose type is not the canonical one's kind (a string of digits is not a
    length, a float is not an integer), naming it, before any cast could reinterpret it."""
    for field in wanted:
        if field.name not in file_schema.names:
            continue
        have = file_schema.field(field.name).type
        if not _kind_ok(field, have):
            raise TraceError(f"column type {have} where the canonical trace has {field.type} "
                             "(docs/trace-schema.md); convert the source with `replay ingest`",
                             path=path, field=field.name)


@dataclass
class _Failure:
    """The first row a rule refused, and how many rows after it the same rule refuses."""

    rule: str
    row: int  # 0-based, in the whole trace
    field: str
    message: str
    request_id: str | None
    more: int = 0


class TraceRowChecker:
    """Refuses the first row ``replay ingest`` would not have written, fed the trace one piece
    (``TraceReader``'s, cast to the canonical schema) at a time, so that no check needs the whole
    table in memory; see the module docstring for the rules. ``replayable=False`` accepts rows out
    of arrival order and hash ids that do not fit the block size: ``replay inspect`` and the
    reports' trace views order rows and cap hits themselves; the engine needs both as ingest writes them.

    Once a rule refuses a row, the later pieces are checked by that rule only, to count the rows it
    also refuses; ``finish`` raises (the first offending row is named with its request id, the
    field, and the count of the rest), after checking request ids are unique across the trace."""

    def __init__(self, hash_block_size: int | None, path: str, *, replayable: bool = True) -> None:
        bs = hash_block_size
        if bs is not None and (isinstance(bs, bool) or bs <= 0):
            raise TraceError(f"replay.hash_block_size is {bs}: tokens per hash id must be a positive integer",
                             path=path)
        self.bs, self.path, self.replayable = bs, path, replayable
        self._failure: _Failure | None = None
        self._last_arrival: int | None = None  # the previous piece's last arrival (rows must be in order)
        self._ids: list[pa.Array] = []  # request ids, piece by piece (the uniqueness check is trace-wide)
        self._rows = 0

    def check(self, table: pa.Table) -> None:
        """Check the trace's next ``table.num_rows`` rows."""
        first = self._rows
        self._rows += table.num_rows
        if "request_id" in table.column_names:
            self._ids.extend(table.column("request_id").chunks)
        only = self._failure.rule if self._failure is not None else None
        for rule, field, mask, reason in self._rules(table, only):
            hits = np.flatnonzero(mask)
            if not len(hits):
                continue
            if self._failure is None:
                i = int(hits[0])
                rid = table.column("request_id")[i].as_py() if "request_id" in table.column_names else None
                self._failure = _Failure(rule, first + i, field, reason(i), rid, len(hits) - 1)
            elif rule == self._failure.rule:
                self._failure.more += len(hits)
        if table.num_rows and "arrival_ms" in table.column_names:
            last = table.column("arrival_ms")[-1].as_py()
            self._last_arrival = int(last) if last is not None else 0

    @property
    def failed(self) -> bool:
        """Whether a row has been refused (``finish`` raises for it)."""
        return self._failure is not None

    def finish(self) -> None:
        """Raise for the first row refused, else check request ids are unique."""
        if self._failure is not None:
            f = self._failure
            self._raise(f.row, f.field, f.message, f.request_id, f.more)
        ids, self._ids = pa.chunked_array(self._ids, pa.string()), []
        if len(ids) > 1 and _has_duplicates(ids):
            first, second, rid = _first_duplicate(ids)
            self._raise(second, "request_id", f"duplicate request id (first at row {first + 1})", rid)

    def _raise(self, row: int, field: str, message: str, rid: str | None, more: int = 0) -> None:
        extra = f" (and {more:,} more rows)" if more else ""
        who = f" (request {rid!r})" if rid is not None else ""
        raise TraceError(f"{message}{who}{extra} (docs/trace-schema.md: what a canonical trace holds)",
                         path=self.path, row=row + 1, field=field)

    def _rules(self, table: pa.Table, only: str | None) -> Iterator[tuple[str, str, np.ndarray, Callable[[int], str]]]:
        """(rule, field, mask of refused rows, reason for row i) for each rule (``only``: that rule alone)."""
        def wanted(rule: str) -> bool:
            return only is None or only == rule

        for name in _REQUIRED:
            if name in table.column_names and wanted(f"null:{name}"):
                yield f"null:{name}", name, _nulls(table, name), lambda i: "missing value (null) in a required column"
        for name, what in _POSITIVE:
            values = _ints(table, name) if wanted(f"positive:{name}") else None
            if values is not None:
                yield (f"positive:{name}", name, values <= 0,
                       lambda i, v=values, w=what: f"{v[i]} {w}: must be at least 1")
        arrival = _ints(table, "arrival_ms") if wanted("arrival") or wanted("order") else None
        if arrival is not None:
            if wanted("arrival"):
                yield ("arrival", "arrival_ms", (arrival < 0) | (arrival > MAX_TIME_MS),
                       lambda i: f"arrival {arrival[i]:,} ms is outside 0..2^42 ms (arrivals count from the "
                                 "trace's first request)")
            if self.replayable and len(arrival) and wanted("order"):
                before = np.concatenate([[self._last_arrival if self._last_arrival is not None else arrival[0]],
                                         arrival[:-1]])
                yield ("order", "arrival_ms", arrival < before,
                       lambda i: f"arrival {arrival[i]:,} ms is before the previous row's {before[i]:,} ms "
                                 "(rows must be in arrival order)")
        delay = _ints(table, "delay_ms") if wanted("delay") else None
        if delay is not None:
            yield ("delay", "delay_ms", (delay < 0) | (delay > MAX_TIME_MS),
                   lambda i: f"delay {delay[i]:,} ms is outside 0..2^42 ms")
        turn = _ints(table, "turn") if wanted("turn") else None
        if turn is not None:
            yield "turn", "turn", turn < 0, lambda i: f"negative turn {turn[i]}"
        if "hash_ids" in table.column_names and table.num_rows:
            yield from _hash_id_rules(table, self.bs, fit=self.replayable, wanted=wanted)


def _ints(table: pa.Table, name: str) -> np.ndarray | None:
    if name not in table.column_names:
        return None
    col = table.column(name)
    return col.fill_null(0).to_numpy().astype(np.int64) if col.null_count else col.to_numpy().astype(np.int64)


def _nulls(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if not col.null_count:
        return np.zeros(table.num_rows, dtype=bool)
    return np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)


# Above this many rows, duplicate request ids are looked for in DuckDB under a memory budget (1.2 s
# and 0.3 GB at 10 M ids) rather than with Arrow's unique kernel (3.8 s and 0.8 GB).
_DUCKDB_UNIQUE_ROWS = 1_000_000


def _has_duplicates(ids: pa.ChunkedArray) -> bool:
    if len(ids) <= _DUCKDB_UNIQUE_ROWS:
        return len(pc.unique(ids)) < len(ids)  # the fastest of Arrow's kernels here (hash once, no counts)
    from replay.base.duckdb_conn import connect

    con = connect(256, threads=2)
    try:
        con.register("trace_ids", pa.table({"request_id": ids}))
        return con.execute("SELECT 1 FROM trace_ids GROUP BY request_id HAVING count(*) > 1 LIMIT 1").fetchone() is not None
    finally:
        con.close()


def _first_duplicate(ids: pa.ChunkedArray) -> tuple[int, int, str]:
    """(first row, second row, id) of the first request id that occurs twice (on the way to an error)."""
    counts = pc.value_counts(ids.combine_chunks())  # values in order of first appearance
    dup = counts.field("values").filter(pc.greater(counts.field("counts"), 1))[0]
    rows = np.flatnonzero(np.asarray(pc.equal(ids, dup).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool))
    return int(rows[0]), int(rows[1]), dup.as_py()


def _hash_id_rules(table: pa.Table, bs: int | None, *, fit: bool,
                   wanted: Callable[[str], bool]) -> Iterator[tuple[str, str, np.ndarray, Callable[[int], str]]]:
    ids = table.column("hash_ids")  # chunk by chunk: a combined copy would double the piece's ids
    lens = pc.list_value_length(ids).fill_null(0).to_numpy().astype(np.int64)
    valid = np.asarray(ids.is_valid().to_numpy(), dtype=bool)
    if wanted("hash:null") and any(pc.list_flatten(chunk).null_count for chunk in ids.chunks):
        whole = ids.combine_chunks()  # only on the way to an error
        flat = pc.list_flatten(whole)
        has_null = np.zeros(table.num_rows, dtype=bool)
        parents = pc.list_parent_indices(whole).to_numpy()
        has_null[parents[np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)]] = True
        yield "hash:null", "hash_ids", has_null, lambda i: "null inside hash_ids (every id must be an integer)"
    if bs is None:
        if wanted("hash:no-size"):
            yield ("hash:no-size", "hash_ids", valid & (lens > 0),
                   lambda i: "hash ids, but the trace's metadata has no replay.hash_block_size (tokens per id)")
        return
    inp = _ints(table, "input_tokens")
    if inp is None or not fit or not wanted("hash:fit"):
        return
    expected = (inp + bs - 1) // bs
    yield ("hash:fit", "hash_ids", valid & (lens != expected),
           lambda i: f"{lens[i]} hash ids but ceil(input_tokens {inp[i]} / hash_block_size {bs}) = {expected[i]}")
