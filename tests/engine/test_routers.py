"""Each router's rule, checked by hand on replicas whose state is set directly."""

from __future__ import annotations

import numpy as np
import pytest

from replay.engine.block_keys import BlockKeys
from replay.engine.request import Request
from replay.engine.routers import RouterContext, build_router
from replay.engine.trace_input import TraceArrays

BS = 16


class StubView:
    """A replica as routers see it: engine/replica_view.ReplicaView's interface, values set directly."""

    def __init__(self, waiting=0, running=0, usage=0.0, cached=(), usable=100, replica=0) -> None:
        self.replica = replica
        self.num_waiting = waiting
        self.num_running = running
        self._usage = usage
        self.num_usable_blocks = usable
        self.num_free_blocks = round(usable * (1.0 - usage))
        self._cached = set(cached)

    def kv_usage(self) -> float:
        return self._usage

    def tier_hit_tokens(self, req, gpu_hit_tokens: int, now_ms: float) -> dict[str, int]:
        return {}

    def waiting_prompt_tokens(self) -> int:
        return 0

    def prefix_hit_blocks(self, runs: list[range]) -> int:
        n = 0
        for key in (k for r in runs for k in r):
            if key not in self._cached:
                break
            n += 1
        return n


def _numbered(views: list[StubView]) -> list[StubView]:
    """Every replica of a fixed fleet, live: ids are the positions."""
    for i, v in enumerate(views):
        v.replica = i
    return views


def test_the_stub_offers_exactly_the_view():
    from replay.engine.replica_view import ReplicaView

    public = {n for n in dir(ReplicaView) if not n.startswith("_")}
    assert public == {n for n in dir(StubView(cached=[1])) if not n.startswith("_")}


def _ctx(n: int, sessions=None, seed: int = 0) -> RouterContext:
    rows = len(sessions) if sessions else 8
    trace = TraceArrays(request_id=[f"r{i}" for i in range(rows)], arrival_ms=np.zeros(rows, np.int64),
                        input_tokens=np.zeros(rows, np.int64), output_tokens=np.zeros(rows, np.int64),
                        hash_offsets=np.zeros(rows + 1, np.int64), hash_values=np.zeros(0, np.uint64),
                        session_id=list(sessions) if sessions else [None] * rows, turn=np.full(rows, -1),
                        delay_ms=np.full(rows, np.nan), priority=np.zeros(rows, np.int64), hash_block_size=BS,
                        shared_lead=np.zeros(rows, np.int64))
    return RouterContext(num_replicas=n, block_size=BS, num_gpu_blocks=101, seed=seed, trace=trace)


def _req(idx: int, ids: list[int], tokens: int | None = None) -> Request:
    """A request whose prompt is one 16-token block per trace id (ids chained by the caller)."""
    tokens = tokens if tokens is not None else len(ids) * BS
    keys = BlockKeys(ids, 0, len(ids), BS, BS, tokens, idx)
    return Request(idx, f"r{idx}", 0.0, tokens, 4, keys)


def _keys(ids: list[int]) -> list[int]:
    return BlockKeys(ids, 0, len(ids), BS, BS, len(ids) * BS, 999).keys_upto(len(ids))[:len(ids)]


def test_round_robin_cycles_and_predicts_its_next_arrival():
    r = build_router("round_robin", {}, _ctx(3))
    reps = _numbered([StubView() for _ in range(3)])
    assert [r.route(_req(i, [i + 1]), reps, 0.0) for i in range(5)] == [0, 1, 2, 0, 1]
    assert [r.next_open_offset(k) for k in range(3)] == [1, 2, 0]


def test_least_loaded_follows_vllm_033_score_and_rotates_ties():
    r = build_router("least_loaded", {"stats_update_ms": 0}, _ctx(3))
    # score = max(inflight, waiting + running) + waiting * 6 * max(0, usage - 0.5)
    reps = _numbered([StubView(waiting=1, running=2, usage=0.9),   # 3 + 1 * 6 * 0.4 = 5.4
            StubView(waiting=0, running=5, usage=0.99),  # 5 (no penalty without waiting)
            StubView(waiting=2, running=2, usage=0.5)])   # 4 (penalty 0 at 50% usage)
    assert r.route(_req(0, [1]), reps, 0.0) == 2
    # Equal scores: the scan starts one engine later after every pick, first strict minimum wins.
    r = build_router("least_loaded", {"stats_update_ms": 0}, _ctx(3))
    idle = _numbered([StubView() for _ in range(3)])
    picks = [r.route(_req(i, [i + 1]), idle, 0.0) for i in range(3)]
    # Snapshot refreshed at every arrival (0 ms); the client's in-flight count then decides.
    assert picks == [0, 1, 2]


def test_least_loaded_counts_its_own_routing_between_snapshots():
    r = build_router("least_loaded", {"stats_update_ms": 100}, _ctx(2))
    reps = _numbered([StubView(), StubView()])
    # One snapshot at t=0 (all idle); routing adds to the local waiting copy, so picks alternate.
    assert [r.route(_req(i, [i + 1]), reps, float(i)) for i in range(4)] == [0, 1, 0, 1]
    r.request_finished(_req(0, [1]), 0)
    r.request_finished(_req(2, [3]), 0)
    assert r.inflight == [0, 2]


