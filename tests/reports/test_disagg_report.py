"""The report and the diff of a disaggregated run: the pools, the KV reads, TTFT by where it went."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from replay.engine import pd_run
from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.reports.diff import diff_runs, render_diff
from replay.reports.report import write_report
from tests.engine_helpers import FixedTimer, make_trace, setup_for


def _rows():
    return [dict(arrival_ms=40 * i, input_tokens=160 + 16 * (i % 3), output_tokens=4,
                 hash_ids=list(range(100 * i, 100 * i + 10 + i % 3))) for i in range(12)]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    timer = FixedTimer(ms=10.0, per_token_ms=0.01)
    monkeypatch.setattr(pd_run, "resolve_setup", lambda cfg: setup_for(500, timer))
    table, meta = make_trace(_rows())
    pd_cfg = {"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 2},
                        "kv_transfer": {"bandwidth_gb_per_s": 1e-2, "latency_ms": 1.0, "bytes_per_token": 1000}}}
    agg_cfg = {"fleet": {"replicas": 3}}
    out = {}
    for name, data in (("agg", agg_cfg), ("pd", pd_cfg)):
        out[name] = tmp_path / name
        replay_trace(table, meta, EngineConfig.model_validate(data), out[name], setup=setup_for(500, timer))
    return out


def test_report_has_the_pools_the_reads_and_the_ttft_breakdown(runs, tmp_path):
    md = tmp_path / "r.md"
    write_report(runs["pd"], md, charts=False)
    text = md.read_text()
    section = text[text.index("## Disaggregation"):]
    assert "| prefill | 1 x 1 | 1 |" in section and "| decode | 2 x 1 | 2 |" in section
    assert "12 requests prefilled on the prefill pool, 0 on their decode replica" in section
    reqs = pd.read_parquet(runs["pd"] / "requests.parquet")
    parts = {}
    for label in ("queued for prefill", "prefill (prefill replica's steps)", "KV read", "TTFT",
                  "decode replica's first step", "decode replica admission (its step boundary, free blocks)"):
        row = re.search(r"\| " + re.escape(label) + r" \| ([0-9.,]+) \|", section)
        assert row, label
        parts[label] = float(row.group(1).replace(",", ""))
    assert parts["TTFT"] == pytest.approx(reqs.ttft_ms.mean(), abs=0.01)
    assert parts["KV read"] == pytest.approx((reqs.kv_transfer_end_ms - reqs.kv_transfer_start_ms).mean(), abs=0.01)
    assert sum(v for k, v in parts.items() if k != "TTFT") == pytest.approx(parts["TTFT"], abs=0.05)
    # The fleet table lists the decode replicas only (the pool requests finish on).
    fleet = text[text.index("## Fleet"):text.index("## Disaggregation")]
    assert "2 replicas" in fleet and fleet.count("\n| 0 |") == 1 and fleet.count("\n| 2 |") == 0


def test_diff_of_aggregated_and_disaggregated_names_the_shapes(runs, tmp_path):
    text = render_diff(diff_runs(runs["agg"], runs["pd"]), {})
    assert "| serving **(differs)** | aggregated | disaggregated: 1 prefill x TP1 + 2 decode x TP1 |" in text
    assert "| GPUs (replicas x TP) | 3 | 3 |" in text
