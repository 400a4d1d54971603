"""Disaggregated prefill/decode: hand-checked timings, the degenerate cases, contention, bad configs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from replay.base.errors import ConfigError, TraceError
from replay.engine import pd_run
from replay.engine.config import EngineConfig, validate_config
from replay.engine.kv_transfer import Transfer, TransferNetwork
from replay.engine.run import replay_trace
from replay.reports.views import read_chunks
from tests.engine.test_fleet import ContextTimer, _rows
from tests.engine_helpers import FixedTimer, make_trace, setup_for


def _pd(prefill: int = 1, decode: int = 1, **fleet) -> dict:
    return {"fleet": {"mode": "disaggregated", "prefill": {"replicas": prefill},
                      "decode": {"replicas": decode}, **fleet}}


def _replay(rows, tmp_path, data: dict, monkeypatch, *, timer=None, blocks: int = 1000, name: str = "out",
            **kw) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """Replay with one timer on every pool; a pool's num_gpu_blocks override sizes its cache."""
    timer = timer or FixedTimer(ms=10.0)

    def pool_setup(cfg: EngineConfig):
        return setup_for(cfg.kv_cache.num_gpu_blocks or blocks, timer)

    monkeypatch.setattr(pd_run, "resolve_setup", pool_setup)
    table, meta = make_trace(rows)
    cfg = EngineConfig.model_validate(data)
    decode_blocks = cfg.pool_config("decode").kv_cache.num_gpu_blocks if cfg.fleet and cfg.fleet.disaggregated else None
    out = tmp_path / name
    info = replay_trace(table, meta, cfg, out, setup=setup_for(decode_blocks or blocks, timer),
                        check_invariants=True, **kw).run_info
    reqs = pd.read_parquet(out / "requests.parquet").set_index("request_id")
    return reqs, read_chunks(out).to_pandas(), pd.read_parquet(out / "steps.parquet"), info


# -- the exact degenerate case ---------------------------------------------------------------------

def test_instant_link_1p1d_is_prefill_then_one_token_step_by_hand(tmp_path, monkeypatch):
    """Infinite bandwidth, zero latency: P's prefill step (10 ms + 1 ms for 100 tokens) ends at 11;
    D admits the request at 11 with its blocks allocated and the read lands at once; the next
    schedule at 11 recomputes the last prompt token (10.01 ms): first token at 21.01, then two
    decode steps of 10.01 ms each."""
    rows = [dict(arrival_ms=0, input_tokens=100, output_tokens=3, hash_ids=list(range(1, 8)))]
    timer = FixedTimer(ms=10.0, per_token_ms=0.01)
    data = _pd(kv_transfer={"bandwidth_gb_per_s": math.inf, "latency_ms": 0.0})
    reqs, chunks, steps, info = _replay(rows, tmp_path, data, monkeypatch, timer=timer)
    r = reqs.loc["r0"]
    assert r.first_scheduled_ms == 0.0
    assert r.prefill_end_ms == 11.0
    assert r.kv_transfer_start_ms == r.kv_transfer_end_ms == 11.0
    assert r.first_token_ms == pytest.approx(21.01, abs=1e-9)
    assert r.finish_ms == pytest.approx(21.01 + 2 * 10.01, abs=1e-9)
    assert r.ttft_ms == pytest.approx(21.01, abs=1e-9)
    assert r.kv_wait_ms == 0.0
    assert r.prefill_replica == 0 and r.decode_replica == 0 and r.replica == 0
    # 7 blocks of 16 tokens move (the partial last block too), at the model's 128 KiB per token.
    assert r.kv_transfer_bytes == 7 * 16 * 131072
    # The prefill replica's token is discarded: three chunks, all from the decode replica.
    assert list(chunks.time_ms.round(6)) == [21.01, 31.02, 41.03]
    assert list(steps[steps.pool == "prefill"].prefill_tokens) == [100]
    dec = steps[steps.pool == "decode"]
    # The last prompt token's step is shaped like a decode (one query token over the prompt's
    # context), as the engine shapes any 1-token remainder.
    assert list(dec.scheduled_tokens) == [1, 1, 1] and list(dec.decode_requests) == [1, 1, 1]
    assert info["pools"]["prefill"]["steps"] == 1 and info["pools"]["decode"]["steps"] == 3
    assert info["pools"]["kv_transfer"]["transfers"] == 1