def test_kv_aware_cost_is_dynamos():
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    req = _req(0, ids)
    keys = _keys(ids)
    # Replica 0 has the first 6 blocks cached; replica 1 has nothing.
    reps = _numbered([StubView(cached=keys[:6]), StubView()])
    r = build_router("kv_aware", {}, _ctx(2))
    # cost_0 = 1.0 * (128 - 6 * 16) / 16 + 8 new blocks = 2 + 8 = 10; cost_1 = 8 + 8 = 16
    assert r.route(req, reps, 0.0) == 0
    assert r.prefill_tokens == [32, 0] and r.active[0].num_blocks == 8
    # A second request sharing the first 4 blocks (chained ids: block 4 differs, so the overlap is
    # 4 blocks): replica 0 carries 32 prefill tokens and 8 active blocks, 4 of them shared:
    # cost_0 = (128 - 64 + 32) / 16 + (8 - 4 + 8) = 6 + 12 = 18; cost_1 = 128 / 16 + 8 = 16.
    other = _req(1, ids[:4] + [50, 51, 52, 53])
    assert _costs(r, other, reps) == [18.0, 16.0]
    assert r.route(other, reps, 0.0) == 1
    # A larger overlap weight: cost_0 = 4 * 96 / 16 + 12 = 36, cost_1 = 4 * 8 + 8 = 40.
    heavy = build_router("kv_aware", {"overlap_score_weight": 4.0}, _ctx(2))
    assert heavy.route(_req(2, ids), reps, 0.0) == 0
    assert _costs(heavy, other, reps) == [36.0, 40.0]


def _costs(router, req, reps) -> list[float]:
    """The router's costs for ``req`` without routing it."""
    return router.costs(req, reps, 0.0, [])


@pytest.mark.parametrize("lookahead", [0, 8])
def test_kv_aware_active_blocks_by_run_match_the_blocks_one_by_one(lookahead: int):
    """Trace blocks of 4 engine blocks, chained ids from a prefix tree, prompts ending inside a
    trace block: the runs kept per request give the same distinct blocks and leading hits as a
    count per block key (Dynamo's ActiveSequences, block by block)."""
    import random

    from replay.engine.routers.kv_aware import ActiveBlocks

    rng = random.Random(7)
    hb = 4 * BS
    children: dict[tuple, int] = {}

    def chain(path: tuple) -> list[int]:  # chained ids: an id names its whole prefix
        ids = []
        for i in range(len(path)):
            ids.append(children.setdefault(path[:i + 1], len(children) + 1))
        return ids

    def request(idx: int) -> tuple[list[range], list[int]]:
        path = tuple(rng.randrange(2) for _ in range(rng.randint(1, 4)))
        ids = chain(path)
        tokens = rng.randint((len(ids) - 1) * hb + 1, len(ids) * hb)
        keys = BlockKeys(ids, 0, len(ids), hb, BS, tokens, idx, lookahead)  # lookahead: unique last keys
        n = tokens // BS
        return [run for run in keys.key_runs(0, n, BS) if len(run)], keys.keys_upto(n)[:n]

    active = ActiveBlocks()
    held: dict[int, int] = {}  # block key -> active requests holding it
    live: list[tuple[list[range], list[int]]] = []
    for idx in range(400):
        runs, keys = request(idx)
        lead = 0
        while lead < len(keys) and keys[lead] in held:
            lead += 1
        assert active.held_prefix(runs) == lead
        if live and rng.random() < 0.45:
            gone_runs, gone_keys = live.pop(rng.randrange(len(live)))
            active.remove(gone_runs)
            for k in gone_keys:
                held[k] -= 1
                if not held[k]:
                    del held[k]
        else:
            active.add(runs)
            live.append((runs, keys))
            for k in keys:
                held[k] = held.get(k, 0) + 1
        assert active.num_blocks == len(held)
    for gone_runs, _ in live:
        active.remove(gone_runs)
    assert active.num_blocks == 0 and not active.lengths and not active.longest


def test_kv_aware_forgets_finished_requests_and_settles_prefills():
    r = build_router("kv_aware", {}, _ctx(2))
    reps = _numbered([StubView(), StubView()])
    a = _req(0, [1, 2, 3])
    w = r.route(a, reps, 0.0)
    assert r.prefill_tokens[w] == 48
    a.first_token_ms = 5.0
    r.request_first_token(a)  # the fleet's word that a's first token is out
    assert r.prefill_tokens[w] == 0 and r.active[w].num_blocks == 3
    r.request_first_token(a)  # told twice (P/D: the prefill and the decode request share a row): once
    assert r.prefill_tokens[w] == 0
    r.request_finished(a, w)
    assert r.active[w].num_blocks == 0 and not r.active[w].lengths


