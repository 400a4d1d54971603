"""`replay run` end to end: the CLI, the Python API, config errors, atomic output, Poisson load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from replay.cli import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "mooncake_sessions.jsonl"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    """The first 150 rows of the bundled sample, as a canonical trace."""
    import pyarrow.parquet as pq

    from replay.ingest import load_trace
    from replay.ingest.schema import TRACE_SCHEMA

    table, meta = load_trace(SAMPLE)
    table = table.slice(0, 150).cast(TRACE_SCHEMA).replace_schema_metadata(meta.to_parquet_metadata())
    path = tmp_path_factory.mktemp("trace") / "small.parquet"
    pq.write_table(table, path)
    return path


def test_run_cli_writes_every_output_and_summary(small_trace, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(small_trace), "-o", str(out), "--set", "load.speedup=2"])
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "GPU prefix hit ratio" in res.output
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet", "run.json"):
        assert (out / name).exists()
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["load"]["speedup"] == 2.0
    assert info["trace"]["path"] == str(small_trace.resolve())
    assert info["totals"]["finished"] == 150
    reqs = pd.read_parquet(out / "requests.parquet")
    assert (reqs.ttft_ms > 0).all() and (reqs.e2e_ms >= reqs.ttft_ms).all()
    assert reqs.cached_tokens.sum() == info["totals"]["prefix_hit_tokens"]


def test_run_cli_accepts_raw_trace_files(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(ROOT / "sample_traces" / "azure_code.csv"), "-o", str(out), "-q",
                                   "--set", "load.max_requests=50"])
    assert res.exit_code == 0, res.output
    info = json.loads((out / "run.json").read_text())
    assert info["trace"]["metadata"]["source_format"] == "azure"
    assert info["totals"]["requests"] == 50
    assert (out / "trace.parquet").exists()  # the in-memory canonical trace is kept beside the outputs


def test_bad_config_key_is_named_and_nothing_is_written(small_trace, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler:\n  max_num_seqz: 4\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(small_trace), "-c", str(cfg), "-o", str(out)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "scheduler.max_num_seqz: unknown key" in text and cfg.name in text
    assert not out.exists()


def test_failed_run_keeps_the_previous_output(small_trace, tmp_path):
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["run", str(small_trace), "-o", str(out), "-q"]).exit_code == 0
    before = (out / "requests.parquet").read_bytes()
    # A KV cache too small for the longest prompt: refused before any work, old output intact.
    res = CliRunner().invoke(app, ["run", str(small_trace), "-o", str(out), "-q",
                                   "--set", "kv_cache.num_gpu_blocks=64"])
    assert res.exit_code == 2 and "can never be replayed" in " ".join(res.output.split())
    assert (out / "requests.parquet").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dirs left


def test_python_api_returns_dataframes(small_trace, tmp_path):
    from replay.api import run

    result = run(small_trace, {"load": {"mode": "poisson", "rate": 5.0}}, outdir=tmp_path / "o", overrides=["seed=3"])
    assert len(result.requests) == 150 and {"request_id", "ttft_ms"} <= set(result.requests.columns)
    gaps = result.requests.sort_values("arrival_ms").arrival_ms.diff().dropna()
    assert abs(gaps.mean() - 200.0) < 40.0  # Poisson at 5 req/s: mean gap 200 ms
    again = run(small_trace, {"load": {"mode": "poisson", "rate": 5.0}}, outdir=tmp_path / "p", overrides=["seed=3"])
    assert again.requests.arrival_ms.tolist() == result.requests.arrival_ms.tolist()
    assert len(result.chunks) == result.requests.output_tokens.sum()
    assert len(result.steps) == result.info["totals"]["steps"]


@pytest.mark.parametrize("text", ["0.33", "0.11", "'0.33'"])
def test_semantics_version_given_as_a_yaml_number(text, tmp_path):
    from replay.engine.config import load_config

    assert load_config(None, [f"semantics={text}"]).semantics == text.strip("'")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"semantics: {text}\n")
    assert load_config(cfg).semantics == text.strip("'")


def test_unknown_semantics_version_is_named():
    from replay.base.errors import ConfigError
    from replay.engine.config import load_config

    with pytest.raises(ConfigError, match="semantics"):
        load_config(None, ["semantics=0.2"])


def test_a_prepared_trace_keeps_its_table_only_where_the_replay_reads_it(small_trace, tmp_path):
    """The CLI lets the trace's table go once the engine's columns are built, unless the replay still
    reads it: to store a non-canonical input beside the outputs, or to hand a fleet's clusters to
    their workers. The same outputs either way as replay_trace, which keeps the table."""
    from replay.api import load_any_trace, resolve_config
    from replay.engine.run import prepare_trace, replay_prepared, replay_trace
    from replay.engine.run_setup import resolve_setup

    cfg, _ = resolve_config(None, ["load.max_requests=40"])
    setup = resolve_setup(cfg)
    table, meta = load_any_trace(small_trace)
    prepared = prepare_trace(table, meta, cfg, setup, trace_path=small_trace)
    assert prepared.table is None and len(prepared.requests.selected) == 40
    # the CLI's way for a canonical file: read a piece at a time, the same fingerprint and columns
    from replay.engine.run import prepare_trace_file

    streamed = prepare_trace_file(small_trace, cfg, setup)
    assert streamed.table is None and streamed.fingerprint == prepared.fingerprint
    assert np.array_equal(streamed.requests.selected, prepared.requests.selected)
    assert np.array_equal(streamed.arrays.hash_values, prepared.arrays.hash_values)
    raw = ROOT / "sample_traces" / "azure_code.csv"
    assert prepare_trace(*load_any_trace(raw), cfg, setup, trace_path=raw).table is not None
    clustered, _ = resolve_config(None, ["fleet.replicas=2", "fleet.clusters=2", "load.max_requests=40"])
    kept = prepare_trace(table, meta, clustered, resolve_setup(clustered), trace_path=small_trace)
    assert kept.table is table
    replay_prepared(kept, clustered, tmp_path / "clustered")
    assert not (tmp_path / "clustered" / "trace.parquet").exists()  # a canonical input is named, not copied

    from replay.base.errors import ConfigError

    with pytest.raises(ConfigError, match="prepared for a fleet without clusters"):  # Ray tasks need the table
        replay_prepared(prepared, clustered, tmp_path / "wrong", ray_address="auto")
    assert not (tmp_path / "wrong").exists()
    replay_prepared(prepared, cfg, tmp_path / "a", setup=setup)
    replay_trace(table, meta, cfg, tmp_path / "b", trace_path=small_trace)
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    a, b = (json.loads((tmp_path / d / "run.json").read_text()) for d in "ab")
    assert a["trace"] == b["trace"] and a["totals"] == b["totals"]
