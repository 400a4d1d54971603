"""Whole-trace facts about hash ids, computed once when a trace is prepared for the engine: whether
the ids are chained (an id names its whole prefix, as a vLLM block hash does), ids made chained
when they are not, and each row's shared lead (the ids another request could ever hit).

Ids numbered densely from 0 are counted in tables indexed by id. Other ids are grouped by sorting;
a sort of every id of a large trace needs scratch memory of many times the ids (1 M reuse-heavy
requests hold 15 M ids: one sort of all took 0.6 GB), so they are split into classes by value and
one class is sorted at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# Ids per class: a class's sort takes scratch near 50 bytes times this, not times the trace's ids.
_IDS_PER_PASS = 1 << 20
_CLASSES_PER_PASS = 16  # classes gathered per scan of the trace's ids (_id_classes)
# Ids below this are scanned with tables indexed by id (5 bytes an entry: 168 MB at most).
_DENSE_IDS = 1 << 25


@dataclass
class IdScan:
    """What one pass over a trace's ids found."""

    chained: bool  # every id always follows the same id, or always starts a row
    shared: np.ndarray  # bool per id position: the same id occurs at another position too


def _row_starts(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """True at each id that starts its row."""
    first = np.zeros(len(flat), dtype=bool)
    first[offsets[:-1][offsets[:-1] < offsets[1:]]] = True
    return first


def _id_classes(flat: np.ndarray) -> Iterator[np.ndarray]:
    """Positions of the ids, in classes by id value (equal ids always share a class), each class about
    ``_IDS_PER_PASS`` ids, ascending positions within a class.

    The positions of ``_CLASSES_PER_PASS`` classes are gathered by one scan of the class array and
    grouped by a stable sort, so the trace is scanned classes / _CLASSES_PER_PASS times, not once per
    class (which made the scans quadratic: 147 of 154 M ids each on 10 M reuse-heavy rows)."""
    parts = max(1, -(-len(flat) // _IDS_PER_PASS))
    if parts == 1:
        yield np.arange(len(flat))
        return
    cls = np.empty(len(flat), dtype=np.uint16)
    for i in range(0, len(flat), _IDS_PER_PASS):  # sliced: no id-sized temporary of 8 bytes an id
        cls[i:i + _IDS_PER_PASS] = flat[i:i + _IDS_PER_PASS] % np.uint64(parts)
    for lo in range(0, parts, _CLASSES_PER_PASS):
        hi = min(parts, lo + _CLASSES_PER_PASS)
        pos = np.flatnonzero((cls >= lo) & (cls < hi)) if hi - lo < parts else np.arange(len(flat))
        of_pos = cls[pos]
        order = np.argsort(of_pos, kind="stable")  # by class, ascending positions within one
        pos = pos[order]
        bounds = np.searchsorted(of_pos[order], np.arange(lo, hi + 1))
        del of_pos, order
        for k in range(hi - lo):
            yield pos[bounds[k]:bounds[k + 1]]


def scan_ids(flat: np.ndarray, offsets: np.ndarray, *, check_chained: bool = True) -> IdScan:
    """Whether the ids are chained (unless ``check_chained`` is False: then reported True) and which
    positions hold an id that occurs elsewhere too. Ids below ``_DENSE_IDS`` (Mooncake-style traces
    number their blocks from 0) are counted in tables indexed by id, in sequential slices; others are
    sorted one class at a time."""
    if not len(flat):
        return IdScan(chained=True, shared=np.zeros(0, dtype=bool))
    top = int(flat.max())
    if top < _DENSE_IDS and len(flat) < 2**31:  # positions and ids in int32
        return _scan_dense(flat, offsets, top + 1, check_chained)
    return _scan_sorted(flat, offsets, check_chained)


def _slices(n: int) -> Iterator[tuple[int, int]]:
    for s in range(0, n, _IDS_PER_PASS):
        yield s, min(n, s + _IDS_PER_PASS)


def _scan_dense(flat: np.ndarray, offsets: np.ndarray, size: int, check_chained: bool) -> IdScan:
    """``scan_ids`` with tables indexed by id (``size`` values; 4 or 5 bytes an entry): sequential
    passes over the trace and lookups in those tables, no sort and no scattered reads of the trace
    (10 M reuse-heavy rows: 154 M ids below 30 M, 37 s sorted)."""
    # One position of each id is its owner (whichever write lands); an id is repeated exactly when
    # some position of it is not its owner.
    owner = np.empty(size, dtype=np.int32)
    for s, e in _slices(len(flat)):
        owner[flat[s:e]] = np.arange(s, e, dtype=np.int32)
    repeated = np.zeros(size, dtype=bool)
    for s, e in _slices(len(flat)):
        ids = flat[s:e]
        repeated[ids[owner[ids] != np.arange(s, e, dtype=np.int32)]] = True
    del owner
    shared = np.empty(len(flat), dtype=bool)
    for s, e in _slices(len(flat)):
        shared[s:e] = repeated[flat[s:e]]
    del repeated
    if not check_chained:
        return IdScan(chained=True, shared=shared)
    first = _row_starts(flat, offsets)

    def predecessors(s: int, e: int) -> np.ndarray:  # -1 where the id starts its row
        prev = np.empty(e - s, dtype=np.int32)
        prev[1:] = flat[s:e - 1]
        prev[0] = flat[s - 1] if s else -1
        prev[first[s:e]] = -1
        return prev

    # Likewise each id's entry holds the predecessor of one of its positions; the ids are chained
    # exactly when every position agrees with its id's entry.
    seen = np.empty(size, dtype=np.int32)
    for s, e in _slices(len(flat)):
        seen[flat[s:e]] = predecessors(s, e)
    chained = all(np.array_equal(seen[flat[s:e]], predecessors(s, e)) for s, e in _slices(len(flat)))
    return IdScan(chained=chained, shared=shared)


def _scan_sorted(flat: np.ndarray, offsets: np.ndarray, check_chained: bool) -> IdScan:
    """``scan_ids`` by one sort per class of ids. Within a run of equal ids (in any order), the ids
    are chained only if every one has the same predecessor and all or none start a row; an id is
    shared when its run is longer than one."""
    shared = np.zeros(len(flat), dtype=bool)
    chained = True
    first = _row_starts(flat, offsets) if check_chained else None
    for pos in _id_classes(flat):
        ids = flat[pos]
        order = np.argsort(ids)
        pos = pos[order]
        ids = ids[order]
        same = ids[1:] == ids[:-1]
        del ids, order
        if chained and check_chained:
            assert first is not None
            starts = first[pos]
            prev = np.where(starts, np.uint64(0), flat[pos - 1])  # position 0 always starts a row
            chained = not np.any(same & ((prev[1:] != prev[:-1]) | (starts[1:] != starts[:-1])))
        dup = np.zeros(len(pos), dtype=bool)
        dup[1:] = same
        dup[:-1] |= same
        shared[pos[dup]] = True
    return IdScan(chained=chained, shared=shared)


def is_chained(flat: np.ndarray, offsets: np.ndarray) -> bool:
    """True when every id always follows the same id (or always starts a row): then an id names
    its whole prefix, as a vLLM block hash does, and shared ids of a row form a leading run."""
    return scan_ids(flat, offsets).chained


def chained_ids(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Ids that name whole prefixes: position i of a row gets one id per distinct (prefix id,
    trace id) pair, the way vLLM chains block hashes (H(parent, block)). Used only for traces
    whose ids are not chained already (per-block content hashes, an id repeated in a row):
    without it a block would match another prompt's block after a different prefix."""
    out = np.empty(len(flat), dtype=np.uint64)
    canon: dict[tuple[int, int], int] = {}
    values = flat.tolist()
    for r in range(len(offsets) - 1):
        prev = 0
        for i in range(int(offsets[r]), int(offsets[r + 1])):
            key = (prev, values[i])
            c = canon.get(key)
            if c is None:
                c = len(canon) + 1
                canon[key] = c
            out[i] = prev = c
    return out


def shared_lead(flat: np.ndarray, offsets: np.ndarray, shared: np.ndarray | None = None) -> np.ndarray:
    """Per row, the number of leading hash ids up to the last one that also occurs in another row.

    Another request can only ever hit this row's blocks named by ids it holds too, so blocks past
    that run are findable by their owner alone; the engine registers them in the prefix cache only
    if their owner is preempted (engine/kv_cache_manager.py). With chained ids the shared ids are a
    leading run anyway; counting up to the last shared one makes no assumption about it. An id
    repeated inside one row counts as shared: conservative, never a lost hit. ``shared``: the
    positions ``scan_ids`` found shared, when known already. Int32 (a row holds far fewer ids).
    """
    n = len(offsets) - 1
    lead = np.zeros(max(n, 0), dtype=np.int32)
    if n <= 0 or not len(flat):
        return lead
    if shared is None:
        shared = scan_ids(flat, offsets, check_chained=False).shared
    # A row's lead ends at its last shared id: the last shared position before the row's end, unless
    # that is before the row's start. Rows in blocks of about _IDS_PER_PASS ids, for the positions.
    starts, ends = offsets[:-1], offsets[1:]
    r0 = 0
    while r0 < n:
        r1 = max(r0 + 1, int(np.searchsorted(starts, starts[r0] + _IDS_PER_PASS, side="right")))
        base = int(starts[r0])
        shared_pos = np.flatnonzero(shared[base:int(ends[r1 - 1])]) + base
        if len(shared_pos):
            k = np.searchsorted(shared_pos, ends[r0:r1]) - 1
            last = shared_pos[np.maximum(k, 0)]
            has = (k >= 0) & (last >= starts[r0:r1])
            lead[r0:r1][has] = (last - starts[r0:r1] + 1)[has]
        r0 = r1
    return lead


def shared_lead_within(flat: np.ndarray, offsets: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``shared_lead`` where only rows of the same group count as others: with replicas known in
    advance (a router whose choice depends on the row alone, or round robin over open-loop
    arrivals), a request can only hit the cache of its own replica, so ids shared with rows served
    elsewhere name blocks nobody here can look up. Rows of group -1 (never replayed) share nothing.
    """
    n = len(offsets) - 1
    lead = np.zeros(max(n, 0), dtype=np.int32)
    if n <= 0 or not len(flat):
        return lead
    lengths = np.diff(offsets)
    for g in np.unique(groups[groups >= 0]).tolist():
        rows = np.flatnonzero(groups == g)
        sub = flat[np.repeat(groups == g, lengths)]
        sub_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths[rows], out=sub_offsets[1:])
        lead[rows] = shared_lead(sub, sub_offsets)
    return lead