def test_kv_aware_approximate_mode_remembers_routed_blocks_for_the_ttl():
    r = build_router("kv_aware", {"kv_events": False, "ttl_s": 1.0}, _ctx(2))
    reps = _numbered([StubView(), StubView()])
    done = _req(0, [1, 2, 3, 4])
    first = r.route(done, reps, 0.0)
    done.first_token_ms = done.finish_ms = 10.0
    r.request_finished(done, first)
    assert r.active[first].num_blocks == 0 and r.prefill_tokens[first] == 0
    keys = _keys([1, 2, 3, 4])
    assert r._approx_overlap(reps[first], keys, 500.0) == 4  # still remembered
    assert r.route(_req(1, [1, 2, 3, 4]), reps, 500.0) == first
    assert r._approx_overlap(reps[first], keys, 1501.0) == 0  # renewed at 500, forgotten 1 s later


def test_kv_aware_temperature_samples_but_prefers_cheap_replicas():
    ids = list(range(1, 33))
    reps = _numbered([StubView(cached=_keys(ids)), StubView(), StubView()])
    r = build_router("kv_aware", {"router_temperature": 0.2}, _ctx(3, seed=1))
    picks = []
    for i in range(200):
        req = _req(i, ids)
        w = r.route(req, reps, 0.0)
        r.request_finished(req, w)
        picks.append(w)
    counts = np.bincount(picks, minlength=3)
    assert counts[0] > 150 and counts[1] + counts[2] > 0


def test_session_affinity_is_consistent_when_the_fleet_grows():
    sessions = [f"s{i}" for i in range(2000)]
    before = build_router("session_affinity", {}, _ctx(8, sessions)).static_targets(np.arange(2000))
    after = build_router("session_affinity", {}, _ctx(9, sessions)).static_targets(np.arange(2000))
    moved = float(np.mean(before != after))
    assert moved < 0.2  # about 1/9 of the sessions move; modulo hashing would move 8/9
    assert set(np.unique(before)) == set(range(8))
    assert (after[before == after] < 8).all()


def test_random_router_is_seeded_and_order_free():
    a = build_router("random", {}, _ctx(4, seed=3)).static_targets(np.arange(8))
    b = build_router("random", {}, _ctx(4, seed=3)).static_targets(np.arange(8)[::-1])[::-1]
    c = build_router("random", {}, _ctx(4, seed=4)).static_targets(np.arange(8))
    assert (a == b).all() and not (a == c).all()


def test_prefix_score_weights_queue_kv_and_prefix():
    r = build_router("prefix_score", {}, _ctx(3))
    ids = [1, 2, 3, 4]
    reps = _numbered([StubView(waiting=4, usage=0.2), StubView(waiting=0, usage=0.8), StubView(waiting=2, usage=0.5)])
    # queue: (4-q)/4 -> 0, 1, 0.5; kv: 0.8, 0.2, 0.5; prefix: nothing routed yet -> 0
    # totals: 2*0 + 2*0.8 = 1.6; 2*1 + 2*0.2 = 2.4; 2*0.5 + 2*0.5 = 2.0 -> replica 1
    assert r.route(_req(0, ids), reps, 0.0) == 1
    # The router now remembers replica 1 holds those 4 blocks: +3 * 4/4 for a request sharing them.
    same = _numbered([StubView(waiting=0, usage=0.2), StubView(waiting=0, usage=0.2), StubView(waiting=0, usage=0.2)])
    assert r.route(_req(1, ids), same, 0.0) == 1
    # With one request queued there, replica 1 loses the queue score (2 * 1): all 4 blocks shared
    # (3 * 4/4 = 3) still win, half of them (3 * 2/4 = 1.5) do not.
    busy = _numbered([StubView(waiting=0, usage=0.2), StubView(waiting=1, usage=0.2), StubView(waiting=0, usage=0.2)])
    assert r.route(_req(2, ids), busy, 0.0) == 1
    assert r.route(_req(3, ids[:2] + [70, 71]), busy, 0.0) in (0, 2)


@pytest.mark.parametrize("name", ["round_robin", "random", "session_affinity", "least_loaded", "kv_aware",
                                  "prefix_score"])
def test_every_router_rejects_unknown_options(name):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        build_router(name, {"no_such_option": 1}, _ctx(2))


def test_prefix_score_precise_counts_each_replicas_leading_cached_blocks():
    r = build_router("prefix_score", {"precise": True}, _ctx(3))
    ids = [1, 2, 3, 4]
    keys = _keys(ids)
    # Leading cached blocks: 1, 3 and 0 of 4 (replica 2 lacks the first block: its others are no
    # prefix hit, and an engine's cache never holds them so). Equal queues and usage: the prefix
    # score decides, 3 * 3/4 on replica 1.
    reps = _numbered([StubView(cached=keys[:1]), StubView(cached=keys[:3]), StubView(cached=keys[1:])])
    assert r.route(_req(0, ids), reps, 0.0) == 1
    assert all(not lru for lru in r.lru)  # precise mode keeps no index of its own
