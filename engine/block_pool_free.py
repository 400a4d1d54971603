"""Freeing blocks: vLLM V1's BlockPool.free_blocks (v1/core/block_pool.py) for engine/block_pool.py.

A freed request's blocks drop one reference each; those reaching zero join the free queue
(engine/free_block_queue.py): blocks without a block hash at its head (vLLM 0.33: reused first),
cached ones at its tail in eviction order (a request's last block first), as one registered run per
call. A trace block's first copies are counted in its table slots (engine/block_hash_map.py), so a
run of them is one slice compare and a list update per block; other blocks are counted by the pool
(``BlockPool.extra_refs``) and recorded off the tables (``run_id_of_block``).
"""

from __future__ import annotations

from typing import cast, final

from replay.engine.block_hash_map import BlockHashToBlockMap, count_equal
from replay.engine.free_block_queue import FreeKVCacheBlockQueue


def free_registered(hash_map: BlockHashToBlockMap, extra_refs: dict[object, int], queue: FreeKVCacheBlockQueue,
                    blocks: list[int], runs: list[range]) -> int:
    """Drop one reference on each of ``blocks``, registered under the keys of ``runs`` (a
    request's key runs in prefix order; the blocks come last key first, so each run is read from
    its end, without building reversed runs); those reaching zero join the tail of ``queue`` as one
    registered run. Returns how many were freed. No key is made for a block that stays in use."""
    # Blocks other holders still reference lose one reference and stay in use; the rest are
    # freed, in order. A table's first copies are counted in its slots: a run inside one table
    # (descending, the eviction order) is one slice compare and a list update per block.
    # (Plain loops over list[object]: compiled, no id is unboxed and boxed again.)
    tables = hash_map.tables
    bs = hash_map.block_size
    batch = FreedBatch(queue.next_run_id)  # the run they join (taken only if any is freed)
    rid = batch.run_id
    freed = batch.blocks
    freed_keys = batch.keys
    blocks_o = cast("list[object]", blocks)
    j = 0
    for rng in reversed(runs):
        m = len(rng)
        if m == 0:
            continue
        top_key = rng.start + (m - 1) * rng.step  # its last key: the first block here
        if top_key < 0 or (m > 1 and rng.step != bs):  # keys unique to the request
            for key in reversed(rng):
                if key >= 0:
                    _release_slot(hash_map, extra_refs, key, blocks_o[j], batch)
                else:
                    _release(extra_refs, blocks_o[j], key, batch)
                j += 1
            continue
        tid, top = hash_map.slot_of(top_key)
        table = tables[tid]
        refs = table.ref_counts
        lo = top - m + 1
        seg = table.blocks[lo:top + 1]
        seg.reverse()
        if seg == blocks[j:j + m]:  # all first copies (the common case)
            ones = count_equal(refs, lo, top + 1, 1)
            if ones == m:  # the last reference on each: all freed, into run rid
                refs[lo:top + 1] = [0] * m
                table.free_run_ids[lo:top + 1] = [rid] * m
                freed.extend(blocks_o[j:j + m])
                freed_keys.extend(reversed(rng))
                j += m
                continue
            if ones == 0:  # all still held by others: counts only
                for s in range(lo, top + 1):
                    refs[s] = refs[s] - 1
                j += m
                continue
        for key in reversed(rng):
            _release_slot(hash_map, extra_refs, key, blocks_o[j], batch)
            j += 1
    if freed:
        queue.append_registered(rid, freed, freed_keys, batch.off_table)
    return len(freed)


def _release_slot(hash_map: BlockHashToBlockMap, extra_refs: dict[object, int], key: int, b: object,
                  batch: FreedBatch) -> None:
    """Drop a reference on ``b``, registered under the trace-named ``key``: counted in the
    key's slot when it is the first copy (freed: the slot takes the batch's run id), else (a
    further copy) by itself."""
    tid, i = hash_map.slot_of(key)
    table = hash_map.tables[tid]
    if cast("list[object]", table.blocks)[i] == b:
        refs = table.ref_counts
        c = refs[i] - 1
        refs[i] = c
        if c == 0:
            table.free_run_ids[i] = batch.run_id
            batch.blocks.append(b)
            batch.keys.append(key)
    else:
        _release(extra_refs, b, key, batch)


def _release(extra_refs: dict[object, int], b: object, key: object, batch: FreedBatch) -> None:
    """Drop a reference on a block outside the slots; at zero it joins the batch, recorded off
    the tables (FreeKVCacheBlockQueue.run_id_of_block)."""
    extra = extra_refs
    c = extra.get(b, 0)
    if c == 0:
        batch.blocks.append(b)
        batch.keys.append(key)
        batch.off_table.append(b)
    elif c == 1:
        del extra[b]
    else:
        extra[b] = c - 1


@final
class FreedBatch:
    """The blocks one free_blocks call frees, in eviction order: they join the free queue as one
    registered run, ``run_id``."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.blocks: list[object] = []
        self.keys: list[object] = []
        self.off_table: list[object] = []  # those recorded in run_id_of_block (not first copies in a slot)
