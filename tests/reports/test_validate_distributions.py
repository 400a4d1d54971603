"""``replay validate`` as distributions: measured vs predicted mean and percentiles per metric and
label, server-side phases from vLLM spans, the terminal CDF chart, files only where ``-o`` says,
and ``replay export --format guidellm`` read back with zero error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from replay.api import run
from replay.cli import app
from replay.ingest import convert
from replay.ingest.detect import detect_format
from replay.reports.export import export
from replay.reports.text_chart import BOTH, MEASURED, PREDICTED, cdf_chart
from replay.reports.validate import compute_validation

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def aiperf_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("aiperf")
    convert(LOGS / "aiperf_profile_export.jsonl", d / "t.parquet", drop_failed=True)
    run(d / "t.parquet", outdir=d / "out")
    return d / "out"


@pytest.fixture(scope="module")
def guidellm_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("guidellm")
    convert(LOGS / "guidellm_v05_benchmarks.json", d / "g.parquet", drop_failed=True)
    run(d / "g.parquet", outdir=d / "out")
    return d / "out"


def _summary(v) -> dict[tuple[str, str], dict]:
    return {(s["metric"], s["grp"]): s for s in v.summary}


def test_distribution_statistics_hand_checked(aiperf_run: Path, tmp_path: Path) -> None:
    """Measurements exactly twice the predictions: every measured statistic is twice the predicted one."""
    exported = export(aiperf_run, "aiperf", tmp_path / "p.jsonl")
    lines = []
    for line in exported.read_text().splitlines():
        rec = json.loads(line)
        for key in ("time_to_first_token", "request_latency"):
            rec["metrics"][key]["value"] *= 2
        lines.append(json.dumps(rec))
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text("\n".join(lines) + "\n")
    v = compute_validation(aiperf_run, measured=doubled)
    ttft = _summary(v)[("ttft", "all")]
    predicted = sorted(w["predicted"] for w in v.worst if w["metric"] == "ttft")
    assert ttft["predicted_q"] == pytest.approx(list(np.percentile(predicted, [50, 90, 99])))
    assert ttft["measured_q"] == pytest.approx([2 * q for q in ttft["predicted_q"]])
    assert ttft["measured_mean"] == pytest.approx(2 * ttft["predicted_mean"])
    # inter_chunk_latency was left as predicted: ITL (each request's mean gap) matches exactly
    itl = _summary(v)[("itl", "all")]
    assert itl["mape_pct"] == pytest.approx(0.0, abs=1e-9) and itl["requests"] == 3


def test_vllm_span_phases_are_compared(tmp_path: Path) -> None:
    convert(LOGS / "vllm_spans_otlp.jsonl", tmp_path / "s.parquet")
    run(tmp_path / "s.parquet", outdir=tmp_path / "out")
    v = compute_validation(tmp_path / "out")
    stats = _summary(v)
    for metric in ("ttft", "tpot", "e2e", "queue", "prefill", "decode"):
        assert stats[(metric, "all")]["requests"] == 3, metric
    pairs = {w["request_id"]: w for w in v.worst if w["metric"] == "queue"}
    assert pairs["cmpl-d4e5f6-0"]["measured"] == pytest.approx(12.1)
    import pyarrow.parquet as pq

    replayed = {r["request_id"]: r for r in pq.read_table(tmp_path / "out" / "requests.parquet").to_pylist()}
    r = replayed["cmpl-d4e5f6-0"]
    assert pairs["cmpl-d4e5f6-0"]["predicted"] == pytest.approx(r["queue_ms"])
    prefill = {w["request_id"]: w["predicted"] for w in v.worst if w["metric"] == "prefill"}
    assert prefill["cmpl-d4e5f6-0"] == pytest.approx(r["first_token_ms"] - r["first_scheduled_ms"])


def test_by_source_run_groups_each_load_level(guidellm_run: Path) -> None:
    v = compute_validation(guidellm_run, by="source_run")
    groups = {s["grp"] for s in v.summary if s["metric"] == "ttft"}
    assert groups == {"concurrent@2", "poisson@8.00"}
    assert _summary(v)[("e2e", "poisson@8.00")]["requests"] == 1  # the incomplete request has no E2E


def test_cli_prints_tables_and_cdfs_and_writes_nothing_without_o(guidellm_run: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "here"
    cwd.mkdir()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, ["validate", str(guidellm_run), "--by", "source_run"])
    finally:
        os.chdir(old)
    assert res.exit_code == 0, res.output
    assert list(cwd.iterdir()) == []  # no validate.md, no validate_files/
    assert "concurrent@2" in res.output and "p99" in res.output and "err %" in res.output
    assert "TTFT (ms): CDF, * measured (4), o predicted (4)" in res.output
    md = tmp_path / "v.md"
    res = CliRunner().invoke(app, ["validate", str(guidellm_run), "-o", str(md)])
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "| TTFT (ms) | 4 |" in text and "| p99 |" in text and "```text" in text
    assert (tmp_path / "v_files").is_dir()


def test_text_cdf_chart() -> None:
    same = cdf_chart("TTFT", "ms", [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    plot = "".join(line.split("|", 1)[1] for line in same.splitlines()[1:-2])
    assert BOTH in plot and MEASURED not in plot and PREDICTED not in plot  # the curves coincide
    apart = cdf_chart("TTFT", "ms", [1.0, 1.1, 1.2], [3.0, 3.1, 3.2])
    plot = "".join(line.split("|", 1)[1] for line in apart.splitlines()[1:-2])
    assert MEASURED in plot and PREDICTED in plot
    # measured reaches 1.0 before predicted leaves 0; both end at 1.0 in the last column
    top, bottom = apart.splitlines()[1].split("|", 1)[1], apart.splitlines()[11].split("|", 1)[1]
    assert MEASURED in top and top.rstrip().endswith(BOTH) and bottom.startswith(PREDICTED)
    assert apart == cdf_chart("TTFT", "ms", [1.2, 1.0, 1.1], [3.2, 3.0, 3.1])  # deterministic, order-free
    assert "log x" in cdf_chart("E2E", "ms", [1.0, 10.0], [100.0, 1000.0])


def test_export_guidellm_round_trip(guidellm_run: Path, tmp_path: Path) -> None:
    out = export(guidellm_run, "guidellm", tmp_path / "benchmarks.json")
    assert detect_format(out) == "guidellm"
    doc = json.loads(out.read_text())
    assert [b["config"]["strategy"] for b in doc["benchmarks"]] == [
        {"type_": "concurrent", "streams": 2}, {"type_": "poisson", "rate": 8.0}]
    v = compute_validation(guidellm_run, measured=out, by="source_run")
    assert v.coverage["matched"] == 4
    for s in v.summary:
        if s["metric"] != "cached_tokens":
            assert s["abs_error_max"] < 1e-3, s  # epoch seconds in float64: about 1e-4 ms of noise
    second = export(guidellm_run, "guidellm", tmp_path / "again.json")
    assert second.read_bytes() == out.read_bytes()


def test_pooled_itl_gaps_round_trip(aiperf_run: Path, tmp_path: Path) -> None:
    """Every gap pooled (vLLM's ITL): an export read back has the same pooled distribution, and the
    count is every chunk after each request's first."""
    import pyarrow.parquet as pq

    exported = export(aiperf_run, "vllm-bench", tmp_path / "b.json")
    v = compute_validation(aiperf_run, measured=exported)
    gaps = _summary(v)[("itl_gaps", "all")]
    runs = pq.read_table(aiperf_run / "chunks.parquet").to_pylist()  # one row per run of chunks
    per_request: dict[int, int] = {}
    for chunk_run in runs:
        per_request[chunk_run["request"]] = per_request.get(chunk_run["request"], 0) + chunk_run["num_steps"]
    assert gaps["requests"] == gaps["predicted_gaps"] == sum(n - 1 for n in per_request.values())
    assert gaps["measured_q"] == pytest.approx(gaps["predicted_q"], abs=1e-9)
    assert gaps["mape_pct"] is None and v.samples["itl_gaps"]["counts"] == [gaps["requests"]] * 2
    assert "itl_gaps" not in {w["metric"] for w in v.worst}


def test_sweep_with_concurrency_levels_is_stated(guidellm_run: Path) -> None:
    v = compute_validation(guidellm_run)
    assert any("the log holds 2 benchmarks; in concurrent@2 the client kept a concurrency limit" in d
               for d in v.differences)


def test_guidellm_export_of_one_token_requests_reads_back(tmp_path: Path) -> None:
    """A one-token request's first token and end are the same instant: the export writes the very
    same double for both (it wrote the end one ulp before the first token, which ingest refused)."""
    from tests.sweep_helpers import write_canonical

    rows = [{"request_id": f"r{i}", "arrival_ms": 37 * i + 0.3 * i, "input_tokens": 100 + 7 * i,
             "output_tokens": 1 if i % 3 == 0 else 5, "hash_ids": [1000 * i + j for j in range(-(-(100 + 7 * i) // 16))]}
            for i in range(60)]
    trace = write_canonical(rows, tmp_path / "t.parquet")
    out = run(trace, None, outdir=tmp_path / "run", progress=False).outdir
    exported = export(out, "guidellm", tmp_path / "g.json")
    convert(exported, tmp_path / "g.parquet", drop_failed=True)
    v = compute_validation(out, measured=exported)
    assert v.coverage["matched"] == 60


def test_guidellm_itl_is_the_gap_between_streamed_chunks_under_mtp(tmp_path: Path) -> None:
    """With speculative decoding an iteration streams several tokens: the measured ITL read from a
    GuideLLM export is the gap between its token iterations, as the replay predicts it (per token it
    was 175% off a run validated against its own export)."""
    from tests.sweep_helpers import write_canonical

    rows = [{"request_id": f"r{i}", "arrival_ms": 50 * i, "input_tokens": 64, "output_tokens": 40,
             "hash_ids": [100 * i + j for j in range(4)]} for i in range(40)]
    trace = write_canonical(rows, tmp_path / "t.parquet")
    out = run(trace, None, outdir=tmp_path / "run", progress=False,
              overrides=["speculative.method=mtp", "speculative.num_speculative_tokens=2",
                         "speculative.expected_accepted_tokens=1.4", "speculative.drafter=synthetic"]).outdir
    exported = export(out, "guidellm", tmp_path / "g.json")
    v = compute_validation(out, measured=exported)
    itl = [s for s in v.summary if s["metric"] == "itl"]
    assert itl and itl[0]["abs_error_max"] < 1e-6, itl
