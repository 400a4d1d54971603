"""Step rows buffered as runs (engine/row_runs.py) expand into exactly the rows given; chunks are
recorded as runs per request.

Hand-checked expansions and chunk runs, a row-group cutter that never lets the batching show in a
file's layout, and the recorder writing row groups of exactly the configured size whatever the
emission sizes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import replay.engine.recorder as recorder_module
from replay.engine.block_keys import BlockKeys
from replay.engine.output_schema import STEPS_SCHEMA, parquet_write_options
from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.row_runs import ChangePoints, ColumnCutter, StepRow, StepRuns, WindowRows
from replay.engine.trace_input import trace_arrays
from tests.engine_helpers import make_trace

DTYPES = [np.dtype(f.type.to_pandas_dtype()) for f in STEPS_SCHEMA]


def _row(step: int, start: float, **kw) -> StepRow:
    """A record_step row: every column 0 unless given (by STEPS_SCHEMA name)."""
    values: dict = {f.name: 0 for f in STEPS_SCHEMA}
    values.update(step=step, start_ms=start, duration_ms=1.5, kv_usage=0.0, cpu_usage=0.0)
    values.update(kw)
    return StepRow(**values)


def _points(*pairs: tuple[int, int]) -> ChangePoints:
    """Change points set in order: (step, value) each."""
    points = ChangePoints()
    for step, value in pairs:
        points.set(step, value)
    return points


def _window(first_step: int, starts: list[float], num_running: int, num_waiting: int, free: ChangePoints,
            usable: int, stored: ChangePoints | None = None, cpu: ChangePoints | None = None,
            num_cpu_blocks: int = 0, replica: int = 0, running_after: int | None = None) -> WindowRows:
    """A window's rows, each step lasting 1.5 ms unless its starts say otherwise."""
    return WindowRows(first_step, starts, [1.5] * len(starts), num_running, num_waiting, usable, free,
                      stored if stored is not None else ChangePoints(), cpu, num_cpu_blocks, replica,
                      num_running if running_after is None else running_after)


