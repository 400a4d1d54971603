"""A canonical trace read from disk is checked as strictly as ``replay ingest`` writes one.

``replay run`` (and every command reading a canonical Parquet) may be handed a file that another
tool wrote, or one that was edited: the engine assumes what ``ingest`` guarantees (no nulls in the
core columns, positive lengths, arrivals in [0, 2^42] ms and in order, unique request ids, hash ids
that fit ``hash_block_size``), so each of those is checked here, once, vectorised over whole columns,
and the first offending row is named (1-based row, its request id, the field).
"""

from __future__ import annotations

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


class _Where:
    """Names the first offending row of a whole-column check."""

    def __init__(self, table: pa.Table, path: str) -> None:
        self.table, self.path = table, path

    def refuse(self, mask: np.ndarray, field: str, reason) -> None:
        """Raise for the first row where ``mask`` holds; ``reason(i)`` says what is wrong with row i."""
        hits = np.flatnonzero(mask)
        if not len(hits):
            return
        i = int(hits[0])
        rid = self.table.column("request_id")[i].as_py() if "request_id" in self.table.column_names else None
        more = f" (and {len(hits) - 1:,} more rows)" if len(hits) > 1 else ""
        who = f" (request {rid!r})" if rid is not None else ""
        raise TraceError(f"{reason(i)}{who}{more} (docs/trace-schema.md: what a canonical trace holds)",
                         path=self.path, row=i + 1, field=field)


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


def check_required_values(table: pa.Table, path: str) -> None:
    """Refuse a null in a column every request must have (before the cast to the non-nullable schema)."""
    where = _Where(table, path)
    for name in _REQUIRED:
        if name in table.column_names:
            where.refuse(_nulls(table, name), name, lambda i: "missing value (null) in a required column")


def check_trace_rows(table: pa.Table, hash_block_size: int | None, path: str, *, replayable: bool = True) -> None:
    """Refuse the first row ``replay ingest`` would not have written (the table is cast to the
    canonical schema already); see the module docstring for the rules. ``replayable=False`` accepts rows
    out of arrival order and hash ids that do not fit the block size: ``replay inspect`` and the
    reports' trace views order rows and cap hits themselves; the engine needs both as ingest writes them."""
    where = _Where(table, path)
    bs = hash_block_size
    if bs is not None and (isinstance(bs, bool) or bs <= 0):
        raise TraceError(f"replay.hash_block_size is {bs}: tokens per hash id must be a positive integer",
                         path=path)
    check_required_values(table, path)
    for name, what in _POSITIVE:
        values = _ints(table, name)
        if values is not None:
            where.refuse(values <= 0, name, lambda i, v=values, w=what: f"{v[i]} {w}: must be at least 1")
    arrival = _ints(table, "arrival_ms")
    if arrival is not None:
        where.refuse((arrival < 0) | (arrival > MAX_TIME_MS), "arrival_ms",
                     lambda i: f"arrival {arrival[i]:,} ms is outside 0..2^42 ms (arrivals count from the trace's "
                               "first request)")
        if replayable and len(arrival) > 1:
            where.refuse(np.concatenate([[False], arrival[1:] < arrival[:-1]]), "arrival_ms",
                         lambda i: f"arrival {arrival[i]:,} ms is before the previous row's {arrival[i - 1]:,} ms "
                                   "(rows must be in arrival order)")
    delay = _ints(table, "delay_ms")
    if delay is not None:
        where.refuse((delay < 0) | (delay > MAX_TIME_MS), "delay_ms",
                     lambda i: f"delay {delay[i]:,} ms is outside 0..2^42 ms")
    turn = _ints(table, "turn")
    if turn is not None:
        where.refuse(turn < 0, "turn", lambda i: f"negative turn {turn[i]}")
    _check_unique_ids(table, where)
    _check_hash_ids(table, bs, where, fit=replayable)


def _check_unique_ids(table: pa.Table, where: _Where) -> None:
    if "request_id" not in table.column_names or table.num_rows < 2:
        return
    ids = table.column("request_id")
    if len(pc.unique(ids)) >= table.num_rows:  # the fastest of Arrow's kernels here (hash once, no counts)
        return
    counts = pc.value_counts(ids.combine_chunks())
    dup = counts.field("values").filter(pc.greater(counts.field("counts"), 1))[0]
    rows = np.flatnonzero(np.asarray(pc.equal(ids, dup).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool))
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[rows[1]] = True
    where.refuse(mask, "request_id", lambda i: f"duplicate request id (first at row {int(rows[0]) + 1})")


def _check_hash_ids(table: pa.Table, bs: int | None, where: _Where, *, fit: bool) -> None:
    if "hash_ids" not in table.column_names:
        return
    ids = table.column("hash_ids")  # chunk by chunk: a combined copy would double the trace's ids
    if not table.num_rows:
        return
    lens = pc.list_value_length(ids).fill_null(0).to_numpy().astype(np.int64)
    valid = np.asarray(ids.is_valid().to_numpy(), dtype=bool)
    if any(pc.list_flatten(chunk).null_count for chunk in ids.chunks):
        whole = ids.combine_chunks()  # only on the way to an error
        flat = pc.list_flatten(whole)
        has_null = np.zeros(table.num_rows, dtype=bool)
        parents = pc.list_parent_indices(whole).to_numpy()
        has_null[parents[np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)]] = True
        where.refuse(has_null, "hash_ids", lambda i: "null inside hash_ids (every id must be an integer)")
    if bs is None:
        where.refuse(valid & (lens > 0), "hash_ids",
                     lambda i: "hash ids, but the trace's metadata has no replay.hash_block_size (tokens per id)")
        return
    inp = _ints(table, "input_tokens")
    if inp is None or not fit:
        return
    expected = (inp + bs - 1) // bs
    where.refuse(valid & (lens != expected), "hash_ids",
                 lambda i: f"{lens[i]} hash ids but ceil(input_tokens {inp[i]} / hash_block_size {bs}) = {expected[i]}")
