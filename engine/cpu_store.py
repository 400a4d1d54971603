"""The G2 tier's CPU block store: vLLM's LRUOffloadingManager (v1/kv_offload/lru_manager.py).

Semantics (identical in ``RunLRUStore`` here and the per-key ``KeyLRUStore`` of
engine/key_lru_store.py):
- ``store(runs, batch, ...)``: vLLM's prepare_store + touch. Keys already held are not stored again.
  If the new keys do not fit, the least recently used keys are evicted, never one still being
  written (its batch not complete), pinned by a load in flight, or named by this call; if there are
  not enough such keys nothing happens (vLLM's prepare_store returns None). Returns the number of
  new keys and of evicted keys (None when nothing was stored).
  Then every key of the call ends at the LRU tail in reverse prefix order, so the prefix head is
  the most recent (vLLM touches the request's keys after preparing the store).
- ``touch(runs)``: the held keys among ``runs`` move to the LRU tail in reverse prefix order.
- ``count_ready(runs, start, ready_below)``: consecutive held, completely written keys from
  position ``start``.

Keys come as runs (``range`` objects from ``BlockKeys.key_runs``): one run per trace block, every
run inside one ``key_group``. ``RunLRUStore`` keeps the LRU as a linked list of such runs, so a
store of a prefill chunk, its later eviction and a lookup cost a few operations per trace block
rather than per offload block (a Mooncake trace block of 512 tokens is 32 blocks of 16): the
reference workload's 2 M-block pool holds about 65,000 runs. Generated tokens are stored one block
per step, so on decode-heavy traffic runs are shorter, at worst one block each, where a run (a
Python object in a linked list) costs more than a per-key OrderedDict entry.
``KeyLRUStore`` (engine/key_lru_store.py) is the plain per-key version: the reference the run store
is tested against.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Final

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


class _Seg:
    """A run of keys adjacent in LRU order, least recent first, all written by one batch.

    ``rng`` steps by +S or -S (S = the store's block size), so its keys fill the interval
    [lo, hi] of its group at stride S; the segments of one group never overlap.
    """

    __slots__ = ("prev", "next", "rng", "lo", "hi", "batch", "group")

    def __init__(self, rng: range, batch: int, group: int) -> None:
        self.prev: _Seg = self
        self.next: _Seg = self
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
# _evict_front's outcomes
_EVICTED: Final = 0
_SHORT: Final = 1
_BLOCKED: Final = 2
_first_key = itemgetter(0)


class RunLRUStore:
    """The LRU as a doubly linked list of key runs, indexed by group (sorted by ``lo``)."""

    def __init__(self, block_size: int) -> None:
        self.stride = block_size  # keys one block apart in a group differ by exactly this
        self.head = _Seg(range(0, 1), -1, 0)  # sentinel: head.next is the least recent run
        self.groups: dict[int, list[_Seg]] = {}
        self.pins: dict[int, list[tuple[int, int]]] = {}  # group -> key intervals pinned by loads in flight
        self.size = 0
        # When a list: the key runs evictions remove are appended to it (a tier below that stores
        # on evictions takes them, engine/kv_tiers.py); None (G2 alone): nothing is collected.
        self.evicted: list[range] | None = None

    def __len__(self) -> int:
        return self.size

    def num_segments(self) -> int:
        return sum(map(len, self.groups.values()))

    def lru_items(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        seg = self.head.next
        while seg is not self.head:
            out.extend(zip(seg.rng, repeat(seg.batch)))
            seg = seg.next
        return out

    def release(self) -> None:
        """Empty the store for good, breaking its list's reference cycles (every run points at its
        neighbours), so that reference counting frees the runs at once when the engine is dropped:
        left to the cyclic garbage collector, a tier store of 650,000 runs took 1.6 s to collect.
        Called once a replay has written its outputs (engine/run.py)."""
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
        self.pins = {}
        self.size = 0

    # -- linked list and group index -----------------------------------------------------------
    def _overlapping(self, group: int, lo: int, hi: int) -> list[_Seg]:
        """Segments of ``group`` holding keys in [lo, hi], by ascending ``lo``."""
        lst = self.groups.get(group)
        if not lst:
            return []
        i = bisect_right(lst, hi, key=_lo)
        out: list[_Seg] = []
        while i > 0 and lst[i - 1].hi >= lo:
            i -= 1
            out.append(lst[i])
        out.reverse()
        return out

    def _unlink(self, seg: _Seg) -> None:
        seg.prev.next = seg.next
        seg.next.prev = seg.prev
        lst = self.groups[seg.group]
        if len(lst) == 1:
            del self.groups[seg.group]
        else:
            del lst[bisect_right(lst, seg.lo, key=_lo) - 1]

    def _link_after(self, seg: _Seg, where: _Seg) -> None:
        seg.prev = where
        seg.next = where.next
        where.next.prev = seg
        where.next = seg
        lst = self.groups.get(seg.group)
        if lst is None:
            self.groups[seg.group] = [seg]
        else:
            insort(lst, seg, key=_lo)

    def _cut(self, seg: _Seg, i0: int, i1: int) -> None:
        """Remove LRU positions i0..i1-1 of ``seg``; what is left keeps its place in the LRU."""
        rng = seg.rng
        before, after = rng[:i0], rng[i1:]
        if before and after:
            seg.set(before)  # shrinking keeps the group's order by lo
            self._link_after(_Seg(after, seg.batch, seg.group), seg)
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
        self._link_after(_Seg(rng, batch, group), tail)

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

    # -- operations ----------------------------------------------------------------------------
    def _held(self, lst: list[_Seg], run: range) -> int:
        """How many keys of ``run`` the runs of its group (``lst``) hold."""
        a, b = run[0], run[-1]
        lo, hi = (a, b) if a <= b else (b, a)
        s = self.stride
        if len(lst) == 1:  # the common case: no bisection, no list
            seg = lst[0]
            top = seg.hi if seg.hi < hi else hi
            bottom = seg.lo if seg.lo > lo else lo
            return (top - bottom) // s + 1 if top >= bottom else 0
        n = 0
        for seg in self._overlapping(key_group(a), lo, hi):
            n += ((seg.hi if seg.hi < hi else hi) - (seg.lo if seg.lo > lo else lo)) // s + 1
        return n

    def num_held(self, runs: list[range]) -> int:
        """How many keys of ``runs`` the store holds (written or not)."""
        groups = self.groups
        n = 0
        if groups:
            for run in runs:
                lst = groups.get(key_group(run[0]))
                if lst is not None:
                    n += self._held(lst, run)
        return n

    @staticmethod
    def _interval(r: range) -> tuple[int, int]:
        a, b = r[0], r[-1]
        return (a, b) if a <= b else (b, a)

    def _protected(self, protected: list[range]) -> dict[int, list[tuple[int, int]]]:
        """This call's key intervals per group (eviction must skip them)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for r in protected:
            out.setdefault(key_group(r[0]), []).append(self._interval(r))
        return out

    def _evictable(self, seg: _Seg, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """LRU position ranges of ``seg`` outside the given key intervals, least recent first."""
        n = len(seg.rng)
        cuts: list[tuple[int, int]] = []
        for lo, hi in intervals:
            if lo > seg.hi or hi < seg.lo:
                continue
            i0, i1 = seg.index(max(lo, seg.lo)), seg.index(min(hi, seg.hi))
            cuts.append((min(i0, i1), max(i0, i1) + 1))
        cuts.sort()
        out: list[tuple[int, int]] = []
        pos = 0
        for c0, c1 in cuts:
            if c0 > pos:
                out.append((pos, c0))
            pos = max(pos, c1)
        if pos < n:
            out.append((pos, n))
        return out

    def _plan_evictions(self, needed: int, ready_below: int,
                        protected: list[range] | None) -> list[tuple[_Seg, list[tuple[int, int]]]] | None:
        pins = self.pins
        mine = self._protected(protected) if protected else None
        plan: list[tuple[_Seg, list[tuple[int, int]]]] = []
        seg = self.head.next
        while seg is not self.head:
            if seg.batch < ready_below:
                ex = pins.get(seg.group) if pins else None
                if mine:
                    own = mine.get(seg.group)
                    if own:
                        ex = ex + own if ex else own
                spans = self._evictable(seg, ex) if ex else [(0, len(seg.rng))]
                chosen: list[tuple[int, int]] = []
                for s0, s1 in spans:
                    take = min(s1 - s0, needed)
                    chosen.append((s0, s0 + take))
                    needed -= take
                    if not needed:
                        break
                if chosen:
                    plan.append((seg, chosen))
                if not needed:
                    return plan
            seg = seg.next
        return None

    def _evict_front(self, needed: int, ready_below: int, avoid: set[int] | None = None) -> int:
        """Evict the ``needed`` least recent keys of completely written batches, when none of them
        is in a group that is pinned or in ``avoid`` (the call's own groups): then they are what
        _plan_evictions would choose, found without planning. Whole runs leave, the last one may be
        cut. Returns _EVICTED, or (nothing changed) _SHORT when there are fewer such keys, _BLOCKED
        when one of the first ``needed`` is in such a group (the caller plans around it)."""
        head = self.head
        pins = self.pins
        seg = head.next
        avail = 0
        while avail < needed:
            if seg is head:
                return _SHORT
            if seg.batch < ready_below:
                if (pins and seg.group in pins) or (avoid is not None and seg.group in avoid):
                    return _BLOCKED
                avail += len(seg.rng)
            seg = seg.next
        seg = head.next
        out = self.evicted
        while needed:
            nxt = seg.next
            if seg.batch < ready_below:
                n = len(seg.rng)
                if n <= needed:
                    if out is not None:
                        out.append(seg.rng)
                    self._unlink(seg)
                    needed -= n
                else:
                    if out is not None:
                        out.append(seg.rng[:needed])
                    self._cut(seg, 0, needed)
                    needed = 0
            seg = nxt
        return _EVICTED

    def store(self, runs: list[range], batch: int, capacity: int, ready_below: int) -> tuple[int, int | None]:
        groups = self.groups
        held = 0
        if groups:
            for run in runs:
                lst = groups.get(key_group(run[0]))
                if lst is not None:
                    held += self._held(lst, run)
        new = runs_len(runs) - held
        need = new - (capacity - self.size)
        evicted = 0
        if need > 0:
            # Usually nothing to skip at the LRU front but unwritten batches: evict it as it is.
            front = self._evict_front(need, ready_below,
                                      {key_group(run[0]) for run in runs} if held else None)
            if front == _SHORT:
                return new, None
            if front == _BLOCKED:
                plan = self._plan_evictions(need, ready_below, runs if held else None)
                if plan is None:
                    return new, None
                out = self.evicted
                for seg, spans in plan:
                    if out is not None:
                        out.extend([seg.rng[s0:s1] for s0, s1 in spans])
                    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(seg.rng):
                        self._unlink(seg)  # a whole run leaves
                        continue
                    for s0, s1 in reversed(spans):  # highest first: lower positions stay valid
                        self._cut(seg, s0, s1)
            evicted = need
            self.size -= need
        if held:
            for run in reversed(runs):
                self._move_to_tail(run[::-1], batch)
        else:  # nothing of the call is held: each run goes to the tail as it is
            for run in reversed(runs):
                self._append(run[::-1], batch, key_group(run[0]))
        self.size += new
        return new, evicted

    def touch(self, runs: list[range], groups: list[int] | None = None) -> None:
        """``groups``: the runs' key groups, when the caller keeps them (a lookup repeated every step)."""
        held = self.groups
        if not held:
            return
        if groups is None:
            groups = list(map(key_group, map(_first_key, runs)))
        if held.keys().isdisjoint(groups):
            return
        for run, group in zip(reversed(runs), reversed(groups)):
            if group in held:
                self._move_to_tail(run[::-1], None)

    def count_ready(self, runs: list[range], start: int, ready_below: int) -> int:
        hits = 0
        groups = self.groups
        for run in runs:
            n = len(run)
            if start >= n:
                start -= n
                continue
            if key_group(run[0]) not in groups:
                break
            if start:
                run = run[start:]
                n -= start
                start = 0
            covered = self._ready_prefix(run, ready_below)
            hits += covered
            if covered < n:
                break
        return hits

    def _ready_prefix(self, run: range, ready_below: int) -> int:
        """How many leading keys of ``run`` are held and completely written."""
        a, b = run[0], run[-1]
        step = run.step
        lst = self.groups[key_group(a)]
        if len(lst) == 1:  # the common case: one run holds the group's keys
            seg = lst[0]
            if seg.batch >= ready_below or not seg.lo <= a <= seg.hi:
                return 0
            covered = ((seg.hi if step > 0 else seg.lo) + step - a) // step
            return covered if covered < len(run) else len(run)
        lo, hi = (a, b) if a <= b else (b, a)
        segs = [s for s in self._overlapping(key_group(a), lo, hi) if s.batch < ready_below]
        pos = a
        while segs:
            for seg in segs:
                if seg.lo <= pos <= seg.hi:
                    pos = seg.hi + step if step > 0 else seg.lo + step
                    break
            else:
                break
        covered = (pos - a) // step
        return covered if covered < len(run) else len(run)

    def pin(self, runs: list[range]) -> None:
        for run in runs:
            self.pins.setdefault(key_group(run[0]), []).append(self._interval(run))

    def unpin(self, runs: list[range]) -> None:
        for run in runs:
            group = key_group(run[0])
            lst = self.pins[group]
            lst.remove(self._interval(run))
            if not lst:
                del self.pins[group]
