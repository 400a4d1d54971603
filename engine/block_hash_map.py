"""The prefix-cache map: vLLM V1's BlockHashToBlockMap (v1/core/kv_cache_utils.py), per trace block.

vLLM maps each block hash to the cached block(s) holding it. Here a key is an int
(engine/block_keys.py): a trace-named key is ``id * ID_STRIDE + offset``, and the keys of one trace
block step by the block size, so they are kept in a ``SlotTable`` per (id, offset mod block size),
indexed by offset // block size. A prefix walk then reads one table slice per trace block instead
of one dict lookup per block (``cached_prefix``), which was the largest single cost of admitting a
request with a long shared prefix. Keys unique to a request (negative: generated tokens, prompts
without ids) stay in a plain dict (``unique``).

Each key maps to its first cached copy. Two requests that compute the same block make two copies
under one key; the later ones are ``further_copies`` (rare), and the key stays cached until its
last copy is evicted (vLLM keeps a dict of block ids per hash).

A table slot also keeps two numbers about its block, so that a hit or a free of a trace block's
blocks is a list update per block and no dict operation (engine/block_pool.py):
- ``ref_counts``: the block's reference count (vLLM's ``KVCacheBlock.ref_cnt``); 0 when free;
- ``free_run_ids``: while the block is free, the id of its free-queue run
  (engine/free_block_queue.py); 0 while in use.
"""

from __future__ import annotations

from typing import Final, final

from replay.engine import block_keys
from replay.engine.whole_table_index import WholeTableIndex

# engine/block_keys.py's key stride, as a constant of this module: compiled code inlines a Final of
# its own module but reads an imported one from the module dict at every use (73 -> 31 ns a slot).
ID_STRIDE: Final = (1 << 24) + 1
if ID_STRIDE != block_keys.ID_STRIDE:  # not an assert: python -O must not drop the check
    raise ImportError("block_hash_map.ID_STRIDE must equal block_keys.ID_STRIDE")


def count_equal(values: list[int], lo: int, hi: int, x: int) -> int:
    """How many of values[lo:hi] equal ``x``. Compiled, a loop of unboxed compares: list.count and
    ``in`` build a slice and compare every entry through the generic object protocol (perf: 40% of
    num_free_among on reuse-20k-8rps), slower for the 16-32 slots of a trace block."""
    n = 0
    for s in range(lo, hi):
        if values[s] == x:
            n += 1
    return n


def key_slot(key: int, block_size: int) -> tuple[int, int]:
    """(table id, slot index) of a trace-named key (key >= 0) in a map of ``block_size``."""
    g = key // ID_STRIDE
    off = key - g * ID_STRIDE
    return g * block_size + off % block_size, off // block_size


@final
class SlotTable:
    """The keys of one trace block that share an offset mod the block size: slot i is the key at
    offset (offset mod block size) + i * block size. Three aligned lists, 0 in an empty slot (block 0,
    the null block, is never handed out)."""

    def __init__(self, length: int) -> None:
        self.blocks = [0] * length  # first cached copy of each slot's key
        self.ref_counts = [0] * length  # its reference count (0: free)
        self.free_run_ids = [0] * length  # its free-queue run while free (0: in use)
        self.num_filled = 0
        self.whole_len = 0  # while a fleet index counts it whole: its whole_key

    def whole_key(self) -> int:
        """2 * length when every slot is filled; 2 * length + 1 when every slot but slot 0 is (a
        trace block's keys end at offsets 1 .. hash block size, so in a table of offsets that are
        multiples of the block size slot 0, offset 0, never fills); 0 otherwise."""
        n = len(self.blocks)
        filled = self.num_filled
        if filled == n:
            return 2 * n
        if filled == n - 1 and not self.blocks[0]:
            return 2 * n + 1
        return 0

    def grow(self, length: int) -> None:
        """At least ``length`` slots (new ones empty)."""
        more = length - len(self.blocks)
        if more > 0:
            grow = [0] * more
            self.blocks.extend(grow)
            self.ref_counts.extend(grow)
            self.free_run_ids.extend(grow)

    def trim(self) -> None:
        """Drop trailing empty slots (eviction takes a prefix's tail first); the table is not empty."""
        blocks = self.blocks
        if not blocks[-1]:
            refs = self.ref_counts
            runs = self.free_run_ids
            while not blocks[-1]:
                blocks.pop()
                refs.pop()
                runs.pop()


