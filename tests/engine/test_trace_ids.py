"""The whole-trace id checks (chained ids, each row's shared lead) against their definitions, row by
row, also when they work in several passes over classes of ids (as on large traces)."""

from __future__ import annotations

import numpy as np
import pytest

import replay.engine.trace_ids as trace_ids
import replay.engine.trace_input as trace_input


def _rows(flat: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [flat[offsets[r]:offsets[r + 1]].tolist() for r in range(len(offsets) - 1)]


def _chained_by_definition(rows: list[list[int]]) -> bool:
    """Every id always follows the same id, or always starts a row."""
    before: dict[int, int | None] = {}
    for row in rows:
        for i, v in enumerate(row):
            prev = row[i - 1] if i else None
            if before.setdefault(v, prev) != prev:
                return False
    return True


def _lead_by_definition(rows: list[list[int]]) -> list[int]:
    """Leading ids up to the last one that occurs elsewhere (another row, or twice in this one)."""
    count: dict[int, int] = {}
    for row in rows:
        for v in row:
            count[v] = count.get(v, 0) + 1
    return [max((i + 1 for i, v in enumerate(row) if count[v] > 1), default=0) for row in rows]


@pytest.mark.parametrize("dense_ids", [0, 1 << 24], ids=["sorted", "dense"])
@pytest.mark.parametrize("ids_per_pass,classes_per_pass", [(1, 8), (3, 8), (3, 1), (2, 3), (1 << 20, 8)])
def test_chained_and_shared_lead_match_their_definitions(ids_per_pass, classes_per_pass, dense_ids, monkeypatch):
    monkeypatch.setattr(trace_ids, "_DENSE_IDS", dense_ids)
    monkeypatch.setattr(trace_ids, "_IDS_PER_PASS", ids_per_pass)
    monkeypatch.setattr(trace_ids, "_CLASSES_PER_PASS", classes_per_pass)
    rng = np.random.default_rng(7)
    for trial in range(150):
        n = int(rng.integers(0, 30))
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(rng.integers(0, 6, n), out=offsets[1:])
        flat = rng.integers(0, int(rng.integers(1, 25)), int(offsets[-1])).astype(np.uint64)
        if trial % 2:
            flat = trace_ids.chained_ids(flat, offsets)
        rows = _rows(flat, offsets)
        assert trace_ids.is_chained(flat, offsets) == _chained_by_definition(rows), rows
        assert trace_ids.shared_lead(flat, offsets).tolist() == _lead_by_definition(rows), rows


def test_a_request_takes_its_own_ids_from_the_trace_array():
    """The trace keeps every id in one uint64 array (values past 2**63 exact), not Python ints."""
    import pyarrow as pa

    from replay.ingest.schema import TRACE_SCHEMA

    big = 2**64 - 5
    table = pa.table({"request_id": ["a", "b"], "arrival_ms": [0, 1], "input_tokens": [32, 48],
                      "output_tokens": [4, 4], "hash_ids": [[big, 7], [big, 7, 9]],
                      "session_id": [None, None], "parent_id": [None, None], "turn": [None, None],
                      "delay_ms": [None, None], "priority": [None, None]}, schema=TRACE_SCHEMA)
    trace = trace_input.trace_arrays(table, 16)
    assert trace.hash_values.dtype == np.uint64
    assert trace.hash_values[trace.hash_offsets[1]:trace.hash_offsets[2]].tolist() == [big, 7, 9]
    assert trace.shared_lead.tolist() == [2, 2]


@pytest.mark.parametrize("classes_per_pass", [1, 2, 5, 64])
def test_id_classes_partition_positions_by_id(classes_per_pass, monkeypatch):
    """Every position once, ascending within a class, and equal ids always in the same class."""
    monkeypatch.setattr(trace_ids, "_IDS_PER_PASS", 4)
    monkeypatch.setattr(trace_ids, "_CLASSES_PER_PASS", classes_per_pass)
    flat = np.random.default_rng(3).integers(0, 40, 101).astype(np.uint64)
    classes = list(trace_ids._id_classes(flat))
    assert len(classes) == 26  # ceil(101 / 4)
    assert sorted(p for c in classes for p in c.tolist()) == list(range(101))
    owner = {}
    for k, c in enumerate(classes):
        assert np.all(np.diff(c) > 0)
        for v in flat[c].tolist():
            assert owner.setdefault(v, k) == k


def test_ids_that_fit_are_kept_as_uint32_and_chunks_read_as_one_column():
    """Ids below 2**32 take 4 bytes each; a table of several chunks (one a slice, as row groups
    read one at a time give) yields the same offsets and ids as the combined column."""
    import pyarrow as pa

    from replay.ingest.schema import TRACE_SCHEMA

    rows = {"request_id": ["a", "b", "c", "d"], "arrival_ms": [0, 1, 2, 3], "input_tokens": [32, 48, 16, 32],
            "output_tokens": [4, 4, 4, 4], "hash_ids": [[1, 2], [1, 2, 3], [9], [1, 5]],
            "session_id": [None] * 4, "parent_id": [None] * 4, "turn": [None, 2, None, None],
            "delay_ms": [None] * 4, "priority": [None] * 4}
    whole = pa.table(rows, schema=TRACE_SCHEMA)
    parts = pa.concat_tables([whole.slice(0, 1), whole.slice(1, 0), pa.table(rows, schema=TRACE_SCHEMA).slice(1, 3)])
    assert parts.column("hash_ids").num_chunks == 3
    for table in (whole, parts):
        trace = trace_input.trace_arrays(table, 16)
        assert trace.hash_values.dtype == np.uint32
        assert trace.hash_offsets.tolist() == [0, 2, 5, 6, 8]
        assert trace.hash_values.tolist() == [1, 2, 1, 2, 3, 9, 1, 5]
        assert trace.shared_lead.tolist() == [2, 2, 0, 1]
        assert trace.turn.tolist() == [-1, 2, -1, -1]
