"""The per-block GPU pool the engine used before anonymous runs: the reference engine/block_pool.py is
tested against (tests/engine/test_real_traces.py replays traffic with both, byte for byte).

Every block is an entry of the free queue, a physical id recycled forever; a free block's value is
its key (None: uncached, 0: private, cached but in no map).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import repeat
from operator import itemgetter

from replay.engine.block_keys import key_group

_first = itemgetter(0)
_second = itemgetter(1)


class PerBlockPool:
    """One free-queue entry per block and one prefix-cache map entry per key (cached, dups)."""

    __slots__ = ("num_gpu_blocks", "block_size", "extra_refs", "cached", "dups", "free_queue", "num_evictions",
                 "uncached_first", "version", "watched", "watch_hit", "watch_free_change", "free_version")

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.extra_refs: dict[int, int] = {}  # block -> references beyond the first
        self.cached: dict[int, int] = {}  # key -> first cached copy
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        self.free_queue: OrderedDict[int, int | None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self.num_evictions = 0
        self.uncached_first = True
        self.version = 0  # as BlockPool: changes to the prefix-cache map, and watched keys
        self.watched: set[int] | None = None
        self.watch_hit = False
        self.free_version = 0  # as BlockPool: changes to which blocks are free
        self.watch_free_change = False  # as BlockPool: a hit or free touched a watched group

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    # The prefix-cache map, one dict entry per key (BlockPool keeps per-trace-block tables).
    def cached_get(self, key: int) -> int | None:
        return self.cached.get(key)

    def is_cached(self, key: int) -> bool:
        return key in self.cached

    def num_cached_keys(self) -> int:
        return len(self.cached)

    def cached_items(self) -> list[tuple[int, int]]:
        return list(self.cached.items())

    def cached_prefix_len(self, runs: list[range]) -> int:
        return len(self.cached_prefix(runs))

    def cached_prefix(self, runs: list[range]) -> list[int]:
        out: list[int] = []
        for rng in runs:
            for key in rng:
                b = self.cached.get(key)
                if b is None:
                    return out
                out.append(b)
        return out

    def ref_cnt(self, b: int) -> int:
        if b == 0:
            return 1  # the null block is never free
        if b in self.free_queue:
            return 0
        return 1 + self.extra_refs.get(b, 0)

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the LRU end; a popped block that is still cached is evicted now."""
        fq = self.free_queue
        if n > len(fq):
            raise RuntimeError(f"cannot allocate {n} blocks: only {len(fq)} free")
        self.free_version += 1
        if n == 1:  # a decode crossing a block boundary: the common case, kept scalar
            b, key = fq.popitem(False)
            if key is not None:
                self.num_evictions += 1
                self.version += 1
                if self.watched is not None and key_group(key) in self.watched:
                    self.watch_hit = True
                if not key:
                    pass  # private: in no map
                elif self.dups:
                    self._evict(b, key)
                else:
                    del self.cached[key]
            return [b]
        popped = list(map(fq.popitem, repeat(False, n)))
        out = list(map(_first, popped))
        values = list(map(_second, popped))
        evicted = n - values.count(None)
        if evicted:
            self.num_evictions += evicted
            keys = list(filter(None, values))  # registered keys (real keys are never 0)
            if keys:
                self.version += 1
                if self.watched is not None and not self.watched.isdisjoint(map(key_group, keys)):
                    self.watch_hit = True
            if not keys:
                pass
            elif self.dups:
                for b, key in popped:
                    if key:
                        self._evict(b, key)
            else:  # every key has one copy, which must be the popped block
                deque(map(self.cached.__delitem__, keys), 0)
        return out

    def touch(self, blocks: Iterable[int], runs: list[range] | None = None) -> None:
        """Take a reference on prefix-cache hits, unlinking free ones from the free queue (``runs``,
        the hits' keys, is what BlockPool counts them by; one count per block here)."""
        fq = self.free_queue
        extra = self.extra_refs
        self.free_version += 1
        self._note_free_change(runs)
        for b in blocks:
            if b in fq:
                del fq[b]
            else:
                extra[b] = extra.get(b, 0) + 1

    def _note_free_change(self, runs: list[range] | None) -> None:
        """As BlockPool: a hit or a free under the keys of ``runs`` (None: unknown keys)."""
        if self.watched is not None and (runs is None or not self.watched.isdisjoint(
                key_group(key) for rng in runs for key in rng)):
            self.watch_free_change = True

    def num_free_among(self, blocks: list[int], runs: list[range] | None = None) -> int:
        """How many of ``blocks`` sit in the free queue (hits that would consume free capacity)."""
        fq = self.free_queue
        return sum(map(fq.__contains__, blocks))

    def free_blocks(self, blocks_in_eviction_order: list[int], runs: list[range], num_uncached: int,
                    num_private: int) -> None:
        """As replay.engine.block_pool.BlockPool.free_blocks, one free-queue entry per block: blocks
        without a hash to the head (reused first, in the given order), cached ones to the tail.
        ``runs`` in prefix order: the blocks come last key first."""
        keys = [key for rng in reversed(runs) for key in reversed(rng)]
        self.free_version += 1
        self._note_free_change(runs)
        fq = self.free_queue
        uncached = blocks_in_eviction_order[:num_uncached]
        for b in reversed(uncached) if self.uncached_first else uncached:  # never shared
            fq[b] = None
            if self.uncached_first:
                fq.move_to_end(b, last=False)
        blocks_in_eviction_order = blocks_in_eviction_order[num_uncached:]
        keys = [0] * num_private + list(keys)
        extra = self.extra_refs
        shared = extra.keys() & blocks_in_eviction_order if extra else None
        if not shared:
            fq.update(zip(blocks_in_eviction_order, keys))
            return
        # Append everything, then take back the blocks other holders still reference: the order of
        # the rest is unchanged and the common blocks cost one C-level insert each.
        fq.update(zip(blocks_in_eviction_order, keys))
        for b in shared:  # other holders remain: drop one reference, keep the block in use
            del fq[b]
            c = extra[b]
            if c == 1:
                del extra[b]
            else:
                extra[b] = c - 1

    # The key map as a plain dict: BlockPool's per-trace-block tables are under test too.
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

    def cache_full_blocks(self, blocks: list[int], runs: list[range]) -> None:
        """As BlockPool.cache_full_blocks, one dict entry per key."""
        keys = [key for rng in runs for key in rng]
        self.version += 1
        if self.watched is not None and not self.watched.isdisjoint(map(key_group, keys)):
            self.watch_hit = True
        for b, key in zip(blocks, keys):
            if key in self.cached:
                self.dups.setdefault(key, []).append(b)
            else:
                self.cached[key] = b

    def check_invariants(self, in_use_keys: dict[int, int | None], holders: dict[int, int]) -> None:
        fq = self.free_queue
        assert 0 not in fq, "the null block is in the free queue"
        for b in range(1, self.num_gpu_blocks):
            assert self.ref_cnt(b) == holders.get(b, 0), f"block {b}: ref_cnt {self.ref_cnt(b)}, held {holders.get(b, 0)}"

        def key_of(b: int) -> int | None:
            return fq[b] if b in fq else in_use_keys.get(b)

        for key, b in self.cached.items():
            assert key_of(b) == key, f"cached key of block {b} mismatches"
        for key, copies in self.dups.items():
            for b in copies:
                assert key_of(b) == key
