"""The GPU KV block pool: vLLM V1's BlockPool (v1/core/block_pool.py), without token contents.

- vLLM reserves block 0 as the null block: ``num_gpu_blocks - 1`` blocks are usable.
- The free queue holds every block with ref_cnt == 0, cached ones included, oldest first; allocation
  pops its LRU end, and a popped block that is still cached is evicted then (lazy eviction). A hit
  on a free cached block unlinks it. Freed blocks without a hash join the head (vLLM 0.33: they
  are reused first), cached ones the tail in the order given.
- Two requests that compute the same block make two copies under one key; the key stays cached
  until its last copy is evicted (vLLM keeps a dict of block ids per hash).

Runs. The free queue is a sequence of runs, one entry per free call and kind, oldest first:
- anonymous runs ``[count, counted_as_eviction]``: free blocks nobody can find again (never full,
  or private: full but findable by nobody, engine/kv_cache_manager.py) are interchangeable, so a
  run only counts them;
- registered runs ``[blocks, keys, next, stale]``: blocks in the prefix-cache map, in eviction
  order. ``where`` maps each free registered block to its run; a hit on a free block (touch)
  removes it from ``where`` and leaves a stale entry that allocation skips.
An allocation consumes runs from the head by slicing. Block ids are handed out fresh (a counter) and
live as long as a block's contents: the id of a registered block is dropped when its key is
evicted. Same decisions, evictions and outputs as one entry per block (tests/reference_block_pool.py,
compared call by call by tests/test_engine_block_pool.py and replay by replay, byte for byte, by
tests/test_engine_real_traces.py); a freed prompt costs a few queue entries, not one per block.

Reference counts are stored sparsely: a registered block is in use exactly when it is not in
``where``, and ``extra_refs`` counts references beyond the first (prefix sharing).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import repeat


class PoolInvariantError(Exception):
    """A --check invariant of the pool failed (an engine bug, never bad input)."""


def _require(ok: bool, message: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not ok:
        raise PoolInvariantError(message)


class BlockPool:
    __slots__ = ("num_gpu_blocks", "extra_refs", "cached", "dups", "free_queue", "where", "num_free",
                 "num_evictions", "_next_id", "_next_run", "uncached_first", "version", "watched", "watch_hit",
                 "free_version")

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.extra_refs: dict[int, int] = {}  # block -> references beyond the first
        self.cached: dict[int, int] = {}  # key -> first cached copy
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        # run id -> [count, evicts] (anonymous) or [blocks, keys, next, stale] (registered)
        self.free_queue: OrderedDict[int, list] = OrderedDict({0: [num_gpu_blocks - 1, False]})
        self.where: dict[int, int] = {}  # free registered block -> its run id
        self.num_free = num_gpu_blocks - 1
        self.num_evictions = 0
        self._next_id = 1
        self._next_run = 1
        self.uncached_first = True  # [0.33] freed blocks without a hash are reused first; [0.11] tail
        # Counts changes to the prefix-cache map (registrations, evictions): a lookup made at an
        # unchanged version would find the same blocks (KVCacheManager.get_computed_blocks).
        self.version = 0
        # Keys a repeated lookup read (a queue head blocked step after step): a change to what any of
        # them maps to sets watch_hit, so the lookup is redone only then.
        self.watched: set[int] | None = None
        self.watch_hit = False
        # Counts changes to which blocks are free (allocations, hits, frees): num_free_among of the
        # same blocks at an unchanged free_version gives the same answer (KVCacheManager memoises it).
        self.free_version = 0

    def get_num_free_blocks(self) -> int:
        return self.num_free

    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the LRU end; a taken block that is still cached is evicted now."""
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} blocks: only {self.num_free} free")
        self.num_free -= n
        self.free_version += 1
        first = self._next_id
        self._next_id = first + n
        fq = self.free_queue
        if n == 1:  # a decode crossing a block boundary: the common case, kept scalar
            rid = next(iter(fq))
            run = fq[rid]
            if len(run) == 2:
                if run[0] == 1:
                    del fq[rid]
                else:
                    run[0] -= 1
                if run[1]:
                    self.num_evictions += 1
                return [first]
            if not run[3]:
                nxt = run[2]
                b, key = run[0][nxt], run[1][nxt]
                if nxt + 1 == len(run[0]):
                    del fq[rid]
                else:
                    run[2] = nxt + 1
                del self.where[b]
                self.num_evictions += 1
                self.version += 1
                if self.watched is not None and key in self.watched:
                    self.watch_hit = True
                if self.dups:
                    self._evict(b, key)
                else:
                    del self.cached[key]
                return [first]
        need = n
        while need:
            rid = next(iter(fq))
            run = fq[rid]
            if len(run) == 2:  # anonymous
                count = run[0]
                take = count if count <= need else need
                if take == count:
                    del fq[rid]
                else:
                    run[0] = count - take
                if run[1]:
                    self.num_evictions += take
                need -= take
                continue
            blocks, keys, nxt, stale = run
            end = len(blocks)
            if not stale:  # no hit took a block out of this run: a plain slice
                stop = nxt + need if nxt + need < end else end
                taken = blocks[nxt:stop]
                taken_keys = keys[nxt:stop]
            else:  # skip the entries hits took out
                where = self.where
                taken, taken_keys = [], []
                stop = nxt
                while stop < end and len(taken) < need:
                    b = blocks[stop]
                    if where.get(b) == rid:
                        taken.append(b)
                        taken_keys.append(keys[stop])
                    else:
                        run[3] -= 1
                    stop += 1
            if stop >= end:
                del fq[rid]
            else:
                run[2] = stop
            if taken:
                need -= len(taken)
                self.num_evictions += len(taken)
                deque(map(self.where.__delitem__, taken), 0)
                self.version += 1
                if self.watched is not None and not self.watched.isdisjoint(taken_keys):
                    self.watch_hit = True
                if self.dups:
                    for b, key in zip(taken, taken_keys):
                        self._evict(b, key)
                else:  # every key has one copy, which must be the taken block
                    deque(map(self.cached.__delitem__, taken_keys), 0)
        return [first] if n == 1 else list(range(first, first + n))

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
        """Take a reference on prefix-cache hits, taking free ones out of the free queue."""
        where = self.where
        fq = self.free_queue
        extra = self.extra_refs
        self.free_version += 1
        for b in blocks:
            rid = where.pop(b, None)
            if rid is not None:
                fq[rid][3] += 1
                self.num_free -= 1
            else:
                extra[b] = extra.get(b, 0) + 1

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of ``blocks`` sit in the free queue (hits that would consume free capacity)."""
        return sum(map(self.where.__contains__, blocks))

    def _append_run(self, count: int, evicts: bool) -> None:
        fq = self.free_queue
        if fq:
            run = fq[next(reversed(fq))]
            if len(run) == 2 and run[1] is evicts:
                run[0] += count
                return
        fq[self._next_run] = [count, evicts]
        self._next_run += 1

    def _prepend_uncached(self, count: int) -> None:
        """Blocks without a hash go to the head of the free queue: reused before any cached block."""
        fq = self.free_queue
        if fq:
            run = fq[next(iter(fq))]
            if len(run) == 2 and not run[1]:
                run[0] += count
                return
        rid = self._next_run
        self._next_run += 1
        fq[rid] = [count, False]
        fq.move_to_end(rid, last=False)

    def free_blocks(self, blocks_in_eviction_order: list[int], keys: list[int], num_uncached: int,
                    num_private: int) -> None:
        """Drop one reference each; blocks reaching zero join the free queue.

        vLLM 0.33 (BlockPool.free_blocks): blocks without a block hash go to the head of the free
        queue (reused first), cached ones to the tail in the given order. The first ``num_uncached``
        blocks are not cached (head), the next ``num_private`` are private (cached, findable by
        nobody; tail): both are anonymous runs. The rest are registered, under ``keys`` (aligned
        with them), and join the tail after the private ones.
        """
        self.free_version += 1
        if num_uncached:
            if self.uncached_first:
                self._prepend_uncached(num_uncached)
            else:
                self._append_run(num_uncached, False)
        if num_private:
            self._append_run(num_private, True)
        skip = num_uncached + num_private
        self.num_free += skip
        if not keys:
            return
        blocks = blocks_in_eviction_order[skip:] if skip else blocks_in_eviction_order
        extra = self.extra_refs
        if extra:
            # Blocks other holders still reference lose one reference and stay in use; the rest
            # are freed, in order. (Plain loops: compiled, each is a direct dict operation.)
            freed: list[int] = []
            freed_keys: list[int] = []
            for b, key in zip(blocks, keys):
                c = extra.get(b, 0)
                if c == 0:
                    freed.append(b)
                    freed_keys.append(key)
                elif c == 1:
                    del extra[b]
                else:
                    extra[b] = c - 1
            if not freed:
                return
            blocks, keys = freed, freed_keys
        rid = self._next_run
        self._next_run += 1
        self.free_queue[rid] = [blocks, keys, 0, 0]
        self.where.update(zip(blocks, repeat(rid)))
        self.num_free += len(blocks)

    def cache_full_blocks(self, blocks: list[int], keys: list[int]) -> None:
        """Register newly full blocks under their keys (at scheduling time, as vLLM does)."""
        cached = self.cached
        self.version += 1
        if self.watched is not None and not self.watched.isdisjoint(keys):
            self.watch_hit = True
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
        usable = self.num_gpu_blocks - 1
        free = 0
        free_keys: dict[int, int] = {}
        for rid, run in self.free_queue.items():
            if len(run) == 2:
                _require(run[0] > 0, f"empty run {rid}")
                free += run[0]
                continue
            blocks, keys, nxt, stale = run
            live = [(b, k) for b, k in zip(blocks[nxt:], keys[nxt:]) if self.where.get(b) == rid]
            _require(len(live) == len(blocks) - nxt - stale, f"run {rid}: stale count {stale} is off")
            free += len(live)
            free_keys.update(live)
        _require(len(free_keys) == len(self.where), "where and the runs disagree")
        _require(free == self.num_free, f"{free} free blocks counted, {self.num_free} recorded")
        _require(self.num_free + len(holders) == usable, (
            f"{self.num_free} free + {len(holders)} in use != {usable} usable blocks"))
        for b, held in holders.items():
            _require(b not in self.where, f"block {b} is held and free")
            _require(held == 1 + self.extra_refs.get(b, 0), (
                f"block {b}: held {held} times, ref_cnt {1 + self.extra_refs.get(b, 0)}"))
        for b in self.extra_refs:
            _require(b in holders, f"block {b}: extra refs on a block nobody holds")

        def key_of(b: int) -> int | None:
            return free_keys[b] if b in free_keys else in_use_keys.get(b)

        for key, b in self.cached.items():
            _require(key_of(b) == key, f"cached key of block {b} mismatches")
        for key, copies in self.dups.items():
            _require(key in self.cached, "duplicate copy without a primary")
            for b in copies:
                _require(key_of(b) == key, f"block {b}: duplicate copy under the wrong key")
        n_keys = len(self.cached) + sum(len(c) for c in self.dups.values())
        n_keyed = len(free_keys) + sum(1 for b, k in in_use_keys.items() if k is not None)
        _require(n_keys == n_keyed, f"{n_keys} cached copies but {n_keyed} keyed blocks")
