"""The GPU KV block pool: vLLM V1's BlockPool (v1/core/block_pool.py), without token contents.

- Block 0 is vLLM's reserved null block: ``num_gpu_blocks - 1`` blocks are usable.
- The free queue holds every block with ref_cnt == 0, cached ones included, oldest first. It is an
  OrderedDict (a C doubly linked list): popping the LRU end, unlinking a touched block and
  appending freed blocks are all O(1).
- Eviction is lazy: a cached block stays findable until it is popped for reuse.
- Two requests that compute the same block make two copies under one key; the key stays cached
  until its last copy is evicted (vLLM keeps a dict of block ids per hash).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class BlockPool:
    __slots__ = ("num_gpu_blocks", "ref_cnt", "block_hash", "cached", "dups", "free_queue",
                 "num_evictions")

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.ref_cnt = [0] * num_gpu_blocks
        self.ref_cnt[0] = 1  # the null block is never free
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        self.cached: dict[int, int] = {}  # key -> first cached copy
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self.num_evictions = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_usage(self) -> float:
        """vLLM's kv_cache_usage gauge: evictable cached blocks count as free."""
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

    def get_cached_block(self, key: int) -> int | None:
        return self.cached.get(key)

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the LRU end; a popped block that is still cached is evicted now."""
        if n > len(self.free_queue):
            raise RuntimeError(f"cannot allocate {n} blocks: only {len(self.free_queue)} free")
        popitem = self.free_queue.popitem
        block_hash = self.block_hash
        ref_cnt = self.ref_cnt
        out = [popitem(last=False)[0] for _ in range(n)]
        for b in out:
            ref_cnt[b] = 1
            if block_hash[b] is not None:
                self._evict(b)
        return out

    def _evict(self, b: int) -> None:
        key = self.block_hash[b]
        self.block_hash[b] = None
        self.num_evictions += 1
        if self.cached.get(key) == b:
            copies = self.dups.get(key)
            if copies:
                self.cached[key] = copies.pop(0)
                if not copies:
                    del self.dups[key]
            else:
                del self.cached[key]
        else:
            copies = self.dups[key]
            copies.remove(b)
            if not copies:
                del self.dups[key]

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-cache hits, unlinking free ones from the free queue."""
        ref_cnt = self.ref_cnt
        free_queue = self.free_queue
        for b in blocks:
            if ref_cnt[b] == 0:
                del free_queue[b]
            ref_cnt[b] += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[int]) -> None:
        """Drop one reference each; blocks reaching zero join the free queue tail in the given order."""
        ref_cnt = self.ref_cnt
        free_queue = self.free_queue
        for b in blocks_in_eviction_order:
            rc = ref_cnt[b] - 1
            ref_cnt[b] = rc
            if rc == 0:
                free_queue[b] = None
            elif rc < 0:  # pragma: no cover - invariant
                raise RuntimeError(f"block {b} freed more often than allocated")

    def cache_full_blocks(self, blocks: list[int], keys: list[int]) -> None:
        """Register newly full blocks under their keys (at scheduling time, as vLLM does)."""
        block_hash = self.block_hash
        cached = self.cached
        for b, key in zip(blocks, keys, strict=True):
            block_hash[b] = key
            if key in cached:
                self.dups.setdefault(key, []).append(b)
            else:
                cached[key] = b

    def check_invariants(self) -> None:
        """Debug mode: block conservation and reference counts (O(pool), never on the hot path)."""
        assert self.ref_cnt[0] == 1, "null block reference changed"
        for b in range(1, self.num_gpu_blocks):
            rc = self.ref_cnt[b]
            assert rc >= 0, f"block {b} has negative ref_cnt {rc}"
            assert (rc == 0) == (b in self.free_queue), f"block {b}: ref_cnt {rc} vs free queue"
        for key, b in self.cached.items():
            assert self.block_hash[b] == key, f"cached key of block {b} mismatches"
        for key, copies in self.dups.items():
            assert key in self.cached, "duplicate copy without a primary"
            for b in copies:
                assert self.block_hash[b] == key
