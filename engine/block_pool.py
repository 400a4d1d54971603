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
- registered runs ``[blocks, keys, next, stale, tracked]``: blocks in the prefix-cache map, in
  eviction order. A free block that is the first cached copy of a trace-named key has its run id
  in its table slot (``fruns``, aligned with the tables like ``refs``: a run freed inside one trace
  block is one slice assignment); any other free registered block is in ``where`` (block -> run
  id), and ``tracked`` counts how many of the run's blocks went there (0: allocation need not look).
  A hit on a free block (touch) clears its run id and leaves a stale entry that allocation skips.
An allocation consumes runs from the head by slicing. Block ids are handed out fresh (a counter) and
live as long as a block's contents: the id of a registered block is dropped when its key is
evicted. Same decisions, evictions and outputs as one entry per block (tests/reference_block_pool.py,
compared call by call by tests/engine/test_block_pool.py and replay by replay, byte for byte, by
tests/engine/test_real_traces.py); a freed prompt costs a few queue entries, not one per block.

Reference counts. A block that is the first cached copy of a trace-named key (a slot of a
trace-block table, below) has its reference count in ``refs``, a list aligned with its table: a hit
on a popular prefix that other running requests hold is a list update per block, no dict operation,
and hits and frees are handed the keys' runs (``touch``, ``num_free_among``, ``free_blocks``) so
they find the slots without a lookup; such a block is free exactly when its count is 0. Any other
block (a key unique to a request, a further copy, a block not yet registered) is in use exactly
when it is not in ``where``, with ``extra_refs``
counting its references beyond the first. A further copy promoted to first copy (its primary
evicted) takes its count into the table. vLLM keeps ``ref_cnt`` on the block object; the count is
the same, only where it is kept differs.

