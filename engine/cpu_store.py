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
run inside one ``key_group``. ``RunLRUStore`` keeps the LRU as a linked list of such runs
(engine/run_list.py), so a store of a prefill chunk, its later eviction and a lookup cost a few
operations per trace block rather than per offload block (a Mooncake trace block of 512 tokens is 32 blocks of 16): the
reference workload's 2 M-block pool holds about 65,000 runs. Generated tokens are stored one block
per step, so on decode-heavy traffic runs are shorter, at worst one block each, where a run (a
Python object in a linked list) costs more than a per-key OrderedDict entry.
``KeyLRUStore`` (engine/key_lru_store.py) is the plain per-key version: the reference the run store
is tested against.
"""

from __future__ import annotations

from typing import Final

from replay.engine.block_keys import key_group
from replay.engine.run_list import RunList, Segment, key_interval, runs_len

__all__ = ["RunLRUStore", "runs_len"]

# _evict_front's outcomes
_EVICTED: Final = 0
_SHORT: Final = 1
_BLOCKED: Final = 2


class RunLRUStore(RunList):
    """The store's semantics over a RunList: held and ready keys, stores with eviction, touches,
    pins."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.pins: dict[int, list[tuple[int, int]]] = {}  # group -> key intervals pinned by loads in flight
        self.size = 0
        # When a list: the key runs evictions remove are appended to it (a tier below that stores
        # on evictions takes them, engine/kv_tiers.py); None (G2 alone): nothing is collected.
        self.evicted: list[range] | None = None

    def __len__(self) -> int:
        return self.size

    def release(self) -> None:
        """Empty the store for good (RunList.release says why). Called once a replay has written its
        outputs (engine/run.py)."""
        super().release()
        self.pins = {}
        self.size = 0

    # -- operations ----------------------------------------------------------------------------
    def _held(self, lst: list[Segment], a: int, step: int, n: int) -> int:
        """How many of the ``n`` keys ``a``, ``a + step``, ... the runs of their group (``lst``) hold."""
        lo, hi = key_interval(a, step, n)
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
                a = run.start
                lst = groups.get(key_group(a))
                if lst is not None:
                    n += self._held(lst, a, run.step, len(run))
        return n

    @staticmethod
    def _interval(r: range) -> tuple[int, int]:
        return key_interval(r.start, r.step, len(r))

    def _protected(self, protected: list[range]) -> dict[int, list[tuple[int, int]]]:
        """This call's key intervals per group (eviction must skip them)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for r in protected:
            out.setdefault(key_group(r.start), []).append(self._interval(r))
        return out

    def _evictable(self, seg: Segment, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """LRU position ranges of ``seg`` outside the given key intervals, least recent first."""
        n = seg.n
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
                        protected: list[range] | None) -> list[tuple[Segment, list[tuple[int, int]]]] | None:
        pins = self.pins
        mine = self._protected(protected) if protected else None
        plan: list[tuple[Segment, list[tuple[int, int]]]] = []
        seg = self.head.next
        while seg is not self.head:
            if seg.batch < ready_below:
                ex = pins.get(seg.group) if pins else None
                if mine:
                    own = mine.get(seg.group)
                    if own:
                        ex = ex + own if ex else own
                spans = self._evictable(seg, ex) if ex else [(0, seg.n)]
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
                avail += seg.n
            seg = seg.next
        seg = head.next
        out = self.evicted
        while needed:
            nxt = seg.next
            if seg.batch < ready_below:
                n = seg.n
                if n <= needed:
                    if out is not None:
                        out.append(seg.keys(0, n))
                    self._unlink(seg)
                    needed -= n
                else:
                    if out is not None:
                        out.append(seg.keys(0, needed))
                    self._cut(seg, 0, needed)
                    needed = 0
            seg = nxt
        return _EVICTED

    def store(self, runs: list[range], batch: int, capacity: int, ready_below: int) -> tuple[int, int | None]:
        groups = self.groups
        held = 0
        if groups:
            for run in runs:
                a = run.start
                lst = groups.get(key_group(a))
                if lst is not None:
                    held += self._held(lst, a, run.step, len(run))
        new = runs_len(runs) - held
        need = new - (capacity - self.size)
        evicted = 0
        if need > 0:
            # Usually nothing to skip at the LRU front but unwritten batches: evict it as it is.
            front = self._evict_front(need, ready_below,
                                      {key_group(run.start) for run in runs} if held else None)
            if front == _SHORT:
                return new, None
            if front == _BLOCKED:
                plan = self._plan_evictions(need, ready_below, runs if held else None)
                if plan is None:
                    return new, None
                out = self.evicted
                for seg, spans in plan:
                    if out is not None:
                        out.extend([seg.keys(s0, s1) for s0, s1 in spans])
                    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == seg.n:
                        self._unlink(seg)  # a whole run leaves
                        continue
                    for s0, s1 in reversed(spans):  # highest first: lower positions stay valid
                        self._cut(seg, s0, s1)
            evicted = need
            self.size -= need
        if held:
            for run in reversed(runs):
                self._move_run_to_tail(run, batch)
        else:  # nothing of the call is held: each run goes to the tail as it is
            for run in reversed(runs):
                self._append_run(run, batch)
        self.size += new
        return new, evicted

    def touch(self, runs: list[range], groups: list[int] | None = None) -> None:
        """``groups``: the runs' key groups, when the caller keeps them (a lookup repeated every step)."""
        held = self.groups
        if not held:
            return
        if groups is None:
            groups = [key_group(run.start) for run in runs]
        if held.keys().isdisjoint(groups):
            return
        for run, group in zip(reversed(runs), reversed(groups)):
            if group in held:
                self._move_run_to_tail(run, None)

    def count_ready(self, runs: list[range], start: int, ready_below: int) -> int:
        hits = 0
        groups = self.groups
        for run in runs:
            n = len(run)
            if start >= n:
                start -= n
                continue
            a = run.start
            if key_group(a) not in groups:
                break
            step = run.step
            if start:
                a += start * step
                n -= start
                start = 0
            covered = self._ready_prefix(a, step, n, ready_below)
            hits += covered
            if covered < n:
                break
        return hits

    def _ready_prefix(self, a: int, step: int, n: int, ready_below: int) -> int:
        """How many of the leading keys ``a``, ``a + step``, ... (``n`` of them) are held and
        completely written."""
        lst = self.groups[key_group(a)]
        if len(lst) == 1:  # the common case: one run holds the group's keys
            seg = lst[0]
            if seg.batch >= ready_below or not seg.lo <= a <= seg.hi:
                return 0
            covered = ((seg.hi if step > 0 else seg.lo) + step - a) // step
            return covered if covered < n else n
        lo, hi = key_interval(a, step, n)
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
        return covered if covered < n else n

    def pin(self, runs: list[range]) -> None:
        for run in runs:
            self.pins.setdefault(key_group(run.start), []).append(self._interval(run))

    def unpin(self, runs: list[range]) -> None:
        for run in runs:
            group = key_group(run.start)
            lst = self.pins[group]
            lst.remove(self._interval(run))
            if not lst:
                del self.pins[group]
