"""A kv_aware fleet's replicas replayed in step by several processes: every choice, and so every
request's result, is the single loop's (engine/lockstep.py)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from replay.base.errors import ConfigError, ReplayError
from replay.engine.arrivals import plan_arrivals
from replay.engine.config import EngineConfig
from replay.engine.lockstep import CostExchange, part_bounds, why_not_lockstep
from replay.engine.run import prepare_trace, replay_prepared
from replay.engine.trace_input import trace_arrays
from tests.engine_helpers import FixedTimer, open_loop_trace, same_results, sessions_trace, setup_for

OUTPUTS = ("requests.parquet", "steps.parquet", "chunks.parquet")


def _replay(tmp_path, trace, name: str, fleet: dict, blocks: int = 40, extra: dict | None = None,
            max_model_len: int = 1 << 20, **kwargs) -> dict:
    table, meta = trace
    cfg = EngineConfig.model_validate({"fleet": fleet, **(extra or {})})
    setup = setup_for(blocks, FixedTimer(5.0, 0.01, 1e-4), max_model_len=max_model_len)
    prepared = prepare_trace(table, meta, cfg, setup, on_error="skip")
    return replay_prepared(prepared, cfg, tmp_path / name, setup=setup, check_invariants=True, **kwargs).run_info


def _same_run(one: dict, step: dict) -> None:
    assert step["totals"] == one["totals"]
    assert step["fleet"]["per_replica"] == one["fleet"]["per_replica"]
    assert step["simulated_span_ms"] == one["simulated_span_ms"]


@pytest.mark.parametrize("options", [
    {},                                                      # Dynamo's defaults: ties drawn
    {"overlap_score_weight": 0.0},                           # every cost ties on load alone
    {"router_temperature": 0.5},                             # softmax sampling over the fleet
    {"kv_events": False},                                    # the approximate index
])
def test_in_step_gives_the_one_loop_results(tmp_path, options):
    fleet = {"replicas": 4, "router": "kv_aware", "router_options": options, "router_latency_ms": 1.0}
    _in_step_matches(tmp_path, fleet)


@pytest.mark.parametrize("options", [{}, {"stats_update_ms": 0}, {"client_count": 3}])
def test_least_loaded_in_step(tmp_path, options):
    # vLLM's DP balancer: scores from periodic snapshots, ties rotating over the whole fleet.
    _in_step_matches(tmp_path, {"replicas": 4, "router": "least_loaded", "router_options": options})


def _in_step_matches(tmp_path, fleet: dict) -> None:
    trace = open_loop_trace(120, 3, gap_ms=4.0)
    one = _replay(tmp_path, trace, "one", fleet, replicas_apart=False)
    step = _replay(tmp_path, trace, "step", fleet, workers=2)
    assert "replicas_in_step" not in one["fleet"] and step["fleet"]["replicas_in_step"] == 2
    assert step["fleet"]["ran_on"] == "2 processes"
    same_results(tmp_path / "one", tmp_path / "step")
    _same_run(one, step)
    assert one["totals"]["preemptions"] > 0  # small caches: each replica's run is not trivial
    served = pq.read_table(tmp_path / "step" / "requests.parquet").column("replica").to_numpy()
    assert set(served.tolist()) == {0, 1, 2, 3}
    # Steps come part after part: replicas 0-1, then 2-3.
    replicas = pq.read_table(tmp_path / "step" / "steps.parquet").column("replica").to_numpy()
    assert (np.diff(replicas // 2) >= 0).all()


@pytest.mark.parametrize(("seed", "replicas", "workers", "blocks"), [
    (11, 3, 2, 400), (12, 6, 3, 400), (13, 2, 2, 120), (14, 5, 2, 2000),
])
def test_in_step_across_shapes(tmp_path, seed, replicas, workers, blocks):
    # Larger caches than above: long decode windows open and stay open past arrivals.
    fleet = {"replicas": replicas, "router": "kv_aware", "router_latency_ms": 0.5 * (seed % 2)}
    trace = open_loop_trace(200, seed, gap_ms=2.0)
    one = _replay(tmp_path, trace, "one", fleet, blocks=blocks, replicas_apart=False)
    step = _replay(tmp_path, trace, "step", fleet, blocks=blocks, workers=workers)
    same_results(tmp_path / "one", tmp_path / "step")
    _same_run(one, step)


def test_uneven_parts_rejected_rows_and_g2(tmp_path):
    # 5 replicas on 3 processes (2, 2, 1); requests longer than the context are refused up front and
    # recorded once; a CPU tier per replica.
    fleet = {"replicas": 5, "router": "kv_aware"}
    extra = {"host_offload": {"num_cpu_blocks": 64}}
    trace = open_loop_trace(150, 5, gap_ms=3.0)
    one = _replay(tmp_path, trace, "one", fleet, extra=extra, max_model_len=250, replicas_apart=False)
    step = _replay(tmp_path, trace, "step", fleet, extra=extra, max_model_len=250, workers=3)
    assert step["fleet"]["replicas_in_step"] == 3
    same_results(tmp_path / "one", tmp_path / "step")
    _same_run(one, step)
    status = pq.read_table(tmp_path / "step" / "requests.parquet").column("status").to_pylist()
    assert "rejected" in status


@pytest.mark.parametrize(("options", "runs_ahead"), [({}, True), ({"router_temperature": 0.5}, False)])
def test_waiting_parts_run_replicas_that_cannot_win_ahead(tmp_path, monkeypatch, options, runs_ahead):
    # While a part waits for the others' costs, its replicas priced above its cheapest run on to the
    # next arrival (engine/fleet_ahead.py); results stay the single loop's. Softmax sampling may pick
    # any replica, so nothing runs ahead there.
    from replay.engine.fleet_ahead import RunAhead

    log = tmp_path / "ahead.log"  # appended to by the forked parts
    real = RunAhead.run_ahead

    def counting(loop, positions):
        ptr = loop._open_ptr
        t_next = loop._open_times[ptr] if ptr < len(loop._open_times) else float("inf")
        due = sum(1 for pos in positions if loop.cores[loop.live_views[pos].replica].wake_ms < t_next)
        with open(log, "a") as f:
            f.write(f"{len(positions)} {due}\n")
        real(loop, positions)

    monkeypatch.setattr(RunAhead, "run_ahead", counting)
    fleet = {"replicas": 6, "router": "kv_aware", "router_options": options}
    trace = open_loop_trace(150, 9, gap_ms=3.0)
    one = _replay(tmp_path, trace, "one", fleet, replicas_apart=False)
    step = _replay(tmp_path, trace, "step", fleet, workers=2)
    same_results(tmp_path / "one", tmp_path / "step")
    _same_run(one, step)
    calls = [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []
    if runs_ahead:
        assert all(1 <= n <= 2 for n, _ in calls)  # at most the part's 3 replicas but its cheapest
        assert sum(due for _, due in calls) > 50  # replicas with steps to take before the next arrival
    else:
        assert calls == []


def test_same_bytes_run_to_run(tmp_path):
    fleet = {"replicas": 3, "router": "kv_aware"}
    trace = open_loop_trace(90, 7, gap_ms=4.0)
    _replay(tmp_path, trace, "a", fleet, workers=2)
    _replay(tmp_path, trace, "b", fleet, workers=2)
    for name in OUTPUTS:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_what_keeps_a_fleet_in_one_loop():
    table, meta = sessions_trace(3)
    trace = trace_arrays(table, meta.hash_block_size)

    def why(fleet: dict, **extra) -> str | None:
        cfg = EngineConfig.model_validate({"fleet": fleet, **extra})
        plan = plan_arrivals(trace, cfg.load, cfg.seed, np.arange(len(trace)))
        return why_not_lockstep(cfg, plan)

    assert "closed-loop" in why({"replicas": 2, "router": "kv_aware"})
    assert "prefix_score" in why({"replicas": 2, "router": "prefix_score"})
    assert "autoscale" in why({"replicas": 2, "router": "kv_aware",
                               "autoscale": {"min_replicas": 1, "max_replicas": 2}})
    assert "single replica" in why({"replicas": 1, "router": "kv_aware"})


def test_beyond_the_request_cap_only_named_processes_step(tmp_path, monkeypatch):
    # Above MAX_APART_REQUESTS the fleet keeps one loop (its memory is bounded), unless the user
    # names the processes: then the parts run in step, with the one loop's results.
    import replay.engine.fleet_partition as fleet_partition

    monkeypatch.setattr(fleet_partition, "MAX_APART_REQUESTS", 50)
    fleet = {"replicas": 3, "router": "kv_aware"}
    trace = open_loop_trace(90, 3, gap_ms=4.0)
    one = _replay(tmp_path, trace, "one", fleet)
    assert "replicas_in_step" not in one["fleet"]
    step = _replay(tmp_path, trace, "step", fleet, workers=2)
    assert step["fleet"]["replicas_in_step"] == 2
    _same_run(one, step)
    same_results(tmp_path / "one", tmp_path / "step")


def test_workers_refused_where_replicas_cannot_step(tmp_path):
    with pytest.raises(ConfigError, match="closed-loop"):
        _replay(tmp_path, sessions_trace(3), "x", {"replicas": 2, "router": "kv_aware"}, workers=2)


def test_part_bounds():
    assert part_bounds(8, 2) == [0, 4, 8]
    assert part_bounds(5, 3) == [0, 2, 4, 5]


def _fail_in_worker(monkeypatch, action) -> None:
    """Run ``action`` in the worker process's part at its 30th arrival."""
    from replay.engine import lockstep

    real = lockstep.ExchangeSeat.publish
    main = os.getpid()

    def publish(self, costs):
        if os.getpid() != main and self.count == 30:
            action()
        return real(self, costs)

    monkeypatch.setattr(lockstep.ExchangeSeat, "publish", publish)