def test_steps_expand_rows_and_windows_in_order() -> None:
    runs = StepRuns(replica_column=False)
    runs.add_row(_row(0, 0.0, scheduled_tokens=100, prefill_tokens=98, prefill_requests=1, decode_requests=2,
                      running=3, waiting=4, kv_usage=1.0 - 90 / 99, kv_blocks_used=9, bytes_loaded=7), 0)
    # 4 decode steps of 3 requests: an allocation at step 2 (free 90 -> 89), stores at step 1, a
    # finish at the last step (2 still running), CPU use 5 then 6 from step 3.
    runs.add_window(_window(1, [1.5, 3.0, 4.5, 6.0], 3, 0, _points((0, 90), (2, 89)), 99, _points((1, 4096)),
                            _points((0, 5), (3, 6)), 10, 0, 2))
    runs.add_row(_row(5, 7.5, running=2, kv_usage=1.0 - 95 / 99, kv_blocks_used=4), 0)
    assert runs.num_rows == 6
    cols = dict(zip(STEPS_SCHEMA.names, runs.columns(DTYPES)))
    assert cols["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert cols["start_ms"].tolist() == [0.0, 1.5, 3.0, 4.5, 6.0, 7.5]
    assert cols["scheduled_tokens"].tolist() == [100, 3, 3, 3, 3, 0]
    assert cols["prefill_tokens"].tolist() == [98, 0, 0, 0, 0, 0]
    assert cols["decode_requests"].tolist() == [2, 3, 3, 3, 3, 0]
    assert cols["running"].tolist() == [3, 3, 3, 3, 2, 2]
    assert cols["waiting"].tolist() == [4, 0, 0, 0, 0, 0]
    assert cols["kv_blocks_used"].tolist() == [9, 9, 9, 10, 10, 4]
    assert cols["bytes_stored"].tolist() == [0, 0, 4096, 0, 0, 0]
    assert cols["bytes_loaded"].tolist() == [7, 0, 0, 0, 0, 0]
    assert cols["cpu_blocks_used"].tolist() == [0, 5, 5, 5, 6, 0]
    # floats: the double rounded to the column's float32, as a typed array's append does
    expected_usage = np.array([1.0 - 90 / 99, 1.0 - 90 / 99, 1.0 - 90 / 99, 1.0 - 89 / 99, 1.0 - 89 / 99,
                               1.0 - 95 / 99]).astype(np.float32)
    assert cols["kv_usage"].dtype == np.float32 and (cols["kv_usage"] == expected_usage).all()
    assert (cols["cpu_usage"] == np.array([0, 0.5, 0.5, 0.5, 0.6, 0], dtype=np.float32)).all()
    assert [c.dtype for c in cols.values()] == DTYPES


def test_window_running_column_edge_cases() -> None:
    runs = StepRuns(replica_column=True)
    # one step, 3 finish
    runs.add_window(_window(0, [0.0], 4, 0, _points((0, 10)), 20, replica=7, running_after=1))
    runs.add_window(_window(1, [1.0, 2.0], 1, 2, _points((0, 10)), 20, replica=7))
    # nobody finishes
    runs.add_window(_window(9, [3.0, 4.0], 5, 0, _points((0, 10)), 20, replica=3, running_after=5))
    cols = dict(zip([*STEPS_SCHEMA.names, "replica"], runs.columns([*DTYPES, np.dtype(np.int32)])))
    assert cols["running"].tolist() == [1, 1, 1, 5, 5]
    assert cols["waiting"].tolist() == [0, 2, 2, 0, 0]
    assert cols["step"].tolist() == [0, 1, 2, 9, 10]  # a fleet interleaves replicas' step indices
    assert cols["replica"].tolist() == [7, 7, 7, 3, 3]


def _runs(points: ChangePoints, n: int, sparse: bool) -> list[tuple[int, int]]:
    runs = points.sparse_runs(n) if sparse else points.held_runs(n)
    return list(zip(runs.values, runs.counts))


def test_sparse_runs() -> None:
    assert _runs(_points(), 3, True) == [(0, 3)]
    assert _runs(_points((0, 5)), 1, True) == [(5, 1)]
    assert _runs(_points((0, 5), (3, 6)), 5, True) == [(5, 1), (0, 2), (6, 1), (0, 1)]
    assert _runs(_points((2, 5), (2, 8)), 3, True) == [(0, 2), (8, 1)]  # the later value for a step stands


def test_held_runs() -> None:
    assert _runs(_points((0, 5)), 3, False) == [(5, 3)]
    assert _runs(_points((0, 5), (0, 7), (2, 8)), 4, False) == [(7, 2), (8, 2)]  # the later value stands
    assert _runs(_points((0, 5), (3, 6)), 3, False) == [(5, 3)]  # a change at or past n covers no step


def _recorder(tmp_path, n: int) -> tuple[Recorder, list[Request]]:
    table, meta = make_trace([{"input_tokens": 10, "output_tokens": 5}] * n)
    reqs = [Request(i, f"r{i}", 0.0, 10, 5, BlockKeys([i], 0, 1, 16, 16, 10, unique_tag=i)) for i in range(n)]
    return Recorder(trace_arrays(table, meta.hash_block_size), tmp_path), reqs


def _file_runs(path) -> list[tuple]:
    t = pq.read_table(path)
    assert t.schema.names == ["request", "replica", "first_step", "num_steps", "tokens"]
    return list(zip(*(t.column(c).to_pylist() for c in t.schema.names), strict=True))


def test_chunk_runs_by_hand(tmp_path) -> None:
    """A run grows while its request emits at the next step of the same replica with the same token
    count; anything else starts a new one; finishing closes it."""
    rec, (a, b, c) = _recorder(tmp_path, 3)
    rec.emit_chunks([a, b], 0, 0, [])            # step 0: a and b emit their first token
    rec.emit_decode_chunks([a, b], 1, 3, 0)      # a decode window: steps 1..3
    rec.emit_chunks([a, c], 4, 0, [2, 1])        # MTP: a emits 2 tokens (new run), c its first
    rec.emit_chunks([c], 5, 1, [])               # c continues on another replica: new run
    rec.emit_chunks([b], 6, 0, [])               # b skipped steps 4, 5 (preempted): new run
    rec.emit_decode_chunks([b], 7, 2, 0)         # continues b's run
    for r in (a, b, c):
        rec.request_finished(r)
    rec.close()
    assert sorted(_file_runs(tmp_path / "chunks.parquet")) == [
        (0, 0, 0, 4, 1), (0, 0, 4, 1, 2), (1, 0, 0, 4, 1), (1, 0, 6, 3, 1), (2, 0, 4, 1, 1), (2, 1, 5, 1, 1)]
    assert rec.num_chunks == 2 + 6 + 2 + 1 + 1 + 2


def test_an_unclosed_chunk_run_fails_the_replay(tmp_path) -> None:
    rec, (a,) = _recorder(tmp_path, 1)
    rec.emit_chunks([a], 0, 0, [])
    with pytest.raises(RuntimeError, match="open chunk run"):
        rec.close()
    rec.abort()


def test_cutter_writes_whole_row_groups_and_carries_the_rest() -> None:
    cutter = ColumnCutter(4)

    def batch(lo: int, hi: int) -> list[np.ndarray]:
        return [np.arange(lo, hi), np.arange(lo, hi) * 10.0]

    assert cutter.cut(batch(0, 3), False) is None  # 3 rows wait
    due = cutter.cut(batch(3, 12), False)  # 12 rows: three groups
    assert due is not None and due[0].tolist() == list(range(12)) and due[1].tolist() == [10.0 * i for i in range(12)]
    due = cutter.cut(batch(12, 17), False)  # 4 due, 1 waits
    assert due is not None and due[0].tolist() == [12, 13, 14, 15]
    due = cutter.cut(batch(17, 17), True)  # the final flush writes what waits
    assert due is not None and due[0].tolist() == [16]
    assert cutter.cut(batch(17, 17), True) is None


@pytest.mark.parametrize("emission", [1, 3, 7])
def test_recorder_row_groups_never_depend_on_batching(tmp_path, monkeypatch, emission: int) -> None:
    """Chunk runs and steps arrive in batches of any size; every row group but the last is exactly
    the configured size and the rows are those emitted, in order."""
    monkeypatch.setattr(recorder_module, "_ROW_GROUP", 5)
    monkeypatch.setattr(recorder_module, "_CHUNK_RUNS_BUFFERED", emission)
    monkeypatch.setattr(recorder_module, "_STEP_ROWS_BUFFERED", 4)
    rec, reqs = _recorder(tmp_path, 3)
    expected_runs: list[tuple] = []
    step = 0
    t = 0.0
    for w in range(6):
        ends = [t + 1.0 + i for i in range(emission)]
        running = [reqs[w % 3], reqs[(w + 1) % 3]]
        for r in running:  # each window's runs close at the next emission of their request
            if r.run_steps and not (r.run_first_step + r.run_steps == step):
                expected_runs.append((r.idx, 0, r.run_first_step, r.run_steps, 1))
        rec.emit_decode_chunks(running, step, emission, 0)
        rec.record_decode_window(_window(step, [e - 1.0 for e in ends], 2, 0, _points((0, 50)), 99))
        step += emission
        if reqs[2].run_steps and reqs[2].run_first_step + reqs[2].run_steps != step:
            expected_runs.append((2, 0, reqs[2].run_first_step, reqs[2].run_steps, 1))
        rec.emit_chunks([reqs[2]], step, 0, [])
        rec.record_step(_row(step, ends[-1]))
        step += 1
        t = ends[-1] + 1.0
    for r in reqs:
        expected_runs.append((r.idx, 0, r.run_first_step, r.run_steps, 1))
        rec.request_finished(r)
    rec.close()
    chunks = pq.ParquetFile(tmp_path / "chunks.parquet")
    steps = pq.ParquetFile(tmp_path / "steps.parquet")
    sizes = [chunks.metadata.row_group(i).num_rows for i in range(chunks.num_row_groups)]
    assert all(s == 5 for s in sizes[:-1]) and 0 < sizes[-1] <= 5 and sum(sizes) == len(expected_runs)
    step_sizes = [steps.metadata.row_group(i).num_rows for i in range(steps.num_row_groups)]
    assert all(s == 4 for s in step_sizes[:-1]) and 0 < step_sizes[-1] <= 4 and sum(step_sizes) == step
    assert _file_runs(tmp_path / "chunks.parquet") == expected_runs
    assert steps.read()["step"].to_pylist() == list(range(step))
    assert rec.num_chunks == sum(n for *_, n, _ in expected_runs) and rec.num_steps == step


def test_requests_file_is_written_one_row_group_at_a_time(tmp_path, monkeypatch) -> None:
    """requests.parquet is built a row group at a time (the whole table at once held every column of
    every request) and is byte for byte the file one write of the whole table gives."""
    monkeypatch.setattr(recorder_module, "REQUESTS_ROW_GROUP", 2)
    rec, reqs = _recorder(tmp_path, 5)
    for k, r in enumerate(reqs):
        r.first_token_ms, r.finish_ms, r.num_output_tokens = 1.0 + k, 2.0 + k, 5
        rec.request_finished(r)
    rec.close()
    written = pq.ParquetFile(tmp_path / "requests.parquet")
    assert [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)] == [2, 2, 1]
    assert written.read()["finish_ms"].to_pylist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    whole = rec._requests_table(np.arange(5))
    pq.write_table(whole, tmp_path / "whole.parquet", row_group_size=2, **parquet_write_options(whole.schema))
    assert (tmp_path / "whole.parquet").read_bytes() == (tmp_path / "requests.parquet").read_bytes()


