"""A fleet whose replicas share nothing is replayed replica by replica: the same results as its one
event loop, and the same bytes whatever the number of processes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from replay.base.errors import ConfigError
from replay.engine.arrivals import plan_arrivals
from replay.engine.config import EngineConfig
from replay.engine.fleet_partition import replica_targets, why_replicas_share
from replay.engine.run import prepare_trace, replay_prepared
from replay.engine.trace_input import trace_arrays
from tests.engine_helpers import FixedTimer, open_loop_trace, same_results, sessions_trace, setup_for

OUTPUTS = ("requests.parquet", "steps.parquet", "chunks.parquet")


def _open_trace(n: int = 60, seed: int = 0):
    """Arrivals 4 ms apart on average: queues, preemption and eviction on small caches."""
    return open_loop_trace(n, seed, gap_ms=4.0)


def _sessions_trace():
    return sessions_trace(4)


def _replay(tmp_path, trace, name: str, fleet: dict, blocks: int = 40, **kwargs) -> dict:
    table, meta = trace
    cfg = EngineConfig.model_validate({"fleet": fleet})
    setup = setup_for(blocks, FixedTimer(5.0, 0.01, 1e-4))
    prepared = prepare_trace(table, meta, cfg, setup)
    return replay_prepared(prepared, cfg, tmp_path / name, setup=setup, check_invariants=True, **kwargs).run_info


@pytest.mark.parametrize("router", ["round_robin", "random"])
def test_apart_gives_the_one_loop_results(tmp_path, router):
    # 40 blocks a replica: preemption and eviction happen, so each replica's run is not trivial.
    fleet = {"replicas": 3, "router": router, "router_latency_ms": 2.0}
    one = _replay(tmp_path, _open_trace(), "one", fleet, replicas_apart=False)
    apart = _replay(tmp_path, _open_trace(), "apart", fleet)
    assert "replicas_apart" not in one["fleet"] and apart["fleet"]["replicas_apart"] is True
    assert apart["fleet"]["ran_on"] == "local"
    same_results(tmp_path / "one", tmp_path / "apart")
    assert apart["totals"] == one["totals"] and apart["totals"]["preemptions"] > 0
    assert apart["fleet"]["per_replica"] == one["fleet"]["per_replica"]
    assert apart["simulated_span_ms"] == one["simulated_span_ms"]
    # Steps come replica by replica.
    replicas = pq.read_table(tmp_path / "apart" / "steps.parquet").column("replica").to_numpy()
    assert (np.diff(replicas) >= 0).all() and set(replicas) == {0, 1, 2}


def test_processes_write_the_same_bytes(tmp_path):
    fleet = {"replicas": 4, "router": "round_robin"}
    one_process = _replay(tmp_path, _open_trace(80, seed=2), "w1", fleet, workers=1)
    three = _replay(tmp_path, _open_trace(80, seed=2), "w3", fleet, workers=3)
    assert three["fleet"]["ran_on"] == "3 processes"
    for name in OUTPUTS:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w3" / name).read_bytes(), name
    assert three["totals"] == one_process["totals"]


def test_progress_counts_every_replicas_requests(tmp_path):
    heard: list[int] = []
    _replay(tmp_path, _open_trace(50, seed=4), "p", {"replicas": 3}, workers=2,
            progress=lambda sim_ms, done: heard.append(done))
    assert heard and heard[-1] == 50 and heard == sorted(heard)


def test_session_affinity_sessions_stay_apart(tmp_path):
    # Every turn of a session goes to one replica, closed-loop turns included: replicas stay apart.
    fleet = {"replicas": 3, "router": "session_affinity"}
    one = _replay(tmp_path, _sessions_trace(), "one", fleet, replicas_apart=False)
    apart = _replay(tmp_path, _sessions_trace(), "apart", fleet)
    assert apart["fleet"]["replicas_apart"] is True
    same_results(tmp_path / "one", tmp_path / "apart")
    assert apart["totals"] == one["totals"]


def test_round_robin_sessions_share_the_turn_order(tmp_path):
    # A closed-loop turn takes round robin's next turn when it is released: which replica gets
    # what depends on every replica's finishes, so the fleet runs in one loop, and --workers says why.
    info = _replay(tmp_path, _sessions_trace(), "rr", {"replicas": 3})
    assert "replicas_apart" not in info["fleet"]
    with pytest.raises(ConfigError, match="closed-loop turn"):
        _replay(tmp_path, _sessions_trace(), "rr2", {"replicas": 3}, workers=2)


@pytest.mark.parametrize(("fleet", "extra", "reason"), [
    ({"replicas": 2, "router": "kv_aware"}, {}, "reads the replicas' state"),
    ({"replicas": 2, "router": "least_loaded"}, {}, "reads the replicas' state"),
    ({"replicas": 2}, {"load": {"mode": "concurrency", "concurrency": 4}}, "concurrency"),
    ({"replicas": 2, "admission": {"max_waiting_per_replica": 4}}, {}, "admission"),
    ({"replicas": 1}, {}, "single replica"),
])
def test_what_ties_replicas_together(tmp_path, fleet, extra, reason):
    cfg = EngineConfig.model_validate({"fleet": fleet, **extra})
    assert reason in (why_replicas_share(cfg) or "")


def test_a_row_refused_at_arrival_takes_no_round_robin_turn():
    table, meta = _open_trace(7)
    trace = trace_arrays(table, meta.hash_block_size)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 3}})
    plan = plan_arrivals(trace, cfg.load, 0, np.arange(7))
    targets = replica_targets(cfg, trace, plan, {2: "too long"}, 100)
    assert targets is not None
    # Row 2 is recorded by replica 0 but takes no turn: rows 0, 1, 3, 4, 5, 6 go 0, 1, 2, 0, 1, 2.
    assert targets.tolist() == [0, 1, 0, 2, 0, 1, 2]


def test_the_cli_replays_apart_by_default(tmp_path):
    from typer.testing import CliRunner

    from replay.cli import app
    from replay.ingest.writer import write_trace_table

    write_trace_table(tmp_path / "t.parquet", *_open_trace(30))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o"), "-q",
                                   "--set", "fleet.replicas=2"])
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["fleet"]["replicas_apart"] is True and info["fleet"]["ran_on"] == "local"  # small: one process
    res = CliRunner().invoke(app, ["run", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "k"), "-q",
                                   "--set", "fleet.replicas=2", "--set", "fleet.router=prefix_score", "--workers", "2"])
    assert res.exit_code == 2 and "prefix_score reads the replicas' state" in res.output
    # kv_aware's replicas run in step instead (engine/lockstep.py).
    res = CliRunner().invoke(app, ["run", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "k"), "-q",
                                   "--set", "fleet.replicas=2", "--set", "fleet.router=kv_aware", "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "k" / "run.json").read_text())["fleet"]["replicas_in_step"] == 2


def test_a_very_large_replay_stays_in_one_loop_unless_processes_are_named(tmp_path, monkeypatch):
    # Beyond MAX_APART_REQUESTS the single loop's bounded memory wins (it hands back served rows),
    # unless the user names more than one process: then the parts run, with the one loop's results.
    import replay.engine.fleet_partition as fleet_partition

    monkeypatch.setattr(fleet_partition, "MAX_APART_REQUESTS", 40)
    info = _replay(tmp_path, _open_trace(41), "big", {"replicas": 2})
    assert "replicas_apart" not in info["fleet"]
    assert _replay(tmp_path, _open_trace(40), "small", {"replicas": 2})["fleet"]["replicas_apart"] is True
    assert "replicas_apart" not in _replay(tmp_path, _open_trace(41), "big1", {"replicas": 2}, workers=1)["fleet"]
    info = _replay(tmp_path, _open_trace(41), "big2", {"replicas": 2}, workers=2)
    assert info["fleet"]["replicas_apart"] is True
    same_results(tmp_path / "big", tmp_path / "big2")


def test_busy_time_is_the_same_to_the_bit(tmp_path):
    # The roofline timer's step times: busy time adds a window's steps one by one, as stepping does,
    # so windows cut at other replicas' arrivals (one loop) or not (apart) give the same bits.
    from pathlib import Path

    from replay.api import prepare_any_trace
    from replay.engine.run_setup import resolve_setup

    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 3, "router": "session_affinity", "router_latency_ms": 5},
                                       "kv_cache": {"num_gpu_blocks": 1200}, "load": {"max_requests": 400}})
    infos = []
    for name, apart in (("one", False), ("apart", True)):
        setup = resolve_setup(cfg)
        prepared = prepare_any_trace(sample, cfg, setup)
        infos.append(replay_prepared(prepared, cfg, tmp_path / name, setup=setup, replicas_apart=apart).run_info)
    one, apart = infos
    assert apart["fleet"]["replicas_apart"] is True
    assert [r["busy_ms"] for r in apart["fleet"]["per_replica"]] == [r["busy_ms"] for r in one["fleet"]["per_replica"]]
    assert apart["fleet"]["busy_imbalance"] == one["fleet"]["busy_imbalance"]


def test_workers_fork_only_once_the_timer_is_ready(tmp_path):
    # A timer loading its tables on a thread (aiconfigurator's) finishes before any worker forks.
    class LoadingTimer(FixedTimer):
        forks_allowed = 0

        def before_fork(self) -> None:
            LoadingTimer.forks_allowed += 1

    table, meta = _open_trace(30)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 2}})
    setup = setup_for(40, LoadingTimer(5.0, 0.01, 1e-4))
    prepared = prepare_trace(table, meta, cfg, setup)
    info = replay_prepared(prepared, cfg, tmp_path / "w", setup=setup, workers=2).run_info
    assert info["fleet"]["ran_on"] == "2 processes" and LoadingTimer.forks_allowed == 1


def test_a_failing_worker_stops_only_its_own_replay(tmp_path, monkeypatch):
    # A worker's error stops the replay with the part named, and the processes stopped are the
    # replay's own workers: another child of this process lives on.
    import multiprocessing

    import replay.engine.cluster_run as cluster_run

    real = cluster_run.replay_cluster

    def failing(trace, config, setup, cp, outdir, **kwargs):
        if cp.cluster == 2:
            raise RuntimeError("boom")
        return real(trace, config, setup, cp, outdir, **kwargs)

    monkeypatch.setattr(cluster_run, "replay_cluster", failing)
    bystander = multiprocessing.get_context("fork").Process(target=time_sleep, args=(30,))
    bystander.start()
    try:
        with pytest.raises(Exception, match="replica 2's replay failed in a worker process|boom"):
            _replay(tmp_path, _open_trace(40), "w", {"replicas": 4}, workers=2)
        assert bystander.is_alive()
        assert not (tmp_path / "w").exists()
    finally:
        bystander.terminate()
        bystander.join()


def time_sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def test_a_fleet_of_many_replicas_stays_in_one_loop():
    from replay.engine.fleet_partition import MAX_APART_REPLICAS, why_not_apart

    table, meta = _open_trace(10)
    trace = trace_arrays(table, meta.hash_block_size)
    for replicas, apart in ((MAX_APART_REPLICAS, True), (MAX_APART_REPLICAS + 1, False)):
        cfg = EngineConfig.model_validate({"fleet": {"replicas": replicas}})
        plan = plan_arrivals(trace, cfg.load, 0, np.arange(10))
        assert (why_not_apart(cfg, plan) is None) is apart
        assert (replica_targets(cfg, trace, plan, {}, 100) is not None) is apart
