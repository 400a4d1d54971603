"""The GPU KV block pool: vLLM V1's BlockPool (v1/core/block_pool.py), without token contents.

- vLLM reserves block 0 as the null block: ``num_gpu_blocks - 1`` blocks are usable.
- The free queue (engine/free_block_queue.py) holds every block with ref_cnt == 0, cached ones
  included, oldest first; allocation pops its LRU end, and a popped block that is still cached is
  evicted then (lazy eviction). A hit on a free cached block takes it out. Freed blocks without a
  hash join the head (vLLM 0.33: they are reused first), cached ones the tail in the order given.
- The prefix-cache map (engine/block_hash_map.py) maps each key to its cached copies.

This module composes the two, and keeps the reference counts that live outside the map's table
slots; returning freed blocks to the queue is engine/block_pool_free.py. Block ids are handed out fresh (a counter) and live as long as a block's contents: the id of
a registered block is dropped when its key is evicted. Same decisions, evictions and outputs as one
free-queue entry and one map entry per block (tests/reference_block_pool.py, compared call by call
by tests/engine/test_block_pool.py and replay by replay, byte for byte, by
tests/engine/test_real_traces.py).

Reference counts (vLLM keeps ``ref_cnt`` on the block object; the count is the same, only where it
is kept differs). A block that is the first cached copy of a trace-named key has its count in its
table slot (``SlotTable.ref_counts``): a hit on a popular prefix that other running requests hold
is a list update per block, no dict operation, and hits and frees are handed the keys' runs
(``touch``, ``num_free_among``, ``free_blocks``) so they find the slots without a lookup; such a
block is free exactly when its count is 0. Any other block (a key unique to a request, a further
copy, a block not yet registered) is in use exactly when the free queue has no run id for it
(``FreeKVCacheBlockQueue.run_id_of_block``), with ``extra_refs`` counting its references beyond
the first. A further copy promoted to first copy (its first copy evicted) takes its count, or its
run id, into the slot.
"""

from __future__ import annotations

from typing import cast

from replay.engine.block_hash_map import BlockHashToBlockMap, SlotTable, cached_prefix_lens_of, count_equal
from replay.engine.block_keys import key_group
from replay.engine.block_pool_checks import PoolInvariantError, check_pool_invariants
from replay.engine.block_pool_free import free_registered
from replay.engine.free_block_queue import AnonymousRun, FreeKVCacheBlockQueue


