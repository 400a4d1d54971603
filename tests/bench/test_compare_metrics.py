"""bench.compare: the same metric definitions over our outputs and AISimulate's, checked by hand."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.compare.compare import agreement
from bench.compare.metrics import ours_metrics, peer_metrics
from bench.compare.report import markdown, summary_markdown, table_rows
from replay.engine.output_schema import CHUNK_ROWS_SCHEMA, REQUESTS_SCHEMA, STEPS_SCHEMA


def _write_ours(outdir, requests: list[dict], chunks: list[tuple[str, float, int]]) -> None:
    outdir.mkdir()
    cols = {f.name: [r.get(f.name) for r in requests] for f in REQUESTS_SCHEMA}
    pq.write_table(pa.table(cols, schema=REQUESTS_SCHEMA), outdir / "requests.parquet")
    # chunks.parquet one row per chunk (the layout before runs, which the views still read)
    ids = pa.array([c[0] for c in chunks]).dictionary_encode().cast(CHUNK_ROWS_SCHEMA.field("request_id").type)
    pq.write_table(pa.table({"request_id": ids, "time_ms": [c[1] for c in chunks], "tokens": [c[2] for c in chunks]},
                            schema=CHUNK_ROWS_SCHEMA), outdir / "chunks.parquet")
    pq.write_table(STEPS_SCHEMA.empty_table(), outdir / "steps.parquet")
    (outdir / "run.json").write_text("{}")


def _req(rid, arrival, first, finish, n_in, n_out, cached=0, cpu=0, pre=0, status="finished"):
    return {"request_id": rid, "arrival_ms": arrival, "first_token_ms": first, "finish_ms": finish,
            "ttft_ms": first - arrival, "e2e_ms": finish - arrival, "input_tokens": n_in, "output_tokens": n_out,
            "cached_tokens": cached, "cpu_hit_tokens": cpu, "num_preemptions": pre, "status": status,
            "tpot_ms": (finish - first) / (n_out - 1) if n_out > 1 else None}


@pytest.fixture
def ours_dir(tmp_path):
    # a: 5 tokens as chunks 1+2+2 (MTP) at 100, 130, 160; b: 3 tokens at 50, 60, 80; c: 1 token;
    # d: unfinished (excluded from every figure).
    reqs = [
        _req("a", 0, 100, 160, 1000, 5, cached=400, cpu=100, pre=1),
        _req("b", 10, 50, 80, 500, 3, cached=0),
        _req("c", 20, 70, 70, 500, 1, cached=250),
        _req("d", 30, 90, 95, 700, 4, cached=700, status="unfinished"),
    ]
    chunks = [("a", 100, 1), ("a", 130, 2), ("a", 160, 2), ("b", 50, 1), ("b", 60, 1), ("b", 80, 1),
              ("c", 70, 1), ("d", 90, 1), ("d", 95, 1)]
    _write_ours(tmp_path / "ours", reqs, chunks)
    return tmp_path / "ours"


def test_ours_metrics_by_hand(ours_dir):
    m = ours_metrics(ours_dir)
    assert m["completed_requests"] == 3 and m["total_requests"] == 4
    assert m["ttft_mean_ms"] == pytest.approx((100 + 40 + 50) / 3)
    assert m["ttft_p50_ms"] == pytest.approx(50)
    assert m["ttft_p99_ms"] == pytest.approx(50 + 0.98 * 50)  # numpy linear between 50 and 100
    # chunk gaps: a 30, 30; b 10, 20 -> pooled 90 / 4
    assert m["itl_pooled_chunk_ms"] == pytest.approx(22.5)
    # per-request mean chunk gap: a 30, b 15 -> 22.5
    assert m["itl_request_mean_ms"] == pytest.approx(22.5)
    # token gaps pooled: (60 + 30) / (4 + 2)
    assert m["itl_pooled_token_ms"] == pytest.approx(15.0)
    # TPOT per request: a 60/4 = 15, b 30/2 = 15
    assert m["tpot_mean_ms"] == pytest.approx(15.0)
    assert m["e2e_mean_ms"] == pytest.approx((160 + 70 + 50) / 3)
    assert m["reuse_ratio"] == pytest.approx((400 + 100 + 250) / 2000)
    assert m["reuse_ratio_gpu"] == pytest.approx(650 / 2000)
    assert m["preemptions"] == 1


@pytest.fixture
def peer_dir(tmp_path):
    out = tmp_path / "peer"
    out.mkdir()
    rows = [
        {"terminal_status": "completed", "arrival_time_ms": 0, "first_token_ms": 100, "last_token_ms": 160,
         "ttft_ms": 100, "e2e_latency_ms": 160, "itl_ms": 15.0, "input_length": 1000, "output_length": 5,
         "reused_input_tokens": 700, "first_admission_reused_input_tokens": 500, "readmission_count": 1,
         "first_admission_g1_reused_input_tokens": 400, "first_admission_host_reused_input_tokens": 100},
        {"terminal_status": "completed", "arrival_time_ms": 10, "first_token_ms": 50, "last_token_ms": 80,
         "ttft_ms": 40, "e2e_latency_ms": 70, "itl_ms": 15.0, "input_length": 500, "output_length": 3,
         "reused_input_tokens": 0, "first_admission_reused_input_tokens": 0, "readmission_count": 0,
         "first_admission_g1_reused_input_tokens": 0, "first_admission_host_reused_input_tokens": 0},
        {"terminal_status": "completed", "arrival_time_ms": 20, "first_token_ms": 70, "last_token_ms": 70,
         "ttft_ms": 50, "e2e_latency_ms": 50, "itl_ms": None, "input_length": 500, "output_length": 1,
         "reused_input_tokens": 250, "first_admission_reused_input_tokens": 250, "readmission_count": 0,
         "first_admission_g1_reused_input_tokens": 250, "first_admission_host_reused_input_tokens": 0},
        {"terminal_status": "rejected", "arrival_time_ms": 30, "first_token_ms": None, "last_token_ms": None,
         "ttft_ms": None, "e2e_latency_ms": None, "itl_ms": None, "input_length": 900000, "output_length": 2,
         "reused_input_tokens": 0, "first_admission_reused_input_tokens": 0, "readmission_count": 0},
    ]
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "prediction.json").write_text(json.dumps({"mean_ttft_ms": 63.3, "mean_itl_ms": 15.0, "wall_time_ms": 12.0}))
    return out


def test_peer_metrics_by_hand(peer_dir):
    m = peer_metrics(peer_dir, speculative=True)
    assert m["completed_requests"] == 3 and m["total_requests"] == 4
    assert m["ttft_mean_ms"] == pytest.approx(190 / 3)
    assert m["itl_pooled_token_ms"] == pytest.approx(15.0)
    assert m["itl_request_mean_ms"] == pytest.approx(15.0)
    assert m["itl_pooled_chunk_ms"] is None  # MTP bursts share a timestamp: chunks are not observable
    assert m["reuse_ratio"] == pytest.approx(750 / 2000)
    assert m["reuse_ratio_all_admissions"] == pytest.approx(950 / 2000)
    assert m["reuse_ratio_gpu"] == pytest.approx(650 / 2000)  # the G1 split
    assert m["preemptions"] == 1
    assert m["peer_reported"]["wall_time_ms"] == 12.0
    assert peer_metrics(peer_dir, speculative=False)["itl_pooled_chunk_ms"] == pytest.approx(15.0)


def test_peer_gpu_reuse_without_host_fields(peer_dir):
    path = peer_dir / "requests.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows:
        r.pop("first_admission_g1_reused_input_tokens", None)
        r.pop("first_admission_host_reused_input_tokens", None)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = peer_metrics(peer_dir, speculative=False)
    assert m["reuse_ratio_gpu"] == pytest.approx(m["reuse_ratio"])  # no host tier: all reuse is GPU reuse


def test_same_definitions_give_same_numbers(ours_dir, peer_dir):
    """The two fixtures describe the same requests: every shared-definition metric must agree."""
    o, p = ours_metrics(ours_dir), peer_metrics(peer_dir, speculative=True)
    for key in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_pooled_token_ms", "tpot_mean_ms",
                "e2e_mean_ms", "reuse_ratio", "reuse_ratio_gpu", "completed_requests", "preemptions"):
        assert o[key] == pytest.approx(p[key]), key
    # ...while vLLM's chunk-based ITL differs from the token-pooled one under MTP.
    assert o["itl_pooled_chunk_ms"] > p["itl_pooled_token_ms"]


def test_agreement_targets():
    ours = {"reuse_ratio": 0.060, "ttft_mean_ms": 115.0, "itl_pooled_token_ms": 10.0}
    peer = {"reuse_ratio": 0.052, "ttft_mean_ms": 100.0, "itl_pooled_token_ms": 8.0}
    got = {c["metric"]: c for c in agreement(ours, peer, "roofline")}
    assert got["reuse_ratio"]["ok"] and got["reuse_ratio"]["diff"] == pytest.approx(0.008)
    assert got["ttft_mean_ms"]["ok"] and got["ttft_mean_ms"]["diff"] == pytest.approx(0.15)
    assert not got["itl_pooled_token_ms"]["ok"]  # +25% > 20%
    aic = {c["metric"]: c for c in agreement(ours, peer, "aic")}
    assert not aic["ttft_mean_ms"]["ok"]  # +15% > 10%
    assert all(c["ok"] is None for c in agreement(None, peer, "aic"))


def test_report_renders(ours_dir, peer_dir):
    result = {
        "name": "t", "description": "d", "date_utc": "2026-01-01T00:00:00Z", "machine": {}, "versions": {},
        "trace": {"input": "x", "rows": 4, "notes": ["n1"]}, "config": {"path": "c.yaml"},
        "translation_notes": ["n2"], "timing_backend": "roofline",
        "ours": {"status": "ok", "metrics": ours_metrics(ours_dir), "command": "replay run",
                 "process": {"wall_s": 1.0, "peak_rss_tree_mib": 100.0}},
        "peer": {"status": "ok", "metrics": peer_metrics(peer_dir, speculative=True), "command": "aisimulate",
                 "process": {"wall_s": 4.0, "peak_rss_tree_mib": 200.0}},
        "speed": {"ours_over_peer_wall": 0.25, "peer_over_ours_wall": 4.0, "ours_not_slower": True},
        "agreement": [],
    }
    rows = {r[0]: r for r in table_rows(result)}
    assert rows["wall time, whole process (s)"][1:] == ("1.00", "4.00", "-75.0%")
    assert rows["ITL mean, pooled chunk gaps (ms)"][2] == "-"
    md = markdown(result)
    assert "| TTFT mean (ms) | 63.3 | 63.3 | +0.0% |" in md and "- n1" in md and "- n2" in md
    summary = summary_markdown([result, {"name": "s", "skipped": "why"}])
    assert "| t | 4 | 1.00 | 4.00 | 0.250 |" in summary and "- s: why" in summary
