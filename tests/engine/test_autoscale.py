"""Autoscaling and admission control: hand-checked scenarios on tiny traces with a fixed step time."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from replay.base.errors import ConfigError
from replay.engine.autoscale import Autoscaler, LoadPredictor, QueuePolicy, ScalingSignals, build_policy
from replay.engine.config import EngineConfig, validate_config
from replay.engine.run import replay_trace
from replay.engine.scaling_config import AutoscaleConfig
from replay.engine.slo_capacity import ReplicaCapacity
from tests.engine_helpers import FixedTimer, make_trace, setup_for

# One replica runs at most 4 requests at once; a request (16 prompt tokens, 12 output tokens) holds
# a seat for 12 steps of 10 ms (the prefill step emits its first token): a replica serves
# 4 / 0.12 s = 33 requests/s, so 20/s leaves it idle 40% of the time and 40/s overloads it.
BASE = {"scheduler": {"max_num_seqs": 4}}
STEP_S = 55.0  # the rate doubles here, between two decisions (every 10 s)


def _step_rows(until_s: float = 120.0) -> list[dict]:
    """20 requests/s until STEP_S, then 40/s: evenly spaced, so every figure is checkable."""
    rows, t = [], 0.0
    while t < until_s * 1000.0:
        rows.append({"arrival_ms": int(round(t)), "input_tokens": 16, "output_tokens": 12})
        t += 50.0 if t < STEP_S * 1000.0 else 25.0
    return rows


def _run(tmp_path, rows, config: dict, name: str = "out"):
    table, meta = make_trace(rows, hash_block_size=None)
    cfg = EngineConfig.model_validate({**BASE, **config})
    out = tmp_path / name
    info = replay_trace(table, meta, cfg, out, setup=setup_for(2000, FixedTimer(10.0)), check_invariants=True).run_info
    reqs = pd.read_parquet(out / "requests.parquet")
    scaling = pd.read_parquet(out / "scaling.parquet") if (out / "scaling.parquet").exists() else None
    return reqs, scaling, info


AUTOSCALE = {"min_replicas": 1, "max_replicas": 4, "policy": "queue", "target": 2.0, "interval_s": 10.0,
             "scale_up_delay_s": 20.0, "scale_down_delay_s": 30.0}


def test_a_rate_step_adds_replicas_after_one_interval_plus_the_delay_and_ttft_recovers(tmp_path):
    reqs, scaling, info = _run(tmp_path, _step_rows(), {"fleet": {"router": "least_loaded", "autoscale": AUTOSCALE}})
    lives = info["scaling"]["replicas"]
    joined = sorted(lf["joined_ms"] for lf in lives if lf["replica"] != 0 or lf["started_ms"] > 0)
    # Nothing moves before the step: one replica keeps up with 20/s, its queue stays empty.
    assert (scaling[scaling.time_ms < STEP_S * 1000].live == 1).all()
    assert (scaling[scaling.time_ms < STEP_S * 1000].desired == 1).all()
    # The first decision after the step (t = 60 s) sees the queue and starts replicas; they join
    # scale_up_delay_s later, empty: not one request runs elsewhere before then.
    first_decision = math.ceil(STEP_S / 10.0) * 10.0 * 1000.0
    assert joined and joined[0] == first_decision + 20_000.0
    assert joined[0] <= STEP_S * 1000 + 10_000 + 20_000  # within one interval plus the delay
    assert (reqs[reqs.arrival_ms < joined[0]].replica == 0).all()
    assert (reqs[reqs.arrival_ms >= joined[0]].replica != 0).any()
    # p99 TTFT per 10 s window: before the step, one step's worth; it recovers to within 2x of that
    # within 3 intervals of the join (the queue built while provisioning drains first).
    reqs["window"] = (reqs.arrival_ms // 10_000).astype(int)
    p99 = reqs.groupby("window").ttft_ms.quantile(0.99)
    before = p99[p99.index < STEP_S // 10].max()
    during = p99[(p99.index >= STEP_S // 10 + 1) & (p99.index < joined[0] // 10_000)]
    assert during.min() > 10 * before  # the SLO is missed while the new replicas boot
    recovered = [w for w in p99.index if w * 10_000 >= joined[0] and p99[w] <= 2 * before]
    assert recovered and recovered[0] * 10_000 <= joined[0] + 3 * 10_000
    assert (reqs.status == "finished").all()


def test_static_at_max_pays_more_gpu_hours_than_the_autoscaled_fleet(tmp_path):
    rows = _step_rows()
    _, _, auto = _run(tmp_path, rows, {"fleet": {"router": "least_loaded", "autoscale": AUTOSCALE,
                                                 "gpu_cost_per_hour": 2.0}}, "auto")
    _, _, static = _run(tmp_path, rows, {"fleet": {"router": "least_loaded", "replicas": 4,
                                                   "gpu_cost_per_hour": 2.0}}, "static")
    assert static["cost"]["gpu_hours"] == pytest.approx(4 * static["simulated_span_ms"] / 3.6e6)
    assert auto["cost"]["gpu_hours"] < static["cost"]["gpu_hours"]
    assert auto["cost"]["cost"] == pytest.approx(2.0 * auto["cost"]["gpu_hours"])
    # Billing: every life from its start to its end, or to the end of the replay.
    span = auto["simulated_span_ms"]
    held = sum((lf["ended_ms"] if lf["ended_ms"] is not None else span) - lf["started_ms"]
               for lf in auto["scaling"]["replicas"])
    assert auto["cost"]["replica_hours"] == pytest.approx(held / 3.6e6)


def test_scale_down_drains_the_newest_replica_which_gets_nothing_new_and_finishes_what_it_holds(tmp_path):
    # A burst, then a trickle: the fleet grows, then drains back to one replica.
    rows = [{"arrival_ms": i * 10, "input_tokens": 16, "output_tokens": 10} for i in range(2000)]
    rows += [{"arrival_ms": 20_000 + i * 500, "input_tokens": 16, "output_tokens": 10} for i in range(200)]
    cfg = dict(AUTOSCALE, scale_up_delay_s=5.0, scale_down_delay_s=10.0, interval_s=5.0)
    reqs, scaling, info = _run(tmp_path, rows, {"fleet": {"router": "round_robin", "autoscale": cfg}})
    lives = info["scaling"]["replicas"]
    drained = [lf for lf in lives if lf["drain_ms"] is not None]
    assert drained and all(lf["state"] == "retired" for lf in drained)
    for lf in drained:
        mine = reqs[reqs.replica == lf["replica"]]
        mine = mine[(mine.arrival_ms >= lf["joined_ms"])]
        assert (mine.arrival_ms <= lf["drain_ms"]).all()  # the router stopped sending at the drain
        assert (mine.finish_ms <= lf["ended_ms"]).all()  # it retired once empty
        assert (mine.finish_ms == lf["ended_ms"]).any() or lf["ended_ms"] == lf["drain_ms"]
    # Drains go newest first: a replica that joined later never outlives an earlier one's drain.
    order = sorted(drained, key=lambda lf: lf["drain_ms"])
    assert order[0]["joined_ms"] >= max(lf["joined_ms"] for lf in order if lf["drain_ms"] == order[0]["drain_ms"])
    assert scaling.live.iloc[-1] == 1
    assert (reqs.status == "finished").all()
    # run.json's per-replica rows: one per id, however many engines served under it.
    rows = info["fleet"]["per_replica"]
    assert len({r["replica"] for r in rows}) == len(rows)
    assert sum(r["requests"] for r in rows) == len(reqs)
    assert sum(r["steps"] for r in rows) == info["totals"]["steps"]


def test_a_replica_joins_with_a_cold_cache(tmp_path):
    # Every request shares one long prefix: the first replica caches it; a joining replica must
    # compute it once itself (no hit on its first request), then hit.
    rows = [{"arrival_ms": i * 5, "input_tokens": 64, "output_tokens": 10, "hash_ids": [1, 2, 3, 4]}
            for i in range(3000)]
    table, meta = make_trace(rows, hash_block_size=16)
    cfg = EngineConfig.model_validate({**BASE, "fleet": {"router": "round_robin",
                                                         "autoscale": dict(AUTOSCALE, interval_s=2.0,
                                                                           scale_up_delay_s=3.0)}})
    replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(2000, FixedTimer(10.0)), check_invariants=True)
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet").sort_values("first_scheduled_ms", kind="stable")
    others = [r for r in sorted(reqs.replica.unique()) if r != 0]
    assert others
    for rid in others:
        first = reqs[reqs.replica == rid].iloc[0]
        assert first.cached_tokens == 0
        assert (reqs[reqs.replica == rid].cached_tokens > 0).any()


def test_autoscaled_runs_are_deterministic(tmp_path):
    rows = _step_rows(80.0)
    config = {"fleet": {"router": "kv_aware", "autoscale": AUTOSCALE, "admission": {"max_waiting_per_replica": 8}}}
    _run(tmp_path, rows, config, "a")
    _run(tmp_path, rows, config, "b")
    _run(tmp_path, rows, {**config, "seed": 7}, "c")
    _run(tmp_path, rows, {**config, "seed": 7}, "d")
    for f in ("requests.parquet", "steps.parquet", "chunks.parquet", "scaling.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
        assert (tmp_path / "c" / f).read_bytes() == (tmp_path / "d" / f).read_bytes(), f


@pytest.mark.parametrize("router", ["round_robin", "random", "session_affinity", "least_loaded", "kv_aware",
                                    "prefix_score"])
def test_every_router_sends_requests_only_to_live_replicas(tmp_path, router):
    rows = _step_rows(90.0)
    for i, r in enumerate(rows):
        r["session_id"] = f"s{i % 37}"
        r["hash_ids"] = [i % 37, 1000 + i]
    table, meta = make_trace(rows, hash_block_size=16)
    cfg = EngineConfig.model_validate({**BASE, "fleet": {"router": router, "autoscale": dict(
        AUTOSCALE, scale_down_delay_s=5.0, interval_s=5.0, scale_up_delay_s=5.0)}})
    info = replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(2000, FixedTimer(10.0))).run_info
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    lives = info["scaling"]["replicas"]
    assert len(lives) > 1
    for row in reqs.itertuples():
        serving = [lf for lf in lives if lf["replica"] == row.replica and lf["joined_ms"] is not None
                   and lf["joined_ms"] <= row.arrival_ms
                   and (lf["drain_ms"] is None or row.arrival_ms <= lf["drain_ms"])  # arrivals before
                   and (lf["ended_ms"] is None or row.arrival_ms <= lf["ended_ms"])]  # a decision at one instant
        assert serving, (row.request_id, row.replica, row.arrival_ms)


def test_token_bucket_admits_the_burst_then_the_rate(tmp_path):
    # 10 requests at t=0, then one every 100 ms: burst 3, 5/s -> the first 3, then one every 200 ms.
    rows = [{"arrival_ms": 0, "input_tokens": 16, "output_tokens": 2} for _ in range(10)]
    rows += [{"arrival_ms": 100 * (i + 1), "input_tokens": 16, "output_tokens": 2} for i in range(10)]
    reqs, _, info = _run(tmp_path, rows, {"fleet": {"replicas": 2, "admission": {"rate": 5.0, "burst": 3}}})
    admitted = reqs[reqs.status == "finished"]
    assert list(admitted.arrival_ms) == [0, 0, 0, 200, 400, 600, 800, 1000]
    refused = reqs[reqs.status == "rejected"]
    assert set(refused.reject_reason) == {"admission: rate limit 5/s, burst 3"}
    assert info["totals"]["rejected"] == 12
    assert info["scaling"]["refused"] == {"admission: rate limit 5/s, burst 3": 12}
    assert refused.replica.isna().all()


def test_waiting_bound_refuses_only_when_every_replica_is_full(tmp_path):
    # Two replicas of 4 running seats each and a bound of 2 waiting: 20 requests at once -> 4 + 2
    # per replica are admitted (routing happens at the arrival instant: nothing runs yet, so all
    # admitted ones wait: 2 x (0..2) waiting, then refused), i.e. exactly 4 admitted of 20.
    rows = [{"arrival_ms": 0, "input_tokens": 16, "output_tokens": 5} for _ in range(20)]
    reqs, _, _ = _run(tmp_path, rows, {"fleet": {"replicas": 2, "router": "least_loaded",
                                                 "admission": {"max_waiting_per_replica": 2}}})
    assert (reqs.status == "finished").sum() == 4
    assert set(reqs[reqs.status == "rejected"].reject_reason) == {"admission: every live replica has >= 2 waiting"}


def test_predicted_wait_bound_sheds_when_the_queue_is_long(tmp_path):
    rows = [{"arrival_ms": 0, "input_tokens": 4000, "output_tokens": 2} for _ in range(40)]
    table, meta = make_trace(rows, hash_block_size=None)
    cfg = EngineConfig.model_validate({"scheduler": {"max_num_batched_tokens": 8192},
                                       "admission_probe": None} if False else
                                      {"fleet": {"admission": {"max_predicted_wait_ms": 25.0}}})
    replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(20000, FixedTimer(10.0)))
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    # A full 8192-token prefill step takes 10 ms: 4000 tokens ahead predict ~4.9 ms; the request
    # arriving behind 11 waiting (44000 tokens, ~54 ms) is the first refused.
    assert (reqs.status == "finished").sum() == 6
    assert set(reqs[reqs.status == "rejected"].reject_reason) == {"admission: predicted wait > 25 ms"}


@pytest.mark.parametrize("override, key", [
    ("fleet.autoscale={min_replicas: 8, max_replicas: 4}", "min_replicas (8) is greater than max_replicas (4)"),
    ("fleet.autoscale={max_replicas: 4, scale_up_delay_s: -1}", "fleet.autoscale.scale_up_delay_s"),
    ("fleet.autoscale={max_replicas: 4, scale_down_delay_s: -5}", "fleet.autoscale.scale_down_delay_s"),
    ("fleet.autoscale={max_replicas: 4, interval_s: 0}", "fleet.autoscale.interval_s"),
    ("fleet.admission={}", "admission needs a bound"),
    ("fleet.admission={burst: 4}", "admission needs a bound"),
    ("fleet.admission={max_waiting_per_replica: 2, burst: 4}", "give rate too"),
    ("fleet.autoscale={max_replicas: 4, policy: slo}", "policy slo needs ttft_ms"),
    ("fleet.autoscale={max_replicas: 4, ttft_ms: 100}", "used by policy slo only"),
    ("fleet.autoscale={max_replicas: 4, min_replicas: 2}\n", None),
    ("fleet.autoscale={max_replicas: 4, min_replicas: 0}", "fleet.autoscale.min_replicas"),
    ("fleet.autoscale={min_replicas: 1}", "fleet.autoscale.max_replicas"),
    ("fleet.autoscale={max_replicas: 4, tolerance: 1.5}", "fleet.autoscale.tolerance"),
    ("fleet.autoscale={max_replicas: 4, bogus: 1}", "fleet.autoscale.bogus: unknown key"),
])
def test_bad_autoscale_and_admission_configs_get_one_clear_error(override, key):
    if key is None:
        validate_config({}, "cfg.yaml", [override])
        return
    with pytest.raises(ConfigError) as exc:
        validate_config({}, "cfg.yaml", [override])
    assert key in str(exc.value) and "cfg.yaml" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_starting_replicas_must_lie_within_the_bounds():
    with pytest.raises(ConfigError, match=r"replicas \(9\) is the autoscaled fleet's starting size"):
        validate_config({"fleet": {"replicas": 9, "autoscale": {"max_replicas": 4}}}, "c.yaml")


def test_bad_config_on_the_command_line_exits_2(tmp_path):
    from typer.testing import CliRunner

    from replay.cli import app

    result = CliRunner().invoke(app, ["run", "sample_traces/mooncake_sessions.jsonl", "-o", str(tmp_path / "o"),
                                      "--set", "fleet.autoscale.max_replicas=2",
                                      "--set", "fleet.autoscale.min_replicas=3"])
    assert result.exit_code == 2
    assert "min_replicas (3) is greater than max_replicas (2)" in result.output
    assert "Traceback" not in result.output


# -- the policies on their own -------------------------------------------------------------------
def _signals(**kw) -> ScalingSignals:
    base = dict(now_ms=0.0, live=4, provisioning=0, waiting=0, kv_usage=0.0, arrivals=0, mean_input_tokens=0.0,
                mean_output_tokens=0.0, interval_ms=60_000.0)
    base.update(kw)
    return ScalingSignals(**base)


def test_queue_policy_is_hpa_with_its_tolerance():
    policy = QueuePolicy(target=4.0, tolerance=0.1)
    assert policy.recommend(_signals(waiting=16)) == 4  # exactly on target
    assert policy.recommend(_signals(waiting=17)) == 4  # 17/16 within 10%: no change
    assert policy.recommend(_signals(waiting=18)) == 5  # ceil(4 * 18/16)
    assert policy.recommend(_signals(waiting=40)) == 10
    assert policy.recommend(_signals(waiting=0)) == 0  # clamped to min_replicas by the autoscaler


def test_scale_down_is_stabilized_over_the_window_and_scale_up_is_not():
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=10, target=4.0, interval_s=60, scale_down_delay_s=180)
    scaler = Autoscaler(cfg, build_policy(cfg, None))
    assert scaler.desired(_signals(now_ms=0, waiting=32)) == 8  # 8 waiting per replica, target 4
    # The load falls: the highest recommendation of the last 180 s holds the fleet.
    assert scaler.desired(_signals(now_ms=60_000, live=8, waiting=8)) == 8
    assert scaler.desired(_signals(now_ms=120_000, live=8, waiting=8)) == 8
    assert scaler.desired(_signals(now_ms=180_000, live=8, waiting=8)) == 8
    assert scaler.desired(_signals(now_ms=240_000, live=8, waiting=8)) == 2
    assert scaler.desired(_signals(now_ms=300_000, live=2, waiting=200)) == 10  # up at once, clamped to max


def test_linear_predictor_extrapolates_one_interval():
    p = LoadPredictor("linear", 3)
    for v in (10.0, 20.0, 30.0):
        p.add(v)
    assert p.predict() == pytest.approx(40.0)
    c = LoadPredictor("constant", 3)
    for v in (10.0, 20.0, 30.0):
        c.add(v)
    assert c.predict() == 30.0


def test_slo_capacity_follows_the_step_time():
    # 10 ms steps whatever the batch: the TPOT objective of 10 ms is met by any batch, so the
    # replica is bounded by max_num_seqs: 4 seats of 10-token requests -> 4 / (10 x 10 ms) = 40/s.
    cap = ReplicaCapacity(FixedTimer(10.0), max_num_batched_tokens=8192, max_num_seqs=4, kv_tokens=10**6,
                          ttft_ms=None, tpot_ms=10.0)
    assert cap.requests_per_s(16, 10) == pytest.approx(40.0, rel=2e-4)
    assert cap.requests_per_s(16, 20) == pytest.approx(20.0, rel=2e-4)
    slow = ReplicaCapacity(FixedTimer(10.0), max_num_batched_tokens=8192, max_num_seqs=4, kv_tokens=10**6,
                           ttft_ms=None, tpot_ms=5.0)
    assert slow.requests_per_s(16, 10) == pytest.approx(1e-3)  # cannot meet 5 ms with 10 ms steps


def test_slo_policy_sizes_the_fleet_from_the_predicted_rate(tmp_path):
    config = {"fleet": {"router": "least_loaded", "autoscale": {
        "min_replicas": 1, "max_replicas": 8, "policy": "slo", "tpot_ms": 10.0, "interval_s": 10.0,
        "scale_up_delay_s": 5.0}}}
    _, scaling, _ = _run(tmp_path, _step_rows(), config)
    # 20/s (at 40/s per replica, ceil(0.5) = 1), then 40/s -> 1 replica still... the step shows in the
    # predicted rate the interval after.
    rates = scaling.set_index("time_ms").predicted_rate
    assert rates[50_000.0] == pytest.approx(20.0)
    assert rates[70_000.0] == pytest.approx(40.0)
    assert (scaling[scaling.time_ms <= 50_000].desired == 1).all()
    assert np.isfinite(rates).all()


def test_fixed_fleet_writes_no_scaling_file_but_reports_cost(tmp_path):
    reqs, scaling, info = _run(tmp_path, _step_rows(10.0), {"fleet": {"replicas": 2, "gpu_cost_per_hour": 3.0}})
    assert scaling is None
    assert "scaling" not in info
    assert info["cost"]["gpu_hours"] == pytest.approx(2 * info["simulated_span_ms"] / 3.6e6)
    assert info["cost"]["cost"] == pytest.approx(3.0 * info["cost"]["gpu_hours"])
    json.dumps(info)


def test_a_reused_replica_id_numbers_its_steps_on_so_chunks_and_itl_stay_exact(tmp_path):
    """Scale up, drain, scale up again: the later engine under a reused id continues the earlier
    one's step numbers, so (replica, step) names one step, every request's chunks add up to its
    output and the ITL samples are one per emitted token after the first (no gap from a chunk
    matched to another engine's step)."""
    from replay.reports.views import open_run

    burst = [{"arrival_ms": i * 10, "input_tokens": 16, "output_tokens": 10} for i in range(1500)]
    trickle = [{"arrival_ms": 15_000 + i * 500, "input_tokens": 16, "output_tokens": 10} for i in range(60)]
    again = [{"arrival_ms": 45_000 + i * 10, "input_tokens": 16, "output_tokens": 10} for i in range(1500)]
    cfg = dict(AUTOSCALE, scale_up_delay_s=5.0, scale_down_delay_s=10.0, interval_s=5.0)
    reqs, _, info = _run(tmp_path, burst + trickle + again, {"fleet": {"router": "round_robin", "autoscale": cfg}})
    lives = info["scaling"]["replicas"]
    reused = {lf["replica"] for lf in lives if lf["started_ms"] > 0 and lf["replica"] in
              {other["replica"] for other in lives if other is not lf and other["started_ms"] < lf["started_ms"]}}
    assert reused, "the scenario must reuse a replica id"
    # run.json counts each engine's own steps once: per replica, they add up to the steps written.
    assert sum(r["steps"] for r in info["fleet"]["per_replica"]) == info["totals"]["steps"]
    run = open_run(tmp_path / "out")
    try:
        con = run.con
        assert con.sql("SELECT count(*) - count(DISTINCT (replica, step)) FROM steps").fetchall()[0][0] == 0
        short = con.sql("SELECT count(*) FROM (SELECT request_id, sum(tokens) AS n FROM chunks GROUP BY 1) "
                        "JOIN requests USING (request_id) WHERE n <> output_tokens").fetchall()[0][0]
        assert short == 0
        gaps, lo = con.sql("SELECT count(*), min(itl_ms) FROM itl_gaps").fetchall()[0]
        assert gaps == int((reqs.output_tokens - 1).sum()) and lo > 0
    finally:
        run.con.close()
