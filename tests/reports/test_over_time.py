"""The fleet over time in reports: GPU-hours, refusals, SLO attainment per window, diff side by side."""

from __future__ import annotations

import pytest

from replay.base.errors import ReplayError
from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.reports.diff import diff_runs, render_diff
from replay.reports.metrics import compute
from replay.reports.report import write_report
from replay.reports.slo import parse_slo
from replay.reports.views import open_run
from tests.engine_helpers import FixedTimer, make_trace, setup_for


def _rows() -> list[dict]:
    # 10/s for 30 s, then 40/s for 30 s: one replica of 4 seats (120 ms a request) cannot keep up.
    rows, t = [], 0.0
    while t < 60_000.0:
        rows.append({"arrival_ms": int(t), "input_tokens": 16, "output_tokens": 12})
        t += 100.0 if t < 30_000.0 else 25.0
    return rows


def _run(tmp_path, name: str, fleet: dict):
    table, meta = make_trace(_rows(), hash_block_size=None)
    cfg = EngineConfig.model_validate({"scheduler": {"max_num_seqs": 4}, "fleet": fleet})
    replay_trace(table, meta, cfg, tmp_path / name, setup=setup_for(2000, FixedTimer(10.0)))
    return tmp_path / name


AUTO = {"router": "least_loaded", "gpu_cost_per_hour": 4.0, "admission": {"max_waiting_per_replica": 30},
        "autoscale": {"max_replicas": 3, "target": 2.0, "interval_s": 5.0, "scale_up_delay_s": 10.0}}


def test_slo_window_and_goal_parse():
    slo = parse_slo("ttft=200,window=60,goal=0.9")
    assert (slo.ttft, slo.window_s, slo.goal) == (200.0, 60.0, 0.9)
    assert slo.as_dict() == {"ttft": 200.0}
    with pytest.raises(ReplayError, match="goal is a fraction"):
        parse_slo("ttft=200,goal=2")


def test_attainment_per_window_counts_refusals_as_misses(tmp_path):
    out = _run(tmp_path, "auto", AUTO)
    run = open_run(out)
    try:
        m = compute(run, parse_slo("ttft=100,window=10,goal=0.9"))
        reqs = run.con.execute("SELECT arrival_ms, status, ttft_ms FROM requests").fetchall()
    finally:
        run.con.close()
    o = m.over_time
    assert o is not None and len(o["windows"]) == 6
    for w in o["windows"]:
        mine = [r for r in reqs if w["window_index"] * 10_000 <= r[0] < (w["window_index"] + 1) * 10_000]
        good = sum(1 for r in mine if r[1] == "finished" and r[2] <= 100)
        assert (w["requests"], w["good"]) == (len(mine), good)
        assert w["rejected"] == sum(1 for r in mine if r[1] == "rejected")
    assert o["windows_met"] == sum(1 for w in o["windows"] if w["attainment"] >= 0.9)
    assert o["windows"][0]["attainment"] == 1.0 and o["windows_met"] < 6
    assert sum(w["rejected"] for w in o["windows"]) == sum(r["requests"] for r in o["refused"]) > 0
    assert o["cost"]["cost"] == pytest.approx(4.0 * o["cost"]["gpu_hours"])
    assert o["timeline"] and {"live", "waiting", "desired"} <= set(o["timeline"][0])


def test_report_and_diff_show_gpu_hours_and_attainment_side_by_side(tmp_path):
    auto = _run(tmp_path, "auto", AUTO)
    static = _run(tmp_path, "static", {"router": "least_loaded", "replicas": 3, "gpu_cost_per_hour": 4.0})
    slo = parse_slo("ttft=100,window=10")
    result = write_report(auto, tmp_path / "r.md", slo=slo)
    text = (tmp_path / "r.md").read_text()
    assert "## Fleet over time" in text and "GPU-hours" in text and "admission: every live replica" in text
    assert "fleet_over_time" in result.charts and result.charts["fleet_over_time"].is_file()
    d = diff_runs(static, auto, slo=slo, names=("static", "autoscaled"))
    md = render_diff(d, {})
    section = md[md.index("## GPU-hours and SLO attainment"):md.index("## Verdict")]
    assert "| GPU-hours |" in section and "| windows meeting the SLO |" in section
    assert "| refused requests | 0 |" in section