def _agg_rows(tmp_path, data, rows, blocks):
    table, meta = make_trace(rows)
    out = tmp_path / "agg"
    replay_trace(table, meta, EngineConfig.model_validate(data), out, setup=setup_for(blocks, ContextTimer()),
                 check_invariants=True)
    return pd.read_parquet(out / "requests.parquet"), read_chunks(out).to_pandas()


@pytest.mark.parametrize("router", ["round_robin", "kv_aware", "least_loaded"])
def test_threshold_above_every_prompt_is_the_aggregated_fleet(tmp_path, monkeypatch, router):
    """Conditional disaggregation that never disaggregates: the decode pool is the aggregated
    fleet, row for row (sessions with closed-loop turns, preemptions, decode windows)."""
    rows = _rows(150, 3, sessions=True)
    base = {"scheduler": {"max_num_batched_tokens": 128}}
    agg, agg_chunks = _agg_rows(tmp_path, {**base, "fleet": {"replicas": 3, "router": router}}, rows, 80)
    data = {**base, **_pd(prefill=2, decode=3, router=router, local_prefill_max_tokens=10**6)}
    reqs, chunks, steps, info = _replay(rows, tmp_path, data, monkeypatch, timer=ContextTimer(), blocks=80)
    reqs = reqs.reset_index()
    assert info["totals"]["preemptions"] > 0
    assert reqs.prefill_replica.isna().all() and (reqs.kv_transfer_bytes == 0).all()
    pd.testing.assert_frame_equal(reqs[list(agg.columns)], agg)
    key = ["request_id", "time_ms"]
    pd.testing.assert_frame_equal(chunks.sort_values(key).reset_index(drop=True),
                                  agg_chunks.sort_values(key).reset_index(drop=True))
    assert (steps.pool == "decode").all()


# -- transfers, contention and held blocks ----------------------------------------------------------

def test_fair_sharing_by_hand():
    """One prefill egress at 1,000 B/ms, two reads of 1,000,000 bytes into two decode replicas.
    The first runs alone for 10 ms (10,000 B), then both at 500 B/ms: the first's last byte at
    10 + 990,000 / 500 = 1,990 ms, the second has 10,000 B left and finishes alone at 2,000 ms.
    Each completes 5 ms (the latency) after its last byte."""
    net = TransferNetwork(bandwidth_gb_per_s=1e-3, latency_ms=5.0)  # 1e-3 GB/s = 1,000 B/ms
    a = Transfer(idx=0, src=0, dst=0, nbytes=1_000_000, start_ms=0.0)
    b = Transfer(idx=1, src=0, dst=1, nbytes=1_000_000, start_ms=10.0)
    net.start(a, 0.0)
    assert net.next_event_ms() == pytest.approx(1000.0)
    net.start(b, 10.0)
    assert a.rate == b.rate == 500.0
    t = net.next_event_ms()
    assert t == pytest.approx(1990.0)
    assert net.advance(t) == []  # a's bytes are done; its completion comes 5 ms later
    assert b.rate == 1000.0
    assert net.next_event_ms() == pytest.approx(1995.0)
    assert [tr.idx for tr in net.advance(1995.0)] == [0]
    t = net.next_event_ms()
    assert t == pytest.approx(2000.0)
    net.advance(t)
    assert [tr.idx for tr in net.advance(2005.0)] == [1]
    assert net.link_busy_ms[("prefill", 0)] == pytest.approx(2000.0)
    assert net.link_busy_ms[("decode", 1)] == pytest.approx(1990.0)


