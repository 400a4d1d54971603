"""``replay export``: a replay in vllm bench and aiperf result shapes, read back by our own readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replay.api import run
from replay.base.errors import ReplayError
from replay.cli import app
from replay.ingest import load_trace
from replay.reports.export import export

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """120 requests on a pool too small for the longest prompts: some are rejected (--on-error skip)."""
    out = tmp_path_factory.mktemp("exp") / "out"
    run(SAMPLE, overrides=["load.max_requests=120", "max_model_len=4096"], outdir=out, on_error="skip")
    return out


def test_vllm_bench_shape(small_run: Path, tmp_path: Path) -> None:
    doc = json.loads(export(small_run, "vllm-bench", tmp_path / "r.json").read_text())
    n = doc["num_prompts"]
    assert n == 120 and doc["completed"] + doc["failed"] == n
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "request_ids"):
        assert len(doc[key]) == n, key
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    bad = [i for i, e in enumerate(doc["errors"]) if e]
    assert bad and all(doc["output_lens"][i] == 0 and doc["itls"][i] == [] for i in bad)
    i = ok[0]
    assert len(doc["itls"][i]) <= doc["output_lens"][i] - 1  # one gap per chunk after the first
    assert doc["latencies"][i] == pytest.approx(doc["ttfts"][i] + sum(doc["itls"][i]))
    assert doc["mean_ttft_ms"] == pytest.approx(1000 * sum(doc["ttfts"][j] for j in ok) / len(ok))
    t, meta = load_trace(tmp_path / "r.json", drop_failed=True)  # detected as vllm-bench
    assert meta.source_format == "vllm-bench" and t.num_rows == len(ok)


def test_aiperf_shape(small_run: Path, tmp_path: Path) -> None:
    lines = export(small_run, "aiperf", tmp_path / "p.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(recs) == 120
    failed = [r for r in recs if r["error"] is not None]
    assert failed and all("error_isl" in r["metrics"] for r in failed)
    good = next(r for r in recs if r["error"] is None)
    m = good["metrics"]
    assert m["time_to_first_token"]["unit"] == "ms" and isinstance(m["inter_chunk_latency"]["value"], list)
    assert good["metadata"]["request_end_ns"] > good["metadata"]["request_start_ns"]
    t, _ = load_trace(tmp_path / "p.jsonl", drop_failed=True)
    assert t.num_rows == 120 - len(failed)


def test_export_is_deterministic_and_refuses_run_files(small_run: Path, tmp_path: Path) -> None:
    a = export(small_run, "vllm-bench", tmp_path / "a.json").read_bytes()
    b = export(small_run, "vllm-bench", tmp_path / "b.json").read_bytes()
    assert a == b
    with pytest.raises(ReplayError, match="the output is the input"):
        export(small_run, "aiperf", small_run / "requests.parquet")
    res = CliRunner().invoke(app, ["export", str(small_run), "-f", "csv", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "unknown export format" in res.output


@pytest.mark.parametrize("fmt", ["vllm-bench", "aiperf"])
def test_export_streams_in_batches_to_the_same_bytes(small_run: Path, tmp_path: Path, monkeypatch, fmt) -> None:
    # The export query is read a batch of requests at a time (bounded memory at 1 M requests): batches
    # of 7 (lists joined across batches, totals, first arrival and last finish over batches) give the
    # bytes of one batch, which are json.dumps of the whole object.
    import replay.reports.export as ex

    whole = export(small_run, fmt, tmp_path / "whole").read_bytes()
    monkeypatch.setattr(ex, "EXPORT_BATCH_ROWS", 7)
    assert export(small_run, fmt, tmp_path / "small").read_bytes() == whole
    if fmt == "vllm-bench":
        doc = json.loads(whole)
        assert whole.decode() == json.dumps(doc) + "\n"
        ok = [i for i, e in enumerate(doc["errors"]) if not e]
        itl = [1000.0 * g for i in ok for g in doc["itls"][i]]
        assert doc["mean_itl_ms"] == pytest.approx(sum(itl) / len(itl))
        assert doc["duration"] == pytest.approx(max(doc["latencies"][i] + doc["start_times"][i] for i in ok)
                                                - min(doc["start_times"]))


@pytest.mark.parametrize("fmt", ["vllm-bench", "aiperf"])
@pytest.mark.parametrize("max_chunks", [1, 40, 1000])
def test_batches_bounded_by_chunk_rows_give_the_same_bytes(small_run: Path, tmp_path: Path, monkeypatch, fmt,
                                                           max_chunks) -> None:
    # A batch also stops at EXPORT_BATCH_CHUNKS chunk rows (requests with many chunks: bounded Python
    # lists and JSON text); 1: every request alone, even one with more chunks than the bound.
    import replay.reports.export as ex

    whole = export(small_run, fmt, tmp_path / "whole").read_bytes()
    sizes: list[tuple[int, int]] = []  # (requests, ITL gaps) per batch
    real = ex._with_itl

    def spy(requests, chunks):
        for batch in real(requests, chunks):
            sizes.append((batch.num_rows, len(batch.column("itl_ms").flatten())))
            yield batch

    monkeypatch.setattr(ex, "EXPORT_BATCH_CHUNKS", max_chunks)
    monkeypatch.setattr(ex, "_with_itl", spy)
    assert export(small_run, fmt, tmp_path / "bounded").read_bytes() == whole
    assert sum(n for n, _ in sizes) == 120 and len(sizes) > 1
    assert all(gaps < max_chunks or n == 1 for n, gaps in sizes)  # gaps are chunk rows less one a request