The prefix-cache map (vLLM's cached_block_hash_to_block) is kept per trace block, not per key: a
trace-named key is id * _ID_STRIDE + offset (engine/block_keys.py), and the keys of one trace block
step by the block size, so ``groups`` maps (id, offset mod block size) to a table of slots indexed by
offset // block size (slot 0 counts the filled ones). A prefix walk then reads one table slice per
trace block instead of one dict lookup per block (``cached_prefix``), which was the largest single
cost of admitting a request with a long shared prefix. Keys unique to a request (negative: generated
tokens, prompts without ids) stay in a plain dict (``unique``). Same keys, same blocks, same
decisions: the per-block reference (tests/reference_block_pool.py) keeps one dict entry per key.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import repeat
from typing import Final, cast

from replay.engine import block_keys

# engine/block_keys.py's key stride, as a constant of this module: compiled code inlines a Final of
# its own module but reads an imported one from the module dict at every use (73 -> 31 ns a slot).
_ID_STRIDE: Final = (1 << 24) + 1
assert _ID_STRIDE == block_keys._ID_STRIDE


def _count(values: list[int], lo: int, hi: int, x: int) -> int:
    """How many of values[lo:hi] equal ``x``. Compiled, a loop of unboxed compares: list.count and
    ``in`` build a slice and compare every entry through the generic object protocol (perf: 40% of
    num_free_among on reuse-20k-8rps), slower for the 16-32 slots of a trace block."""
    n = 0
    for s in range(lo, hi):
        if values[s] == x:
            n += 1
    return n


class PoolInvariantError(Exception):
    """A --check invariant of the pool failed (an engine bug, never bad input)."""


def _require(ok: bool, message: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not ok:
        raise PoolInvariantError(message)


class BlockPool:
    __slots__ = ("num_gpu_blocks", "block_size", "extra_refs", "groups", "refs", "fruns", "unique", "dups",
                 "free_queue", "where",
                 "num_free", "num_evictions", "_next_id", "_next_run", "uncached_first", "version", "watched",
                 "watch_hit", "free_version")

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        # Keyed by the block's int object as the caller's list holds it (dict[object, ...] and loops
        # over list[object]): compiled code would otherwise unbox each id and box it again, a new
        # int object per dict operation that the dict must then compare by value.
        self.extra_refs: dict[object, int] = {}  # block outside the tables -> references beyond the first
        self.block_size = block_size
        # The prefix-cache map, key -> first cached copy (see the module doc): trace-named keys in
        # per-trace-block tables [filled, slot 0, slot 1, ...] (0: empty; block 0 is never handed
        # out), keys unique to a request in a dict.
        self.groups: dict[int, list[int]] = {}
        # Reference counts of the tables' blocks, per slot (aligned with groups; 0: free or empty).
        self.refs: dict[int, list[int]] = {}
        # The free-queue run of each free slot block (aligned with groups; 0: in use or empty).
        self.fruns: dict[int, list[int]] = {}
        self.unique: dict[int, int] = {}
        self.dups: dict[int, list[int]] = {}  # key -> further copies (rare)
        # run id -> [count, evicts] (anonymous) or [blocks, keys, next, stale, tracked] (registered)
        self.free_queue: OrderedDict[int, list] = OrderedDict({0: [num_gpu_blocks - 1, False]})
        self.where: dict[object, int] = {}  # free registered block outside the slots -> its run id
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

    # -- the prefix-cache map ------------------------------------------------------------------------
    def _slot(self, key: int) -> tuple[int, int]:
        """(table id, index in the table) of a trace-named key (key >= 0); one-to-one."""
        bs = self.block_size
        g = key // _ID_STRIDE
        off = key - g * _ID_STRIDE
        return g * bs + off % bs, 1 + off // bs

    def cached_get(self, key: int) -> int | None:
        """The first cached copy of ``key``, or None."""
        if key < 0:
            return self.unique.get(key)
        tid, i = self._slot(key)
        table = self.groups.get(tid)
        if table is None or i >= len(table):
            return None
        b = table[i]
        return b if b else None

    def is_cached(self, key: int) -> bool:
        return self.cached_get(key) is not None

    def num_cached_keys(self) -> int:
        return sum(t[0] for t in self.groups.values()) + len(self.unique)

    def cached_items(self) -> list[tuple[int, int]]:
        """(key, first copy) of every cached key (diagnostics and tests; O(map))."""
        bs = self.block_size
        out = list(self.unique.items())
        for tid, table in self.groups.items():
            g = tid // bs
            rem = tid - g * bs
            for i in range(1, len(table)):
                if table[i]:
                    out.append((g * _ID_STRIDE + (i - 1) * bs + rem, table[i]))
        return out

    def _put(self, key: int, b: int) -> bool:
        """Map ``key`` to ``b`` unless it is mapped already (then False: ``b`` is a further copy)."""
        if key < 0:
            unique = self.unique
            if key in unique:
                return False
            unique[key] = b
            return True
        tid, i = self._slot(key)
        table = self._table(tid, i + 1)
        if table[i]:
            return False
        table[i] = b
        table[0] += 1
        self.refs[tid][i] = 1  # its owner's reference
        return True

    def _table(self, tid: int, length: int) -> list[int]:
        """The table ``tid``, created or grown (empty slots) to at least ``length`` entries."""
        table = self.groups.get(tid)
        if table is None:
            table = [0] * length
            self.groups[tid] = table
            self.refs[tid] = [0] * length
            self.fruns[tid] = [0] * length
        elif len(table) < length:
            grow = [0] * (length - len(table))
            table.extend(grow)
            self.refs[tid].extend(grow)
            self.fruns[tid].extend(grow)
        return table

    def _replace(self, key: int, b: int) -> None:
        """The first copy of a mapped ``key`` (just evicted, so unreferenced) is now the further copy
        ``b``, whose references, or (free) its run id, move into the table."""
        if key < 0:
            self.unique[key] = b
        else:
            tid, i = self._slot(key)
            self.groups[tid][i] = b
            rid = self.where.pop(b, 0)
            if rid:
                self.fruns[tid][i] = rid
            else:
                self.refs[tid][i] = 1 + self.extra_refs.pop(b, 0)
                self.fruns[tid][i] = 0

    def _drop(self, key: int) -> None:
        """Unmap a mapped ``key``."""
        if key < 0:
            del self.unique[key]
            return
        tid, i = self._slot(key)
        table = self.groups[tid]
        table[i] = 0
        self.fruns[tid][i] = 0
        self._emptied(tid, table, 1)

    def _emptied(self, tid: int, table: list[int], m: int) -> None:
        """``m`` slots of ``table`` were just emptied: drop the table once it is empty, else its
        trailing empty slots (eviction takes a prefix's tail first)."""
        left = table[0] - m
        if left == 0:
            del self.groups[tid]
            del self.refs[tid]
            del self.fruns[tid]
            return
        table[0] = left
        if not table[-1]:
            refs = self.refs[tid]
            fruns = self.fruns[tid]
            while not table[-1]:
                table.pop()
                refs.pop()
                fruns.pop()

    def _span(self, keys: list[int], j: int, step: int) -> int:
        """End of the run of ``keys`` from ``j`` that steps by ``step`` (+-block size) inside one
        table: consecutive slots, so one slice assignment maps or unmaps them all. A unique key
        (negative, kept in a dict) is a run of its own."""
        key = keys[j]
        if key < 0:
            return j + 1
        off = key - (key // _ID_STRIDE) * _ID_STRIDE
        # slots left in this table in the run's direction (offsets stay in [0, _ID_STRIDE))
        room = (off // -step if step < 0 else (_ID_STRIDE - 1 - off) // step) + 1
        end = len(keys)
        if end > j + room:
            end = j + room
        k = j + 1
        while k < end and keys[k] == key + step:
            key += step
            k += 1
        return k

    def _drop_all(self, keys: list[int]) -> None:
        """Unmap mapped ``keys`` (eviction order: a trace block's blocks usually last first)."""
        step = -self.block_size
        j = 0
        while j < len(keys):
            k = self._span(keys, j, step)
            m = k - j
            if m < 4:
                for key in keys[j:k]:
                    self._drop(key)
            else:
                tid, top = self._slot(keys[j])
                table = self.groups[tid]
                zeros = [0] * m
                table[top - m + 1:top + 1] = zeros
                self.fruns[tid][top - m + 1:top + 1] = zeros
                self._emptied(tid, table, m)
            j = k

    def _put_all(self, blocks: list[int], runs: list[range]) -> None:
        """Map the keys of ``runs`` (BlockKeys.key_runs, prefix order) to ``blocks``; keys mapped
        already get a further copy."""
        bs = self.block_size
        j = 0
        for rng in runs:
            m = len(rng)
            if m >= 4 and rng.step == bs and rng[0] >= 0:  # one trace block's run: one table
                tid, i = self._slot(rng[0])
                table = self._table(tid, i + m)
                if _count(table, i, i + m, 0) == m:  # all free: one slice assignment
                    table[i:i + m] = blocks[j:j + m]
                    table[0] += m
                    self.refs[tid][i:i + m] = [1] * m  # their owner's references
                    j += m
                    continue
            for key in rng:
                b = blocks[j]
                if not self._put(key, b):  # computed twice (or twice in one call): a further copy
                    self.dups.setdefault(key, []).append(b)
                j += 1

    def cached_prefix(self, runs: list[range]) -> list[int]:
        """First cached copies of the leading mapped keys of ``runs`` (BlockKeys.key_runs: each run
        in one trace block, stepping by the block size, or unique keys), up to the first unmapped one.
        One table slice per trace block."""
        out: list[int] = []
        groups = self.groups
        bs = self.block_size
        for rng in runs:
            n = len(rng)
            if n == 0:
                continue
            k0 = rng[0]
            if k0 < 0 or rng.step != bs:
                for key in rng:
                    b = self.cached_get(key)
                    if b is None:
                        return out
                    out.append(b)
                continue
            tid, i = self._slot(k0)
            table = groups.get(tid)
            if table is None:
                return out
            end = i + n
            # every slot filled (slot 0 counts them), or none of these empty: the whole slice
            if end <= len(table) and (table[0] == len(table) - 1 or _count(table, i, end, 0) == 0):
                out += table[i:end]
                continue
            for b in table[i:end]:
                if not b:
                    return out
                out.append(b)
            return out
        return out

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
                if run[4]:
                    self.where.pop(b, None)  # (a slot's block is not in where)
                self.num_evictions += 1
                self.version += 1
                if self.watched is not None and key in self.watched:
                    self.watch_hit = True
                if self.dups:
                    self._evict(b, key)
                else:
                    self._drop(key)
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
            blocks, keys, nxt, stale, tracked = run
            end = len(blocks)
            if not stale:  # no hit took a block out of this run: a plain slice
                stop = nxt + need if nxt + need < end else end
                taken = blocks[nxt:stop]
                taken_keys = keys[nxt:stop]
            else:  # skip the entries hits took out
                taken, taken_keys = [], []
                stop = nxt
                while stop < end and len(taken) < need:
                    b = blocks[stop]
                    key = keys[stop]
                    if self._free_in(b, key, rid):
                        taken.append(b)
                        taken_keys.append(key)
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
                if tracked:
                    pop = self.where.pop
                    for b in taken:
                        pop(b, None)  # (a slot's block is not in where)
                self.version += 1
                if self.watched is not None and not self.watched.isdisjoint(taken_keys):
                    self.watch_hit = True
                if self.dups:
                    for b, key in zip(taken, taken_keys):
                        self._evict(b, key)
                else:  # every key has one copy, which must be the taken block
                    self._drop_all(taken_keys)
        return [first] if n == 1 else list(range(first, first + n))

    def _free_in(self, b: int, key: int, rid: int) -> bool:
        """Whether entry (``b``, ``key``) of registered run ``rid`` is still free there (no hit took
        it out since; a block freed again belongs to its newer run)."""
        if key >= 0:
            tid, i = self._slot(key)
            table = self.groups.get(tid)
            if table is not None and i < len(table) and table[i] == b:
                return self.fruns[tid][i] == rid
        return self.where.get(b) == rid

    def _evict(self, b: int, key: int) -> None:
        if self.cached_get(key) == b:
            copies = self.dups.get(key)
            if copies:
                self._replace(key, copies.pop(0))
                if not copies:
                    del self.dups[key]
            else:
                self._drop(key)
        else:
            copies = self.dups[key]
            copies.remove(b)
            if not copies:
                del self.dups[key]

    def touch(self, blocks: list[int], runs: list[range]) -> None:
        """Take a reference on prefix-cache hits, taking free ones out of the free queue.

        ``blocks`` are what ``cached_prefix(runs)`` returned (``runs`` may cover more keys): the
        hits of a trace-block run are that table's slots, counted there.
        """
        self.free_version += 1
        n = len(blocks)
        bs = self.block_size
        j = 0
        for rng in runs:
            if j >= n:
                break
            m = len(rng)
            if m > n - j:
                m = n - j
            if m == 0:
                continue
            k0 = rng[0]
            if k0 >= 0 and rng.step == bs:
                tid, i = self._slot(k0)
                self._hold_slots(tid, i, blocks, j, m)
                j += m
                continue
            for key in rng[:m]:
                if key >= 0:
                    tid, i = self._slot(key)
                    self._hold_slots(tid, i, blocks, j, 1)
                else:
                    self._hold(cast("list[object]", blocks)[j])
                j += 1

    def _hold_slots(self, tid: int, i: int, blocks: list[int], j: int, m: int) -> None:
        """One more reference on slots i..i+m-1 of table ``tid``, which hold ``blocks[j:j+m]``."""
        table = self.groups[tid]
        _require(table[i:i + m] == blocks[j:j + m], "prefix hits are not the table's blocks")
        refs = self.refs[tid]
        zeros = _count(refs, i, i + m, 0)
        if zeros:
            fruns = self.fruns[tid]
            fq = self.free_queue
            if m > 1 and zeros == m:
                rid = fruns[i]
                if _count(fruns, i, i + m, rid) == m:  # all free in one run (a finished turn's prompt)
                    self._went_stale(fq, rid, m)
                    fruns[i:i + m] = [0] * m
                    refs[i:i + m] = [1] * m
                    self.num_free -= m
                    return
            for s in range(i, i + m):
                c = refs[s]
                if c == 0:  # a free cached block: out of the free queue (its entry goes stale)
                    self._went_stale(fq, fruns[s], 1)
                    fruns[s] = 0
                    self.num_free -= 1
                refs[s] = c + 1
        else:  # every one in use already (a popular prefix): counts only
            for s in range(i, i + m):
                refs[s] = refs[s] + 1  # (not +=: compiled, that is a generic object operation)

    @staticmethod
    def _went_stale(fq: OrderedDict[int, list], rid: int, n: int) -> None:
        """A hit took ``n`` of run ``rid``'s free blocks out: ``n`` more stale entries, and a run with
        no free block left leaves the queue now (allocation would otherwise walk all its entries to
        skip them; nothing refers to it any more)."""
        run = fq[rid]
        stale = run[3] + n
        if stale == len(run[0]) - run[2]:
            del fq[rid]
        else:
            run[3] = stale

    def _hold(self, b: object) -> None:
        """One more reference on a block outside the tables."""
        rid = self.where.pop(b, None)
        if rid is not None:
            self._went_stale(self.free_queue, rid, 1)
            self.num_free -= 1
        else:
            extra = self.extra_refs
            extra[b] = extra.get(b, 0) + 1

    def num_free_among(self, blocks: list[int], runs: list[range]) -> int:
        """How many of ``blocks`` (``cached_prefix(runs)``) sit in the free queue: hits that would
        consume free capacity."""
        n = len(blocks)
        bs = self.block_size
        refs_of = self.refs
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
            k0 = rng[0]
            if k0 >= 0 and rng.step == bs:
                tid, i = self._slot(k0)
                refs = refs_of[tid]
                count += _count(refs, i, min(i + m, len(refs)), 0)
                j += m
                continue
            for key in rng[:m]:
                if key >= 0:
                    tid, i = self._slot(key)
                    if refs_of[tid][i] == 0:
                        count += 1
                elif cast("list[object]", blocks)[j] in self.where:
                    count += 1
                j += 1
        return count

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

    def free_blocks(self, blocks_in_eviction_order: list[int], runs: list[range], num_uncached: int,
                    num_private: int) -> None:
        """Drop one reference each; blocks reaching zero join the free queue.

        vLLM 0.33 (BlockPool.free_blocks): blocks without a block hash go to the head of the free
        queue (reused first), cached ones to the tail in the given order. The first ``num_uncached``
        blocks are not cached (head), the next ``num_private`` are private (cached, findable by
        nobody; tail): both are anonymous runs. The rest are registered, under the keys of ``runs``
        (in the blocks' order: a request's key runs reversed, each reversed), and join the tail
        after the private ones. No key is made for a block that stays in use.
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
        if not runs:
            return
        blocks = blocks_in_eviction_order[skip:] if skip else blocks_in_eviction_order
        # Blocks other holders still reference lose one reference and stay in use; the rest are
        # freed, in order. A table's first copies are counted in its slots: a run inside one table
        # (descending, the eviction order) is one slice compare and a list update per block.
        # (Plain loops over list[object]: compiled, no id is unboxed and boxed again.)
        groups = self.groups
        refs_of = self.refs
        step = -self.block_size
        rid = self._next_run  # the run the freed blocks join (taken only if any is freed)
        freed: list[object] = []
        freed_keys: list[object] = []
        tracked: list[object] = []  # freed blocks outside the slots: they go to where
        blocks_o = cast("list[object]", blocks)
        j = 0
        for rng in runs:
            m = len(rng)
            if m == 0:
                continue
            top_key = rng[0]
            if top_key < 0 or (m > 1 and rng.step != step):  # keys unique to the request
                for key in rng:
                    if key >= 0:
                        self._release_slot(key, blocks_o[j], freed, freed_keys, rid, tracked)
                    else:
                        self._release(blocks_o[j], key, freed, freed_keys, tracked)
                    j += 1
                continue
            tid, top = self._slot(top_key)
            table = groups[tid]
            refs = refs_of[tid]
            lo = top - m + 1
            seg = table[lo:top + 1]
            seg.reverse()
            if seg == blocks[j:j + m]:  # all first copies (the common case)
                ones = _count(refs, lo, top + 1, 1)
                if ones == m:  # the last reference on each: all freed, into run rid
                    refs[lo:top + 1] = [0] * m
                    self.fruns[tid][lo:top + 1] = [rid] * m
                    freed.extend(blocks_o[j:j + m])
                    freed_keys.extend(rng)
                    j += m
                    continue
                if ones == 0:  # all still held by others: counts only
                    for s in range(lo, top + 1):
                        refs[s] = refs[s] - 1
                    j += m
                    continue
            for key in rng:
                self._release_slot(key, blocks_o[j], freed, freed_keys, rid, tracked)
                j += 1
        if not freed:
            return
        self._next_run = rid + 1
        self.free_queue[rid] = [freed, freed_keys, 0, 0, len(tracked)]
        if tracked:
            self.where.update(zip(tracked, repeat(rid)))
        self.num_free += len(freed)

    def _release_slot(self, key: int, b: object, freed: list[object], freed_keys: list[object], rid: int,
                      tracked: list[object]) -> None:
        """Drop a reference on ``b``, registered under the trace-named ``key``: counted in the
        key's slot when it is the first copy (freed: the slot takes run ``rid``), else (a further
        copy) by itself."""
        tid, i = self._slot(key)
        table = cast("list[object]", self.groups[tid])
        if table[i] == b:
            refs = self.refs[tid]
            c = refs[i] - 1
            refs[i] = c
            if c == 0:
                self.fruns[tid][i] = rid
                freed.append(b)
                freed_keys.append(key)
        else:
            self._release(b, key, freed, freed_keys, tracked)

    def _release(self, b: object, key: object, freed: list[object], freed_keys: list[object],
                 tracked: list[object]) -> None:
        """Drop a reference on a block outside the tables; at zero it joins ``freed`` (and ``where``)."""
        extra = self.extra_refs
        c = extra.get(b, 0)
        if c == 0:
            freed.append(b)
            freed_keys.append(key)
            tracked.append(b)
        elif c == 1:
            del extra[b]
        else:
            extra[b] = c - 1

    def cache_full_blocks(self, blocks: list[int], runs: list[range]) -> None:
        """Register newly full blocks under their keys, given as runs (at scheduling time, as vLLM
        does)."""
        self.version += 1
        watched = self.watched
        if watched is not None:
            for rng in runs:
                if not watched.isdisjoint(rng):
                    self.watch_hit = True
                    break
        self._put_all(blocks, runs)

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
            blocks, keys, nxt, stale, tracked = run
            live = [(b, k) for b, k in zip(blocks[nxt:], keys[nxt:]) if self._free_in(b, k, rid)]
            _require(len(live) == len(blocks) - nxt - stale, f"run {rid}: stale count {stale} is off")
            _require(sum(1 for b, _ in live if self.where.get(b) == rid) <= tracked,
                     f"run {rid}: more blocks in where than its count {tracked}")
            free += len(live)
            free_keys.update(live)
        in_slots = sum(len(f) - f.count(0) for f in self.fruns.values())
        _require(len(free_keys) == len(self.where) + in_slots, "where, the slots' run ids and the runs disagree")
        _require(free == self.num_free, f"{free} free blocks counted, {self.num_free} recorded")
        _require(self.num_free + len(holders) == usable, (
            f"{self.num_free} free + {len(holders)} in use != {usable} usable blocks"))
        slot_refs: dict[int, int] = {}  # a table's block -> its slot's reference count
        for tid, table in self.groups.items():
            refs = self.refs[tid]
            fruns = self.fruns[tid]
            _require(len(refs) == len(table) == len(fruns), f"table {tid}: {len(refs)} counts and "
                     f"{len(fruns)} run ids for {len(table)} slots")
            for i in range(1, len(table)):
                b = table[i]
                if b:
                    _require((refs[i] == 0) == (fruns[i] != 0), f"block {b}: count {refs[i]} but run id "
                             f"{fruns[i]}")
                    _require(b not in self.where, f"block {b}: in a slot and in where")
                    slot_refs[b] = refs[i]
                else:
                    _require(refs[i] == 0 and fruns[i] == 0, f"table {tid}: an empty slot counts {refs[i]} "
                             f"references, run id {fruns[i]}")
        _require(self.refs.keys() == self.groups.keys() == self.fruns.keys(),
                 "counts kept for tables that do not exist")
        for b, held in holders.items():
            _require(b not in self.where and b not in free_keys, f"block {b} is held and free")
            ref_cnt = slot_refs[b] if b in slot_refs else 1 + self.extra_refs.get(b, 0)
            _require(held == ref_cnt, f"block {b}: held {held} times, ref_cnt {ref_cnt}")
        for extra_b in self.extra_refs:
            _require(extra_b in holders, f"block {extra_b}: extra refs on a block nobody holds")
            _require(extra_b not in slot_refs, f"block {extra_b}: counted in a table and outside it")

        def key_of(b: int) -> int | None:
            return free_keys[b] if b in free_keys else in_use_keys.get(b)

        for key, b in self.cached_items():
            _require(key_of(b) == key, f"cached key of block {b} mismatches")
        for key, copies in self.dups.items():
            _require(self.is_cached(key), "duplicate copy without a primary")
            for b in copies:
                _require(key_of(b) == key, f"block {b}: duplicate copy under the wrong key")
        n_keys = self.num_cached_keys() + sum(len(c) for c in self.dups.values())
        n_keyed = len(free_keys) + sum(1 for b, k in in_use_keys.items() if k is not None)
        _require(n_keys == n_keyed, f"{n_keys} cached copies but {n_keyed} keyed blocks")