def test_settled_requests_are_written_early_and_their_columns_handed_back(tmp_path, monkeypatch) -> None:
    """A row group of requests.parquet whose rows have all arrived and ended is written while the
    replay runs (write_settled_requests) and its rows' timing columns go back to the system; the
    file is byte for byte the one written at the end, and the columns the run's summary reads stay."""
    monkeypatch.setattr(recorder_module, "REQUESTS_ROW_GROUP", 1024)
    n = 2500
    (tmp_path / "early").mkdir()
    (tmp_path / "late").mkdir()
    early, reqs = _recorder(tmp_path / "early", n)
    late, late_reqs = _recorder(tmp_path / "late", n)
    running = set(range(1500, 1510))  # still decoding when the first check comes

    def end(rec: Recorder, rs: list[Request], rows) -> None:
        for k in rows:
            r = rs[k]
            r.first_token_ms, r.finish_ms, r.num_output_tokens, r.num_cached_tokens = 1.0 + k, 2.0 + k, 5, 16
            rec.request_finished(r)

    for rec, rs in ((early, reqs), (late, late_reqs)):
        end(rec, rs, [k for k in range(2100) if k not in running])
        rec.request_rejected(2100, 5.0, "too long")
    early.write_settled_requests(1000)  # not a whole group arrived yet: nothing written
    assert early.first_token[:1000].all()
    early.write_settled_requests(2400)  # the second group waits for rows 1500..1509
    released = early.first_token[:2048] == 0
    ended = [k for k in range(1024, 2048) if k not in running]
    assert released[:1024].sum() >= 512 and not released[ended].any()  # whole pages of the first group only
    assert early.finish[:1500].all() and early.output_tokens[:1500].all()  # the summary's columns stay
    for rec, rs in ((early, reqs), (late, late_reqs)):
        end(rec, rs, sorted(running) + list(range(2101, n)))
        rec.close()
    early_file = pq.ParquetFile(tmp_path / "early" / "requests.parquet")
    assert [early_file.metadata.row_group(i).num_rows for i in range(3)] == [1024, 1024, 452]
    assert (tmp_path / "early" / "requests.parquet").read_bytes() == (tmp_path / "late" / "requests.parquet").read_bytes()


