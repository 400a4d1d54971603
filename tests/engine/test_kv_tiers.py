"""Hand-checked KV tier scenarios (block size 16, fixed 10 ms steps, 1,000 bytes per token).

An offload block of 16 tokens is 16,000 bytes: 10 ms on a 0.0016 GB/s link. GPU prefix caching is
off unless said, so only the tiers can hit.
"""

from __future__ import annotations

import gc

import pandas as pd
import pytest

from replay.base.errors import ConfigError
from replay.engine.config import EngineConfig, apply_overrides, validate_config
from replay.engine.run import replay_trace
from tests.engine_helpers import FixedTimer, make_trace, setup_for

SLOW = 0.0016  # GB/s: 10 ms per 16-token block


def tier(name, medium="disk", scope="replica", num_blocks=100, read=SLOW, write=SLOW, **kw):
    return {"name": name, "medium": medium, "scope": scope, "num_blocks": num_blocks,
            "read_gb_per_s": read, "write_gb_per_s": write, **kw}


def run_tiers(rows, tmp_path, tiers, *, host=None, fleet=None, num_gpu_blocks=64, caching=False):
    table, meta = make_trace(rows)
    data = {"scheduler": {"max_num_batched_tokens": 1000},
            "kv_cache": {"enable_prefix_caching": caching, "tiers": tiers}}
    if host is not None:
        data["host_offload"] = host
    if fleet is not None:
        data["fleet"] = fleet
    cfg = EngineConfig.model_validate(data)
    out = tmp_path / "out"
    info = replay_trace(table, meta, cfg, out, setup=setup_for(num_gpu_blocks, FixedTimer(), kv_bytes_per_token=1000),
                        check_invariants=True).run_info
    return pd.read_parquet(out / "requests.parquet").set_index("request_id"), info


def test_disk_tier_write_through_then_load(tmp_path):
    # A (48 tokens, 3 blocks) runs 0-10 ms; the GPU offers its 3 blocks, written to the disk from the
    # step's end: 30 ms, visible at 40. B (same prompt) arrives at 50: 3 disk blocks hit, a full hit
    # (47 tokens loaded, the last recomputed); the read takes 30 ms, so B is scheduled at 80.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=50, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, info = run_tiers(rows, tmp_path, [tier("ssd")])
    b = reqs.loc["r1"]
    assert (b.cached_tokens, b.cpu_hit_tokens, b.ssd_hit_tokens) == (0, 47, 47)
    assert b.load_wait_ms == 30.0 and b.first_scheduled_ms == 80.0
    assert reqs.loc["r0", "ssd_hit_tokens"] == 0
    (ssd,) = info["kv_tiers"]
    assert (ssd["hit_tokens"], ssd["blocks_written"], ssd["blocks_read"]) == (47, 3, 3)
    assert ssd["bytes_read"] == 3 * 16_000 and ssd["hit_rate"] == 47 / 96
    assert ssd["link_utilization"]["read"] == pytest.approx(30.0 / info["simulated_span_ms"])


def test_write_not_complete_is_not_a_hit(tmp_path):
    # B arrives at 30 ms, before A's write completes (40 ms): nothing to load.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=30, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, _ = run_tiers(rows, tmp_path, [tier("ssd")])
    assert reqs.loc["r1", "ssd_hit_tokens"] == 0 and reqs.loc["r1", "cpu_hit_tokens"] == 0


def test_two_loads_share_one_link_in_issue_order(tmp_path):
    # A1 (blocks 1, 2) and A2 (3, 4) run in one step; the 4 blocks are written at 10-50 ms. B (1, 2)
    # and C (3, 4) arrive at 60 and both hit (31 tokens each). Their reads queue on the disk link:
    # B's 20 ms from 60 to 80, C's from 80 to 100.
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(input_tokens=32, output_tokens=1, hash_ids=[3, 4]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[3, 4])]
    reqs, info = run_tiers(rows, tmp_path, [tier("ssd")])
    assert list(reqs.loc[["r2", "r3"], "ssd_hit_tokens"]) == [31, 31]
    assert list(reqs.loc[["r2", "r3"], "load_wait_ms"]) == [20.0, 40.0]
    assert list(reqs.loc[["r2", "r3"], "first_scheduled_ms"]) == [80.0, 100.0]


