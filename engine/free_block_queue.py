"""The free-block queue: vLLM V1's FreeKVCacheBlockQueue (v1/core/kv_cache_utils.py), run-length encoded.

vLLM links every free block (ref_cnt == 0, cached or not) into one doubly linked list, least
recently used first: allocation pops the head, a prefix-cache hit on a free block unlinks it, and a
freed block joins the tail (or, without a block hash, the head). This queue keeps the same order as
a sequence of runs, one per free call and kind, oldest first, so that a freed prompt costs a few
entries instead of one per block:

- ``AnonymousRun``: free blocks nobody can find again (never full, or full but private: findable
  by nobody, engine/kv_cache_manager.py). They are interchangeable, so the run only counts them,
  and says whether taking one counts as an eviction (a private block was cached).
- ``RegisteredRun``: free blocks that are in the prefix-cache map, in eviction order, with their
  keys. A hit takes a block out of the middle of a run without moving anything: the block's entry
  goes stale (the run counts its stale entries, ``num_stale``) and allocation skips it. A run whose
  every remaining entry is stale leaves the queue at once.

Which run a free registered block is in is recorded beside it: in its table slot for the first
cached copy of a trace-named key (engine/block_hash_map.py, ``SlotTable.free_run_ids``), else in
``run_id_of_block`` here (``RegisteredRun.num_off_table`` counts how many of a run's blocks went
there, so allocation need not look when none did). engine/block_pool.py composes the two.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import repeat
from typing import final


@final
class AnonymousRun:
    """``count`` interchangeable free blocks that no key maps to."""

    def __init__(self, count: int, counts_as_eviction: bool) -> None:
        self.count = count
        # Private blocks were cached (findable by nobody): taking one is an eviction, as in vLLM.
        self.counts_as_eviction = counts_as_eviction


@final
class RegisteredRun:
    """Free registered blocks and their keys, in eviction order; entries before ``head`` are taken.

    Lists of objects (ints as the caller's lists hold them): compiled code would otherwise unbox
    each id and box it again, a new int object per dict operation."""

    def __init__(self, blocks: list[object], keys: list[object], num_off_table: int) -> None:
        self.blocks = blocks
        self.keys = keys
        self.head = 0  # the next entry allocation looks at
        self.num_stale = 0  # entries from head on that a hit took out (allocation skips them)
        self.num_off_table = num_off_table  # how many of the blocks were recorded in run_id_of_block

    def num_live(self) -> int:
        """Free blocks still in this run."""
        return len(self.blocks) - self.head - self.num_stale


@final
class FreeKVCacheBlockQueue:
    """The free blocks in LRU order (allocation end first), as runs keyed by a run id."""

    def __init__(self, num_blocks: int) -> None:
        # run id -> run, oldest first; ids are never reused, so a stale record of one is harmless.
        self.runs: OrderedDict[int, AnonymousRun | RegisteredRun] = OrderedDict({0: AnonymousRun(num_blocks, False)})
        self.next_run_id = 1
        # Free registered blocks outside the table slots -> the id of the run they are in.
        self.run_id_of_block: dict[object, int] = {}

    def append_anonymous(self, count: int, counts_as_eviction: bool) -> None:
        """``count`` anonymous blocks join the tail (merged into the tail run when of the same kind)."""
        runs = self.runs
        if runs:
            run = runs[next(reversed(runs))]
            if isinstance(run, AnonymousRun) and run.counts_as_eviction is counts_as_eviction:
                run.count += count
                return
        runs[self.next_run_id] = AnonymousRun(count, counts_as_eviction)
        self.next_run_id += 1

    def prepend_uncached(self, count: int) -> None:
        """Blocks without a hash join the head (vLLM 0.33): reused before any cached block."""
        runs = self.runs
        if runs:
            run = runs[next(iter(runs))]
            if isinstance(run, AnonymousRun) and not run.counts_as_eviction:
                run.count += count
                return
        rid = self.next_run_id
        self.next_run_id += 1
        runs[rid] = AnonymousRun(count, False)
        runs.move_to_end(rid, last=False)

    def append_registered(self, rid: int, blocks: list[object], keys: list[object],
                          off_table: list[object]) -> None:
        """Registered ``blocks`` (under ``keys``) join the tail as run ``rid``, which must be
        ``next_run_id`` (the caller wrote it into the blocks' table slots already); ``off_table``
        are those of them recorded here rather than in a slot."""
        self.next_run_id = rid + 1
        self.runs[rid] = RegisteredRun(blocks, keys, len(off_table))
        if off_table:
            self.run_id_of_block.update(zip(off_table, repeat(rid)))

    def remove_from_run(self, rid: int, n: int) -> None:
        """A hit took ``n`` of run ``rid``'s free blocks out (vLLM: remove): ``n`` more stale
        entries, and a run with no free block left leaves the queue now (allocation would otherwise
        walk all its entries to skip them; nothing refers to it any more)."""
        run = self.runs[rid]
        assert isinstance(run, RegisteredRun)
        stale = run.num_stale + n
        if stale == len(run.blocks) - run.head:
            del self.runs[rid]
        else:
            run.num_stale = stale

    def remove_off_table(self, b: object) -> bool:
        """Take the free block ``b`` (recorded in run_id_of_block) out of the queue after a hit;
        False when it is not free there."""
        rid = self.run_id_of_block.pop(b, 0)
        if rid:
            self.remove_from_run(rid, 1)
            return True
        return False
