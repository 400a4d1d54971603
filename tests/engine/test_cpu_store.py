"""The run-based G2 CPU store against the plain per-key LRU (vLLM's LRUOffloadingManager).

Random sequences of stores, touches, lookups, pins and unpins over requests that share prefixes
(trace ids) and own unique tails must leave both stores with the same keys in the same LRU order
with the same batch ids, and return the same results at every call.
"""

from __future__ import annotations

import gc
import random

import pytest

from replay.engine.block_keys import BlockKeys, key_group, runs_slice
from replay.engine.cpu_store import RunLRUStore, runs_len
from replay.engine.key_lru_store import KeyLRUStore


def test_key_runs_flatten_to_block_keys_and_stay_in_one_group():
    ids = [7, 8, 9, 10, 11]
    for bs, la in [(16, 0), (16, 2), (64, 0), (48, 1)]:
        keys = BlockKeys(ids, 0, 5, 100, bs, 470, unique_tag=3, lookahead=la)
        for j0, j1 in [(0, 12), (3, 9), (0, 1), (5, 5), (2, 40)]:
            runs = keys.key_runs(j0, j1, bs)
            assert [k for r in runs for k in r] == [keys.prefix_key((j + 1) * bs + la) for j in range(j0, j1)]
            for r in runs:
                assert len({key_group(k) for k in r}) == 1
                assert abs(r.step) == bs


def test_runs_slice():
    runs = [range(0, 50, 10), range(100, 80, -5), range(7, 8)]
    flat = [k for r in runs for k in r]
    for i0 in range(0, 10):
        for i1 in range(i0, 11):
            got = runs_slice(runs, i0, i1)
            assert [k for r in got for k in r] == flat[i0:i1]
            assert runs_len(got) == len(flat[i0:i1])


def _requests(rng: random.Random, n: int, bs: int, hb: int, la: int):
    """Requests over a small tree of trace ids (shared prefixes)."""
    out = []
    for tag in range(n):
        depth = rng.randint(1, 6)
        ids, node = [], 0
        for _ in range(depth):  # children of a node: node * 3 + 1..3, so ids chain
            node = node * 3 + rng.randint(1, 3)
            ids.append(node)
        tokens = max(1, depth * hb - rng.choice([0, 0, bs, bs // 2 + 1]))
        out.append(BlockKeys(ids, 0, depth, hb, bs, tokens, unique_tag=tag + 1, lookahead=la))
    return out


# (offload block size, hash block size, lookahead): hash blocks of 4 offload blocks, of one, of a
# non-multiple, smaller than an offload block; with and without MTP lookahead hashes.
_SHAPES = [(16, 64, 0), (16, 16, 2), (16, 40, 3), (64, 32, 0), (32, 96, 1)]


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("seed", range(6))
def test_run_store_matches_key_store(seed, shape):
    rng = random.Random(seed)
    bs, hb, la = shape
    reqs = _requests(rng, 12, bs, hb, la)
    capacity = rng.choice([6, 15, 40, 200])
    ref, run = KeyLRUStore(bs), RunLRUStore(bs)
    pins: list[list[range]] = []
    for batch in range(300):
        ready_below = max(0, batch - rng.randint(0, 3))
        op = rng.random()
        keys = rng.choice(reqs)
        blocks = rng.randint(1, 40)  # beyond the prompt: unique (generated-token) keys
        j0 = rng.choice([0, 0, rng.randint(0, blocks - 1)])
        runs = keys.key_runs(j0, blocks, bs)
        if op < 0.5:
            assert run.store(runs, batch, capacity, ready_below) == ref.store(runs, batch, capacity, ready_below)
        elif op < 0.7:
            run.touch(runs)
            ref.touch(runs)
        elif op < 0.85:
            start = rng.randint(0, blocks - j0)
            assert run.count_ready(runs, start, ready_below) == ref.count_ready(runs, start, ready_below)
            held = {key for key, _ in ref.lru_items()}
            assert run.num_held(runs) == sum(key in held for r in runs for key in r)
        elif op < 0.95 or not pins:
            part = runs_slice(runs, rng.randint(0, 3), rng.randint(3, 12))
            if part:
                run.pin(part)
                ref.pin(part)
                pins.append(part)
        else:
            part = pins.pop(rng.randrange(len(pins)))
            run.unpin(part)
            ref.unpin(part)
        assert len(run) == len(ref) <= capacity
        assert run.lru_items() == ref.lru_items()


def test_run_store_keeps_a_trace_block_as_one_run():
    # 4 requests of 8 trace blocks of 32 offload blocks each, stored a chunk of 128 blocks at a time
    # into a store of 256 blocks: the store holds 8 runs, not 256 keys, and evicts whole runs.
    bs = 16
    store = RunLRUStore(bs)
    for tag in range(4):
        keys = BlockKeys(list(range(tag * 100, tag * 100 + 8)), 0, 8, 32 * bs, bs, 8 * 32 * bs, unique_tag=tag + 1)
        for c in range(2):
            assert store.store(keys.key_runs(c * 128, (c + 1) * 128, bs), tag * 2 + c, 256, 10**9) == (
                128, 0 if tag * 2 + c < 2 else 128)
    assert len(store) == 256
    assert store.num_segments() == 8


@pytest.mark.parametrize("store_class", [KeyLRUStore, RunLRUStore])
def test_eviction_skips_a_batch_still_being_written(store_class):
    # A (2 keys, batch 0) then B (2 keys, batch 1); a touch makes A the most recent, so the LRU
    # order is B, A. C (1 key, batch 2) needs one slot while batch 1's copy is still running
    # (ready_below = 1): B may not be evicted although it is least recent, so A's first key goes.
    bs = 16
    a, b, c = (range(k * 1000, k * 1000 + 2 * bs, bs) for k in (1, 2, 3))
    store = store_class(bs)
    assert store.store([a], 0, 4, 10) == (2, 0)
    assert store.store([b], 1, 4, 10) == (2, 0)
    store.touch([a])
    assert store.store([c[:1]], 2, 4, 1) == (1, 1)
    # A is touched in reverse prefix order (head most recent), so its tail key is the oldest.
    assert store.lru_items() == [(b[1], 1), (b[0], 1), (a[0], 0), (c[0], 2)]
    # Nothing is complete (ready_below = 0): no room can be made, and nothing changes.
    assert store.store([range(5000, 5000 + bs, bs)], 3, 4, 0) == (1, None)
    assert len(store) == 4


def _filled_store(num_requests: int) -> RunLRUStore:
    """A store holding one run per request (unique prompts: nothing merges)."""
    bs = 16
    store = RunLRUStore(bs)
    for tag in range(num_requests):
        keys = BlockKeys([tag * 10 + 1, tag * 10 + 2], 0, 2, 32, bs, 64, unique_tag=tag + 1)
        store.store(keys.key_runs(0, 2, bs), tag, 10**6, 10**9)
    return store


def test_released_store_leaves_no_cycles_for_the_collector():
    # The LRU's runs point at their neighbours: a dropped store is garbage only the cyclic collector
    # finds (the control), unless release() broke the links first; then reference counting frees
    # it and at most the sentinel (which points at itself) is left for the collector.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        control = _filled_store(50)
        assert control.num_segments() >= 50
        del control
        assert gc.collect() >= 50
        store = _filled_store(50)
        store.release()
        assert len(store) == 0 and store.num_segments() == 0 and store.lru_items() == []
        del store
        assert gc.collect() <= 2
    finally:
        if was_enabled:
            gc.enable()