def test_disk_link_is_per_node(tmp_path):
    # The same two loads on two replicas (round robin: B on replica 0, C on replica 1) of one node:
    # each replica's disk tier is its own store, but the node's link is shared: 20 then 40 ms.
    # (B and C each hit their own replica's copy, written by A1 and A2 on their replicas.)
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(input_tokens=32, output_tokens=1, hash_ids=[3, 4]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[3, 4])]
    fleet = {"replicas": 2, "router": "round_robin"}
    reqs, _ = run_tiers(rows, tmp_path, [tier("ssd", replicas_per_node=2)], fleet=fleet)
    assert list(reqs.loc[["r2", "r3"], "replica"]) == [0, 1]
    # A1's and A2's writes share the node's write link too: 20 ms each, done at 30 and 50.
    assert list(reqs.loc[["r2", "r3"], "load_wait_ms"]) == [20.0, 40.0]
    reqs, _ = run_tiers(rows, tmp_path / "own", [tier("ssd")], fleet=fleet)  # a link per replica
    assert list(reqs.loc[["r2", "r3"], "load_wait_ms"]) == [20.0, 20.0]


def test_cluster_tier_is_shared_by_replicas(tmp_path):
    # A runs on replica 0; B (same prompt, round robin: replica 1) finds it in the cluster pool,
    # at the remote tier's cost: 5 ms to first byte + 30 ms on replica 1's NIC -> ready at 85.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=50, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    fleet = {"replicas": 2, "router": "round_robin"}
    pool = tier("pool", medium="remote", scope="cluster", latency_ms=5.0, read=SLOW, write=1.0)
    reqs, info = run_tiers(rows, tmp_path, [pool], fleet=fleet)
    b = reqs.loc["r1"]
    assert b.replica == 1 and b.pool_hit_tokens == 47
    assert b.load_wait_ms == 35.0 and b.first_scheduled_ms == 85.0
    assert info["kv_tiers"][0]["pools"] == 1
    # The same tier with replica scope: replica 1 has its own, empty store.
    reqs, _ = run_tiers(rows, tmp_path / "replica", [{**pool, "scope": "replica"}], fleet=fleet)
    assert reqs.loc["r1", "pool_hit_tokens"] == 0


def test_pool_aggregate_bandwidth_queues_replicas(tmp_path):
    # Two replicas each load 2 blocks from a cluster pool at once: each NIC is fast, the pool's
    # aggregate read link (0.0016 GB/s) is not: 20 ms, then 40 ms.
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(input_tokens=32, output_tokens=1, hash_ids=[3, 4]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=60, input_tokens=32, output_tokens=1, hash_ids=[3, 4])]
    fleet = {"replicas": 2, "router": "round_robin"}
    pool = tier("pool", medium="remote", scope="cluster", read=100.0, write=100.0, pool_read_gb_per_s=SLOW)
    reqs, info = run_tiers(rows, tmp_path, [pool], fleet=fleet)
    assert sorted(reqs.loc[["r2", "r3"], "load_wait_ms"]) == [20.0, 40.0]
    assert set(info["kv_tiers"][0]["link_utilization"]) == {"pool_read", "read", "write"}


def test_on_evict_tier_takes_g2_evictions_and_a_hit_spans_tiers(tmp_path):
    # G2 holds 3 blocks. A (1, 2) is stored there; D (7, 8) at 100 ms evicts one block: G2's LRU
    # order puts a request's tail before its head, so block 2 leaves and goes to the on-evict disk.
    # B (1, 2) at 200 ms: block 1 from G2, block 2 from the disk (a full hit: 31 tokens, 16 + 15).
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=100, input_tokens=32, output_tokens=1, hash_ids=[7, 8]),
            dict(arrival_ms=200, input_tokens=32, output_tokens=1, hash_ids=[1, 2])]
    host = {"num_cpu_blocks": 3, "d2h_gbps": SLOW, "h2d_gbps": SLOW, "latency_us": 0.0}
    reqs, info = run_tiers(rows, tmp_path, [tier("ssd", store="on_evict")], host=host)
    b = reqs.loc["r2"]
    assert (b.cpu_hit_tokens, b.host_hit_tokens, b.ssd_hit_tokens) == (31, 16, 15)
    # Both parts load at once (G2's lane and the disk link): 10 ms each, ready at 210.
    assert b.load_wait_ms == 10.0
    (ssd,) = info["kv_tiers"]
    # D's eviction, then B's promotion of block 2 back into the full G2 evicts one more.
    assert ssd["blocks_written"] == 2 and info["totals"]["cpu_evictions"] == 2


