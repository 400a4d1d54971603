"""The GPU pool with anonymous runs against the per-block reference (tests/reference_block_pool.py).

Random admissions (prefix hits, new blocks, registration of a prefix of them, private blocks,
never-full tails) and frees in random order, with shared keys so that hits, shared references and
duplicate copies all occur. Block ids differ between the two pools (fresh ids against recycled
ones), so everything is compared through keys: free counts, evictions, the cached key set and the
hits each admission finds.
"""

from __future__ import annotations

import random

import pytest

from replay.engine.block_keys import BlockKeys
from replay.engine.block_pool import BlockPool
from replay.engine.free_block_queue import AnonymousRun
from tests.reference_block_pool import PerBlockPool


def _slice_runs(runs: list[range], a: int, b: int) -> list[range]:
    """Keys a..b-1 of the concatenated ``runs``, as runs (how the engine hands keys to the pool)."""
    out, pos = [], 0
    for rng in runs:
        lo, hi = max(a - pos, 0), min(b - pos, len(rng))
        if lo < hi:
            out.append(rng[lo:hi])
        pos += len(rng)
    return out


def _eviction_runs(runs: list[range], n: int) -> list[range]:
    """The first ``n`` keys' runs, in prefix order (KVCacheManager.free; the blocks come last key
    first)."""
    return _slice_runs(runs, 0, n)


class _Table:
    def __init__(self, keys: list[int], runs: list[range]) -> None:
        self.keys = keys
        self.runs = runs
        self.blocks: list[int] = []
        self.registered = 0  # leading blocks registered under their keys
        self.full = 0  # leading full blocks (registered or private)


def _hits(pool, keys: list[int]) -> list[int]:
    out = []
    for key in keys:
        b = pool.cached_get(key)
        if b is None:
            break
        out.append(b)
    return out


def _tree_prompt(rng: random.Random, _tag: int) -> tuple[list[int], list[range]]:
    """Keys of a small key tree (chained prefixes shared between requests), one run per key."""
    keys, node = [], 0
    for _ in range(rng.randint(1, 8)):
        node = node * 4 + rng.randint(1, 4)
        keys.append(node)
    return keys, [range(k, k + 1) for k in keys]


