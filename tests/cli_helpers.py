"""Small real inputs for CLI tests: a canonical trace cut from the bundled sample, and a run of it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "mooncake_sessions.jsonl"


def invoke(*args: str):
    from replay.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def write_sample_trace(path: Path, rows: int = 60) -> Path:
    """The first ``rows`` rows of the bundled Mooncake sample as a canonical Parquet trace."""
    from replay.ingest import load_trace
    from replay.ingest.schema import TRACE_SCHEMA

    table, meta = load_trace(SAMPLE)
    table = table.slice(0, rows).cast(TRACE_SCHEMA).replace_schema_metadata(meta.to_parquet_metadata())
    pq.write_table(table, path)
    return path


def write_sample_run(outdir: Path, trace: Path, *extra: str) -> Path:
    res = invoke("run", trace, "-o", outdir, "-q", *extra)
    assert res.exit_code == 0, res.output
    return outdir
