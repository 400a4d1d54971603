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


def key_interval(first: int, step: int, n: int) -> tuple[int, int]:
    """(lowest, highest) of the ``n`` keys ``first``, ``first + step``, ..."""
    last = first + (n - 1) * step
    return (first, last) if step > 0 else (last, first)


class Segment:
    """A run of keys adjacent in LRU order, least recent first, all written by one batch.

    Its ``n`` keys are ``first``, ``first + step``, ... with ``step`` +S or -S (S = the store's block
    size; a one-key segment keeps the step it came with), so they fill the interval [lo, hi] of its
    group at stride S; the segments of one group never overlap. Plain ints rather than a range:
    compiled, reading a range's items or slicing one is a generic Python call (tens to hundreds of
    ns) where an int field is a load; ranges are built only for the keys an eviction hands on.
    """

    __slots__ = ("prev", "next", "first", "step", "n", "lo", "hi", "batch", "group")

    def __init__(self, first: int, step: int, n: int, batch: int, group: int) -> None:
        self.prev: Segment = self
        self.next: Segment = self
        self.batch = batch
        self.group = group
        self.step = step
        self.first = first
        self.n = n
        self.lo, self.hi = key_interval(first, step, n)

    def set(self, first: int, n: int) -> None:
        """Keep ``n`` keys from ``first`` (same step)."""
        self.first = first
        self.n = n
        self.lo, self.hi = key_interval(first, self.step, n)

    def keys(self, i0: int, i1: int) -> range:
        """LRU positions i0..i1-1 as a range (what an eviction hands to the tier below)."""
        s = self.step
        return range(self.first + i0 * s, self.first + i1 * s, s)

    def index(self, key: int) -> int:
        return (key - self.first) // self.step


_lo = attrgetter("lo")


class RunList:
    """The LRU list of key runs (``head.next`` the least recent) and its index by group."""

    def __init__(self, block_size: int) -> None:
        self.stride = block_size  # keys one block apart in a group differ by exactly this
        self.head = Segment(0, 1, 1, -1, 0)  # sentinel: head.next is the least recent run
        self.groups: dict[int, list[Segment]] = {}

    def num_segments(self) -> int:
        return sum(map(len, self.groups.values()))

    def lru_items(self) -> list[tuple[int, int]]:
        """(key, batch) from the least recent key to the most recent."""
        out: list[tuple[int, int]] = []
        seg = self.head.next
        while seg is not self.head:
            out.extend(zip(seg.keys(0, seg.n), repeat(seg.batch)))
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
        n = seg.n
        if i0 > 0 and i1 < n:
            after = Segment(seg.first + i1 * seg.step, seg.step, n - i1, seg.batch, seg.group)
            seg.set(seg.first, i0)  # shrinking keeps the group's order by lo
            self._link_after(after, seg)
        elif i0 > 0:
            seg.set(seg.first, i0)
        elif i1 < n:
            seg.set(seg.first + i1 * seg.step, n - i1)
        else:
            self._unlink(seg)

    def _append_run(self, run: range, batch: int) -> None:
        """Put the keys of ``run`` (prefix order) at the tail last key first (see ``_append``)."""
        n = len(run)
        step = run.step
        a = run.start
        self._append(a + (n - 1) * step, -step, n, batch, key_group(a))

    def _move_run_to_tail(self, run: range, new_batch: int | None) -> None:
        """``_move_to_tail`` of the keys of ``run`` (prefix order), last key first."""
        n = len(run)
        step = run.step
        self._move_to_tail(run.start + (n - 1) * step, -step, n, new_batch)

    def _append(self, first: int, step: int, n: int, batch: int, group: int) -> None:
        """Put the ``n`` keys ``first``, ``first + step``, ... (LRU order) at the tail, extending the
        tail run when they continue it."""
        tail = self.head.prev
        if tail is not self.head and tail.group == group and tail.batch == batch:
            d = first - (tail.first + (tail.n - 1) * tail.step)
            if (d == self.stride or d == -self.stride) and (tail.n == 1 or tail.step == d) and (
                    n == 1 or step == d):
                tail.step = d  # contiguous keys: no other run in between
                tail.set(tail.first, tail.n + n)
                return
        self._link_after(Segment(first, step, n, batch, group), tail)

    def _move_to_tail(self, first: int, step: int, n: int, new_batch: int | None) -> None:
        """Move the held keys among the ``n`` keys ``first``, ``first + step``, ... to the tail in
        that order; with ``new_batch``, add the missing ones there too (written by that batch)."""
        group = key_group(first)
        lo, hi = key_interval(first, step, n)
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
                seg.step = step
                seg.first = first
                return
        segs = self._overlapping(group, lo, hi)
        if not segs:
            if new_batch is not None:
                self._append(first, step, n, new_batch, group)
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
        if step < 0:
            pieces.reverse()
        pos = first
        for plo, phi, batch in pieces:
            p0, p1 = (plo, phi) if step > 0 else (phi, plo)
            if p0 != pos and new_batch is not None:
                self._append(pos, step, (p0 - pos) // step, new_batch, group)
            self._append(p0, step, (p1 - p0) // step + 1, batch, group)
            pos = p1 + step
        end = first + n * step  # one step past the last key
        if new_batch is not None and pos != end:
            self._append(pos, step, (end - pos) // step, new_batch, group)
