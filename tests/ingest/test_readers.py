"""Every reader on small fixtures (tests/ingest_fixtures) and the metadata it records."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replay.base.errors import ConfigError, TraceError
from replay.ingest import convert, load_trace, read_trace
from replay.ingest.detect import detect_format
from replay.ingest.hashing import chain_hash_blocks
from replay.ingest.schema import TRACE_SCHEMA

FIX = Path(__file__).resolve().parents[1] / "ingest_fixtures"


@pytest.mark.parametrize("name, fmt", [
    ("bailian.jsonl", "bailian"), ("burstgpt_v1.csv", "burstgpt"), ("burstgpt_v2.csv", "burstgpt"),
    ("azure2023.csv", "azure"), ("azure2024.csv", "azure"), ("azure2025.csv", "azure"),
    ("requests.jsonl", "requests"), ("mooncake_ext.jsonl", "mooncake"),
])
def test_detect(name: str, fmt: str) -> None:
    assert detect_format(FIX / name) == fmt


def test_detect_unknown_csv_names_the_columns() -> None:
    with pytest.raises(TraceError, match=r"generic\.csv, line 1: unrecognised CSV columns.*--map"):
        detect_format(FIX / "generic.csv")


def test_mooncake_extended_fields_and_sessions() -> None:
    t, meta = load_trace(FIX / "mooncake_ext.jsonl")
    rows = t.to_pylist()
    assert [r["request_id"] for r in rows] == ["s1-1", "s2-1", "s1-2", "s1-3"]
    assert rows[1]["arrival_ms"] == 100 and rows[1]["priority"] == 2  # created_time / input_tokens aliases
    assert rows[1]["input_tokens"] == 100 and rows[1]["output_tokens"] == 5
    # A later turn with only a delay: ready no earlier than the previous turn + delay.
    assert rows[2]["arrival_ms"] == 3000 and rows[2]["delay_ms"] == 3000
    assert rows[3]["delay_ms"] == 500 and rows[3]["arrival_ms"] == 3500  # `delay` alias
    assert [r["turn"] for r in rows] == [1, 1, 2, 3]
    assert [r["parent_id"] for r in rows] == [None, None, "s1-1", "s1-2"]
    assert meta.hash_block_size == 512 and meta.prefix_identity == "real" and meta.source_format == "mooncake"


def test_bailian_parent_chain_sessions_and_seconds() -> None:
    t, meta = load_trace(FIX / "bailian.jsonl")
    rows = t.to_pylist()
    assert [r["arrival_ms"] for r in rows] == [0, 750, 2500, 9500]
    assert [r["session_id"] for r in rows] == ["101", "102", "101", "101"]
    assert [r["parent_id"] for r in rows] == [None, None, "101", "103"]
    assert [r["turn"] for r in rows] == [1, 1, 2, 3]
    assert meta.hash_block_size == 16


@pytest.mark.parametrize("name, arrivals, start", [
    ("azure2023.csv", [0, 52, 99], "2023-11-16T18:17:03.979Z"),
    ("azure2024.csv", [0, 491, 991], "2024-05-10T00:00:00.009Z"),
    ("azure2025.csv", [0, 2250], "2025-03-01T10:00:00.000Z"),
])
def test_azure_releases(name: str, arrivals: list[int], start: str) -> None:
    t, meta = load_trace(FIX / name)
    assert t.column("arrival_ms").to_pylist() == arrivals
    assert meta.start_time == start and meta.prefix_identity == "absent" and meta.hash_block_size is None
    assert t.column("hash_ids").null_count == t.num_rows


def test_azure_2025_notes_images() -> None:
    _, meta = load_trace(FIX / "azure2025.csv")
    assert "NumImages" in (meta.notes or "")


def test_burstgpt_v1_failed_rows() -> None:
    with pytest.raises(TraceError, match=r"burstgpt_v1\.csv, line 3, field 'Response tokens': zero output"):
        load_trace(FIX / "burstgpt_v1.csv")
    t, meta = load_trace(FIX / "burstgpt_v1.csv", drop_failed=True)
    assert t.column("arrival_ms").to_pylist() == [0, 2500]
    assert meta.source_format == "burstgpt-v1"


def test_burstgpt_v2_sessions() -> None:
    t, meta = load_trace(FIX / "burstgpt_v2.csv")
    assert meta.source_format == "burstgpt-v2"
    assert t.column("session_id").to_pylist() == ["s1", None, "s1"]
    assert t.column("turn").to_pylist() == [1, None, 2]
    assert t.column("arrival_ms").to_pylist() == [0, 1500, 30000]


def test_requests_token_ids_are_chain_hashed_and_text_uses_fallback() -> None:
    t, meta = load_trace(FIX / "requests.jsonl")
    rows = t.to_pylist()
    assert [r["input_tokens"] for r in rows[:2]] == [20, 17]
    # Same first 16 tokens -> same first id; different tails -> different second ids.
    assert rows[0]["hash_ids"][0] == rows[1]["hash_ids"][0]
    assert rows[0]["hash_ids"][1] != rows[1]["hash_ids"][1]
    assert rows[0]["hash_ids"] == chain_hash_blocks(list(range(1, 21)), 16)
    assert [r["output_tokens"] for r in rows] == [5, 7, 64, 12]
    assert meta.tokenizer == "byte-fallback-4" and meta.hash_block_size == 16
    assert [r["arrival_ms"] for r in rows] == [0, 1500, 2000, 3000]
    assert meta.start_time == "2024-01-01T00:00:00.000Z"


def test_requests_missing_tokenizer_file() -> None:
    with pytest.raises(ConfigError, match="tokenizer file not found"):
        load_trace(FIX / "requests.jsonl", tokenizer="/nonexistent/tokenizer.json")


def test_chain_hash_prefix_property() -> None:
    a = chain_hash_blocks(list(range(48)), 16)
    b = chain_hash_blocks(list(range(32)) + [0] * 16, 16)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(chain_hash_blocks(list(range(33)), 16)) == 3


def test_generic_csv_mapping() -> None:
    mapping = {"arrival": "ts", "input_tokens": "prompt_len", "output_tokens": "gen_len", "hash_ids": "ids",
               "session_id": "user"}
    t, meta = load_trace(FIX / "generic.csv", format="csv", mapping=mapping, time_unit="s", block_size=512)
    assert t.column("arrival_ms").to_pylist() == [0, 250, 500]
    assert t.column("hash_ids").to_pylist() == [[1, 2], [3], [1, 2, 4]]
    assert t.column("session_id").to_pylist() == ["u1", "u2", "u1"]
    assert meta.source_format == "csv" and meta.time_unit == "s"


def test_generic_requires_time_unit_and_mapping() -> None:
    with pytest.raises(ConfigError, match="--time-unit"):
        load_trace(FIX / "generic.csv", format="csv",
                   mapping={"arrival": "ts", "input_tokens": "prompt_len", "output_tokens": "gen_len"})
    with pytest.raises(ConfigError, match="output_tokens"):
        load_trace(FIX / "generic.csv", format="csv", mapping={"arrival": "ts", "input_tokens": "prompt_len"},
                   time_unit="s")
    with pytest.raises(ConfigError, match="unknown canonical field"):
        load_trace(FIX / "generic.csv", format="csv", mapping={"nope": "ts"}, time_unit="s")


def test_generic_jsonl_ms() -> None:
    mapping = {"arrival": "t", "input_tokens": "n_in", "output_tokens": "n_out", "request_id": "rid"}
    t, _ = load_trace(FIX / "generic.jsonl", mapping=mapping, time_unit="ms")
    assert t.column("request_id").to_pylist() == ["x1", "x2"]
    assert t.column("arrival_ms").to_pylist() == [0, 250]


def test_convert_writes_schema_and_metadata(tmp_path: Path) -> None:
    dest = tmp_path / "t.parquet"
    res = convert(FIX / "bailian.jsonl", dest)
    assert res.rows_written == 4 and res.rows_rejected == 0 and res.side_file is None
    schema = pq.read_schema(dest)
    assert schema.remove_metadata().equals(TRACE_SCHEMA)
    keys = {k.decode() for k in schema.metadata}
    for key in ("source_format", "source_file", "source_sha256", "time_unit", "start_time", "hash_block_size",
                "prefix_identity", "tokenizer", "tool_version"):
        assert f"replay.{key}" in keys
    table, meta = read_trace(dest)
    assert meta.source_file == "bailian.jsonl" and len(meta.source_sha256 or "") == 64
    assert table.num_rows == 4


def test_uint64_ids_survive(tmp_path: Path) -> None:
    big = 2**64 - 1
    src = tmp_path / "m.jsonl"
    src.write_text(f'{{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [{big}, {2**63 + 5}]}}\n')
    convert(src, tmp_path / "m.parquet")
    t, _ = read_trace(tmp_path / "m.parquet")
    assert t.column("hash_ids").to_pylist() == [[big, 2**63 + 5]]


def test_gzip_csv(tmp_path: Path) -> None:
    import gzip

    src = tmp_path / "a.csv.gz"
    src.write_bytes(gzip.compress((FIX / "azure2025.csv").read_bytes()))
    t, _ = load_trace(src)
    assert t.num_rows == 2


def test_canonical_input(tmp_path: Path) -> None:
    dest = tmp_path / "t.parquet"
    convert(FIX / "azure2023.csv", dest)
    table, meta = load_trace(dest)
    assert table.num_rows == 3 and meta.source_format == "azure"
    with pytest.raises(TraceError, match="already a canonical trace"):
        convert(dest, tmp_path / "again.parquet")
