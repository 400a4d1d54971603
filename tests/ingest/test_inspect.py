"""The inspect figures on hand-checked traces, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from replay.cli import app
from replay.ingest import trace_stats
from replay.ingest.schema import TRACE_SCHEMA

FIX = Path(__file__).resolve().parents[1] / "ingest_fixtures"


def _table(rows: list[tuple[int, int, list[int]]]) -> pa.Table:
    return pa.table({
        "request_id": [str(i) for i in range(len(rows))],
        "arrival_ms": [r[0] for r in rows],
        "input_tokens": [r[1] for r in rows],
        "output_tokens": [1] * len(rows),
        "hash_ids": [r[2] for r in rows],
        "session_id": [None] * len(rows),
        "parent_id": [None] * len(rows),
        "turn": [None] * len(rows),
        "delay_ms": [None] * len(rows),
        "priority": [None] * len(rows),
    }, schema=TRACE_SCHEMA)


def test_reuse_definitions_by_hand() -> None:
    # Block size 10. Rows in arrival order (the third row is listed first to check ordering).
    t = _table([
        (20, 25, [1, 2, 9]),   # third: ids 1,2 seen; 9 seen (row 2) but after a... run = 3 -> min(30, 25) = 25
        (0, 30, [1, 2, 3]),    # first: nothing seen
        (10, 30, [1, 4, 9]),   # second: 1 seen, 4 new -> run 1 -> 10 tokens; 9 new
    ])
    s = trace_stats(t, lru_blocks=(2, 100), block_size=10)
    assert s["block_references"] == 9 and s["unique_blocks"] == 5
    assert s["block_reuse_fraction"] == pytest.approx(4 / 9)  # row2: id 1; row3: 1, 2, 9
    assert s["token_prefix_hit_infinite"] == pytest.approx((0 + 10 + 25) / 85)
    # LRU of 2 ids: row1 inserts 1,2,3 -> cache [2,3]; row2: 1 missing -> run 0; touches -> [4,9];
    # row3: 1 missing -> run 0. Infinite-ish cache (100): runs 0, 1, 3 -> 4 / 9.
    assert s["lru_hit"] == {"2": 0.0, "100": pytest.approx(4 / 9)}
    assert s["rows"] == 3 and s["span_s"] == pytest.approx(0.02)


def test_lru_leading_run_stops_at_first_miss() -> None:
    t = _table([(0, 30, [1, 2, 3]), (1, 30, [1, 5, 2])])
    s = trace_stats(t, lru_blocks=(10,), block_size=10)
    assert s["lru_hit"]["10"] == pytest.approx(1 / 6)  # id 2 is cached but after the miss on 5


def _reference_stats(rows: list[tuple[int, int, list[int] | None]], block: int, caps: list[int]) -> dict:
    """The module doc's definitions, row by row in plain Python (stable arrival order)."""
    ordered = [r for _, r in sorted(enumerate(rows), key=lambda e: (e[1][0], e[0]))]
    seen_before: set[int] = set()
    refs = hits = tokens = total = 0
    for _, inp, ids in ordered:
        ids = ids or []
        refs += len(ids)
        hits += sum(1 for x in ids if x in seen_before)
        run = next((k for k, x in enumerate(ids) if x not in seen_before), len(ids))
        tokens += min(run * block, inp)
        total += inp
        seen_before.update(ids)
    lru = {}
    for cap in caps:
        cache: list[int] = []
        got = 0
        for _, _, ids in ordered:
            ids = ids or []
            run = next((k for k, x in enumerate(ids) if x not in cache), len(ids))
            got += run
            for x in ids:
                if x in cache:
                    cache.remove(x)
                cache.append(x)
                if len(cache) > cap:
                    cache.pop(0)
        lru[str(cap)] = got / refs if refs else None
    return {"block_references": refs, "unique_blocks": len(seen_before),
            "block_reuse_fraction": hits / refs, "token_prefix_hit_infinite": tokens / total, "lru_hit": lru}


def _random_rows(rng, n_max: int = 120, ids: int = 25) -> list[tuple[int, int, list[int] | None]]:
    return [(rng.randrange(40), rng.randrange(1, 400),
             None if rng.random() < 0.1 else [rng.randrange(ids) for _ in range(rng.randrange(6))])
            for _ in range(rng.randrange(1, n_max))]


def _assert_same_figures(got: dict, want: dict) -> None:
    # Exact: every figure is an integer count divided once, by the same division as the definitions.
    for key in ("block_references", "unique_blocks", "block_reuse_fraction", "token_prefix_hit_infinite",
                "lru_hit"):
        assert got[key] == want[key], key


# (rows per block, references per first-use pass): one row per block and a pass per 4 references
# (tens of parts, many ids alone in theirs), small odd sizes, and the defaults (one block, one pass).
SIZES = [(1, 4), (3, 5), (7, 64), (1 << 18, 1 << 23)]