def test_promotion_into_g2(tmp_path):
    # As above; B's disk block is promoted into G2 when the load completes, so E (1, 2) at 300 ms
    # finds both blocks in G2.
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=100, input_tokens=32, output_tokens=1, hash_ids=[7, 8]),
            dict(arrival_ms=200, input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=300, input_tokens=32, output_tokens=1, hash_ids=[1, 2])]
    host = {"num_cpu_blocks": 3, "d2h_gbps": SLOW, "h2d_gbps": SLOW, "latency_us": 0.0}
    reqs, _ = run_tiers(rows, tmp_path, [tier("ssd", store="on_evict")], host=host)
    e = reqs.loc["r3"]
    assert (e.host_hit_tokens, e.ssd_hit_tokens) == (31, 0)


def test_eviction_lru_in_a_tiny_tier(tmp_path):
    # A disk of 2 blocks: A (1, 2) then D (7, 8) fill and replace it; B (1, 2) misses, F (7, 8) hits.
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=100, input_tokens=32, output_tokens=1, hash_ids=[7, 8]),
            dict(arrival_ms=200, input_tokens=32, output_tokens=1, hash_ids=[1, 2]),
            dict(arrival_ms=300, input_tokens=32, output_tokens=1, hash_ids=[7, 8])]
    reqs, info = run_tiers(rows, tmp_path, [tier("ssd", num_blocks=2)])
    assert list(reqs.ssd_hit_tokens) == [0, 0, 0, 0] or list(reqs.ssd_hit_tokens) == [0, 0, 0, 31]
    assert reqs.loc["r2", "ssd_hit_tokens"] == 0
    assert info["kv_tiers"][0]["evictions"] >= 2


def test_without_tiers_no_tier_columns(tmp_path):
    rows = [dict(input_tokens=32, output_tokens=1, hash_ids=[1, 2])]
    reqs, info = run_tiers(rows, tmp_path, [])
    assert not [c for c in reqs.columns if c.endswith("_hit_tokens") and c != "cpu_hit_tokens"]
    assert "kv_tiers" not in info


@pytest.mark.parametrize("tiers, key", [
    ([tier("ssd"), tier("ssd")], "kv_cache.tiers.ssd: a duplicate tier name"),
    ([tier("host")], "kv_cache.tiers.host: the host_offload tier's name"),
    ([tier("ssd", num_blocks=0)], "kv_cache.tiers.0.num_blocks"),
    ([tier("ssd", read=0.0)], "kv_cache.tiers.0.read_gb_per_s"),
    ([tier("ssd", write=-1.0)], "kv_cache.tiers.0.write_gb_per_s"),
    ([tier("pool", medium="remote", scope="cluster", block_size=32)], "kv_cache.tiers.pool.block_size"),
    ([tier("ssd", store="on_evict")], "kv_cache.tiers.ssd.store"),
])
def test_bad_tier_configs_name_the_key(tiers, key):
    data = {"kv_cache": {"tiers": tiers}, "host_offload": {"num_cpu_blocks": 10}}
    if key.endswith(".store"):
        del data["host_offload"]
    with pytest.raises(ConfigError) as exc:
        validate_config(data, "cfg.yaml")
    assert key in str(exc.value)


def test_set_addresses_a_tier_by_name():
    data = {"kv_cache": {"tiers": [tier("ssd"), tier("pool", medium="remote", scope="cluster")]}}
    apply_overrides(data, ["kv_cache.tiers.pool.num_blocks=7", "kv_cache.tiers.ssd.read_gb_per_s=2.5"])
    cfg = validate_config(data, "x")
    assert cfg.kv_cache.tiers[1].num_blocks == 7 and cfg.kv_cache.tiers[0].read_gb_per_s == 2.5
    with pytest.raises(ConfigError, match="no single entry named 'nvme'"):
        apply_overrides(data, ["kv_cache.tiers.nvme.num_blocks=7"])


