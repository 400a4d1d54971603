"""Every validation error names file, line and field; skip mode, sorting and atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.base.errors import TraceError
from replay.ingest import convert, load_trace, read_trace
from replay.ingest.validate import block_size_hint

GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'


def _jsonl(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("line, field, message", [
    ('{"timestamp": 1, "output_length": 5, "hash_ids": [1]}', "input_length", "missing input length"),
    ('{"timestamp": 1, "input_length": "abc", "output_length": 5, "hash_ids": [1]}', "input_length",
     "not an integer"),
    ('{"timestamp": 1, "input_length": -3, "output_length": 5, "hash_ids": [1]}', "input_length", "negative length"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 0, "hash_ids": [1]}', "output_length",
     "zero output tokens"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3.5, "hash_ids": [1]}', "output_length",
     "not an integer"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [-1]}', "hash_ids", "outside uint64"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [18446744073709551616]}', "hash_ids",
     "outside uint64"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3}', "hash_ids", "missing hash ids"),
    ('{"timestamp": "noon", "input_length": 10, "output_length": 3, "hash_ids": [1]}', "timestamp",
     "not a number"),
    ('{"input_length": 10, "output_length": 3, "hash_ids": [1]}', "timestamp", "missing timestamp"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 3, "hash_ids": [1]}', "timestamp",
     "negative timestamp"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [1], "delay_ms": -1}', "delay_ms",
     "negative delay"),
    ('{"timestamp": 1, "input_length": 3000000000, "output_length": 3, "hash_ids": [1]}', "input_length",
     "does not fit int32"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [1]} trailing', "<json>",
     "invalid JSON"),
])
def test_errors_name_file_line_field(tmp_path: Path, line: str, field: str, message: str) -> None:
    src = _jsonl(tmp_path, GOOD, "", line)  # the blank line must not shift line numbers
    dest = tmp_path / "out.parquet"
    with pytest.raises(TraceError) as exc:
        convert(src, dest, format="mooncake")
    text = str(exc.value)
    assert text.startswith(f"{src}, line 3, field '{field}': "), text
    assert message in text
    assert not dest.exists() and list(tmp_path.glob(".out.parquet*")) == []


def test_block_size_mismatch_hint(tmp_path: Path) -> None:
    # 32x too many ids: the trace was hashed at 16-token blocks.
    line = json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": list(range(64))})
    with pytest.raises(TraceError, match=r"line 1, field 'hash_ids': 64 hash ids but ceil\(input_tokens 1024 / "
                                         r"block size 512\) = 2; block size 16 would fit \(--block-size 16\)"):
        convert(_jsonl(tmp_path, line), tmp_path / "o.parquet")
    t, meta = load_trace(_jsonl(tmp_path, line), block_size=16)
    assert meta.hash_block_size == 16 and t.num_rows == 1


def test_block_size_hint_ranges() -> None:
    assert block_size_hint(6758, 14) == "block size 512 would fit (--block-size 512)"
    assert block_size_hint(100, 0) == "no hash ids for a non-empty prompt"
    assert block_size_hint(1000, 3) == "block sizes 334..499 would fit"


def test_csv_errors_use_file_lines(tmp_path: Path) -> None:
    src = tmp_path / "a.csv"
    src.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,10,1\r\n\r\n"
                    b"2023-11-16 18:17:04.0,x,1\r\n2023-13-99 99:99:99,5,1\r\n2023-11-16 18:17:05.0,5\r\n")
    with pytest.raises(TraceError, match=r"a\.csv, line 4, field 'ContextTokens': not an integer: 'x'"):
        convert(src, tmp_path / "o.parquet")
    res = convert(src, tmp_path / "o.parquet", on_error="skip")
    assert res.rows_written == 1 and res.rows_rejected == 3
    side = [json.loads(x) for x in res.side_file.read_text().splitlines()]
    got = {(r["line"], r["field"]) for r in side}
    assert got == {(4, "ContextTokens"), (5, "TIMESTAMP"), (6, "<row>")}
    assert any("unparseable timestamp" in r["reason"] for r in side)


def test_skip_writes_good_rows_and_side_file(tmp_path: Path) -> None:
    bad = '{"timestamp": 3, "input_length": -1, "output_length": 5, "hash_ids": [1]}'
    src = _jsonl(tmp_path, GOOD, bad, GOOD.replace('"timestamp": 0', '"timestamp": 9'))
    dest = tmp_path / "o.parquet"
    res = convert(src, dest, on_error="skip")
    assert (res.rows_written, res.rows_rejected) == (2, 1)
    assert res.side_file == tmp_path / "o.parquet.rejected.jsonl"
    (rec,) = [json.loads(x) for x in res.side_file.read_text().splitlines()]
    assert rec["line"] == 2 and rec["field"] == "input_length" and rec["record"]["input_tokens"] == -1
    t, _ = read_trace(dest)
    assert t.column("request_id").to_pylist() == ["0", "2"]  # ids are source record indices


def test_out_of_order_rows_sorted_with_count(tmp_path: Path) -> None:
    lines = [GOOD.replace('"timestamp": 0', f'"timestamp": {ts}') for ts in (0, 50, 20, 30, 60, 10)]
    res = convert(_jsonl(tmp_path, *lines), tmp_path / "o.parquet")
    assert res.rows_resorted == 3
    assert any("3 row(s) were out of time order" in w for w in res.warnings)
    t, _ = read_trace(tmp_path / "o.parquet")
    assert t.column("arrival_ms").to_pylist() == [0, 10, 20, 30, 50, 60]
    assert t.column("request_id").to_pylist() == ["0", "5", "2", "3", "1", "4"]


def test_out_of_order_rebased_source(tmp_path: Path) -> None:
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:05,1,1\n2023-11-16 18:00:01,2,1\n")
    res = convert(src, tmp_path / "o.parquet")
    t, meta = read_trace(tmp_path / "o.parquet")
    assert res.rows_resorted == 1
    assert t.column("arrival_ms").to_pylist() == [0, 4000]
    assert meta.start_time == "2023-11-16T18:00:01.000Z"


def test_duplicate_request_ids(tmp_path: Path) -> None:
    a = '{"request_id": "r1", "timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}'
    with pytest.raises(TraceError, match=r"line 2, field 'request_id': duplicate request id 'r1'"):
        convert(_jsonl(tmp_path, a, a), tmp_path / "o.parquet")


def test_failed_run_keeps_previous_output(tmp_path: Path) -> None:
    dest = tmp_path / "o.parquet"
    convert(_jsonl(tmp_path, GOOD), dest)
    before = dest.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n" + '{"timestamp": 1, "input_length": 0, "output_length": 5, "hash_ids": []}\n')
    with pytest.raises(TraceError, match="zero input tokens"):
        convert(bad, dest)
    assert dest.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "o.parquet", "t.jsonl"]


def test_deterministic_output(tmp_path: Path) -> None:
    src = _jsonl(tmp_path, GOOD, GOOD)
    convert(src, tmp_path / "a.parquet")
    convert(src, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_all_rows_rejected(tmp_path: Path) -> None:
    bad = '{"timestamp": 3, "input_length": -1, "output_length": 5, "hash_ids": [1]}'
    with pytest.raises(TraceError, match="no usable rows"):
        convert(_jsonl(tmp_path, bad), tmp_path / "o.parquet", on_error="skip")
    assert not (tmp_path / "o.parquet").exists()
    assert (tmp_path / "o.parquet.rejected.jsonl").exists()
