"""KV tiers on fleets that grow (autoscaling) or split (clusters): what a cluster tier is shared by."""

from __future__ import annotations

import pandas as pd
import pytest

from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from tests.engine_helpers import FixedTimer, make_trace, setup_for

POOL = {"name": "pool", "medium": "remote", "scope": "cluster", "num_blocks": 1000,
        "read_gb_per_s": 1.0, "write_gb_per_s": 1.0}


def _run(tmp_path, rows, data: dict, name: str = "out", **kw):
    table, meta = make_trace(rows, hash_block_size=16)
    out = tmp_path / name
    info = replay_trace(table, meta, EngineConfig.model_validate(data), out,
                        setup=setup_for(2000, FixedTimer(10.0), kv_bytes_per_token=1000), **kw).run_info
    return out, pd.read_parquet(out / "requests.parquet").set_index("request_id"), info


def test_a_joining_replica_starts_cold_but_reads_the_cluster_tier(tmp_path):
    # Every request shares one prefix; replica 0 caches it on its GPU and writes it to the pool.
    # A replica that joins later has an empty GPU cache: its first request loads the prefix from
    # the pool (63 tokens: a full hit recomputes the last) instead of computing it.
    rows = [{"arrival_ms": i * 5, "input_tokens": 64, "output_tokens": 10, "hash_ids": [1, 2, 3, 4]}
            for i in range(3000)]
    autoscale = {"min_replicas": 1, "max_replicas": 4, "policy": "queue", "target": 2.0, "interval_s": 2.0,
                 "scale_up_delay_s": 3.0, "scale_down_delay_s": 30.0}
    data = {"scheduler": {"max_num_seqs": 4}, "kv_cache": {"tiers": [POOL]},
            "fleet": {"router": "round_robin", "autoscale": autoscale}}
    _, reqs, info = _run(tmp_path, rows, data, check_invariants=True)
    reqs = reqs.sort_values("first_scheduled_ms", kind="stable")
    joined = [r for r in sorted(reqs.replica.unique()) if r != 0]
    assert joined
    for rid in joined:
        first = reqs[reqs.replica == rid].iloc[0]
        assert (first.cached_tokens, first.pool_hit_tokens) == (0, 63)
    assert reqs.loc["r0", "pool_hit_tokens"] == 0
    assert info["kv_tiers"][0]["pools"] == 1


def _alternating_rows():
    # Four requests with one prompt, 100 ms apart: a global round robin over two clusters sends
    # r0 and r2 to cluster 0, r1 and r3 to cluster 1.
    return [dict(arrival_ms=100 * i, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]) for i in range(4)]


@pytest.mark.parametrize("ray_address", [None, "auto"])
def test_a_cluster_tier_is_per_cluster(tmp_path, ray_address):
    """No GPU prefix caching: hits come from the pool alone. r1 misses (cluster 1's pool is empty,
    r0 wrote to cluster 0's), r2 and r3 hit their own cluster's pool. --ray gives the same bytes."""
    if ray_address is not None:
        pytest.importorskip("ray")
    data = {"kv_cache": {"enable_prefix_caching": False, "tiers": [POOL]},
            "fleet": {"replicas": 2, "clusters": 2}}
    out, reqs, info = _run(tmp_path, _alternating_rows(), data, name=str(ray_address), ray_address=ray_address)
    assert list(reqs.replica) == [0, 1, 0, 1]
    assert list(reqs.pool_hit_tokens) == [0, 0, 47, 47]
    (pool,) = info["kv_tiers"]
    assert (pool["pools"], pool["hit_tokens"], pool["blocks_written"], pool["blocks_read"]) == (2, 94, 6, 6)
    if ray_address is not None:
        local, _, local_info = _run(tmp_path, _alternating_rows(), data, name="local")
        for name in ("requests.parquet", "steps.parquet", "chunks.parquet"):
            assert (out / name).read_bytes() == (local / name).read_bytes(), name
        assert local_info["kv_tiers"] == info["kv_tiers"]
