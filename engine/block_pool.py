"""The GPU KV block pool: vLLM V1's BlockPool (v1/core/block_pool.py), without token contents.

- vLLM reserves block 0 as the null block: ``num_gpu_blocks - 1`` blocks are usable.
- The free queue holds every block with ref_cnt == 0, cached ones included, oldest first; allocation
  pops its LRU end, and a popped block that is still cached is evicted then (lazy eviction). A hit
  on a free cached block unlinks it; freed blocks join the tail in the order given.
- Two requests that compute the same block make two copies under one key; the key stays cached
  until its last copy is evicted (vLLM keeps a dict of block ids per hash).

Anonymous runs. Only a block registered in the prefix-cache map can ever be found again, so only
such blocks need an identity in the free queue. Every other free block (never full, or private:
full but findable by nobody, engine/kv_cache_manager.py) is interchangeable with its neighbours: a
request's frees put them in the queue as one run entry ``[count, counted_as_eviction]``, and an
allocation consumes runs by count. Block ids are handed out fresh (a counter) and live as long as
a block's contents: the id of a registered block is dropped when its key is evicted. Same
decisions, evictions and outputs as one entry per block (tests/reference_block_pool.py, checked
byte for byte by tests/test_engine_real_traces.py); a prompt nobody shares costs two queue entries,
not one per block.

Reference counts are stored sparsely: a registered block is in use exactly when it is not in the
free queue, and ``extra_refs`` counts references beyond the first (prefix sharing).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import islice, repeat
from operator import itemgetter

_first = itemgetter(0)
_second = itemgetter(1)


class BlockPool:
    __slots__ = ("num_gpu_blocks", "extra_refs", "cached", "dups", "free_queue", "num_free",
                 "num_evictions", "_next_id", "_next_run")

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.extra_refs: dict[int, int] = {}  # block -> references beyond the first
        self.cached: dict[int, int] = {}  # key -> first cached copy
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        # block id (> 0) -> its key, for free registered blocks; run id (< 0) -> [count, evicts]
        self.free_queue: OrderedDict[int, int | list] = OrderedDict({-1: [num_gpu_blocks - 1, False]})
        self.num_free = num_gpu_blocks - 1
        self.num_evictions = 0
        self._next_id = 1
        self._next_run = -2

    def get_num_free_blocks(self) -> int:
        return self.num_free

    def get_usage(self) -> float:
        """vLLM's kv_cache_usage gauge: evictable cached blocks count as free."""
        return 1.0 - self.num_free / (self.num_gpu_blocks - 1)

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the LRU end; a taken block that is still cached is evicted now."""
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} blocks: only {self.num_free} free")
        self.num_free -= n
        first = self._next_id
        self._next_id = first + n
        fq = self.free_queue
        if n == 1:  # a decode crossing a block boundary: the common case, kept scalar
            head = next(iter(fq))
            if head < 0:
                run = fq[head]
                if run[0] == 1:
                    del fq[head]
                else:
                    run[0] -= 1
                if run[1]:
                    self.num_evictions += 1
            else:
                b, key = fq.popitem(False)
                self.num_evictions += 1
                if self.dups:
                    self._evict(b, key)
                else:
                    del self.cached[key]
            return [first]
        need = n
        while need:
            head = next(iter(fq))
            if head < 0:  # an anonymous run
                run = fq[head]
                count = run[0]
                take = count if count <= need else need
                if take == count:
                    del fq[head]
                else:
                    run[0] = count - take
                if run[1]:
                    self.num_evictions += take
                need -= take
                continue
            # Registered blocks at the head: take them in bulk, up to the next run. Look ahead in
            # growing windows, so a short stretch before a run costs little and a long one O(its length).
            window = 16
            while True:
                ids = list(islice(fq, window if window < need else need))
                if min(ids) < 0:
                    k = next(i for i, b in enumerate(ids) if b < 0)
                    break
                if len(ids) < window or window >= need:
                    k = len(ids)
                    break
                window *= 4
            popped = list(map(fq.popitem, repeat(False, k)))
            need -= len(popped)
            self.num_evictions += len(popped)
            if self.dups:
                for b, key in popped:
                    self._evict(b, key)
            else:  # every key has one copy, which must be the popped block
                deque(map(self.cached.__delitem__, map(_second, popped)), 0)
        return list(range(first, first + n))

    def _evict(self, b: int, key: int) -> None:
        cached = self.cached
        if cached.get(key) == b:
            copies = self.dups.get(key)
            if copies:
                cached[key] = copies.pop(0)
                if not copies:
                    del self.dups[key]
            else:
                del cached[key]
        else:
            copies = self.dups[key]
            copies.remove(b)
            if not copies:
                del self.dups[key]

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-cache hits, unlinking free ones from the free queue."""
        fq = self.free_queue
        extra = self.extra_refs
        for b in blocks:
            if b in fq:
                del fq[b]
                self.num_free -= 1
            else:
                extra[b] = extra.get(b, 0) + 1

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of ``blocks`` sit in the free queue (hits that would consume free capacity)."""
        fq = self.free_queue
        return sum(map(fq.__contains__, blocks))

    def _append_run(self, count: int, evicts: bool) -> None:
        fq = self.free_queue
        if fq:
            last = next(reversed(fq))
            if last < 0:
                run = fq[last]
                if run[1] is evicts:
                    run[0] += count
                    return
        fq[self._next_run] = [count, evicts]
        self._next_run -= 1

    def free_blocks(self, blocks_in_eviction_order: list[int], keys: list[int], num_uncached: int,
                    num_private: int) -> None:
        """Drop one reference each; blocks reaching zero join the free queue tail in the given order.

        The first ``num_uncached`` blocks are not cached, the next ``num_private`` are private
        (cached, findable by nobody): both join as anonymous runs. The rest are registered, under
        ``keys`` (aligned with them).
        """
        if num_uncached:
            self._append_run(num_uncached, False)
        if num_private:
            self._append_run(num_private, True)
        skip = num_uncached + num_private
        self.num_free += skip
        if not keys:
            return
        blocks = blocks_in_eviction_order[skip:] if skip else blocks_in_eviction_order
        extra = self.extra_refs
        fq = self.free_queue
        fq.update(zip(blocks, keys))
        self.num_free += len(blocks)
        shared = extra.keys() & blocks if extra else None
        if not shared:
            return
        # Take back the blocks other holders still reference: the order of the rest is unchanged
        # and the common blocks cost one C-level insert each.
        for b in shared:  # other holders remain: drop one reference, keep the block in use
            del fq[b]
            self.num_free -= 1
            c = extra[b]
            if c == 1:
                del extra[b]
            else:
                extra[b] = c - 1

    def cache_full_blocks(self, blocks: list[int], keys: list[int]) -> None:
        """Register newly full blocks under their keys (at scheduling time, as vLLM does)."""
        cached = self.cached
        if len(keys) == 1:
            key = keys[0]
            if key in cached:
                self.dups.setdefault(key, []).append(blocks[0])
            else:
                cached[key] = blocks[0]
            return
        if cached.keys().isdisjoint(keys):
            n0 = len(cached)
            cached.update(zip(keys, blocks))
            if len(cached) == n0 + len(keys):
                return
            for key in keys:  # a key twice in one call (never with chained ids): take the loop below
                cached.pop(key, None)
        dups = self.dups
        for b, key in zip(blocks, keys):
            if key in cached:
                dups.setdefault(key, []).append(b)
            else:
                cached[key] = b

    def check_invariants(self, in_use_keys: dict[int, int | None], holders: dict[int, int]) -> None:
        """Debug mode: counts, references and keys agree (O(pool), never on the hot path).

        ``in_use_keys`` maps each in-use block to the key its holders know it by (None when it is
        not registered); ``holders`` counts the block tables holding each in-use block.
        """
        fq = self.free_queue
        usable = self.num_gpu_blocks - 1
        free = 0
        for b, v in fq.items():
            if b < 0:
                assert v[0] > 0, f"empty run {b}"
                free += v[0]
            else:
                assert v, f"free block {b} in the queue without a key"
                free += 1
        assert free == self.num_free, f"{free} free blocks counted, {self.num_free} recorded"
        assert self.num_free + len(holders) == usable, (
            f"{self.num_free} free + {len(holders)} in use != {usable} usable blocks")
        for b, held in holders.items():
            assert b not in fq, f"block {b} is held and free"
            assert held == 1 + self.extra_refs.get(b, 0), (
                f"block {b}: held {held} times, ref_cnt {1 + self.extra_refs.get(b, 0)}")
        for b in self.extra_refs:
            assert b in holders, f"block {b}: extra refs on a block nobody holds"

        def key_of(b: int) -> int | None:
            return fq[b] if b in fq else in_use_keys.get(b)

        for key, b in self.cached.items():
            assert key_of(b) == key, f"cached key of block {b} mismatches"
        for key, copies in self.dups.items():
            assert key in self.cached, "duplicate copy without a primary"
            for b in copies:
                assert key_of(b) == key
        n_keys = len(self.cached) + sum(len(c) for c in self.dups.values())
        n_keyed = sum(1 for b in fq if b > 0) + sum(
            1 for b, k in in_use_keys.items() if k is not None and b not in fq)
        assert n_keys == n_keyed, f"{n_keys} cached copies but {n_keyed} keyed blocks"