@pytest.mark.parametrize("host, replicas", [(None, 1), ({"num_cpu_blocks": 40, "d2h_gbps": 0.05, "h2d_gbps": 0.05}, 1),
                                            (None, 3)])
def test_fast_forward_is_byte_identical_with_tiers(tmp_path, host, replicas):
    # Decode windows prepare the tiers' stores and replay the blocked head's lookups; stepping
    # one step at a time must give the same bytes, with a tiny disk tier evicting and a pool.
    from tests.engine.test_fast_forward import _busy_trace

    table, meta = _busy_trace(150, seed=7)
    tiers = [tier("ssd", num_blocks=30, read=0.05, write=0.05, store="on_evict" if host else "write_through"),
             tier("pool", medium="remote", scope="cluster", num_blocks=400, read=0.02, write=0.02, latency_ms=1.0)]
    data = {"scheduler": {"max_num_batched_tokens": 64}, "kv_cache": {"tiers": tiers}}
    if host:
        data["host_offload"] = host
    if replicas > 1:
        data["fleet"] = {"replicas": replicas, "router": "least_loaded"}
    cfg = EngineConfig.model_validate(data)
    outs = []
    for ff in (True, False):
        out = tmp_path / f"ff{ff}"
        info = replay_trace(table, meta, cfg, out, setup=setup_for(60, FixedTimer(5.0, 0.01, 1e-4)),
                            fast_forward=ff, check_invariants=True).run_info
        outs.append((out, info))
    (a, ia), (b, ib) = outs
    assert ia["totals"] == ib["totals"] and ia["kv_tiers"] == ib["kv_tiers"]
    assert sum(t["hit_tokens"] for t in ia["kv_tiers"]) > 0
    if replicas == 1:
        for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
        return
    # A fleet's windows write their replica's rows in one go, so rows of different replicas
    # interleave differently (with or without tiers); the contents must be equal.
    assert (a / "requests.parquet").read_bytes() == (b / "requests.parquet").read_bytes()
    for name, keys in (("chunks.parquet", None), ("steps.parquet", ["replica", "step"])):
        x, y = pd.read_parquet(a / name), pd.read_parquet(b / name)
        keys = keys or list(x.columns)
        assert x.sort_values(keys).reset_index(drop=True).equals(y.sort_values(keys).reset_index(drop=True)), name


def test_router_tier_weights_name_known_tiers():
    data = {"kv_cache": {"tiers": [tier("ssd")]},
            "fleet": {"replicas": 2, "router": "kv_aware", "router_options": {"tier_weights": {"nvme": 0.5}}}}
    with pytest.raises(ConfigError, match="fleet.router_options.tier_weights.nvme: no such KV tier"):
        validate_config(data, "x")
    data["fleet"]["router_options"]["tier_weights"] = {"ssd": 1.5}
    with pytest.raises(ConfigError, match=r"in \[0, 1\]"):
        validate_config(data, "x")


@pytest.mark.parametrize("router", ["kv_aware", "prefix_score"])
def test_router_follows_a_prefix_in_a_replica_tier(tmp_path, router):
    # A (blocks 1-3) runs on replica 0 and leaves the GPU cache only on its disk tier (GPU prefix
    # caching off). B, same prompt, arrives once the write has landed: with the disk weighed, the
    # router sends it to replica 0, where it loads 47 tokens; without, both replicas look alike and
    # the least-cost tie goes by the seeded draw.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=100, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    options = {"tier_weights": {"ssd": 1.0}}
    if router == "prefix_score":
        options["precise"] = True
    fleet = {"replicas": 2, "router": router, "router_options": options}
    hits = []
    for seed_dir in range(4):  # whatever the seed, B follows its prefix
        table, meta = make_trace(rows)
        cfg = EngineConfig.model_validate({"seed": seed_dir, "scheduler": {"max_num_batched_tokens": 1000},
                                           "kv_cache": {"enable_prefix_caching": False, "tiers": [tier("ssd")]},
                                           "fleet": fleet})
        out = tmp_path / f"s{seed_dir}"
        replay_trace(table, meta, cfg, out, setup=setup_for(64, FixedTimer(), kv_bytes_per_token=1000))
        reqs = pd.read_parquet(out / "requests.parquet").set_index("request_id")
        assert reqs.loc["r1", "replica"] == reqs.loc["r0", "replica"]
        hits.append(reqs.loc["r1", "ssd_hit_tokens"])
    assert hits == [47] * 4


