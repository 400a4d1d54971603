"""A canonical trace read one row group at a time: the same fingerprint however the rows are
chunked, the same engine columns as from the whole table, and row checks that name the first bad
row of the whole trace and count the rest across row groups."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.base.errors import TraceError
from replay.engine.trace_input import TraceArraysBuilder, trace_arrays
from replay.ingest.fingerprint import (
    PREFIX,
    WINDOW_ROWS,
    file_fingerprint,
    legacy_fingerprint,
    same_trace,
    trace_fingerprint,
)
from replay.ingest.schema import TraceMetadata, TraceReader, read_trace, trace_schema_for
from tests.cli_helpers import invoke, write_sample_run, write_sample_trace


def _table(n: int, *, wide_from: int | None = None, start_id: int = 0) -> pa.Table:
    """n canonical rows, 1 to 4 ids of 16 tokens each; rows from ``wide_from`` on carry ids >= 2^32."""
    rng = np.random.default_rng(7)
    lens = rng.integers(1, 5, n)
    ids, next_id = [], start_id
    for i, k in enumerate(lens):
        base = 2**32 if wide_from is not None and i >= wide_from else 0
        ids.append([base + next_id + j for j in range(int(k))])
        next_id += int(k)
    schema = trace_schema_for()
    cols = {
        "request_id": pa.array([f"r{i}" for i in range(n)]),
        "arrival_ms": pa.array(np.arange(n, dtype=np.int64) * 10),
        "input_tokens": pa.array((lens * 16).astype(np.int32)),
        "output_tokens": pa.array(rng.integers(1, 50, n).astype(np.int32)),
        "hash_ids": pa.array(ids, pa.list_(pa.uint64())),
        "session_id": pa.array([f"s{i % 7}" if i % 3 else None for i in range(n)], pa.string()),
        "parent_id": pa.nulls(n, pa.string()),
        "turn": pa.array([i % 5 if i % 3 else None for i in range(n)], pa.int32()),
        "delay_ms": pa.array([i if i % 4 == 0 else None for i in range(n)], pa.int64()),
        "priority": pa.array([i % 2 for i in range(n)], pa.int32()),
    }
    return pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)


def _write(table: pa.Table, path, row_group: int):
    meta = TraceMetadata(source_format="test", source_file="-", time_unit="ms", hash_block_size=16,
                         prefix_identity="real")
    pq.write_table(table.replace_schema_metadata(meta.to_parquet_metadata()), path, row_group_size=row_group)
    return path


def test_fingerprint_does_not_depend_on_chunks_or_row_groups(tmp_path):
    table = _table(3 * WINDOW_ROWS // 2)
    whole = trace_fingerprint(table.combine_chunks())
    assert whole.startswith(PREFIX)
    assert trace_fingerprint(pa.Table.from_batches(table.to_batches(max_chunksize=1000))) == whole
    for group in (777, WINDOW_ROWS, 200_000):
        path = _write(table, tmp_path / f"g{group}.parquet", group)
        assert pq.ParquetFile(path).metadata.num_row_groups == -(-table.num_rows // group)
        assert file_fingerprint(path) == whole == trace_fingerprint(read_trace(path)[0])
    changed = table.set_column(3, "output_tokens", pa.array(np.r_[table.column(3).to_numpy()[:-1], 999], pa.int32()))
    assert trace_fingerprint(changed) != whole
    assert trace_fingerprint(table.slice(0, table.num_rows - 1)) != whole


def test_a_legacy_fingerprint_still_identifies_its_trace(tmp_path):
    path = _write(_table(500), tmp_path / "t.parquet", 64)
    old = legacy_fingerprint(path)
    assert not old.startswith(PREFIX) and len(old) == 64
    assert same_trace(path, old) and same_trace(path, file_fingerprint(path))
    other = _write(_table(499), tmp_path / "u.parquet", 64)
    assert not same_trace(other, old) and not same_trace(other, file_fingerprint(path))


def test_session_ids_are_coded_once_each():
    from replay.engine.trace_input import CodedStrings, session_array, sessions_of

    table = _table(2000)
    arrays = trace_arrays(table, 16)
    col = arrays.session_id
    assert isinstance(col, CodedStrings) and len(col.values) == 7 and col.codes.dtype == np.int32
    want = table.column("session_id").to_pylist()
    assert [col[i] for i in range(len(col))] == want
    rows = np.array([0, 1, 2, 5, 1999])
    assert session_array(col, rows).to_pylist() == [want[i] for i in rows]
    positions, ids = sessions_of(col, rows)
    assert positions == [1, 2, 3, 4] and ids == [want[1], want[2], want[5], want[1999]]
    assert sessions_of(want, rows) == (positions, ids)
    assert CodedStrings.from_list([None, "a", "b", "a"]).codes.tolist() == [-1, 0, 1, 0]
    assert not CodedStrings.from_list([None, None]).any() and session_array(CodedStrings.from_list([None]),
                                                                           np.array([0])).to_pylist() == [None]


def _arrays_equal(a, b) -> None:
    for name in ("arrival_ms", "input_tokens", "output_tokens", "hash_offsets", "hash_values", "turn", "delay_ms",
                 "priority", "shared_lead"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    assert [a.request_id[i] for i in range(len(a))] == [b.request_id[i] for i in range(len(b))]
    assert [a.session_id[i] for i in range(len(a))] == [b.session_id[i] for i in range(len(b))]
    assert a.rechained == b.rechained


@pytest.mark.parametrize("wide_from", [None, 0, 1234])
def test_the_engine_columns_built_piece_by_piece_equal_the_whole_tables(tmp_path, wide_from):
    """uint32 ids while they fit, uint64 from the first piece that needs it; an id bound too small
    grows the array; an empty piece adds nothing."""
    table = _table(3000, wide_from=wide_from)
    whole = trace_arrays(table.combine_chunks(), 16)
    assert whole.hash_values.dtype == (np.uint32 if wide_from is None else np.uint64)
    for bound in (0, 10, len(whole.hash_values)):
        builder = TraceArraysBuilder(table.num_rows, 16, bound)
        for lo in range(0, table.num_rows, 700):
            builder.add(table.slice(lo, 700))
            builder.add(table.slice(lo, 0))
        _arrays_equal(builder.finish(), whole)
    path = _write(table, tmp_path / "t.parquet", 512)
    reader = TraceReader(path, replayable=True)
    assert reader.hash_id_bound() >= len(whole.hash_values)
    builder = TraceArraysBuilder(reader.num_rows, 16, reader.hash_id_bound())
    for piece in reader.pieces():
        builder.add(piece)
    _arrays_equal(builder.finish(), whole)
    with pytest.raises(ValueError, match="rows of the"):
        TraceArraysBuilder(table.num_rows + 1, 16, 0).finish()


def test_columns_without_a_value_cost_no_memory():
    """turn, priority and delay all null: one value seen n times (a broadcast view, no array); a
    first value in a later piece makes the array, with the earlier rows null."""
    table = _table(3000)
    nulls = {name: pa.nulls(3000, table.schema.field(name).type)
             for name in ("turn", "priority", "delay_ms", "session_id")}
    blank = table
    for name, col in nulls.items():
        blank = blank.set_column(blank.schema.get_field_index(name), name, col)
    arrays = trace_arrays(blank, 16)
    assert arrays.session_id.codes.strides == (0,) and not arrays.session_id.any()
    for name, null in (("turn", -1), ("priority", 0), ("delay_ms", np.nan)):
        col = getattr(arrays, name)
        assert col.strides == (0,) and len(col) == 3000, name
        assert np.array_equal(col[[0, 2999]], [null, null], equal_nan=True)
    late = blank.slice(0, 2000)
    late = pa.concat_tables([late, table.slice(2000)])
    builder = TraceArraysBuilder(3000, 16, 0)
    for lo in range(0, 3000, 1000):
        builder.add(late.slice(lo, 1000))
    built = builder.finish()
    whole = trace_arrays(table, 16)
    assert built.turn.strides != (0,)
    assert np.array_equal(built.turn[:2000], np.full(2000, -1)) and np.array_equal(built.turn[2000:], whole.turn[2000:])
    assert np.isnan(built.delay_ms[:2000]).all()
    assert [built.session_id[i] for i in (0, 1999, 2001)] == [None, None, table.column("session_id")[2001].as_py()]
    assert np.array_equal(built.delay_ms[2000:], whole.delay_ms[2000:], equal_nan=True)


def _bad(tmp_path, name: str, column: str, values: dict[int, object], group: int = 100):
    table = _table(1000)
    col = table.column(column).to_pylist()
    for i, v in values.items():
        col[i] = v
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(col, table.schema.field(column).type))
    return _write(table, tmp_path / name, group)


def test_row_checks_name_the_first_bad_row_of_the_whole_trace_and_count_the_rest(tmp_path):
    path = _bad(tmp_path, "neg.parquet", "output_tokens", {250: -1, 251: -2, 777: 0})
    with pytest.raises(TraceError, match=r"row 251, field 'output_tokens': -1 output tokens.*'r250'.*and 2 more rows"):
        read_trace(path)
    # a row before the previous one where a row group starts (rows 400 and 399 in two groups)
    path = _bad(tmp_path, "order.parquet", "arrival_ms", {400: 3985})
    with pytest.raises(TraceError, match=r"row 401, field 'arrival_ms': arrival 3,985 ms is before the previous "
                                         r"row's 3,990 ms"):
        read_trace(path, replayable=True)
    assert read_trace(path)[0].num_rows == 1000  # inspect's reading: order is its own business
    path = _bad(tmp_path, "dup.parquet", "request_id", {930: "r5"})
    with pytest.raises(TraceError, match=r"row 931, field 'request_id': duplicate request id \(first at row 6\)"):
        read_trace(path)


def test_a_bad_row_reaches_no_consumer(tmp_path, monkeypatch):
    """The pieces after a refused row are read only to count: a reader building engine columns
    never sees a null id (which numpy could not hold) before the error."""
    from replay.ingest import schema

    monkeypatch.setattr(schema, "PIECE_ROWS", 100)
    path = _bad(tmp_path, "null.parquet", "hash_ids", {150: [1, None]})
    seen = []
    with pytest.raises(TraceError, match=r"row 151, field 'hash_ids': null inside hash_ids"):
        for piece in TraceReader(path, replayable=True).pieces():
            seen.append(piece.num_rows)
    assert seen == [100]  # the first piece only


def test_run_and_report_read_the_trace_in_pieces(tmp_path):
    """`replay run` of a canonical file records the streamed fingerprint, and the report finds the
    trace by it; a run.json from before (a legacy fingerprint) still finds its trace."""
    trace = write_sample_trace(tmp_path / "t.parquet")
    out = write_sample_run(tmp_path / "out", trace)
    info = json.loads((out / "run.json").read_text())
    assert info["trace"]["fingerprint"] == file_fingerprint(trace)
    info["trace"]["fingerprint"] = legacy_fingerprint(trace)
    (out / "run.json").write_text(json.dumps(info))
    res = invoke("report", out, "-o", tmp_path / "r.md", "--no-charts")
    assert res.exit_code == 0 and "not the one replayed" not in " ".join(res.output.split()), res.output
