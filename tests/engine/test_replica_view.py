"""ReplicaView, what a router may read of a replica, checked by hand on two real replicas."""

from __future__ import annotations

import math

import pytest

from replay.engine.block_keys import BlockKeys
from replay.engine.config import EngineConfig
from replay.engine.core import OPEN, EngineCore
from replay.engine.recorder import Recorder
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.scheduler_factory import build_scheduler
from replay.engine.trace_input import trace_arrays
from tests.engine_helpers import FixedTimer, make_trace, run_small

BS = 16
USABLE = 40  # 41 GPU blocks, block 0 being vLLM's null block


def _req(idx: int, ids: list[int]) -> Request:
    """A prompt of one full block per trace id (ids chained: a shared leading run of ids is a
    shared prefix)."""
    tokens = len(ids) * BS
    return Request(idx, f"r{idx}", 0.0, tokens, 4, BlockKeys(ids, 0, len(ids), BS, BS, tokens, idx))


def _runs(ids: list[int]) -> list[range]:
    return _req(99, ids).keys.key_runs(0, len(ids), BS)


@pytest.fixture
def fleet(tmp_path):
    """Replica 0: r0 (ids 1-4) prefilled and running, two requests routed but not queued yet.
    Replica 1: r1 (ids 1-2) prefilled and running, one request routed."""
    table, meta = make_trace([dict(arrival_ms=0, input_tokens=64, output_tokens=4, hash_ids=[i])
                              for i in range(8)])
    rec = Recorder(trace_arrays(table, meta.hash_block_size), tmp_path, replica_column=True)
    cores = []
    for replica, ids in enumerate(([1, 2, 3, 4], [1, 2])):
        sched = build_scheduler(EngineConfig(), USABLE + 1, 1 << 20)
        core = EngineCore(replica, sched, FixedTimer(), rec)
        core.receive(_req(replica, ids), 0.0, OPEN, 1)
        end, completes = core.begin(0.0, horizon=lambda c: 0.0, next_event=lambda c: math.inf)
        assert completes  # the prefill step
        core.complete(lambda r, t, c: None)
        cores.append(core)
    # Routed with 50 ms of router latency: on their way, counted as waiting.
    cores[0].receive(_req(2, [20, 21]), 50.0, OPEN, 2)
    cores[0].receive(_req(3, [30]), 50.0, OPEN, 3)
    cores[1].receive(_req(4, [40]), 50.0, OPEN, 4)
    yield [ReplicaView(c) for c in cores]
    rec.abort()


def test_queue_lengths_and_kv_usage(fleet):
    v0, v1 = fleet
    assert (v0.num_waiting, v0.num_running) == (2, 1)
    assert (v1.num_waiting, v1.num_running) == (1, 1)
    # The prefill steps allocated each prompt's blocks: 4 and 2 of 40.
    assert (v0.num_free_blocks, v0.num_usable_blocks) == (36, 40)
    assert (v1.num_free_blocks, v1.num_usable_blocks) == (38, 40)
    assert v0.kv_usage() == pytest.approx(4 / 40)
    assert v1.kv_usage() == pytest.approx(2 / 40)


def test_ids_and_waiting_prompt_tokens(fleet):
    v0, v1 = fleet
    assert (v0.replica, v1.replica) == (0, 1)
    # On their way: two prompts of 2 and 1 blocks on replica 0, one of 1 block on replica 1.
    assert (v0.waiting_prompt_tokens(), v1.waiting_prompt_tokens()) == (3 * BS, BS)


def test_prefix_hits(fleet):
    v0, v1 = fleet
    assert [v.prefix_hit_blocks(_runs([1, 2, 3, 9])) for v in fleet] == [3, 2]
    assert [v.prefix_hit_blocks(_runs([1, 2, 3, 4, 5])) for v in fleet] == [4, 2]
    assert [v.prefix_hit_blocks(_runs([1])) for v in fleet] == [1, 1]
    # Chained ids: block 2 names its whole prefix, so [9, 2] shares nothing with [1, 2].
    assert [v.prefix_hit_blocks(_runs([9, 2])) for v in fleet] == [0, 0]
    assert [v.prefix_hit_blocks([]) for v in fleet] == [0, 0]
    # Every replica at once (what the routers ask at each arrival) answers the same.
    from replay.engine.replica_view import prefix_hit_blocks_of

    for ids in ([1, 2, 3, 9], [1, 2, 3, 4, 5], [1], [9, 2], []):
        assert prefix_hit_blocks_of(list(fleet), _runs(ids)) == [v.prefix_hit_blocks(_runs(ids)) for v in fleet]


def test_views_asked_answers_for_its_own_list_only(fleet):
    """A router keeps a ViewsAsked while the fleet hands it the same list: a list grown in place or
    replaced is a different one, and stand-ins (no ReplicaView) are asked through their method."""
    from replay.engine.replica_view import ViewsAsked

    views = list(fleet)
    asked = ViewsAsked(views)
    assert asked.is_for(views) and asked.ids == [0, 1]
    assert not asked.is_for(list(views))  # equal, but not the list read
    for ids in ([1, 2, 3, 9], [1, 2, 3, 4, 5], [9, 2], []):
        assert asked.prefix_hit_blocks(_runs(ids)) == [v.prefix_hit_blocks(_runs(ids)) for v in fleet]

    class StandIn:
        replica = 7

        def prefix_hit_blocks(self, runs):
            return 5

    views.append(StandIn())
    assert not asked.is_for(views)  # grown in place
    mixed = ViewsAsked(views)
    assert mixed.ids == [0, 1, 7]
    assert mixed.prefix_hit_blocks(_runs([1, 2, 3, 9])) == [3, 2, 5]


def test_the_view_is_read_only_and_hands_out_no_engine_object(fleet):
    v0 = fleet[0]
    public = sorted(n for n in dir(v0) if not n.startswith("_"))
    assert public == ["kv_usage", "num_free_blocks", "num_running", "num_usable_blocks", "num_waiting",
                      "prefix_hit_blocks", "replica", "tier_hit_tokens", "waiting_prompt_tokens"]
    for name in public:
        value = getattr(v0, name)
        if callable(value):
            continue
        assert type(value) is int, name
    with pytest.raises(AttributeError):
        v0.num_waiting = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        v0.kv_pool = None  # type: ignore[attr-defined]


def test_routers_get_the_same_views_at_every_routing(tmp_path, monkeypatch):
    from replay.engine.routers.least_loaded import LeastLoadedRouter

    seen = []
    route = LeastLoadedRouter.route

    def spy(self, req, replicas, now_ms):
        seen.append(replicas)
        return route(self, req, replicas, now_ms)

    monkeypatch.setattr(LeastLoadedRouter, "route", spy)
    rows = [dict(arrival_ms=10 * i, input_tokens=40, output_tokens=3, hash_ids=[i, 100 + i, 200 + i])
            for i in range(6)]
    run_small(rows, tmp_path, num_gpu_blocks=200, config={"fleet": {"replicas": 3, "router": "least_loaded"}})
    assert len(seen) == 6
    assert all(s is seen[0] for s in seen)
    assert len(seen[0]) == 3 and all(type(v) is ReplicaView for v in seen[0])