def test_max_min_fairness_gives_a_bottlenecked_share_to_others():
    """x: P0 -> D0, y, z, w: P1 -> D0, D1, D2. P1's egress is the bottleneck (three reads: 333.3
    each); D0's ingress then has 666.7 left for x, which P0's egress allows: x is not held to an
    equal split of D0 (500)."""
    net = TransferNetwork(bandwidth_gb_per_s=1e-3, latency_ms=0.0)
    x, y, z, w = (Transfer(0, 0, 0, 10**6, 0.0), Transfer(1, 1, 0, 10**6, 0.0), Transfer(2, 1, 1, 10**6, 0.0),
                  Transfer(3, 1, 2, 10**6, 0.0))
    for tr in (x, y, z, w):
        net.start(tr, 0.0)
    assert (y.rate, z.rate, w.rate) == pytest.approx((1000 / 3,) * 3)
    assert x.rate == pytest.approx(2000 / 3)
    assert net.next_event_ms() == pytest.approx(1500.0)  # x's 1e6 bytes at 666.7 B/ms
    assert [tr.idx for tr in net.advance(1500.0)] == [0]
    assert (y.rate, z.rate, w.rate) == pytest.approx((1000 / 3,) * 3)  # P1's egress still bounds them


def _contention_rows():
    # Two 160-token prompts (10 blocks each) arriving together.
    return [dict(arrival_ms=0, input_tokens=160, output_tokens=2, hash_ids=list(range(100 * i, 100 * i + 10)))
            for i in range(2)]


def test_reads_out_of_one_prefill_replica_share_its_egress(tmp_path, monkeypatch):
    """1P + 2D, 1,000 bytes per token, 1,000 B/ms links, 5 ms latency. P prefills both prompts in
    one 10 ms step; both reads (160,000 bytes each) start at 10 and share P's egress at 500 B/ms:
    last bytes at 330, complete at 335; each decode replica's 1-token step ends at 345."""
    transfer = {"bandwidth_gb_per_s": 1e-3, "latency_ms": 5.0, "bytes_per_token": 1000}
    reqs, _, _, info = _replay(_contention_rows(), tmp_path, _pd(1, 2, kv_transfer=transfer), monkeypatch)
    assert sorted(reqs.decode_replica) == [0, 1]
    assert (reqs.kv_transfer_bytes == 160_000).all()
    assert (reqs.kv_transfer_start_ms == 10.0).all()
    assert list(reqs.kv_transfer_end_ms) == pytest.approx([335.0, 335.0])
    assert list(reqs.first_token_ms) == pytest.approx([345.0, 345.0])
    assert list(reqs.kv_wait_ms) == pytest.approx([325.0, 325.0])
    assert info["pools"]["kv_transfer"]["prefill_egress_busy_ms"] == pytest.approx([320.0])
    # Two prefill replicas: each read has its own egress (and each decode replica its ingress).
    reqs2, _, _, _ = _replay(_contention_rows(), tmp_path, _pd(2, 2, kv_transfer=transfer), monkeypatch, name="p2")
    assert list(reqs2.kv_transfer_end_ms) == pytest.approx([175.0, 175.0])
    assert list(reqs2.first_token_ms) == pytest.approx([185.0, 185.0])
    # One decode replica: both reads share its ingress instead.
    reqs3, _, _, _ = _replay(_contention_rows(), tmp_path, _pd(2, 1, kv_transfer=transfer), monkeypatch, name="d1")
    assert list(reqs3.kv_transfer_end_ms) == pytest.approx([335.0, 335.0])