@final
class BlockHashToBlockMap:
    """Key -> first cached copy (per-trace-block tables and a dict), and further copies."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tables: dict[int, SlotTable] = {}  # table id (slot_of) -> table
        self.unique: dict[int, int] = {}  # key unique to a request -> first cached copy
        self.further_copies: dict[int, list[int]] = {}  # key -> copies beyond the first (rare)
        self.index: WholeTableIndex | None = None  # the fleet's index of whole tables, if it keeps one
        self.index_bit = 0  # this map's bit there

    def join_index(self, index: WholeTableIndex) -> None:
        """Be counted in ``index`` from now on (the map is empty: a fleet joins before its replay)."""
        if self.tables:
            raise RuntimeError("a prefix-cache map joins a fleet index only while empty")
        self.index = index
        self.index_bit = index.add_map()

    def _reindex(self, tid: int, table: SlotTable) -> None:
        """Table ``tid`` changed: tell the index whether it is whole now, and at what length."""
        index = self.index
        if index is None:
            return
        new_len = table.whole_key()
        if new_len != table.whole_len:
            index.set_whole(tid, self.index_bit, table.whole_len, new_len)
            table.whole_len = new_len

    def slot_of(self, key: int) -> tuple[int, int]:
        """(table id, slot index) of a trace-named key (key >= 0); one-to-one."""
        return key_slot(key, self.block_size)

    def get_one_block(self, key: int) -> int | None:
        """The first cached copy of ``key``, or None."""
        if key < 0:
            return self.unique.get(key)
        tid, i = self.slot_of(key)
        table = self.tables.get(tid)
        if table is None or i >= len(table.blocks):
            return None
        b = table.blocks[i]
        return b if b else None

    def num_keys(self) -> int:
        return sum(t.num_filled for t in self.tables.values()) + len(self.unique)

    def items(self) -> list[tuple[int, int]]:
        """(key, first copy) of every cached key (diagnostics and tests; O(map))."""
        bs = self.block_size
        out = list(self.unique.items())
        for tid, table in self.tables.items():
            g = tid // bs
            rem = tid - g * bs
            blocks = table.blocks
            for i in range(len(blocks)):
                if blocks[i]:
                    out.append((g * ID_STRIDE + i * bs + rem, blocks[i]))
        return out

    def table_for(self, tid: int, length: int) -> SlotTable:
        """The table ``tid``, created or grown (empty slots) to at least ``length`` slots."""
        table = self.tables.get(tid)
        if table is None:
            table = SlotTable(length)
            self.tables[tid] = table
        elif len(table.blocks) < length:
            table.grow(length)
        return table

    # -- registration --------------------------------------------------------------------------------
    def insert(self, key: int, b: int) -> bool:
        """Map ``key`` to ``b`` (referenced once, by its owner) unless it is mapped already (then
        False: ``b`` is a further copy)."""
        if key < 0:
            unique = self.unique
            if key in unique:
                return False
            unique[key] = b
            return True
        tid, i = self.slot_of(key)
        table = self.table_for(tid, i + 1)
        if table.blocks[i]:
            self._reindex(tid, table)  # table_for may have grown it
            return False
        table.blocks[i] = b
        table.num_filled += 1
        table.ref_counts[i] = 1
        self._reindex(tid, table)
        return True

    def insert_all(self, blocks: list[int], runs: list[range]) -> None:
        """Map the keys of ``runs`` (BlockKeys.key_runs, prefix order) to ``blocks``; keys mapped
        already get a further copy."""
        bs = self.block_size
        j = 0
        for rng in runs:
            m = len(rng)
            if m >= 4 and rng.step == bs and rng.start >= 0:  # one trace block's run: one table
                tid, i = self.slot_of(rng.start)
                table = self.table_for(tid, i + m)
                if count_equal(table.blocks, i, i + m, 0) == m:  # all empty: one slice assignment
                    table.blocks[i:i + m] = blocks[j:j + m]
                    table.num_filled += m
                    table.ref_counts[i:i + m] = [1] * m  # their owner's references
                    self._reindex(tid, table)
                    j += m
                    continue
            for key in rng:
                b = blocks[j]
                if not self.insert(key, b):  # computed twice (or twice in one call): a further copy
                    self.further_copies.setdefault(key, []).append(b)
                j += 1

    def replace_first_copy(self, key: int, b: int, ref_count: int, free_run_id: int) -> None:
        """The first copy of a mapped ``key`` (just evicted, so unreferenced) is now the further copy
        ``b``: ``ref_count`` references, or (0) free in run ``free_run_id``."""
        if key < 0:
            self.unique[key] = b
        else:
            tid, i = self.slot_of(key)
            table = self.tables[tid]
            table.blocks[i] = b
            table.ref_counts[i] = ref_count
            table.free_run_ids[i] = free_run_id

    # -- eviction ------------------------------------------------------------------------------------
    def pop(self, key: int) -> None:
        """Unmap a mapped ``key`` (its first copy is free: no references to clear)."""
        if key < 0:
            del self.unique[key]
            return
        tid, i = self.slot_of(key)
        table = self.tables[tid]
        table.blocks[i] = 0
        table.free_run_ids[i] = 0
        self._slots_emptied(tid, table, 1)

    def _slots_emptied(self, tid: int, table: SlotTable, m: int) -> None:
        """``m`` slots of ``table`` were just emptied: drop the table once it is empty, else its
        trailing empty slots."""
        left = table.num_filled - m
        if left == 0:
            del self.tables[tid]
            if table.whole_len:
                index = self.index
                assert index is not None
                index.set_whole(tid, self.index_bit, table.whole_len, 0)
            return
        table.num_filled = left
        table.trim()
        self._reindex(tid, table)

    def _same_table_run_end(self, keys: list[int], j: int, step: int) -> int:
        """End of the run of ``keys`` from ``j`` that steps by ``step`` (+-block size) inside one
        table: consecutive slots, so one slice assignment maps or unmaps them all. A unique key
        (negative, kept in a dict) is a run of its own."""
        key = keys[j]
        if key < 0:
            return j + 1
        off = key - (key // ID_STRIDE) * ID_STRIDE
        # slots left in this table in the run's direction (offsets stay in [0, ID_STRIDE))
        room = (off // -step if step < 0 else (ID_STRIDE - 1 - off) // step) + 1
        end = len(keys)
        if end > j + room:
            end = j + room
        k = j + 1
        while k < end and keys[k] == key + step:
            key += step
            k += 1
        return k

    def pop_all(self, keys: list[int]) -> None:
        """Unmap mapped ``keys`` whose first copies are free (eviction order: a trace block's blocks
        usually last first)."""
        step = -self.block_size
        j = 0
        while j < len(keys):
            k = self._same_table_run_end(keys, j, step)
            m = k - j
            if m < 4:
                for key in keys[j:k]:
                    self.pop(key)
            else:
                tid, top = self.slot_of(keys[j])
                table = self.tables[tid]
                zeros = [0] * m
                table.blocks[top - m + 1:top + 1] = zeros
                table.free_run_ids[top - m + 1:top + 1] = zeros
                self._slots_emptied(tid, table, m)
            j = k

    # -- lookup --------------------------------------------------------------------------------------
    def cached_prefix_len(self, runs: list[range]) -> int:
        """``len(cached_prefix(runs))`` without building the list (routers only count the hits)."""
        return self._walk_prefix(runs, None)

    def cached_prefix(self, runs: list[range]) -> list[int]:
        """First cached copies of the leading mapped keys of ``runs`` (BlockKeys.key_runs: each run
        in one trace block, stepping by the block size, or unique keys), up to the first unmapped one.
        One table slice per trace block."""
        out: list[int] = []
        self._walk_prefix(runs, out)
        return out

    def _walk_prefix(self, runs: list[range], out: list[int] | None) -> int:
        """How many leading keys of ``runs`` are mapped; their first cached copies are appended to
        ``out`` when it is a list."""
        return self.walk_slots(runs, run_slots(runs, self.block_size), out)

    def walk_slots(self, runs: list[range], slots: list[tuple[int, int, int]], out: list[int] | None,
                   first: int = 0) -> int:
        """``_walk_prefix`` with the runs' slots (``run_slots``) computed already: a router asking
        every replica computes them once for all of them. From ``slots[first]`` on (the index has
        found the ones before it whole)."""
        n_hit = 0
        tables = self.tables
        for k in range(first, len(slots)):
            tid, i, n = slots[k]
            if tid < 0:  # keys unique to a request, or unaligned: one by one
                for key in runs[i]:
                    b = self.get_one_block(key)
                    if b is None:
                        return n_hit
                    if out is not None:
                        out.append(b)
                    n_hit += 1
                continue
            table = tables.get(tid)
            if table is None:
                return n_hit
            blocks = table.blocks
            end = i + n
            nb = len(blocks)
            if end <= nb and (table.num_filled == nb or (i and table.num_filled == nb - 1 and not blocks[0])):
                j = end  # every slot filled (slot 0 unread, or filled too): the whole slice
            else:  # up to the first empty slot (one scan: counting the empty ones first cost a second)
                stop = end if end < len(blocks) else len(blocks)
                j = i
                while j < stop and blocks[j]:
                    j += 1
            if out is not None:
                out += blocks[i:j]
            n_hit += j - i
            if j < end:
                return n_hit
        return n_hit


def run_slots(runs: list[range], block_size: int) -> list[tuple[int, int, int]]:
    """Where a prefix walk finds each non-empty run of ``runs`` (BlockKeys.key_runs): (table id, first
    slot, length) for a trace block's run, or (-1, its index in ``runs``, length) for keys unique to a
    request (or not a trace block's step), which are looked up one by one. The same for every map of
    ``block_size`` (``key_slot``)."""
    slots: list[tuple[int, int, int]] = []
    for r, rng in enumerate(runs):
        n = len(rng)
        if n == 0:
            continue
        k0 = rng.start
        if k0 < 0 or rng.step != block_size:
            slots.append((-1, r, n))
            continue
        tid, i = key_slot(k0, block_size)
        slots.append((tid, i, n))
    return slots


def cached_prefix_lens_of(maps: list[BlockHashToBlockMap], runs: list[range]) -> list[int]:
    """``cached_prefix_len(runs)`` of each map. A router asks every replica at every arrival, so the
    runs' slots are computed once for all the maps that share the first one's block size, and the
    maps of one fleet index are walked together while their tables are whole (WholeTableIndex)."""
    if not maps:
        return []
    bs = maps[0].block_size
    slots = run_slots(runs, bs)
    index = maps[0].index
    if index is not None and all(m.index is index for m in maps):  # one fleet's maps: one block size
        mask = 0
        for m in maps:
            mask |= m.index_bit
        walk = index.walk(slots, mask)
        out: list[int] = []
        for m in maps:
            bit = m.index_bit
            if walk.mask & bit:  # whole through slot k - 1; walks on from k (nothing left, or unique keys)
                k = walk.k
                out.append(walk.hits + m.walk_slots(runs, slots, None, k) if k < len(slots) else walk.hits)
                continue
            for left, at, before in walk.drops:
                if left & bit:
                    out.append(before + m.walk_slots(runs, slots, None, at))
                    break
        return out
    return [m.walk_slots(runs, slots, None) if m.block_size == bs else m.cached_prefix_len(runs) for m in maps]