@pytest.mark.parametrize(("block_rows", "pass_refs"), SIZES)
def test_reuse_figures_out_of_core_equal_the_definitions(block_rows, pass_refs, monkeypatch) -> None:
    # The reuse passes read the ids one block of rows at a time and split the id space into parts of
    # about pass_refs references (bounded memory at 10 M rows): any sizes give the figures of the
    # definitions, on unsorted arrivals (with ties), rows without ids and a chunked table.
    import random

    import replay.ingest.reuse as reuse

    monkeypatch.setattr(reuse, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(reuse, "PASS_REFS", pass_refs)
    rng = random.Random(block_rows * 1000 + pass_refs)
    for _ in range(8):
        rows = _random_rows(rng)
        t = _table([(a, i, ids if ids is not None else []) for a, i, ids in rows])
        if len(rows) > 2:
            t = pa.concat_tables([t.slice(0, len(rows) // 2), t.slice(len(rows) // 2)])
        got = trace_stats(t, lru_blocks=(1, 4, 50), block_size=16)
        want = _reference_stats(rows, 16, [1, 4, 50])
        if not want["block_references"]:
            continue
        _assert_same_figures(got, want)


def _write(tmp_path: Path, rows: list[tuple[int, int, list[int] | None]], name: str = "t.parquet") -> Path:
    from replay.ingest.schema import TraceMetadata
    from replay.ingest.writer import TraceWriter

    meta = TraceMetadata(source_format="test", source_file="-", time_unit="ms", hash_block_size=16,
                         prefix_identity="synthesized")
    path = tmp_path / name
    t = _table(rows)
    writer = TraceWriter(path, meta, row_group_rows=7)  # several row groups
    for start in range(0, t.num_rows, 5):
        writer.write(t.slice(start, 5))
    writer.close()
    return path


@pytest.mark.parametrize(("block_rows", "pass_refs"), SIZES)
def test_inspect_of_a_parquet_file_streams_the_same_figures(block_rows, pass_refs, tmp_path, monkeypatch) -> None:
    # `replay inspect FILE.parquet` reads hash_ids from the file pass by pass (never into the table):
    # its JSON equals the definitions and the in-memory figures of the whole table, sorted or not.
    import random

    import replay.ingest.reuse as reuse
    from replay.ingest import read_trace

    monkeypatch.setattr(reuse, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(reuse, "PASS_REFS", pass_refs)
    rng = random.Random(7 + block_rows + pass_refs)
    for k in range(4):
        rows = _random_rows(rng, 100, 40)
        if k % 2:
            rows.sort(key=lambda r: r[0])  # in arrival order: the streamed path (unsorted: read whole)
        path = _write(tmp_path, rows, f"t{k}.parquet")
        res = CliRunner().invoke(app, ["inspect", str(path), "--json", "--lru-blocks", "1,4,50"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.output)
        want = _reference_stats(rows, 16, [1, 4, 50])
        if not want["block_references"]:
            assert got["block_reuse_fraction"] is None
            continue
        _assert_same_figures(got, want)
        in_memory = trace_stats(read_trace(path)[0], lru_blocks=(1, 4, 50))
        assert {k: v for k, v in got.items() if k in in_memory} == json.loads(json.dumps(in_memory))


def test_inspect_names_a_null_hash_id(tmp_path: Path) -> None:
    # Ingest refuses [null, 2]; a hand-made Parquet file can hold it: one line naming file, row and field.
    path = _write(tmp_path, [(0, 30, [1, 2]), (1, 30, [3, None])])
    res = CliRunner().invoke(app, ["inspect", str(path)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "field 'hash_ids'" in text and "row 1" in text and "Traceback" not in text


def test_stats_need_block_size_when_ids_present() -> None:
    with pytest.raises(ValueError, match="block_size"):
        trace_stats(_table([(0, 10, [1])]))


def test_no_hash_ids_means_unknown_reuse() -> None:
    t = _table([(0, 10, [1])]).set_column(4, "hash_ids", pa.nulls(1, pa.list_(pa.uint64())))
    s = trace_stats(t, lru_blocks=(10,))
    assert s["block_reuse_fraction"] is None and s["lru_hit"] == {"10": None}


def test_inspect_cli_json_and_table(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["inspect", str(FIX / "bailian.jsonl"), "--json", "--lru-blocks", "2,100"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["rows"] == 4 and data["sessions"] == 2 and set(data["lru_hit"]) == {"2", "100"}
    assert data["hash_block_size"] == 16 and data["source_format"] == "bailian"
    res = runner.invoke(app, ["inspect", str(FIX / "azure2023.csv")])
    assert res.exit_code == 0 and "unknown, not zero" in res.output


def test_inspect_cli_errors_cleanly() -> None:
    res = CliRunner().invoke(app, ["inspect", str(FIX / "azure2023.csv"), "--lru-blocks", "a,b"])
    assert res.exit_code == 2 and "--lru-blocks" in res.output


def test_ingest_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "o.parquet"
    res = runner.invoke(app, ["ingest", str(FIX / "burstgpt_v1.csv"), "-o", str(out)])
    text = " ".join(res.output.split())  # rich wraps long lines
    assert res.exit_code == 2 and "line 3, field 'Response tokens': zero output tokens" in text
    assert not out.exists()
    res = runner.invoke(app, ["ingest", str(FIX / "burstgpt_v1.csv"), "-o", str(out), "--drop-failed"])
    assert res.exit_code == 0 and out.exists()
    res = runner.invoke(app, ["ingest", str(FIX / "generic.csv"), "-o", str(out), "--format", "csv",
                              "--map", "arrival=ts", "--map", "input_tokens=prompt_len",
                              "--map", "output_tokens=gen_len", "--time-unit", "s"])
    assert res.exit_code == 0, res.output
