"""The LRU order of a CPU store as a doubly linked list of key runs, indexed by key group.

Keys come as runs (``range`` objects from ``BlockKeys.key_runs``): one run per trace block, every
run inside one ``key_group``, stepping by the block size. ``RunList`` keeps a least-recent-first
list of ``Segment``s (runs of keys adjacent in LRU order and written by one batch) and, per group,
its segments sorted by their lowest key, so moving a trace block's keys to the tail, cutting them
out or finding them costs a few operations per trace block rather than per key. The store that
gives the list its meaning (what is stored, evicted, pinned, ready) is engine/cpu_store.py.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from itertools import repeat
from operator import attrgetter

from replay.engine.block_keys import key_group


def runs_len(runs: list[range]) -> int:
    # A plain loop: compiled, it is a native loop; sum(map(len, ...)) goes through generic calls.
    n = 0
    for run in runs:
        n += len(run)
    return n


def runs_slice(runs: list[range], i0: int, i1: int) -> list[range]:
    """Positions i0..i1-1 of the concatenated runs, still as runs."""
    out: list[range] = []
    if i1 <= i0:
        return out
    pos = 0
    for run in runs:
        n = len(run)
        if pos + n > i0 and pos < i1:
            out.append(run[max(0, i0 - pos):i1 - pos])
        pos += n
        if pos >= i1:
            break
    return out


class Segment:
    """A run of keys adjacent in LRU order, least recent first, all written by one batch.

    ``rng`` steps by +S or -S (S = the store's block size), so its keys fill the interval
    [lo, hi] of its group at stride S; the segments of one group never overlap.
    """

    __slots__ = ("prev", "next", "rng", "lo", "hi", "batch", "group")

    def __init__(self, rng: range, batch: int, group: int) -> None:
        self.prev: Segment = self
        self.next: Segment = self
        self.batch = batch
        self.group = group
        self.rng = rng
        a, b = rng[0], rng[-1]
        self.lo, self.hi = (a, b) if a <= b else (b, a)

    def set(self, rng: range) -> None:
        self.rng = rng
        a, b = rng[0], rng[-1]
        self.lo, self.hi = (a, b) if a <= b else (b, a)

    def index(self, key: int) -> int:
        return (key - self.rng.start) // self.rng.step


_lo = attrgetter("lo")


class RunList:
    """The LRU list of key runs (``head.next`` the least recent) and its index by group."""

    def __init__(self, block_size: int) -> None:
        self.stride = block_size  # keys one block apart in a group differ by exactly this
        self.head = Segment(range(0, 1), -1, 0)  # sentinel: head.next is the least recent run
        self.groups: dict[int, list[Segment]] = {}

    def num_segments(self) -> int:
        return sum(map(len, self.groups.values()))

    def lru_items(self) -> list[tuple[int, int]]:
        """(key, batch) from the least recent key to the most recent."""
        out: list[tuple[int, int]] = []
        seg = self.head.next
        while seg is not self.head:
            out.extend(zip(seg.rng, repeat(seg.batch)))
            seg = seg.next
        return out

    def release(self) -> None:
        """Empty the list for good, breaking its reference cycles (every run points at its
        neighbours), so that reference counting frees the runs at once: left to the cyclic garbage
        collector, a tier store of 650,000 runs took 1.6 s to collect."""
        head = self.head
        seg = head.next
        while seg is not head:
            after = seg.next
            seg.prev = head
            seg.next = head
            seg = after
        head.prev = head
        head.next = head
        self.groups = {}

    # -- linked list and group index -----------------------------------------------------------
    def _overlapping(self, group: int, lo: int, hi: int) -> list[Segment]:
        """Segments of ``group`` holding keys in [lo, hi], by ascending ``lo``."""
        lst = self.groups.get(group)
        if not lst:
            return []
        i = bisect_right(lst, hi, key=_lo)
        out: list[Segment] = []
        while i > 0 and lst[i - 1].hi >= lo:
            i -= 1
            out.append(lst[i])
        out.reverse()
        return out

    def _unlink(self, seg: Segment) -> None:
        seg.prev.next = seg.next
        seg.next.prev = seg.prev
        lst = self.groups[seg.group]
        if len(lst) == 1:
            del self.groups[seg.group]
        else:
            del lst[bisect_right(lst, seg.lo, key=_lo) - 1]

    def _link_after(self, seg: Segment, where: Segment) -> None:
        seg.prev = where
        seg.next = where.next
        where.next.prev = seg
        where.next = seg
        lst = self.groups.get(seg.group)
        if lst is None:
            self.groups[seg.group] = [seg]
        else:
            insort(lst, seg, key=_lo)

    def _cut(self, seg: Segment, i0: int, i1: int) -> None:
        """Remove LRU positions i0..i1-1 of ``seg``; what is left keeps its place in the LRU."""
        rng = seg.rng
        before, after = rng[:i0], rng[i1:]
        if before and after:
            seg.set(before)  # shrinking keeps the group's order by lo
            self._link_after(Segment(after, seg.batch, seg.group), seg)
        elif before:
            seg.set(before)
        elif after:
            seg.set(after)
        else:
            self._unlink(seg)

    def _append(self, rng: range, batch: int, group: int) -> None:
        """Put ``rng`` (LRU order) at the tail, extending the tail run when it continues it."""
        tail = self.head.prev
        if tail is not self.head and tail.group == group and tail.batch == batch:
            t = tail.rng
            d = rng[0] - t[-1]
            if (d == self.stride or d == -self.stride) and (len(t) == 1 or t.step == d) and (
                    len(rng) == 1 or rng.step == d):
                tail.set(range(t[0], rng[-1] + d, d))  # contiguous keys: no other run in between
                return
        self._link_after(Segment(rng, batch, group), tail)

    def _move_to_tail(self, lru_rng: range, new_batch: int | None) -> None:
        """Move the held keys of ``lru_rng`` to the tail in its order; with ``new_batch``, add the
        missing ones there too (written by that batch)."""
        group = key_group(lru_rng[0])
        a, b = lru_rng[0], lru_rng[-1]
        lo, hi = (a, b) if a <= b else (b, a)
        lst = self.groups.get(group)
        if lst is not None and len(lst) == 1:
            seg = lst[0]
            if seg.lo == lo and seg.hi == hi:
                # The common case (a trace block held whole, as one run): relink that run at the
                # tail in the new order. The general path below would cut it out and append a new
                # one there; no other run of its group exists to merge with, so the result is the same.
                tail = self.head.prev
                if seg is not tail:
                    seg.prev.next = seg.next
                    seg.next.prev = seg.prev
                    seg.prev = tail
                    seg.next = self.head
                    tail.next = seg
                    self.head.prev = seg
                seg.rng = lru_rng
                return
        segs = self._overlapping(group, lo, hi)
        if not segs:
            if new_batch is not None:
                self._append(lru_rng, new_batch, group)
            return
        pieces: list[tuple[int, int, int]] = []
        for seg in segs:
            plo = seg.lo if seg.lo > lo else lo
            phi = seg.hi if seg.hi < hi else hi
            i0, i1 = seg.index(plo), seg.index(phi)
            if i0 > i1:
                i0, i1 = i1, i0
            pieces.append((plo, phi, seg.batch))
            self._cut(seg, i0, i1 + 1)
        step = lru_rng.step
        if step < 0:
            pieces.reverse()
        pos = a
        for plo, phi, batch in pieces:
            first, last = (plo, phi) if step > 0 else (phi, plo)
            if first != pos and new_batch is not None:
                self._append(range(pos, first, step), new_batch, group)
            self._append(range(first, last + step, step), batch, group)
            pos = last + step
        if new_batch is not None and pos != b + step:
            self._append(range(pos, b + step, step), new_batch, group)
