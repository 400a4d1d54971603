"""The block pool's debug checks (``replay run --check``): counts, references and keys agree.

O(pool) per call, so never on the hot path; kept out of engine/block_pool.py (compiled) because
only the debug mode runs it. ``BlockPool.check_invariants`` calls it (a reference pool in the tests
has its own), so it names the pool's parts through ``CheckedPool`` rather than importing the pool.
"""

from __future__ import annotations

from typing import Protocol, cast

from replay.engine.block_hash_map import BlockHashToBlockMap
from replay.engine.free_block_queue import AnonymousRun, FreeKVCacheBlockQueue


class PoolInvariantError(Exception):
    """A --check invariant of the pool failed (an engine bug, never bad input)."""


def require_invariant(ok: bool, message: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not ok:
        raise PoolInvariantError(message)


class CheckedPool(Protocol):
    """What the checks read of engine/block_pool.py's BlockPool."""

    num_gpu_blocks: int
    num_free: int
    extra_refs: dict[object, int]
    free_block_queue: FreeKVCacheBlockQueue
    cached_block_hash_to_block: BlockHashToBlockMap

    def is_free_in_run(self, b: int, key: int, rid: int) -> bool: ...

    def cached_items(self) -> list[tuple[int, int]]: ...

    def is_cached(self, key: int) -> bool: ...

    def num_cached_keys(self) -> int: ...


def check_pool_invariants(pool: CheckedPool, in_use_keys: dict[int, int | None], holders: dict[int, int]) -> None:
    """Debug mode: counts, references and keys agree (O(pool), never on the hot path).

    ``in_use_keys`` maps each in-use block to the key its holders know it by (None when it is
    not registered); ``holders`` counts the block tables holding each in-use block.
    """
    usable = pool.num_gpu_blocks - 1
    queue = pool.free_block_queue
    off_table = queue.run_id_of_block
    hash_map = pool.cached_block_hash_to_block
    free = 0
    free_keys: dict[int, int] = {}
    for rid, run in queue.runs.items():
        if isinstance(run, AnonymousRun):
            require_invariant(run.count > 0, f"empty run {rid}")
            free += run.count
            continue
        head = run.head
        blocks = cast("list[int]", run.blocks)[head:]
        keys = cast("list[int]", run.keys)[head:]
        live = [(b, k) for b, k in zip(blocks, keys) if pool.is_free_in_run(b, k, rid)]
        require_invariant(len(live) == run.num_live(), f"run {rid}: stale count {run.num_stale} is off")
        require_invariant(sum(1 for b, _ in live if off_table.get(b) == rid) <= run.num_off_table,
                          f"run {rid}: more blocks recorded off the tables than its count {run.num_off_table}")
        free += len(live)
        free_keys.update(live)
    in_slots = sum(len(t.free_run_ids) - t.free_run_ids.count(0) for t in hash_map.tables.values())
    require_invariant(len(free_keys) == len(off_table) + in_slots,
                      "run_id_of_block, the slots' run ids and the runs disagree")
    require_invariant(free == pool.num_free, f"{free} free blocks counted, {pool.num_free} recorded")
    require_invariant(pool.num_free + len(holders) == usable, (
                      f"{pool.num_free} free + {len(holders)} in use != {usable} usable blocks"))
    slot_refs: dict[int, int] = {}  # a table's block -> its slot's reference count
    for tid, table in hash_map.tables.items():
        tblocks = table.blocks
        refs = table.ref_counts
        run_ids = table.free_run_ids
        require_invariant(len(refs) == len(tblocks) == len(run_ids), f"table {tid}: {len(refs)} counts and "
                          f"{len(run_ids)} run ids for {len(tblocks)} slots")
        require_invariant(table.num_filled == len(tblocks) - tblocks.count(0),
                          f"table {tid}: {table.num_filled} slots counted as filled")
        for i in range(len(tblocks)):
            b = tblocks[i]
            if b:
                require_invariant((refs[i] == 0) == (run_ids[i] != 0), f"block {b}: count {refs[i]} but run id "
                                  f"{run_ids[i]}")
                require_invariant(b not in off_table, f"block {b}: in a slot and in run_id_of_block")
                slot_refs[b] = refs[i]
            else:
                require_invariant(refs[i] == 0 and run_ids[i] == 0, f"table {tid}: an empty slot counts {refs[i]} "
                                  f"references, run id {run_ids[i]}")
    index = hash_map.index
    if index is not None:  # the fleet's index of whole tables counts this map's exactly
        bit = hash_map.index_bit
        for tid, table in hash_map.tables.items():
            require_invariant(table.whole_len == table.whole_key(), f"table {tid}: indexed with whole key "
                              f"{table.whole_len}, has {table.whole_key()}")
        for tid, by_len in index.whole.items():
            for length, members in by_len.items():
                if members & bit:
                    table = hash_map.tables.get(tid)
                    require_invariant(table is not None and table.whole_len == length,
                                      f"table {tid}: the fleet index counts it with whole key {length}")
        for tid, table in hash_map.tables.items():
            if table.whole_len:
                require_invariant(index.whole.get(tid, {}).get(table.whole_len, 0) & bit != 0,
                                  f"table {tid}: whole, missing from the fleet index")
    for b, held in holders.items():
        require_invariant(b not in off_table and b not in free_keys, f"block {b} is held and free")
        ref_cnt = slot_refs[b] if b in slot_refs else 1 + pool.extra_refs.get(b, 0)
        require_invariant(held == ref_cnt, f"block {b}: held {held} times, ref_cnt {ref_cnt}")
    for extra_b in pool.extra_refs:
        require_invariant(extra_b in holders, f"block {extra_b}: extra refs on a block nobody holds")
        require_invariant(extra_b not in slot_refs, f"block {extra_b}: counted in a table and outside it")

    def key_of(b: int) -> int | None:
        return free_keys[b] if b in free_keys else in_use_keys.get(b)

    for key, b in pool.cached_items():
        require_invariant(key_of(b) == key, f"cached key of block {b} mismatches")
    for key, copies in hash_map.further_copies.items():
        require_invariant(pool.is_cached(key), "duplicate copy without a primary")
        for b in copies:
            require_invariant(key_of(b) == key, f"block {b}: duplicate copy under the wrong key")
    n_keys = pool.num_cached_keys() + sum(len(c) for c in hash_map.further_copies.values())
    n_keyed = len(free_keys) + sum(1 for b, k in in_use_keys.items() if k is not None)
    require_invariant(n_keys == n_keyed, f"{n_keys} cached copies but {n_keyed} keyed blocks")
