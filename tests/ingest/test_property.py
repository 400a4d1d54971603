"""Property test of the ingest readers: random valid rows round-trip exactly; every invalid row is
refused with its own line (hypothesis generates the files; --on-error skip lists the refusals)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.base.errors import TraceError
from replay.ingest import convert

BLOCK = 16
U64 = 2**64 - 1

ids = st.integers(min_value=0, max_value=U64)


@st.composite
def valid_row(draw) -> dict:
    n_in = draw(st.integers(min_value=1, max_value=200))
    return {
        # below 1e9: a value from 1e9 on reads as an epoch-seconds clock and is refused (ingest/columns.py)
        "timestamp": draw(st.integers(min_value=0, max_value=10**9 - 1)),
        "input_length": n_in,
        "output_length": draw(st.integers(min_value=1, max_value=2**31 - 1)),
        "hash_ids": draw(st.lists(ids, min_size=math.ceil(n_in / BLOCK), max_size=math.ceil(n_in / BLOCK))),
    }


# Each corruption breaks exactly one thing the validator must catch.
CORRUPTIONS = {
    "negative input": lambda r: {**r, "input_length": -r["input_length"]},
    "zero output": lambda r: {**r, "output_length": 0},
    "output beyond int32": lambda r: {**r, "output_length": 2**31},
    "ids do not match the length": lambda r: {**r, "hash_ids": r["hash_ids"] + [7]},
    "null inside hash_ids": lambda r: {**r, "hash_ids": [None] + r["hash_ids"][1:]},
    "id beyond uint64": lambda r: {**r, "hash_ids": [U64 + 1] + r["hash_ids"][1:]},
    "timestamp beyond 2^42 ms": lambda r: {**r, "timestamp": 10**18},
    "negative timestamp": lambda r: {**r, "timestamp": -5},
    "input not an integer": lambda r: {**r, "input_length": "many"},
    "boolean output": lambda r: {**r, "output_length": True},
    "missing input": lambda r: {k: v for k, v in r.items() if k != "input_length"},
    "invalid JSON": "{not json",
    "not an object": "[1, 2, 3]",
    "invalid UTF-8": b'{"request_id": "r\xff"}',
}

row_or_bad = st.one_of(
    valid_row().map(lambda r: ("ok", r)),
    st.tuples(st.sampled_from(sorted(CORRUPTIONS)), valid_row()),
)


def _line(kind: str, row: dict, rid: str) -> bytes:
    fix = CORRUPTIONS.get(kind)
    if isinstance(fix, bytes):
        return fix
    if isinstance(fix, str):
        return fix.encode()
    obj = fix(row) if fix else row
    return json.dumps({"request_id": rid, **obj}).encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_or_bad, min_size=1, max_size=25))
def test_valid_rows_round_trip_and_bad_rows_are_refused_with_their_line(rows):
    with tempfile.TemporaryDirectory() as d:
        src, dest = Path(d) / "t.jsonl", Path(d) / "t.parquet"
        lines = [_line(kind, row, f"r{i}") for i, (kind, row) in enumerate(rows)]
        src.write_bytes(b"\n".join(lines) + b"\n")
        good = [(i, row) for i, (kind, row) in enumerate(rows) if kind == "ok"]
        bad_lines = {i + 1 for i, (kind, _) in enumerate(rows) if kind != "ok"}
        if not good:
            with pytest.raises(TraceError, match="no usable rows" if bad_lines else "no rows"):
                convert(src, dest, format="mooncake", block_size=BLOCK, on_error="skip")
            return
        result = convert(src, dest, format="mooncake", block_size=BLOCK, on_error="skip")
        side = [json.loads(x) for x in result.side_file.read_text().splitlines()] if result.side_file else []
        assert {r["line"] for r in side} == bad_lines
        assert len(side) == len(bad_lines)  # one refusal per bad row, each with its own line
        # valid rows: sorted (stably) by time, rebased to the first arrival, every value exact
        expect = sorted(good, key=lambda ir: ir[1]["timestamp"])
        base = expect[0][1]["timestamp"]
        table = pq.read_table(dest)
        assert table.column("request_id").to_pylist() == [f"r{i}" for i, _ in expect]
        assert table.column("arrival_ms").to_pylist() == [r["timestamp"] - base for _, r in expect]
        assert table.column("input_tokens").to_pylist() == [r["input_length"] for _, r in expect]
        assert table.column("output_tokens").to_pylist() == [r["output_length"] for _, r in expect]
        assert table.column("hash_ids").to_pylist() == [r["hash_ids"] for _, r in expect]
        assert result.metadata.arrival_offset_ms == base


def test_every_bad_row_alone_is_refused_in_fail_mode(tmp_path):
    """on_error=fail: the same corruptions stop the ingest at their line, and nothing is written."""
    ok = {"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}
    for kind in CORRUPTIONS:
        src, dest = tmp_path / "t.jsonl", tmp_path / "t.parquet"
        src.write_bytes(_line("ok", ok, "a") + b"\n" + _line(kind, ok, "b") + b"\n")
        with pytest.raises(TraceError, match=r"t\.jsonl, line 2"):
            convert(src, dest, format="mooncake", block_size=BLOCK)
        assert not dest.exists(), kind