def test_outputs_are_zstd_with_float_columns_byte_stream_split(tmp_path) -> None:
    """Every Parquet output of a replay is zstd-compressed; its float columns (times, durations,
    usages) are BYTE_STREAM_SPLIT, its integer and string columns dictionary-encoded, and the values
    read back are the engine's doubles (the encoding changes bytes on disk, never a value)."""
    from tests.cli_helpers import write_sample_run, write_sample_trace

    out = write_sample_run(tmp_path / "out", write_sample_trace(tmp_path / "t.parquet"))
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        meta = pq.ParquetFile(out / name).metadata
        schema = meta.schema.to_arrow_schema()
        for i in range(meta.num_columns):
            col = meta.row_group(0).column(i)
            assert col.compression == "ZSTD", (name, col.path_in_schema)
            if pa.types.is_floating(schema.field(i).type):
                assert "BYTE_STREAM_SPLIT" in col.encodings, (name, col.path_in_schema, col.encodings)
            else:
                assert "RLE_DICTIONARY" in col.encodings or col.encodings == ("PLAIN", "RLE"), \
                    (name, col.path_in_schema, col.encodings)
    steps = pq.read_table(out / "steps.parquet")
    starts, durations = steps["start_ms"].to_pylist(), steps["duration_ms"].to_pylist()
    assert all(b >= a + d for a, d, b in zip(starts, durations, starts[1:]))  # back to back or idle between
