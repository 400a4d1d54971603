"""get_computed_blocks' memo (pool version, watched keys) never returns a stale answer.

A queue head that cannot be admitted is looked up at every step; the engine answers from a memo
until a key in one of the key groups (trace ids) its walk read is registered or evicted
(BlockPool.watched), and counts how many of its hits are free until a hit or a free touches one of
those groups (BlockPool.watch_free_change). Here random admissions, decodes, frees and evictions run on a tiny pool while
one head is asked again and again, and every answer must equal a fresh walk of the map; hand-checked
cases pin the eviction of a watched key and a change elsewhere that keeps the memo.
"""

from __future__ import annotations

import random

import pytest

from replay.engine.block_keys import BlockKeys
from replay.engine.block_pool import BlockPool
from replay.engine.kv_cache_manager import KVCacheManager
from replay.engine.request import Request

BS = 4  # tokens per block (and per trace id: one id names one block)


def _request(idx: int, ids: list[int], extra_tokens: int = 1) -> Request:
    tokens = len(ids) * BS + extra_tokens  # a partial last block, so every full block can hit
    all_ids = ids + [10_000 + idx]  # the partial block's own id
    keys = BlockKeys(all_ids, 0, len(all_ids), BS, BS, tokens, unique_tag=idx + 1)
    return Request(idx, f"r{idx}", 0.0, tokens, 8, keys)


def _fresh_walk(kv: KVCacheManager, req: Request) -> list[int]:
    limit = (req.num_tokens - 1) // BS
    hits = []
    for key in req.keys.keys_upto(limit)[:limit]:
        b = kv.pool.cached_get(key)
        if b is None:
            break
        hits.append(b)
    if kv.drop_last_hit and hits:
        hits.pop()
    return hits


def _prompt(rng: random.Random) -> list[int]:
    ids, node = [], 0
    for _ in range(rng.randint(1, 6)):
        node = node * 3 + rng.randint(1, 3)  # a small tree: chained prefixes are shared
        ids.append(node)
    return ids


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("drop_last_hit", [False, True])
def test_memoised_lookups_equal_fresh_walks(seed: int, drop_last_hit: bool) -> None:
    rng = random.Random(seed)
    kv = KVCacheManager(rng.choice([16, 24, 40]), BS, drop_last_hit=drop_last_hit)
    running: list[Request] = []
    head = _request(0, _prompt(rng))
    asked = answered_from_memo = from_watch = 0
    for step in range(1, 400):
        op = rng.random()
        if op < 0.35:  # admit a new request with its hits, if it fits
            # (looked up without the memo: the head's memo must survive others' activity, as when
            # the head is blocked and only running requests allocate, register and free)
            r = _request(step, _prompt(rng))
            hits = _fresh_walk(kv, r)
            if kv.allocate_slots(r, r.num_tokens - len(hits) * BS, hits):
                r.num_computed_tokens = r.num_tokens
                running.append(r)
        elif op < 0.6 and running:  # a decode token (a new block now and then)
            r = rng.choice(running)
            if kv.allocate_slots(r, 1):
                r.num_computed_tokens += 1
                r.num_output_tokens += 1
        elif running:  # a finish: its blocks go to the free queue, still cached until evicted
            kv.free(running.pop(rng.randrange(len(running))))
        if rng.random() < 0.2:
            head = _request(1_000 + step, _prompt(rng))  # a new queue head
        for _ in range(rng.randint(1, 2)):  # waiting_is_blocked(), then schedule()
            before = kv._memo
            version_changed = before is not None and before[1] != kv.pool.version
            hits, tokens = kv.get_computed_blocks(head)
            asked += 1
            answered_from_memo += kv._memo is before
            from_watch += kv._memo is before and version_changed
            assert hits == _fresh_walk(kv, head), f"step {step}: stale lookup"
            assert tokens == len(hits) * BS
            # how many of the hits are free (the admission gate's count), memoised while watched
            free_hits = kv.pool.num_free_among(hits, head.keys.key_runs(0, len(hits), BS))
            assert kv.num_blocks_to_admit(head, hits, head.num_tokens) == (
                -(-head.num_tokens // BS) - len(hits) + free_hits), f"step {step}: stale free count"
    assert 0 < answered_from_memo < asked and from_watch > 0  # every path was exercised


def test_evicting_a_watched_key_is_seen() -> None:
    """A head hits 2 cached free blocks; unrelated allocations (new version) keep the answer; an
    allocation that evicts one of its hit blocks changes it."""
    kv = KVCacheManager(6, BS)  # 5 usable blocks
    a = _request(1, [1, 4])  # 2 full blocks + a partial one
    kv.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    kv.free(a)  # free queue, oldest first: 2 never-full... then a's blocks in eviction order
    head = _request(2, [1, 4, 13])
    first, _ = kv.get_computed_blocks(head)
    assert len(first) == 2
    b = _request(3, [2])  # 1 full block + partial: 2 new blocks, taken from the free queue head
    kv.allocate_slots(b, b.num_tokens)
    assert kv.get_computed_blocks(head)[0] == _fresh_walk(kv, head)
    assert kv.get_computed_blocks(head)[0] == _fresh_walk(kv, head)  # memo with a watch
    c = _request(4, [3, 7])
    kv.allocate_slots(c, c.num_tokens)  # takes the rest: evicts head's hits
    assert kv.get_computed_blocks(head)[0] == _fresh_walk(kv, head) != first


def test_a_change_in_another_group_keeps_the_memo_and_one_in_a_read_group_redoes_the_walk(monkeypatch) -> None:
    """The head's first walk sets the watch: registering an unrelated trace id answers from the
    memo (no walk), registering the head's first miss redoes it and finds the new hit."""
    kv = KVCacheManager(20, BS)
    a = _request(1, [1, 4])
    kv.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    head = _request(2, [1, 4, 13])
    walks = []
    walk = BlockPool.cached_prefix
    monkeypatch.setattr(BlockPool, "cached_prefix", lambda pool, runs: walks.append(1) or walk(pool, runs))
    assert len(kv.get_computed_blocks(head)[0]) == 2 and len(walks) == 1
    other = _request(3, [2, 7])
    kv.allocate_slots(other, other.num_tokens)  # registers ids 2 and 7: groups the head never read
    version = kv.pool.version
    assert version == kv._memo[1] + 1  # the map changed...
    assert kv.get_computed_blocks(head)[0] == _fresh_walk(kv, head) and len(walks) == 1  # ...not for the head
    c = _request(4, [1, 4, 13])
    kv.allocate_slots(c, c.num_tokens)  # registers id 13: the head's first miss
    hits, tokens = kv.get_computed_blocks(head)
    assert len(walks) == 2 and hits == _fresh_walk(kv, head) and len(hits) == 3 and tokens == 3 * BS
