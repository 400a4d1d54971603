"""A replay that owns its trace hands back the hash ids of rows already arrived, and writes the
requests that have ended as it goes, with the same outputs; where an earlier row can still come back
(closed-loop session turns) nothing is handed back."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.api import resolve_config
from replay.engine.run import prepare_trace_file, replay_prepared
from replay.engine.run_setup import resolve_setup
from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ids are handed back on Linux only")


def _trace(path, n: int, *, sessions: bool) -> str:
    """n rows of 64 ids each (1,024 prompt tokens), ids shared in prefixes of 32, 20 ms apart."""
    rng = np.random.default_rng(3)
    ids = [[int(rng.integers(0, 5)) * 1000 + j for j in range(32)] + [100_000 + i * 64 + j for j in range(32)]
           for i in range(n)]
    table = pa.Table.from_pydict({
        "request_id": [f"q{i}" for i in range(n)],
        "arrival_ms": np.arange(n, dtype=np.int64) * 20,
        "input_tokens": np.full(n, 1024, dtype=np.int32),
        "output_tokens": rng.integers(2, 30, n).astype(np.int32),
        "hash_ids": pa.array(ids, pa.list_(pa.uint64())),
        "session_id": pa.array([f"s{i % 5}" if sessions else None for i in range(n)], pa.string()),
        "parent_id": pa.nulls(n, pa.string()),
        "turn": pa.array([i // 5 if sessions else None for i in range(n)], pa.int32()),
        "delay_ms": pa.array([100 if sessions and i >= 5 else None for i in range(n)], pa.int64()),
        "priority": pa.nulls(n, pa.int32()),
    }, schema=TRACE_SCHEMA)
    meta = TraceMetadata(source_format="test", source_file="-", time_unit="ms", hash_block_size=16,
                         prefix_identity="real")
    pq.write_table(table.replace_schema_metadata(meta.to_parquet_metadata()), path)
    return str(path)


def _replay(trace: str, out, once: bool, sets: tuple[str, ...] = (), workers: int = 1):
    cfg, _ = resolve_config(None, ["kv_cache.num_gpu_blocks=2000", *sets])
    setup = resolve_setup(cfg)
    prepared = prepare_trace_file(trace, cfg, setup)
    replay_prepared(prepared, cfg, out, setup=setup, once=once, workers=workers)
    return prepared.arrays


def _summary(outdir) -> dict:
    """run.json but for what differs between any two runs (wall time)."""
    info = json.loads((outdir / "run.json").read_text())
    info.pop("wall_time_s")
    return info


def test_ids_of_arrived_rows_are_handed_back_with_the_same_outputs(tmp_path, monkeypatch):
    from replay.engine import fleet, recorder

    monkeypatch.setattr(fleet, "_RELEASE_EVERY", 100)
    monkeypatch.setattr(recorder, "REQUESTS_ROW_GROUP", 256)  # requests.parquet's groups are written as they settle
    trace = _trace(tmp_path / "t.parquet", 1200, sessions=False)
    kept = _replay(trace, tmp_path / "kept", once=False)
    released = _replay(trace, tmp_path / "released", once=True)
    assert kept.ids_released_row == 0 and released.ids_released_row == 1100
    # the whole pages of the first 1,100 rows' ids read as zeros now: their memory went back
    middle = slice(10_000, 60_000)  # rows 156 to 937
    assert not released.hash_values[middle].any() and kept.hash_values[middle].any()
    assert np.array_equal(released.hash_values[-64:], kept.hash_values[-64:])
    # and the offsets of those rows: at least one whole page (512 of them) reads as zeros
    assert (released.hash_offsets[:1100] == 0).sum() >= 512 and (kept.hash_offsets[:1100] == 0).sum() == 1
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        assert pq.read_table(tmp_path / "kept" / name).equals(pq.read_table(tmp_path / "released" / name)), name
    assert (tmp_path / "kept" / "requests.parquet").read_bytes() == (tmp_path / "released" / "requests.parquet").read_bytes()
    assert _summary(tmp_path / "kept") == _summary(tmp_path / "released")


def test_parts_in_step_hand_back_ids_and_written_rows_too(tmp_path, monkeypatch):
    # Every part of a fleet in step meets every arrival, in its own process: each hands back the ids
    # of rows already arrived and writes the rows it took that have ended (the spy sees the part this
    # process runs), with the one loop's results.
    from replay.engine import fleet, recorder

    monkeypatch.setattr(fleet, "_RELEASE_EVERY", 100)
    monkeypatch.setattr(recorder, "_PART_REQUESTS_ROW_GROUP", 64)
    written_before: list[int] = []
    real = recorder.Recorder._release_written_rows

    def spy(self, end: int) -> None:
        if self.cluster_part:
            written_before.append(end)
        real(self, end)

    monkeypatch.setattr(recorder.Recorder, "_release_written_rows", spy)
    trace = _trace(tmp_path / "t.parquet", 1200, sessions=False)
    sets = ("fleet.replicas=3", "fleet.router=kv_aware")
    kept = _replay(trace, tmp_path / "kept", once=False, sets=sets)
    released = _replay(trace, tmp_path / "released", once=True, sets=sets, workers=2)
    assert json.loads((tmp_path / "released" / "run.json").read_text())["fleet"]["replicas_in_step"] == 2
    assert kept.ids_released_row == 0 and released.ids_released_row == 1100
    assert not released.hash_values[10_000:60_000].any()
    assert written_before and written_before == sorted(written_before) and written_before[-1] > 900
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        a = pq.read_table(tmp_path / "kept" / name)
        b = pq.read_table(tmp_path / "released" / name)
        if name == "requests.parquet":
            assert a.equals(b)
        else:  # the same rows; in step they come part after part
            assert sorted(a.to_pylist(), key=repr) == sorted(b.to_pylist(), key=repr), name


def test_closed_loop_turns_keep_every_id(tmp_path, monkeypatch):
    from replay.engine import fleet

    monkeypatch.setattr(fleet, "_RELEASE_EVERY", 10)
    trace = _trace(tmp_path / "s.parquet", 200, sessions=True)
    assert _replay(trace, tmp_path / "out", once=True).ids_released_row == 0


def test_poisson_arrivals_hand_back_only_the_plan_s_own_pages(tmp_path, monkeypatch):
    """Poisson arrivals come in trace order: the plan's order is a copy of the selected rows, so
    handing its pages back leaves the selection (which the recorder and the summary read) whole."""
    from replay.engine import fleet

    monkeypatch.setattr(fleet, "_RELEASE_EVERY", 100)
    trace = _trace(tmp_path / "t.parquet", 1200, sessions=False)
    poisson = ("load.mode=poisson", "load.rate=40")
    kept = _replay(trace, tmp_path / "kept", once=False, sets=poisson)
    released = _replay(trace, tmp_path / "released", once=True, sets=poisson)
    assert kept.ids_released_row == 0 and released.ids_released_row == 1100
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        assert pq.read_table(tmp_path / "kept" / name).equals(pq.read_table(tmp_path / "released" / name)), name
    assert _summary(tmp_path / "kept") == _summary(tmp_path / "released")
    assert _summary(tmp_path / "kept")["totals"]["finished"] == 1200
