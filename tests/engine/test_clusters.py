"""A fleet split into clusters behind a global balancer: who goes where, and one merged output."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from replay.engine.arrivals import plan_arrivals
from replay.engine.clusters import assign_clusters
from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.engine.trace_input import trace_arrays
from tests.engine_helpers import FixedTimer, open_loop_trace, sessions_trace, setup_for


def _open_trace(n: int = 40, seed: int = 0):
    return open_loop_trace(n, seed)


def _sessions_trace():
    return sessions_trace(3)


def _run(tmp_path, table, meta, name, fleet: dict, blocks: int = 400):
    cfg = EngineConfig.model_validate({"fleet": fleet})
    out = tmp_path / name
    info = replay_trace(table, meta, cfg, out, setup=setup_for(blocks, FixedTimer(5.0, 0.01, 1e-4)),
                        check_invariants=True).run_info
    return out, info


def test_round_robin_over_clusters_of_one_replica_is_a_round_robin_fleet(tmp_path):
    # With one replica per cluster and open-loop rows, the global round robin sends each request
    # where a round-robin fleet of the same replicas does: the same requests, step for step; only
    # the steps file's row order differs (a fleet interleaves replicas in time, the merge
    # concatenates clusters).
    table, meta = _open_trace()
    fleet_out, fleet_info = _run(tmp_path, table, meta, "fleet", {"replicas": 3, "router": "round_robin"})
    cl_out, cl_info = _run(tmp_path, table, meta, "clusters", {"replicas": 3, "clusters": 3})
    assert pq.read_table(cl_out / "requests.parquet").equals(pq.read_table(fleet_out / "requests.parquet"))
    sort = [("replica", "ascending"), ("step", "ascending")]
    assert pq.read_table(cl_out / "steps.parquet").sort_by(sort).equals(
        pq.read_table(fleet_out / "steps.parquet").sort_by(sort))
    assert cl_info["totals"] == fleet_info["totals"]
    assert [r["replica"] for r in cl_info["fleet"]["per_replica"]] == [0, 1, 2]
    assert cl_info["fleet"]["per_replica"] == fleet_info["fleet"]["per_replica"]


def test_each_cluster_has_its_own_router_over_its_replicas(tmp_path):
    table, meta = _open_trace(60, seed=3)
    out, info = _run(tmp_path, table, meta, "c", {"replicas": 4, "clusters": 2, "router": "kv_aware",
                                                  "global_router": "prefix_hash"})
    reqs = pq.read_table(out / "requests.parquet").to_pandas()
    trace = trace_arrays(table, meta.hash_block_size)
    cfg = EngineConfig.model_validate({})
    plan = plan_arrivals(trace, cfg.load, 0, np.arange(len(trace)))
    cluster = assign_clusters(trace, plan, 2, "prefix_hash", 0)
    assert (reqs.replica // 2 == cluster).all()  # cluster c holds replicas 2c and 2c + 1
    # prefix_hash: rows with the same first hash id share a cluster
    first = [ids[0] for ids in table.column("hash_ids").to_pylist()]
    by_head: dict[int, set[int]] = {}
    for head, c in zip(first, cluster.tolist()):
        by_head.setdefault(head, set()).add(c)
    assert all(len(cs) == 1 for cs in by_head.values())
    assert info["totals"]["finished"] == 60 and info["fleet"]["clusters"] == 2
    assert len(info["fleet"]["per_replica"]) == 4


@pytest.mark.parametrize("global_router", ["round_robin", "random", "session_hash", "prefix_hash"])
def test_closed_loop_turns_stay_in_their_sessions_cluster(tmp_path, global_router):
    table, meta = _sessions_trace()
    trace = trace_arrays(table, meta.hash_block_size)
    cfg = EngineConfig.model_validate({})
    plan = plan_arrivals(trace, cfg.load, 0, np.arange(len(trace)))
    assert plan.dependents  # later turns are closed-loop
    cluster = assign_clusters(trace, plan, 2, global_router, 0)
    sessions = table.column("session_id").to_pylist()
    for s in set(sessions):
        assert len({c for c, sid in zip(cluster.tolist(), sessions) if sid == s}) == 1
    out, info = _run(tmp_path, table, meta, global_router, {"replicas": 2, "clusters": 2,
                                                           "global_router": global_router})
    assert info["totals"]["finished"] == 9


def test_round_robin_and_random_spread_open_arrivals(tmp_path):
    table, meta = _open_trace(40)
    trace = trace_arrays(table, meta.hash_block_size)
    plan = plan_arrivals(trace, EngineConfig().load, 0, np.arange(len(trace)))
    rr = assign_clusters(trace, plan, 4, "round_robin", 0)
    assert rr[plan.open_order].tolist() == [i % 4 for i in range(40)]
    rnd = assign_clusters(trace, plan, 4, "random", 0)
    assert set(rnd.tolist()) == {0, 1, 2, 3}
    assert rnd.tolist() == assign_clusters(trace, plan, 4, "random", 0).tolist()  # seeded
    assert rnd.tolist() != assign_clusters(trace, plan, 4, "random", 1).tolist()


def test_cluster_config_is_checked():
    with pytest.raises(ValidationError, match="multiple of fleet.clusters"):
        EngineConfig.model_validate({"fleet": {"replicas": 5, "clusters": 2}})
    with pytest.raises(ValidationError, match="concurrency"):
        EngineConfig.model_validate({"fleet": {"replicas": 4, "clusters": 2},
                                     "load": {"mode": "concurrency", "concurrency": 8}})
    with pytest.raises(ValidationError):
        EngineConfig.model_validate({"fleet": {"replicas": 4, "clusters": 2, "global_router": "kv_aware"}})


@pytest.mark.slow
def test_ray_replays_the_clusters_into_the_same_bytes(tmp_path):
    pytest.importorskip("ray")
    table, meta = _open_trace(60, seed=5)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 4, "clusters": 2, "router": "kv_aware",
                                                 "global_router": "random"}})
    outs = {}
    for ray_address in (None, "auto"):
        out = tmp_path / str(ray_address)
        info = replay_trace(table, meta, cfg, out, setup=setup_for(400, FixedTimer(5.0, 0.01, 1e-4)),
                            ray_address=ray_address).run_info
        assert info["fleet"]["ran_on"] == ("ray" if ray_address else "local")
        outs[ray_address] = (out, info)
    (a, ia), (b, ib) = outs[None], outs["auto"]
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert ia["totals"] == ib["totals"] and ia["fleet"]["per_replica"] == ib["fleet"]["per_replica"]


def test_ray_needs_clusters(tmp_path):
    from replay.base.errors import ConfigError

    table, meta = _open_trace(5)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 2}})
    with pytest.raises(ConfigError, match="fleet.clusters"):
        replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(400, FixedTimer(5.0)), ray_address="auto")


@pytest.mark.parametrize("clusters, workers", [(2, 2), (4, 3)])
def test_worker_processes_replay_the_clusters_into_the_same_bytes(tmp_path, clusters, workers):
    """--workers: the clusters in forked processes (fewer processes than clusters: they take turns)."""
    table, meta = _open_trace(80, seed=9)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 2 * clusters, "clusters": clusters,
                                                 "router": "kv_aware", "global_router": "prefix_hash"}})
    runs = {}
    for n in (1, workers):
        out = tmp_path / f"w{n}"
        info = replay_trace(table, meta, cfg, out, setup=setup_for(400, FixedTimer(5.0, 0.01, 1e-4)),
                            workers=n).run_info
        runs[n] = (out, info)
    (a, ia), (b, ib) = runs[1], runs[workers]
    assert ia["fleet"]["ran_on"] == "local" and ib["fleet"]["ran_on"] == f"{min(workers, clusters)} processes"
    for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert ia["totals"] == ib["totals"] and ia["fleet"]["per_replica"] == ib["fleet"]["per_replica"]
    assert len(set(pq.read_table(b / "requests.parquet").column("replica").to_pylist()) - {None}) > clusters


def test_a_failing_worker_names_its_cluster_and_leaves_no_output(tmp_path, monkeypatch):
    from replay.base.errors import ReplayError
    from replay.engine import cluster_run

    real = cluster_run.replay_cluster

    def fail_in_cluster_1(trace, config, setup, cp, outdir, **kw):
        if cp.cluster == 1:
            raise RuntimeError("boom")
        return real(trace, config, setup, cp, outdir, **kw)

    monkeypatch.setattr(cluster_run, "replay_cluster", fail_in_cluster_1)  # the forked worker inherits it
    table, meta = _open_trace(30, seed=2)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 4, "clusters": 2}})
    with pytest.raises(ReplayError, match="cluster 1's replay failed in a worker process.*boom"):
        replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(400, FixedTimer(5.0)), workers=2)
    assert not (tmp_path / "o").exists()


def test_workers_need_clusters_or_replicas_that_share_nothing(tmp_path):
    from replay.base.errors import ConfigError

    table, meta = _open_trace(5)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 2, "router": "prefix_score"}})
    with pytest.raises(ConfigError, match="--workers.*fleet.clusters.*prefix_score reads"):
        replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(400, FixedTimer(5.0)), workers=2)
