"""The inspect figures on hand-checked traces, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from ingest import trace_stats
from ingest.schema import TRACE_SCHEMA
from replay.cli import app

FIX = Path(__file__).parent / "ingest_fixtures"


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