def test_prefill_blocks_stay_held_until_the_read_completes(tmp_path, monkeypatch):
    """The prefill replica's cache holds one prompt (11 usable blocks, 10 needed): the second
    prompt waits there until the first read lands (vLLM delays freeing P's blocks). A: prefill
    0-10, read 10-170, first token 180. B: prefill 170-180, read 180-340, first token 350."""
    transfer = {"bandwidth_gb_per_s": 1e-3, "latency_ms": 0.0, "bytes_per_token": 1000}
    data = _pd(1, 1, kv_transfer=transfer)
    data["fleet"]["prefill"]["kv_cache"] = {"num_gpu_blocks": 12}
    reqs, _, steps, _ = _replay(_contention_rows(), tmp_path, data, monkeypatch)
    assert list(reqs.prefill_end_ms) == [10.0, 180.0]
    assert list(reqs.first_scheduled_ms) == [0.0, 170.0]
    assert list(reqs.kv_transfer_end_ms) == pytest.approx([170.0, 340.0])
    assert list(reqs.first_token_ms) == pytest.approx([180.0, 350.0])
    assert list(reqs.queue_ms) == [0.0, 170.0]
    pre = steps[steps.pool == "prefill"]
    assert list(pre.kv_blocks_used) == [10, 10]  # B's step: A's blocks are free again (cached)


def test_decode_prefix_hit_shrinks_the_read(tmp_path, monkeypatch):
    """destination_missing moves only the blocks the decode replica lacks; full_prompt moves all.
    The second request shares 5 full blocks with the first, which the decode replica holds."""
    rows = [dict(arrival_ms=0, input_tokens=160, output_tokens=2, hash_ids=list(range(10))),
            dict(arrival_ms=1000, input_tokens=160, output_tokens=2, hash_ids=list(range(5)) + [50, 51, 52, 53, 54])]
    transfer = {"bytes_per_token": 1000}
    reqs, _, _, _ = _replay(rows, tmp_path, _pd(kv_transfer=transfer), monkeypatch)
    assert list(reqs.decode_cached_tokens) == [0, 80]
    assert list(reqs.kv_transfer_bytes) == [160_000, 80_000]
    assert list(reqs.cached_tokens) == [0, 80]  # the prefill replica's own hit
    full = {"bytes_per_token": 1000, "timing_mode": "full_prompt"}
    reqs2, _, _, _ = _replay(rows, tmp_path, _pd(kv_transfer=full), monkeypatch, name="full")
    assert list(reqs2.kv_transfer_bytes) == [160_000, 160_000]


def test_local_prefill_threshold_and_prefill_queue_bound(tmp_path, monkeypatch):
    """Short uncached prompts stay on the decode replica; so do all prompts while the prefill
    queue is longer than its bound."""
    rows = [dict(arrival_ms=0, input_tokens=40, output_tokens=2, hash_ids=[1, 2, 3]),
            dict(arrival_ms=0, input_tokens=400, output_tokens=2, hash_ids=list(range(10, 35)))]
    reqs, _, _, _ = _replay(rows, tmp_path, _pd(local_prefill_max_tokens=64), monkeypatch)
    assert reqs.prefill_replica.isna().tolist() == [True, False]
    assert reqs.loc["r0"].ttft_ms == 10.0  # prefilled where it decodes: first token at its prefill's end
    burst = [dict(arrival_ms=0, input_tokens=400, output_tokens=2, hash_ids=list(range(100 * i, 100 * i + 25)))
             for i in range(4)]
    reqs2, _, _, _ = _replay(burst, tmp_path, _pd(prefill_queue_max=1), monkeypatch, name="queue")
    # Two requests queue for prefill; the third and fourth find the queue longer than 1.
    assert reqs2.prefill_replica.isna().tolist() == [False, False, True, True]


def test_disaggregated_sessions_and_windows_are_exact(tmp_path, monkeypatch):
    """Closed-loop turns, several pools, fast-forwarded decode windows: the same rows as stepping
    one step at a time."""
    rows = _rows(200, 7, sessions=True)
    data = {"scheduler": {"max_num_batched_tokens": 128},
            **_pd(2, 3, router="kv_aware", prefill_router="kv_aware",
                  kv_transfer={"bandwidth_gb_per_s": 5e-3, "latency_ms": 2.0, "bytes_per_token": 1000})}
    a, ac, as_, ai = _replay(rows, tmp_path, data, monkeypatch, timer=ContextTimer(), blocks=90, name="ff")
    b, bc, bs, bi = _replay(rows, tmp_path, data, monkeypatch, timer=ContextTimer(), blocks=90, name="step",
                            fast_forward=False)
    pd.testing.assert_frame_equal(a, b)
    assert (a.status == "finished").all()
    key = ["request_id", "time_ms"]
    pd.testing.assert_frame_equal(ac.sort_values(key).reset_index(drop=True), bc.sort_values(key).reset_index(drop=True))
    assert ai["totals"] == bi["totals"]
    assert ai["schedule_calls"] < bi["schedule_calls"]  # windows did fast-forward