def test_size_curve_from_one_run(tmp_path):
    # Shadow stores of other sizes see the tier's writes and loads: at the tier's own size the
    # curve gives the tier's own hits, and it never falls as the size grows.
    from tests.engine.test_fast_forward import _busy_trace

    table, meta = _busy_trace(150, seed=3)
    ssd = tier("ssd", num_blocks=40, read=0.05, write=0.05, size_curve=[10, 40, 160, 640])
    cfg = EngineConfig.model_validate({"scheduler": {"max_num_batched_tokens": 256},
                                       "kv_cache": {"enable_prefix_caching": False, "tiers": [ssd]}})
    info = replay_trace(table, meta, cfg, tmp_path / "out", setup=setup_for(200, FixedTimer(5.0, 0.01)),
                        check_invariants=True).run_info
    (t,) = info["kv_tiers"]
    curve = [p["hit_tokens"] for p in t["size_curve"]]
    assert curve == sorted(curve) and curve[0] < curve[-1]
    # At the tier's own size, close to the tier's own hits: the shadow counts whole blocks (the tier
    # drops a full hit's recomputed token) and ignores pins (the tier cannot evict a block being
    # loaded, so in a 40-block tier it sometimes keeps other blocks than a plain LRU would).
    assert abs(curve[1] - t["hit_tokens"]) <= 0.1 * t["hit_tokens"]
    assert [p["num_blocks"] for p in t["size_curve"]] == [10, 40, 160, 640]


def test_report_section_lists_tiers():
    from replay.reports.kv_tiers import kv_tiers_section

    info = {"kv_tiers": [{"name": "ssd", "medium": "disk", "scope": "replica", "store": "write_through",
                          "num_blocks": 100, "hit_tokens": 4800, "hit_rate": 0.25, "bytes_read": 2e9,
                          "bytes_written": 3e9, "evictions": 7, "writes_dropped": 0,
                          "link_utilization": {"read": 0.5, "write": 0.25},
                          "size_curve": [{"num_blocks": 50, "hit_tokens": 10, "hit_rate": 0.1}]}]}
    text = "\n".join(kv_tiers_section(info))
    assert "## KV tiers" in text and "| ssd | disk, replica, write_through | 100 | 4,800 | 0.2500 |" in text
    assert "read 50.0%, write 25.0%" in text and "- ssd: 50: 0.1000" in text
    assert kv_tiers_section({}) == []


def test_unbounded_cluster_tier_reaches_the_ideal_reuse(tmp_path):
    # The bound: one cluster tier with room for everything, at (practically) infinite bandwidth and
    # no latency, on a 4-replica fleet that spreads each session's turns round robin: every prefix
    # computed anywhere is found anywhere, so the fleet's GPU + tier hits equal the trace's ideal
    # reuse that `replay inspect` reports, less prefixes still being computed when asked for (none
    # on this trace: a session's turns wait for the previous answer; on the Mooncake conversation
    # trace's first 3,000 requests and 8 replicas, 3,760 of 12,964,863 ideal tokens, docs/kv-tiers.md).
    from pathlib import Path

    from replay.ingest.api import inspect_trace, load_trace

    path = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"
    stats, _, _ = inspect_trace(path)
    table, meta = load_trace(path)
    pool = tier("pool", medium="remote", scope="cluster", num_blocks=10**9, read=1e6, write=1e6)
    cfg = EngineConfig.model_validate({"kv_cache": {"tiers": [pool]},
                                       "fleet": {"replicas": 4, "router": "round_robin"}})
    t = replay_trace(table, meta, cfg, tmp_path / "out").run_info["totals"]
    got = t["prefix_hit_tokens"] + t["cpu_hit_tokens"]
    assert t["cpu_hit_tokens"] > 0 and t["prefix_hit_tokens"] > 0  # turns on other replicas hit the pool
    assert got == round(stats["token_prefix_hit_infinite"] * stats["input_tokens_total"])


