"""KV tiers on a disaggregated fleet, by hand: the prefill replica skips what the tiers hold and
writes its blocks through to them; a decode replica loads a cluster tier's blocks from it
(``decode_source: cluster_tier``) or all of the prompt over the P->D link (``prefill``)."""

from __future__ import annotations

import pandas as pd
import pytest

from replay.base.errors import ConfigError
from replay.engine import pd_run
from replay.engine.config import EngineConfig, validate_config
from replay.engine.run import replay_trace
from tests.engine_helpers import FixedTimer, make_trace, setup_for

SLOW = 0.0016  # GB/s = 1,600 bytes per ms: a 16-token block of 16,000 bytes takes 10 ms


def _run(rows, tmp_path, monkeypatch, *, decode_source: str, name: str = "out"):
    """1P+1D, 10 ms steps, no GPU prefix caching (the tier alone gives hits), 1,000 KV bytes per
    token on both the tier and the P->D link (1,600 bytes per ms: 10 ms per block)."""
    timer = FixedTimer(ms=10.0)
    monkeypatch.setattr(pd_run, "resolve_setup", lambda cfg: setup_for(1000, timer, kv_bytes_per_token=1000))
    pool = {"name": "pool", "medium": "remote", "scope": "cluster", "num_blocks": 100,
            "read_gb_per_s": SLOW, "write_gb_per_s": SLOW}
    data = {"kv_cache": {"enable_prefix_caching": False, "tiers": [pool]},
            "fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                      "kv_transfer": {"bandwidth_gb_per_s": SLOW, "bytes_per_token": 1000,
                                      "decode_source": decode_source}}}
    table, meta = make_trace(rows)
    out = tmp_path / name
    info = replay_trace(table, meta, EngineConfig.model_validate(data), out,
                        setup=setup_for(1000, timer, kv_bytes_per_token=1000), check_invariants=True).run_info
    return pd.read_parquet(out / "requests.parquet").set_index("request_id"), info


# A (3 blocks) seeds the pool: P computes it 0-10 and writes its 3 blocks through, landing at 40.
# B (blocks 1-4) arrives at 100: P loads blocks 1-3 from the pool (100-130), computes block 4
# (130-140) and writes it (140-150). D gets B at 140, when the pool holds blocks 1-3.
ROWS = [dict(arrival_ms=0, input_tokens=48, output_tokens=2, hash_ids=[1, 2, 3]),
        dict(arrival_ms=100, input_tokens=64, output_tokens=2, hash_ids=[1, 2, 3, 4])]


def test_decode_loads_the_cluster_tier_part_and_reads_the_rest_from_prefill(tmp_path, monkeypatch):
    reqs, info = _run(ROWS, tmp_path, monkeypatch, decode_source="cluster_tier")
    a, b = reqs.loc["r0"], reqs.loc["r1"]
    # A: the pool is empty when D admits it at 10: all 3 blocks over P->D (30 ms), first token 50.
    assert (a.decode_tier_tokens, a.kv_transfer_bytes) == (0, 48_000)
    assert (a.kv_transfer_end_ms, a.first_token_ms) == (40.0, 50.0)
    # B on P: 48 tokens from the pool (the prefill replica's hit), ready at 130, prefill ends 140.
    assert (b.pool_hit_tokens, b.cpu_hit_tokens, b.cached_tokens) == (48, 48, 0)
    assert b.prefill_end_ms == 140.0
    # B on D at 140: blocks 1-3 from the pool over D's NIC (30 ms: 170); block 4, whose write lands
    # only at 150, over P->D (10 ms: 150). Ready at 170; the 1-token step gives the first token at 180.
    assert (b.decode_tier_tokens, b.decode_tier_bytes, b.kv_transfer_bytes) == (48, 48_000, 16_000)
    assert b.kv_transfer_end_ms == 150.0
    assert b.kv_wait_ms == 30.0 and b.first_token_ms == 180.0
    (pool,) = info["kv_tiers"]
    # Hits count the compute saved (P's); reads count both replicas' loads; written: A's 3 + B's 1.
    assert (pool["hit_tokens"], pool["blocks_read"], pool["blocks_written"]) == (48, 6, 4)


def test_decode_source_prefill_reads_the_whole_prompt_over_the_link(tmp_path, monkeypatch):
    reqs, info = _run(ROWS, tmp_path, monkeypatch, decode_source="prefill")
    b = reqs.loc["r1"]
    # P's side is unchanged: the pool saves it 48 tokens of compute.
    assert b.pool_hit_tokens == 48 and b.prefill_end_ms == 140.0
    # D reads all 4 blocks from P: 40 ms, ready at 180, first token at 190.
    assert (b.decode_tier_tokens, b.kv_transfer_bytes) == (0, 64_000)
    assert b.kv_transfer_end_ms == 180.0 and b.first_token_ms == 190.0
    assert info["kv_tiers"][0]["blocks_read"] == 3


def test_the_tier_must_hold_blocks_decode_would_otherwise_read():
    """Without a cluster tier, decode_source cluster_tier has nothing to read from; pools cannot
    set tiers of their own (a cluster tier is one store both pools share)."""
    disk = {"name": "ssd", "medium": "disk", "num_blocks": 10, "read_gb_per_s": 1.0, "write_gb_per_s": 1.0}
    fleet = {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    with pytest.raises(ConfigError, match="fleet.kv_transfer.decode_source"):
        validate_config({"kv_cache": {"tiers": [disk]},
                         "fleet": {**fleet, "kv_transfer": {"decode_source": "cluster_tier"}}}, "cfg.yaml")
    with pytest.raises(ConfigError, match="fleet.decode.kv_cache.tiers"):
        validate_config({"kv_cache": {"tiers": [disk]},
                         "fleet": {**fleet, "decode": {"replicas": 1, "kv_cache": {"tiers": []}}}}, "cfg.yaml")


def test_a_pool_cannot_set_tiers_when_the_fleet_has_none():
    # Refused with or without top-level tiers: a pool's own tiers were otherwise ignored in silence.
    disk = {"name": "ssd", "medium": "disk", "num_blocks": 10, "read_gb_per_s": 1.0, "write_gb_per_s": 1.0}
    fleet = {"mode": "disaggregated", "prefill": {"replicas": 1},
             "decode": {"replicas": 1, "kv_cache": {"tiers": [disk]}}}
    with pytest.raises(ConfigError, match="fleet.decode.kv_cache.tiers"):
        validate_config({"fleet": fleet}, "cfg.yaml")