def _trace_prompt(rng: random.Random, tag: int, lookahead: int) -> tuple[list[int], list[range]]:
    """Engine keys (engine/block_keys.py) of a prompt over chained trace ids of 64 tokens, 16-token
    blocks, a partial last trace block, and sometimes blocks past the prompt (keys unique to it)."""
    ids, node = [], 0
    for _ in range(rng.randint(1, 4)):
        node = node * 3 + rng.randint(1, 3)
        ids.append(node)
    tokens = rng.randint((len(ids) - 1) * 64 + 1, len(ids) * 64)
    keys = BlockKeys(ids, 0, len(ids), 64, 16, tokens, unique_tag=tag, lookahead=lookahead)
    n = rng.randint(1, (tokens + 40) // 16)
    runs = keys.key_runs(0, n, 16)
    return [k for r in runs for k in r], runs


@pytest.mark.parametrize("style", ["tree", "trace"])
@pytest.mark.parametrize("seed", range(20))
def test_anonymous_runs_match_per_block_pool(seed, style):
    rng = random.Random(seed)
    n = rng.choice([12, 30, 64])
    pools = [BlockPool(n), PerBlockPool(n)]
    lookahead = seed % 3 == 1
    for pool in pools:  # [0.33] uncached blocks to the head; [0.11] (odd seeds) to the tail
        pool.uncached_first = seed % 2 == 0
    active: list[list[_Table]] = []
    for step in range(400):
        if active and (rng.random() < 0.45 or pools[0].num_free < 3):
            pair = active.pop(rng.randrange(len(active)))
            for pool, t in zip(pools, pair):
                blocks = t.blocks[::-1]
                pool.free_blocks(blocks, _eviction_runs(t.runs, t.registered), len(t.blocks) - t.full,
                                 t.full - t.registered)
        else:
            if style == "tree":
                keys, runs = _tree_prompt(rng, step)
            else:
                keys, runs = _trace_prompt(rng, step, lookahead)
            # The table walk finds what a per-key walk of the same pool finds, block for block.
            assert pools[0].cached_prefix(runs) == _hits(pools[0], keys)
            assert pools[0].cached_prefix_len(runs) == len(_hits(pools[0], keys))  # the routers' count
            hits = [pool.cached_prefix(runs) for pool in pools]
            assert len(hits[0]) == len(hits[1])
            if rng.random() < 0.3:  # looked up before another request registered the prefix: copies
                cut = rng.randint(0, len(hits[0]))
                hits = [h[:cut] for h in hits]
            nh = len(hits[0])
            new_full = len(keys) - nh
            tail = rng.randint(0, 2)  # never-full blocks
            need = new_full + tail
            free_hits = [pool.num_free_among(h, runs) for pool, h in zip(pools, hits)]
            assert free_hits[0] == free_hits[1]
            if need + free_hits[0] > pools[0].num_free:
                continue
            reg = nh + rng.randint(0, new_full)  # the rest of the full blocks stay private
            pair = []
            for pool, h in zip(pools, hits):
                t = _Table(keys, runs)
                pool.touch(h, runs)
                t.blocks = h + pool.get_new_blocks(need)
                if reg > nh:
                    pool.cache_full_blocks(t.blocks[nh:reg], _slice_runs(runs, nh, reg))
                t.registered, t.full = reg, len(keys)
                pair.append(t)
            active.append(pair)
        a, b = pools
        assert a.num_free == b.num_free
        assert a.num_evictions == b.num_evictions
        assert dict(a.cached_items()).keys() == dict(b.cached_items()).keys()
        assert a.num_cached_keys() == b.num_cached_keys()
        further = a.cached_block_hash_to_block.further_copies
        assert {k: len(v) for k, v in further.items()} == {k: len(v) for k, v in b.dups.items()}
        holders: dict[int, int] = {}
        in_use: dict[int, int | None] = {}
        for pair in active:
            t = pair[0]
            for j, blk in enumerate(t.blocks):
                holders[blk] = holders.get(blk, 0) + 1
                if in_use.get(blk) is None:
                    in_use[blk] = t.keys[j] if j < t.registered else None
        a.check_invariants(in_use, holders)
    assert pools[0].num_evictions > 0


def _anonymous_runs(pool: BlockPool) -> list[tuple[int, bool]]:
    """The free queue as (count, counts_as_eviction), when every run is anonymous."""
    runs = list(pool.free_block_queue.runs.values())
    assert all(isinstance(run, AnonymousRun) for run in runs)
    return [(run.count, run.counts_as_eviction) for run in runs]


def test_a_never_shared_prompt_is_two_queue_entries():
    pool = BlockPool(10_001)
    blocks = pool.get_new_blocks(7_500)
    pool.free_blocks(blocks[::-1], [], 1, 7_499)  # one never-full block, the rest private
    # The never-full block joins the untouched (uncached) initial run; the private blocks are one run.
    assert _anonymous_runs(pool) == [(2_501, False), (7_499, True)]
    pool.get_new_blocks(9_000)
    assert pool.num_evictions == 9_000 - 2_501  # private blocks count as evicted, uncached ones not
    assert pool.num_free == 1_000


@pytest.mark.parametrize("pool_class", [BlockPool, PerBlockPool])
def test_a_prefix_walk_stops_at_an_evicted_block_inside_a_trace_block(pool_class):
    """Four blocks of one 64-token trace block, freed so that the second is evicted first: the walk
    finds the first block only, though the third and fourth are still cached."""
    pool = pool_class(6, 16)  # 5 usable blocks
    keys = BlockKeys([7], 0, 1, 64, 16, 64, unique_tag=1)
    run = keys.key_runs(0, 4, 16)
    assert len(run) == 1 and len(run[0]) == 4
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(blocks, run)
    assert pool.cached_prefix(run) == blocks
    b1, b2, b3, b4 = blocks
    # the blocks' keys, read back to front: the second, fourth, third and first
    pool.free_blocks([b2, b4, b3, b1], [run[0][0:1], run[0][2:3], run[0][3:4], run[0][1:2]], 0, 0)
    pool.get_new_blocks(2)  # the never-used block, then b2 (evicted)
    assert pool.num_evictions == 1
    assert pool.cached_prefix(run) == [b1]
    assert [pool.cached_get(k) for k in run[0]] == [b1, None, b3, b4]
    assert pool.num_cached_keys() == 3
    pool.get_new_blocks(3)  # b4, b3, b1
    assert pool.cached_prefix(run) == [] and pool.num_cached_keys() == 0


def test_a_run_whose_blocks_are_all_hit_leaves_the_free_queue():
    """A request's four registered blocks are freed (one run), then a second request hits three of
    them: the run keeps one free block. A third request hits that one too: the run, all stale now,
    leaves the queue at once, and the next allocation takes the never-used blocks without walking it."""
    pool = BlockPool(11, 16)  # 10 usable blocks
    keys = BlockKeys([7], 0, 1, 64, 16, 64, unique_tag=1)
    run = keys.key_runs(0, 4, 16)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(blocks, run)
    pool.free_blocks(blocks[::-1], [run[0]], 0, 0)
    assert len(pool.free_block_queue.runs) == 2 and pool.num_free == 10
    first_three = pool.cached_prefix([run[0][:3]])
    pool.touch(first_three, [run[0][:3]])
    assert len(pool.free_block_queue.runs) == 2 and pool.num_free == 7  # the run still holds its last block
    last = pool.cached_prefix(run)[3:]
    pool.touch(last, [run[0][3:4]])
    assert _anonymous_runs(pool) == [(6, False)] and pool.num_free == 6
    fresh = pool.get_new_blocks(6)
    assert pool.num_evictions == 0 and pool.cached_prefix(run) == blocks
    in_use = {b: k for b, k in zip(blocks, run[0])} | {b: None for b in fresh}
    pool.check_invariants(in_use, {b: 1 for b in blocks + fresh})