def test_a_failing_part_stops_the_others(tmp_path, monkeypatch):
    # The main process's part, waiting for the failed part's costs, stops; the worker's error is the
    # one reported, and nothing is written.
    def fail():
        raise RuntimeError("injected failure")

    _fail_in_worker(monkeypatch, fail)
    with pytest.raises(ReplayError, match="injected failure"):
        _replay(tmp_path, open_loop_trace(120, 3, gap_ms=4.0), "x", {"replicas": 4, "router": "kv_aware"},
                workers=2)
    assert not (tmp_path / "x").exists()


def test_a_dead_part_stops_the_others(tmp_path, monkeypatch):
    # The worker process dies outright (no error to report): the main process's part sees it gone
    # within a second and the replay stops with an error, nothing written.
    import signal

    _fail_in_worker(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGKILL))
    with pytest.raises(ReplayError, match="worker process"):
        _replay(tmp_path, open_loop_trace(120, 3, gap_ms=4.0), "x", {"replicas": 4, "router": "kv_aware"},
                workers=2)
    assert not (tmp_path / "x").exists()


def test_a_slow_starting_part_is_waited_for(tmp_path, monkeypatch):
    # The worker's part takes its seat 1.5 s after the main process's part starts waiting for it
    # (its peer checks run every half second): a late peer is not a peer that ended.
    import time

    from replay.engine import lockstep

    real = lockstep.ExchangeSeat.start
    main = os.getpid()

    def slow_start(self):
        if os.getpid() != main:
            time.sleep(1.5)
        real(self)

    monkeypatch.setattr(lockstep.ExchangeSeat, "start", slow_start)
    fleet = {"replicas": 2, "router": "kv_aware"}
    trace = open_loop_trace(40, 1, gap_ms=4.0)
    one = _replay(tmp_path, trace, "one", fleet, replicas_apart=False)
    step = _replay(tmp_path, trace, "step", fleet, workers=2)
    same_results(tmp_path / "one", tmp_path / "step")
    _same_run(one, step)


def test_workers_with_the_single_loop_asked_for(tmp_path):
    with pytest.raises(ConfigError, match="replicas_apart is off"):
        _replay(tmp_path, open_loop_trace(20, 1), "x", {"replicas": 2, "router": "kv_aware"}, workers=2,
                replicas_apart=False)


def test_swap_in_one_process():
    ex = CostExchange([0, 2])
    seat = ex.seat(0)
    seat.start()
    for costs in ([1.5, 2.0], [3.0, 0.5]):  # the two slots in turn
        seat.publish(costs)
        assert seat.collect() == costs
