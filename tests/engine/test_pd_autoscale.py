"""Autoscaled pools of a disaggregated fleet: hand-checked scenarios with a fixed step time."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replay.base.errors import ConfigError
from replay.engine.config import validate_config
from replay.engine.slo_capacity import ReplicaCapacity
from tests.engine.test_disagg import _replay
from tests.engine_helpers import FixedTimer

STEP_S = 55.0  # the arrival rate quadruples here, between two decisions (every 10 s)

# Every step lasts 100 ms. A prefill replica takes one request per step (max_num_seqs 1): 10/s.
# A decode replica holds a request for its 12 output tokens (1.2 s) among 64 seats: 53/s, and at
# 20/s it uses about 24 requests x 2 blocks of its 1000: 5% KV usage, far below the 70% target.
PREFILL_SCALING = {"min_replicas": 1, "max_replicas": 4, "policy": "queue", "target": 2.0, "interval_s": 10.0,
                   "scale_up_delay_s": 20.0, "scale_down_delay_s": 30.0}
DECODE_SCALING = {"min_replicas": 1, "max_replicas": 4, "policy": "kv_usage", "interval_s": 10.0,
                  "scale_up_delay_s": 20.0, "scale_down_delay_s": 30.0}


def _step_rows(until_s: float = 120.0) -> list[dict]:
    """5 requests/s until STEP_S, then 20/s, evenly spaced; distinct prompts (no prefix hits)."""
    rows, t, i = [], 0.0, 0
    while t < until_s * 1000.0:
        rows.append({"arrival_ms": int(round(t)), "input_tokens": 16, "output_tokens": 12, "hash_ids": [i]})
        t += 200.0 if t < STEP_S * 1000.0 else 50.0
        i += 1
    return rows


def _fleet(**fleet) -> dict:
    return {"scheduler": {"max_num_seqs": 64},
            "fleet": {"mode": "disaggregated", "router": "least_loaded", "prefill_router": "least_loaded",
                      "kv_transfer": {"bandwidth_gb_per_s": float("inf")}, **fleet}}


def test_a_rate_step_on_the_prefill_pool_adds_prefill_replicas_after_one_interval_plus_the_delay(
        tmp_path, monkeypatch):
    data = _fleet(prefill={"scheduler": {"max_num_seqs": 1}, "autoscale": PREFILL_SCALING, "gpu_cost_per_hour": 3.0},
                  decode={"autoscale": DECODE_SCALING}, gpu_cost_per_hour=2.0)
    reqs, _, steps, info = _replay(_step_rows(), tmp_path, data, monkeypatch, timer=FixedTimer(ms=100.0))
    scaling = pd.read_parquet(tmp_path / "out" / "scaling.parquet")
    pre = scaling[scaling["pool"] == "prefill"]
    dec = scaling[scaling["pool"] == "decode"]
    assert len(pre) == len(dec) and len(pre) >= 12  # one decision per pool every 10 s
    # Before the step one prefill replica keeps up (5/s of its 10/s): nothing moves.
    assert (pre[pre.time_ms < STEP_S * 1000].live == 1).all()
    assert (pre[pre.time_ms < STEP_S * 1000].desired == 1).all()
    # The first decision after the step (60 s) sees the prefill queue and starts replicas, which
    # join 20 s later: no request is prefilled elsewhere before 80 s.
    lives = info["scaling"]["pools"]["prefill"]["replicas"]
    joined = sorted(lf["joined_ms"] for lf in lives if lf["started_ms"] > 0)
    assert joined and joined[0] == 60_000.0 + 20_000.0
    assert min(lf["started_ms"] for lf in lives if lf["started_ms"] > 0) == 60_000.0
    assert (reqs[reqs.arrival_ms < joined[0]].prefill_replica == 0).all()
    assert (reqs[reqs.arrival_ms >= joined[0]].prefill_replica != 0).any()
    first_step = steps[(steps.pool == "prefill") & (steps.replica != 0)].start_ms.min()
    assert first_step >= joined[0]
    # The decode pool's KV usage stays far below its target: it never changes.
    assert (dec.live == 1).all() and (dec.desired == 1).all() and (dec.provisioning == 0).all()
    assert dec.kv_usage.max() < 0.2
    assert len(info["scaling"]["pools"]["decode"]["replicas"]) == 1
    assert (reqs.decode_replica == 0).all()
    assert (reqs.status == "finished").all()
    # Cost per pool: the decode pool held its one replica (one GPU) for the whole replay at the
    # fleet's price; the prefill pool its lives at its own price.
    span_h = info["cost"]["pools"]["decode"]["replica_hours"]
    assert span_h == pytest.approx(reqs.finish_ms.max() / 3.6e6)
    prefill_h = sum(lf["hours"] for lf in lives)
    assert info["cost"]["pools"]["prefill"]["replica_hours"] == pytest.approx(prefill_h)
    assert info["cost"]["pools"]["prefill"]["cost"] == pytest.approx(prefill_h * 3.0)
    assert info["cost"]["pools"]["decode"]["cost"] == pytest.approx(span_h * 2.0)
    assert info["cost"]["cost"] == pytest.approx(prefill_h * 3.0 + span_h * 2.0)
    assert info["pools"]["prefill"]["replicas"] == 4


def test_a_draining_prefill_replica_retires_only_when_the_decode_side_has_read_its_blocks(tmp_path, monkeypatch):
    """Two prefill replicas, two requests at t = 0 (one each, round robin), a slow link: each read
    of 7 blocks x 16 tokens x 128 KiB takes about 4.9 s. The first decision (1 s) sees no queue and
    drains prefill replica 1 (the newest; both joined at 0, the higher id first); it holds r1's
    blocks until its read completes, and retires then, not before."""
    rows = [dict(arrival_ms=0, input_tokens=100, output_tokens=3, hash_ids=list(range(1, 8))),
            dict(arrival_ms=0, input_tokens=100, output_tokens=3, hash_ids=list(range(11, 18)))]
    scaling = {"min_replicas": 1, "max_replicas": 2, "policy": "queue", "interval_s": 1.0,
               "scale_up_delay_s": 0.0, "scale_down_delay_s": 0.0}
    data = {"fleet": {"mode": "disaggregated", "prefill": {"replicas": 2, "autoscale": scaling},
                      "decode": {"replicas": 2}, "router": "round_robin",
                      "kv_transfer": {"bandwidth_gb_per_s": 0.003}}}
    reqs, _, _, info = _replay(rows, tmp_path, data, monkeypatch)
    r1 = reqs.loc["r1"]
    assert r1.prefill_replica == 1 and r1.prefill_end_ms == pytest.approx(10.0)
    assert r1.kv_transfer_end_ms > 4000.0
    lives = {lf["replica"]: lf for lf in info["scaling"]["pools"]["prefill"]["replicas"]}
    assert lives[1]["drain_ms"] == 1000.0
    assert lives[1]["state"] == "retired"
    assert lives[1]["ended_ms"] == pytest.approx(r1.kv_transfer_end_ms)
    assert lives[0]["state"] == "live"


def test_pool_slo_capacity_prefill_on_ttft_decode_on_itl():
    """A prefill replica (10 ms + 0.01 ms per token) at a 1 s TTFT: one step per 8192-token budget
    of prompts; a decode replica at a 50 ms ITL: bounded by max_num_seqs alone with a fixed step."""
    timer = FixedTimer(ms=10.0)
    prefill = ReplicaCapacity(timer, max_num_batched_tokens=8192, max_num_seqs=4, kv_tokens=10**6,
                              ttft_ms=1000.0, tpot_ms=None, role="prefill")
    decode = ReplicaCapacity(timer, max_num_batched_tokens=8192, max_num_seqs=4, kv_tokens=10**6,
                             ttft_ms=None, tpot_ms=50.0, role="decode")
    # Prefill: 1000-token prompts, 8192 tokens per 10 ms step: 819.2 prompts/s at most (the budget).
    assert prefill.requests_per_s(1000, 100) == pytest.approx(819.2, rel=1e-3)
    # Decode: 4 seats, each request decodes 100 tokens at 10 ms: 4 / 1 s = 4 requests/s.
    assert decode.requests_per_s(1000, 100) == pytest.approx(4.0, rel=1e-3)


@pytest.mark.parametrize("pool,scaling,key", [
    ("prefill", {"min_replicas": 3, "max_replicas": 2}, "min_replicas (3) is greater than max_replicas"),
    ("prefill", {"max_replicas": 2, "policy": "slo", "tpot_ms": 50}, "for ttft_ms only"),
    ("decode", {"max_replicas": 2, "policy": "slo", "ttft_ms": 500}, "for tpot_ms only"),
    ("decode", {"max_replicas": 2, "scale_up_delay_s": -1}, "fleet.decode.autoscale.scale_up_delay_s"),
])
def test_bad_pool_autoscale_configs_name_the_key(pool, scaling, key):
    data = {"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}}
    data["fleet"][pool] = {"autoscale": scaling}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "cfg.yaml")
    assert key in str(err.value)


def test_fleet_autoscale_on_a_disaggregated_fleet_points_to_the_pools():
    data = {"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                      "autoscale": {"max_replicas": 2}}}
    with pytest.raises(ConfigError, match="fleet.prefill.autoscale"):
        validate_config(data, "cfg.yaml")


def test_autoscaled_pools_are_deterministic(tmp_path, monkeypatch):
    data = _fleet(prefill={"scheduler": {"max_num_seqs": 1}, "autoscale": PREFILL_SCALING},
                  decode={"replicas": 1})
    rows = _step_rows(90.0)
    a = _replay(rows, tmp_path, data, monkeypatch, timer=FixedTimer(ms=100.0), name="a")
    b = _replay(rows, tmp_path, data, monkeypatch, timer=FixedTimer(ms=100.0), name="b")
    for name in ("requests.parquet", "steps.parquet", "scaling.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert json.dumps(a[3]["scaling"]) == json.dumps(b[3]["scaling"])


def test_the_report_shows_the_fleet_over_time_per_pool(tmp_path, monkeypatch):
    from replay.reports.report import write_report
    from replay.reports.slo import parse_slo

    data = _fleet(prefill={"scheduler": {"max_num_seqs": 1}, "autoscale": PREFILL_SCALING},
                  decode={"autoscale": DECODE_SCALING}, gpu_cost_per_hour=2.0)
    _replay(_step_rows(90.0), tmp_path, data, monkeypatch, timer=FixedTimer(ms=100.0))
    result = write_report(tmp_path / "out", tmp_path / "r.md", slo=parse_slo("ttft=1000,window=10"))
    text = (tmp_path / "r.md").read_text()
    section = text[text.index("## Fleet over time"):]
    assert "- prefill pool:" in section and "- decode pool:" in section
    assert "Autoscaling of the prefill pool:" in section and "Autoscaling of the decode pool:" in section
    assert result.charts["fleet_over_time"].is_file()


def test_run_json_counts_every_engine_that_served_and_no_empty_slot(tmp_path, monkeypatch):
    data = _fleet(prefill={"scheduler": {"max_num_seqs": 1}, "autoscale": PREFILL_SCALING},
                  decode={"autoscale": DECODE_SCALING})
    reqs, _, steps, info = _replay(_step_rows(90.0), tmp_path, data, monkeypatch, timer=FixedTimer(ms=100.0))
    # The decode pool kept its one replica: one row, though it has 8 slots; it served every request.
    assert [r["replica"] for r in info["fleet"]["per_replica"]] == [0]
    assert info["fleet"]["per_replica"][0]["requests"] == len(reqs)
    assert info["totals"]["steps"] == len(steps)