def test_the_replay_is_deterministic(tmp_path, monkeypatch):
    rows = _rows(120, 9, sessions=True)
    data = _pd(2, 2, router="random", prefill_router="least_loaded",
               kv_transfer={"bandwidth_gb_per_s": 1e-2, "bytes_per_token": 1000})
    _replay(rows, tmp_path, data, monkeypatch, timer=ContextTimer(), name="a")
    _replay(rows, tmp_path, data, monkeypatch, timer=ContextTimer(), name="b")
    for f in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


# -- bad configs and requests -----------------------------------------------------------------------

@pytest.mark.parametrize("data, key", [
    (_pd(prefill=0), "fleet.prefill.replicas"),
    ({"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 0}}},
     "fleet.decode.replicas"),
    (_pd(kv_transfer={"bandwidth_gb_per_s": 0}), "fleet.kv_transfer.bandwidth_gb_per_s"),
    (_pd(kv_transfer={"bandwidth_gb_per_s": -5}), "fleet.kv_transfer.bandwidth_gb_per_s"),
    (_pd(kv_transfer={"bytes_per_token": 0}), "fleet.kv_transfer.bytes_per_token"),
    ({"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1},
                "decode": {"replicas": 1, "kv_cache": {"block_size": 32}}}}, "fleet.decode.kv_cache.block_size"),
    ({"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1, "model": "Qwen/Qwen3-8B"},
                "decode": {"replicas": 1}}}, "fleet.prefill.model"),
    ({"fleet": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1,
                "scheduler": {"max_num_seqs": 0}}}}, "fleet.decode.scheduler.max_num_seqs"),
    ({"fleet": {"prefill": {"replicas": 1}}}, "fleet.prefill needs fleet.mode: disaggregated"),
    ({"fleet": {"mode": "disaggregated", "decode": {"replicas": 1}}}, "needs fleet.prefill"),
    ({"fleet": {"mode": "disaggregated", "replicas": 4, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}},
     "fleet.replicas"),
    ({"prefill": {"replicas": 1}}, "prefill: unknown key"),
])
def test_bad_configs_name_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        validate_config(data, "cfg.yaml")
    assert key in str(err.value)


def test_a_read_larger_than_the_decode_cache_is_rejected_with_a_reason(tmp_path, monkeypatch):
    rows = [dict(arrival_ms=0, input_tokens=160, output_tokens=2, hash_ids=list(range(10))),
            dict(arrival_ms=5, input_tokens=640, output_tokens=2, hash_ids=list(range(20, 60)))]
    data = _pd()
    data["fleet"]["decode"]["kv_cache"] = {"num_gpu_blocks": 30}
    with pytest.raises(TraceError, match="r1"):
        _replay(rows, tmp_path, data, monkeypatch)
    reqs, _, _, _ = _replay(rows, tmp_path, data, monkeypatch, name="skip", on_error="skip")
    assert list(reqs.status) == ["finished", "rejected"]
    assert "KV blocks" in reqs.loc["r1"].reject_reason
    # ... and a prompt larger than the prefill pool's cache, likewise.
    data = _pd()
    data["fleet"]["prefill"]["kv_cache"] = {"num_gpu_blocks": 30}
    reqs, _, _, _ = _replay(rows, tmp_path, data, monkeypatch, name="skip2", on_error="skip")
    assert list(reqs.status) == ["finished", "rejected"]
    assert "prefill replica" in reqs.loc["r1"].reject_reason
