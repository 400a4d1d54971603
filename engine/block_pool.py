"""The GPU KV block pool: vLLM V1's BlockPool (v1/core/block_pool.py), without token contents.

- Block 0 is vLLM's reserved null block: ``num_gpu_blocks - 1`` blocks are usable.
- The free queue holds every block with ref_cnt == 0, cached ones included, oldest first. It is an
  OrderedDict (a C doubly linked list): popping the LRU end, unlinking a touched block and
  appending freed blocks are all O(1).
- Eviction is lazy: a cached block stays findable until it is popped for reuse.
- Two requests that compute the same block make two copies under one key; the key stays cached
  until its last copy is evicted (vLLM keeps a dict of block ids per hash).

A free block's key is 0 when it is a private block (engine/kv_cache_manager.py): cached, so its
reuse counts as an eviction, but in no map because nobody can look it up.

Reference counts are stored sparsely: a block is in use exactly when it is not in the free queue,
and ``extra_refs`` counts references beyond the first (prefix sharing). A free block's key (None
when uncached) is the free queue's value, and the caller passes keys in when it frees blocks (a
request knows the keys of its cached prefix). That lets the common cases (allocating, caching and
freeing blocks nobody else holds) run as bulk C-level operations on lists and dicts instead of
Python loops, which is what keeps a chunk's block work cheap.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import repeat
from operator import itemgetter

_first = itemgetter(0)
_second = itemgetter(1)


class BlockPool:
    __slots__ = ("num_gpu_blocks", "extra_refs", "cached", "dups", "free_queue", "num_evictions")

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.extra_refs: dict[int, int] = {}  # block -> references beyond the first
        self.cached: dict[int, int] = {}  # key -> first cached copy
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        self.free_queue: OrderedDict[int, int | None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self.num_evictions = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_usage(self) -> float:
        """vLLM's kv_cache_usage gauge: evictable cached blocks count as free."""
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

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
        if n == 1:  # a decode crossing a block boundary: the common case, kept scalar
            b, key = fq.popitem(False)
            if key is not None:
                self.num_evictions += 1
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
            if not keys:
                pass
            elif self.dups:
                for b, key in popped:
                    if key:
                        self._evict(b, key)
            else:  # every key has one copy, which must be the popped block
                deque(map(self.cached.__delitem__, keys), 0)
        return out

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
            else:
                extra[b] = extra.get(b, 0) + 1

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of ``blocks`` sit in the free queue (hits that would consume free capacity)."""
        fq = self.free_queue
        return sum(map(fq.__contains__, blocks))

    def free_blocks(self, blocks_in_eviction_order: list[int], keys: list[int | None]) -> None:
        """Drop one reference each; blocks reaching zero join the free queue tail in the given order.

        ``keys[i]`` is the key block i is cached under (None if it is not cached).
        """
        extra = self.extra_refs
        fq = self.free_queue
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
            cached.update(zip(keys, blocks))
            return
        dups = self.dups
        for b, key in zip(blocks, keys):
            if key in cached:
                dups.setdefault(key, []).append(b)
            else:
                cached[key] = b

    def check_invariants(self, in_use_keys: dict[int, int | None] | None = None) -> None:
        """Debug mode: keys and free queue agree (O(pool), never on the hot path).

        ``in_use_keys`` maps each in-use block to the key its holders know it by.
        """
        fq = self.free_queue
        assert 0 not in fq, "the null block is in the free queue"
        for b, c in self.extra_refs.items():
            assert c >= 1 and b not in fq, f"block {b}: extra refs {c} on a free block"
        in_use_keys = in_use_keys or {}

        def key_of(b: int) -> int | None:
            return fq[b] if b in fq else in_use_keys.get(b)

        for key, b in self.cached.items():
            assert key_of(b) == key, f"cached key of block {b} mismatches"
        for key, copies in self.dups.items():
            assert key in self.cached, "duplicate copy without a primary"
            for b in copies:
                assert key_of(b) == key
        n_keys = len(self.cached) + sum(len(c) for c in self.dups.values())
        n_keyed = sum(1 for k in fq.values() if k) + sum(
            1 for b, k in in_use_keys.items() if k is not None and b not in fq)
        assert n_keys == n_keyed, f"{n_keys} cached copies but {n_keyed} keyed blocks"
