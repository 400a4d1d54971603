"""Shared set-up of the sweep tests: a small slice of the sample trace, and direct runs to compare with."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "mooncake_sessions.jsonl"


def write_canonical(rows: list[dict], path: Path, hash_block_size: int = 16) -> Path:
    """A canonical Parquet trace from rows (request_id, arrival_ms, input_tokens, output_tokens, hash_ids)."""
    import pyarrow as pa

    full = []
    for r in rows:
        row = dict.fromkeys(TRACE_SCHEMA.names)
        row.update(r)
        full.append(row)
    table = pa.Table.from_pylist(full, schema=TRACE_SCHEMA)
    meta = TraceMetadata(source_format="test", source_file=str(path), time_unit="ms",
                         hash_block_size=hash_block_size, prefix_identity="real")
    pq.write_table(table.replace_schema_metadata(meta.to_parquet_metadata()), path)
    return path
