"""A fleet's index of its replicas' whole prefix-cache tables: one walk of a prompt for every replica.

A KV-aware router asks every replica, at every arrival, how many leading blocks of the prompt it
holds. The index counts, per trace block, which maps (engine/block_hash_map.py) hold its table whole,
so one walk of the prompt's slots answers for all of them up to where each drops out; only there is a
map's own table read (``block_hash_map.cached_prefix_lens_of``). The maps keep their bits current as
their tables fill and empty.
"""

from __future__ import annotations

from typing import final


@final
class SharedWalk:
    """What one walk of a prompt's slots over the index found. ``mask``: the members whole through
    slot ``k`` - 1, ``hits`` blocks; ``drops``: (members that left at slot k, k, hits before k)."""

    def __init__(self, mask: int, k: int, hits: int, drops: list[tuple[int, int, int]]) -> None:
        self.mask = mask
        self.k = k
        self.hits = hits
        self.drops = drops


@final
class WholeTableIndex:
    """Which maps of a fleet hold each trace block's table whole (every slot filled, or every slot
    but slot 0: SlotTable.whole_key), by whole key: ``whole[tid][key]`` is a bitmask of maps (one
    bit each). A router asking every replica how
    much of a prompt it holds walks the prompt once for all of them (``walk``): a map whose
    tables are whole through a run passes it with the others, and only where it drops out (usually
    at one run) is its own table read. Dynamo's router keeps one radix tree over every worker's
    blocks for the same reason. Each map keeps its bits current as its tables fill and empty."""

    def __init__(self) -> None:
        self.whole: dict[int, dict[int, int]] = {}
        self.num_maps = 0

    def add_map(self) -> int:
        """A new member's bit."""
        bit = 1 << self.num_maps
        self.num_maps += 1
        return bit

    def set_whole(self, tid: int, bit: int, old_len: int, new_len: int) -> None:
        """The member ``bit``'s table ``tid`` had whole key ``old_len`` and has ``new_len`` (0: not
        whole, or gone)."""
        whole = self.whole
        by_len = whole.get(tid)
        if old_len:
            assert by_len is not None
            left = by_len[old_len] & ~bit
            if left:
                by_len[old_len] = left
            else:
                del by_len[old_len]
                if not by_len:
                    del whole[tid]
                    by_len = None
        if new_len:
            if by_len is None:
                by_len = {}
                whole[tid] = by_len
            by_len[new_len] = by_len.get(new_len, 0) | bit

    def walk(self, slots: list[tuple[int, int, int]], mask: int) -> SharedWalk:
        """Walk ``slots`` (block_hash_map.run_slots) for the members in ``mask`` while their tables
        are whole; stops at the first slot of keys unique to a request or when no member is left."""
        drops: list[tuple[int, int, int]] = []  # (members leaving at slot k, k, hits before k)
        hits = 0
        whole = self.whole
        k = 0
        for tid, i, n in slots:
            if tid < 0:
                break  # keys unique to a request: each member walks them itself
            keep = 0
            by_len = whole.get(tid)
            if by_len is not None:
                end = 2 * (i + n)
                for key, members in by_len.items():  # length >= i + n, and slot 0 filled if read
                    if key >= end and (i or not key & 1):
                        keep |= members
            keep &= mask
            if keep != mask:
                drops.append((mask & ~keep, k, hits))
                mask = keep
                if not mask:
                    break
            hits += n
            k += 1
        return SharedWalk(mask, k, hits, drops)