class BlockPool:
    __slots__ = ("num_gpu_blocks", "block_size", "extra_refs", "cached_block_hash_to_block", "free_block_queue",
                 "num_free", "num_evictions", "_next_block_id", "uncached_first", "version", "watched",
                 "watch_hit", "watch_free_change", "free_version")

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        # Keyed by the block's int object as the caller's list holds it (dict[object, ...] and loops
        # over list[object]): compiled code would otherwise unbox each id and box it again, a new
        # int object per dict operation that the dict must then compare by value.
        self.extra_refs: dict[object, int] = {}  # block outside the slots -> references beyond the first
        self.cached_block_hash_to_block = BlockHashToBlockMap(block_size)
        self.free_block_queue = FreeKVCacheBlockQueue(num_gpu_blocks - 1)
        self.num_free = num_gpu_blocks - 1
        self.num_evictions = 0
        self._next_block_id = 1
        self.uncached_first = True  # [0.33] freed blocks without a hash are reused first; [0.11] tail
        # Counts changes to the prefix-cache map (registrations, evictions): a lookup made at an
        # unchanged version would find the same blocks (KVCacheManager.get_computed_blocks).
        self.version = 0
        # Key groups (BlockKeys.key_group: trace ids) the last lookup read (a queue head blocked step
        # after step): registering or evicting a key of one of them sets watch_hit, so the lookup is
        # redone only then (KVCacheManager.get_computed_blocks).
        self.watched: set[int] | None = None
        self.watch_hit = False
        # Set when a hit or a free touched a block of a watched group: how many of that lookup's hits
        # are free may have changed (KVCacheManager memoises num_free_among of them until then).
        self.watch_free_change = False
        # Counts changes to which blocks are free (allocations, hits, frees): num_free_among of the
        # same blocks at an unchanged free_version gives the same answer (KVCacheManager memoises it).
        self.free_version = 0

    def get_num_free_blocks(self) -> int:
        return self.num_free

    # -- the prefix-cache map ------------------------------------------------------------------------
    def cached_get(self, key: int) -> int | None:
        """The first cached copy of ``key``, or None."""
        return self.cached_block_hash_to_block.get_one_block(key)

    def is_cached(self, key: int) -> bool:
        return self.cached_block_hash_to_block.get_one_block(key) is not None

    def num_cached_keys(self) -> int:
        return self.cached_block_hash_to_block.num_keys()

    def cached_items(self) -> list[tuple[int, int]]:
        """(key, first copy) of every cached key (diagnostics and tests; O(map))."""
        return self.cached_block_hash_to_block.items()

    def cached_prefix(self, runs: list[range]) -> list[int]:
        """First cached copies of the leading mapped keys of ``runs`` (BlockKeys.key_runs), up to the
        first unmapped one."""
        return self.cached_block_hash_to_block.cached_prefix(runs)

    def cached_prefix_len(self, runs: list[range]) -> int:
        """How many blocks ``cached_prefix(runs)`` would return (a router's count, no list built)."""
        return self.cached_block_hash_to_block.cached_prefix_len(runs)

    # -- allocation ----------------------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Take ``n`` blocks from the LRU end; a taken block that is still cached is evicted now."""
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} blocks: only {self.num_free} free")
        self.num_free -= n
        self.free_version += 1
        first = self._next_block_id
        self._next_block_id = first + n
        queue = self.free_block_queue
        runs = queue.runs
        if n == 1:  # a decode crossing a block boundary: the common case, kept scalar
            rid = next(iter(runs))
            run = runs[rid]
            if isinstance(run, AnonymousRun):
                if run.count == 1:
                    del runs[rid]
                else:
                    run.count -= 1
                if run.counts_as_eviction:
                    self.num_evictions += 1
                return [first]
            if not run.num_stale:
                head = run.head
                b = run.blocks[head]
                key = cast(int, run.keys[head])
                if head + 1 == len(run.blocks):
                    del runs[rid]
                else:
                    run.head = head + 1
                if run.num_off_table:
                    queue.run_id_of_block.pop(b, None)  # (a slot's block is not there)
                self.num_evictions += 1
                self.version += 1
                if self.watched is not None and key_group(key) in self.watched:
                    self.watch_hit = True
                hash_map = self.cached_block_hash_to_block
                if hash_map.further_copies:
                    self._evict_cached_block(cast(int, b), key)
                else:
                    hash_map.pop(key)
                return [first]
        need = n
        while need:
            rid = next(iter(runs))
            run = runs[rid]
            if isinstance(run, AnonymousRun):
                count = run.count
                take = count if count <= need else need
                if take == count:
                    del runs[rid]
                else:
                    run.count = count - take
                if run.counts_as_eviction:
                    self.num_evictions += take
                need -= take
                continue
            blocks = run.blocks
            keys = run.keys
            head = run.head
            end = len(blocks)
            if not run.num_stale:  # no hit took a block out of this run: a plain slice
                stop = head + need if head + need < end else end
                taken = blocks[head:stop]
                taken_keys = keys[head:stop]
            else:  # skip the entries hits took out
                taken, taken_keys = [], []
                stop = head
                while stop < end and len(taken) < need:
                    b = blocks[stop]
                    entry_key = keys[stop]
                    if self.is_free_in_run(cast(int, b), cast(int, entry_key), rid):
                        taken.append(b)
                        taken_keys.append(entry_key)
                    else:
                        run.num_stale -= 1
                    stop += 1
            if stop >= end:
                del runs[rid]
            else:
                run.head = stop
            if taken:
                need -= len(taken)
                self.num_evictions += len(taken)
                if run.num_off_table:
                    off_table = queue.run_id_of_block
                    for b in taken:
                        off_table.pop(b, None)  # (a slot's block is not there)
                self.version += 1
                if self.watched is not None and any_in_groups(cast("list[int]", taken_keys), self.watched):
                    self.watch_hit = True
                hash_map = self.cached_block_hash_to_block
                if hash_map.further_copies:
                    for b, taken_key in zip(taken, taken_keys):
                        self._evict_cached_block(cast(int, b), cast(int, taken_key))
                else:  # every key has one copy, which must be the taken block
                    hash_map.pop_all(cast("list[int]", taken_keys))
        return [first] if n == 1 else list(range(first, first + n))

    def is_free_in_run(self, b: int, key: int, rid: int) -> bool:
        """Whether entry (``b``, ``key``) of registered run ``rid`` is still free there (no hit took
        it out since; a block freed again belongs to its newer run)."""
        if key >= 0:
            hash_map = self.cached_block_hash_to_block
            tid, i = hash_map.slot_of(key)
            table = hash_map.tables.get(tid)
            if table is not None and i < len(table.blocks) and table.blocks[i] == b:
                return table.free_run_ids[i] == rid
        return self.free_block_queue.run_id_of_block.get(b) == rid

    def _evict_cached_block(self, b: int, key: int) -> None:
        """Allocation took ``b``, cached under ``key``, with further copies around: the key stays
        cached while a copy is left (vLLM: _maybe_evict_cached_block)."""
        hash_map = self.cached_block_hash_to_block
        further = hash_map.further_copies
        if hash_map.get_one_block(key) == b:
            copies = further.get(key)
            if copies:
                self._promote_further_copy(key, copies.pop(0))
                if not copies:
                    del further[key]
            else:
                hash_map.pop(key)
        else:
            copies = further[key]
            copies.remove(b)
            if not copies:
                del further[key]

    def _promote_further_copy(self, key: int, b: int) -> None:
        """``b`` becomes the first copy of ``key`` (whose first copy was just evicted); for a
        trace-named key its run id (free) or references (in use) move into the key's slot."""
        ref_count = 0
        rid = 0
        if key >= 0:
            rid = self.free_block_queue.run_id_of_block.pop(b, 0)
            if not rid:
                ref_count = 1 + self.extra_refs.pop(b, 0)
        self.cached_block_hash_to_block.replace_first_copy(key, b, ref_count, rid)

    # -- hits ----------------------------------------------------------------------------------------
    def touch(self, blocks: list[int], runs: list[range]) -> None:
        """Take a reference on prefix-cache hits, taking free ones out of the free queue.

        ``blocks`` are what ``cached_prefix(runs)`` returned (``runs`` may cover more keys): the
        hits of a trace-block run are that table's slots, counted there.
        """
        self.free_version += 1
        if self.watched is not None:
            self._note_free_change(runs)
        n = len(blocks)
        bs = self.block_size
        hash_map = self.cached_block_hash_to_block
        tables = hash_map.tables
        j = 0
        for rng in runs:
            if j >= n:
                break
            m = len(rng)
            if m > n - j:
                m = n - j
            if m == 0:
                continue
            k0 = rng.start
            if k0 >= 0 and rng.step == bs:
                tid, i = hash_map.slot_of(k0)
                self._hold_slots(tables[tid], i, blocks, j, m)
                j += m
                continue
            for key in rng[:m]:
                if key >= 0:
                    tid, i = hash_map.slot_of(key)
                    self._hold_slots(tables[tid], i, blocks, j, 1)
                else:
                    self._hold(cast("list[object]", blocks)[j])
                j += 1

    def _hold_slots(self, table: SlotTable, i: int, blocks: list[int], j: int, m: int) -> None:
        """One more reference on slots i..i+m-1 of ``table``, which hold ``blocks[j:j+m]``."""
        if table.blocks[i:i + m] != blocks[j:j + m]:  # survives python -O, unlike assert
            raise PoolInvariantError("prefix hits are not the table's blocks")
        refs = table.ref_counts
        zeros = count_equal(refs, i, i + m, 0)
        if zeros:
            run_ids = table.free_run_ids
            queue = self.free_block_queue
            if m > 1 and zeros == m:
                rid = run_ids[i]
                if count_equal(run_ids, i, i + m, rid) == m:  # all free in one run (a finished turn's prompt)
                    queue.remove_from_run(rid, m)
                    run_ids[i:i + m] = [0] * m
                    refs[i:i + m] = [1] * m
                    self.num_free -= m
                    return
            for s in range(i, i + m):
                c = refs[s]
                if c == 0:  # a free cached block: out of the free queue (its entry goes stale)
                    queue.remove_from_run(run_ids[s], 1)
                    run_ids[s] = 0
                    self.num_free -= 1
                refs[s] = c + 1
        else:  # every one in use already (a popular prefix): counts only
            for s in range(i, i + m):
                refs[s] = refs[s] + 1  # (not +=: compiled, that is a generic object operation)

    def _hold(self, b: object) -> None:
        """One more reference on a block outside the slots."""
        if self.free_block_queue.remove_off_table(b):
            self.num_free -= 1
        else:
            extra = self.extra_refs
            extra[b] = extra.get(b, 0) + 1

    def num_free_among(self, blocks: list[int], runs: list[range]) -> int:
        """How many of ``blocks`` (``cached_prefix(runs)``) sit in the free queue: hits that would
        consume free capacity."""
        n = len(blocks)
        bs = self.block_size
        hash_map = self.cached_block_hash_to_block
        tables = hash_map.tables
        count = 0
        j = 0
        for rng in runs:
            if j >= n:
                break
            m = len(rng)
            if m > n - j:
                m = n - j
            if m == 0:
                continue
            k0 = rng.start
            if k0 >= 0 and rng.step == bs:
                tid, i = hash_map.slot_of(k0)
                refs = tables[tid].ref_counts
                count += count_equal(refs, i, min(i + m, len(refs)), 0)
                j += m
                continue
            for key in rng[:m]:
                if key >= 0:
                    tid, i = hash_map.slot_of(key)
                    if tables[tid].ref_counts[i] == 0:
                        count += 1
                elif cast("list[object]", blocks)[j] in self.free_block_queue.run_id_of_block:
                    count += 1
                j += 1
        return count

    def free_blocks(self, blocks_in_eviction_order: list[int], runs: list[range], num_uncached: int,
                    num_private: int) -> None:
        """Drop one reference each; blocks reaching zero join the free queue.

        vLLM 0.33 (BlockPool.free_blocks): blocks without a block hash go to the head of the free
        queue (reused first), cached ones to the tail in the given order. The first ``num_uncached``
        blocks are not cached (head), the next ``num_private`` are private (cached, findable by
        nobody; tail): both are anonymous runs. The rest are registered, under the keys of ``runs``
        (a request's key runs in prefix order: the blocks come in the reverse order, last key
        first), and join the tail after the private ones, as one registered run. No key is made for
        a block that stays in use.
        """
        self.free_version += 1
        queue = self.free_block_queue
        if num_uncached:
            if self.uncached_first:
                queue.prepend_uncached(num_uncached)
            else:
                queue.append_anonymous(num_uncached, False)
        if num_private:
            queue.append_anonymous(num_private, True)
        skip = num_uncached + num_private
        self.num_free += skip
        if runs:
            if self.watched is not None:
                self._note_free_change(runs)
            blocks = blocks_in_eviction_order[skip:] if skip else blocks_in_eviction_order
            self.num_free += free_registered(self.cached_block_hash_to_block, self.extra_refs, queue, blocks, runs)

    def _note_free_change(self, runs: list[range]) -> None:
        """Blocks under the keys of ``runs`` were taken or freed: note it if a watched group is
        among them (each run lies in one group)."""
        watched = self.watched
        assert watched is not None
        for rng in runs:
            if len(rng) and key_group(rng.start) in watched:
                self.watch_free_change = True
                return

    # -- registration --------------------------------------------------------------------------------
    def cache_full_blocks(self, blocks: list[int], runs: list[range]) -> None:
        """Register newly full blocks under their keys, given as runs (at scheduling time, as vLLM
        does)."""
        self.version += 1
        watched = self.watched
        if watched is not None:
            for rng in runs:  # each run lies in one group
                if len(rng) and key_group(rng.start) in watched:
                    self.watch_hit = True
                    break
        self.cached_block_hash_to_block.insert_all(blocks, runs)

    def check_invariants(self, in_use_keys: dict[int, int | None], holders: dict[int, int]) -> None:
        """Debug mode (``--check``): counts, references and keys agree (engine/block_pool_checks.py).

        ``in_use_keys`` maps each in-use block to the key its holders know it by (None when it is
        not registered); ``holders`` counts the block tables holding each in-use block."""
        check_pool_invariants(self, in_use_keys, holders)


def cached_prefix_lens(pools: list[BlockPool], runs: list[range]) -> list[int]:
    """``cached_prefix_len(runs)`` of each pool, in one compiled loop: a router asks every replica
    at every arrival (64 calls through the interpreter each arrival on a 64-replica fleet)."""
    return cached_prefix_lens_of([pool.cached_block_hash_to_block for pool in pools], runs)


def any_in_groups(keys: list[int], groups: set[int]) -> bool:
    """Whether any of ``keys`` is in one of the key ``groups`` (BlockKeys.key_group)."""
    for key in keys:
        if key_group(key) in groups:
            return True
    return False