def test_two_requests_of_one_step_offer_the_same_prefix(tmp_path):
    # A and B share blocks 1-2 and run in one step: each offers them (one write each: the second
    # finds nothing new once the first has landed, but both are in flight together, so both are
    # sent). C later finds the shared prefix.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 4]),
            dict(arrival_ms=200, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 5])]
    reqs, info = run_tiers(rows, tmp_path, [tier("ssd")])
    assert reqs.loc["r2", "ssd_hit_tokens"] == 32
    (ssd,) = info["kv_tiers"]
    # C sends block 5, still in flight when the replay ends (so not held).
    assert ssd["blocks_written"] == 3 + 3 + 1 and ssd["blocks_held"] == 4


def test_sweep_keys_address_a_tier_by_name():
    from replay.sweep.grid import check_config_key

    check_config_key("kv_cache.tiers.ssd.num_blocks", "--vary")
    with pytest.raises(ConfigError, match="unknown config key"):
        check_config_key("kv_cache.tierz.ssd.num_blocks", "--vary")


@pytest.mark.parametrize("enabled", [True, False])
def test_replay_leaves_the_collector_as_it_found_it_and_no_store_garbage(tmp_path, enabled):
    # Collection is off during a replay (engine/run.py) and restored after; the G2 and tier stores
    # are released when the outputs are written, so what the replay drops is freed by reference
    # counting and the collector finds about 800 objects here (pandas' and the recorder's), where
    # without the release it found 5,648 (the stores' runs and their group lists).
    rows = [dict(arrival_ms=10.0 * i, input_tokens=48, output_tokens=20, hash_ids=[i, i + 1, i + 2])
            for i in range(300)]
    gc.collect()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        run_tiers(rows, tmp_path, [tier("ssd", num_blocks=1000), tier("pool", medium="remote", scope="cluster",
                                                                     num_blocks=1000)],
                  host={"num_cpu_blocks": 1000, "d2h_gbps": 10.0, "h2d_gbps": 10.0})
        assert gc.isenabled() is enabled
        gc.disable()
        assert gc.collect() < 1500
    finally:
        (gc.enable if was else gc.disable)()


def test_hit_tokens_per_tier_by_hand():
    """Host loaded 2 offload blocks of 16 tokens, disk 4; the GPU hit 8 tokens into the first one and
    the full hit recomputes its last token: the GPU's 8 come off host, the last token off disk."""
    from replay.engine.kv_tiers import hit_tokens_per_tier

    assert hit_tokens_per_tier([32, 64], 8, 87, 16) == [24, 63]
    assert hit_tokens_per_tier([0, 48], 0, 48, 16) == [0, 48]  # nothing in host: all from disk
    assert hit_tokens_per_tier([16, 0], 16, 15, 16) == [15, 0]  # GPU hit on a boundary: no share to give


def test_loads_in_flight_stay_reserved_without_the_full_prompt_gate(tmp_path):
    # vLLM 0.33 reserves the blocks of the loads in flight in allocate_slots, not in the full-prompt
    # gate: with scheduler.reserve_full_isl false a small GPU cache with G2 must still complete
    # (without the reservation the sample sessions stopped at 699.5 s: a preempted head needing
    # 1,802 blocks, behind it a finished load holding 296, nothing running).
    from pathlib import Path

    from replay.ingest.api import load_trace

    path = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"
    table, meta = load_trace(path)
    cfg = EngineConfig.model_validate({"kv_cache": {"num_gpu_blocks": 1200},
                                       "host_offload": {"num_cpu_blocks": 20000},
                                       "scheduler": {"reserve_full_isl": False}})
    t = replay_trace(table, meta, cfg, tmp_path / "out").run_info["totals"]
    assert t["finished"] == table.num_rows and t["cpu_hit_tokens"] > 0
