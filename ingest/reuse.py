"""Prefix-reuse figures of ``replay inspect`` from hash ids streamed in arrival order, in bounded memory.

A 10 M-row trace holds about 80 M hash-id references to about 28 M distinct ids: any table of all
distinct ids (a Python dict, Arrow's dictionary encoding, a dense numbering) takes several GB
(6 GB at a million requests). Instead the ids are read again for each of a few passes, never all at once:

* a count pass: each row's number of references (and whether the trace has ids at all);
* first-use passes: the id space is cut into ``parts`` by a hash of the id, ``parts`` chosen so a
  part holds about ``PASS_REFS`` references. For one part, its references (id, row, position in the
  row) are gathered and sorted by id; an id's first row is the least row of its group, and a
  reference is *seen* when its row is later. The unseen references of a part lower their rows'
  first-miss positions, which, once every part is done, are the rows' leading runs of seen ids;
* an LRU pass: the caches are walked one block of rows at a time (each holds at most its capacity).

Every figure is an integer count until the final division, so the result does not depend on the
number of parts or the block size (tests/ingest/test_inspect.py forces many of both).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Rows per block of the streamed passes: Python ints of the LRU walk and the per-reference
# temporaries of a first-use pass exist for one block at a time.
BLOCK_ROWS = 1 << 18
# References per first-use pass: about 50 bytes each at the pass's peak (id, row, position, sort
# order and the sorted copies), so ~8 M references stay near 400 MB.
PASS_REFS = 1 << 23

IdStream = Callable[[], Iterable[pa.Array]]
"""Starts a new pass over the ``hash_ids`` lists, rows in arrival order (any chunking)."""

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads sequential ids over the parts too


class NullHashIdError(ValueError):
    """A ``hash_ids`` list holds a null element (ingest refuses these; a hand-made Parquet may not)."""

    def __init__(self, row: int) -> None:
        super().__init__(f"hash_ids of row {row} (0-based, in arrival order) holds a null id")
        self.row = row


def _blocks(stream: IdStream) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids as uint64, references per row) for each block of at most BLOCK_ROWS rows of a new pass."""
    row0 = 0
    for arr in stream():
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        for chunk in chunks:
            for start in range(0, len(chunk), BLOCK_ROWS):
                part = chunk.slice(start, BLOCK_ROWS)
                lengths = pc.list_value_length(part).fill_null(0).to_numpy().astype(np.int64)
                flat = part.flatten()  # skips the values behind null lists
                if flat.null_count:
                    first = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
                    raise NullHashIdError(row0 + int(np.searchsorted(np.cumsum(lengths), first, side="right")))
                yield flat.to_numpy().astype(np.uint64, copy=False), lengths
                row0 += len(part)


def count_references(stream: IdStream) -> tuple[np.ndarray, int]:
    """(references per row, rows whose ``hash_ids`` is null), over one pass."""
    lengths, nulls = [], 0
    for arr in stream():
        for chunk in (arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]):
            nulls += chunk.null_count
            lengths.append(pc.list_value_length(chunk).fill_null(0).to_numpy().astype(np.int64))
    return (np.concatenate(lengths) if lengths else np.empty(0, np.int64)), nulls


def _part_of(ids: np.ndarray, parts: int) -> np.ndarray:
    return ((ids * _MIX) >> np.uint64(32)) % np.uint64(parts)


def _first_use_pass(stream: IdStream, part: int, parts: int, first_miss: np.ndarray) -> tuple[int, int]:
    """Seen references and distinct ids of one part; lowers ``first_miss`` at its unseen references."""
    row_type = np.int32 if len(first_miss) < np.iinfo(np.int32).max else np.int64
    got_ids, got_rows, got_pos = [], [], []
    row0 = 0
    for ids, lengths in _blocks(stream):
        take = np.flatnonzero(_part_of(ids, parts) == part) if parts > 1 else np.arange(len(ids))
        row_in_block = np.repeat(np.arange(len(lengths)), lengths)[take]
        row_start = (np.cumsum(lengths) - lengths)[row_in_block]
        got_ids.append(ids[take])
        got_rows.append((row_in_block + row0).astype(row_type))
        got_pos.append((take - row_start).astype(np.int32))
        row0 += len(lengths)
    ids = np.concatenate(got_ids)
    if not len(ids):
        return 0, 0
    del got_ids
    order = np.argsort(ids)
    ids = ids[order]
    rows = np.concatenate(got_rows)[order]
    del got_rows
    pos = np.concatenate(got_pos)[order]
    del got_pos, order
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    del ids
    first_row = np.repeat(np.minimum.reduceat(rows, starts), np.diff(np.append(starts, len(rows))))
    unseen = rows <= first_row  # == : the id's first row (every reference in it, repeats included)
    del first_row
    np.minimum.at(first_miss, rows[unseen], pos[unseen])
    return int(len(rows) - np.count_nonzero(unseen)), len(starts)


def _lru_walk(cache: OrderedDict, capacity: int, flat: list[int], bounds: list[int]) -> int:
    """Leading-run hits of one block of rows; touches each row's ids in order (misses inserted)."""
    move, evict = cache.move_to_end, cache.popitem
    hits = 0
    for r in range(len(bounds) - 1):
        row = flat[bounds[r]:bounds[r + 1]]
        run = 0
        for x in row:
            if x not in cache:
                break
            run += 1
        hits += run
        for x in row[:run]:
            move(x)
        for x in row[run:]:
            if x in cache:
                move(x)
            else:
                cache[x] = None
                if len(cache) > capacity:
                    evict(last=False)
    return hits


def lru_hits(stream: IdStream, capacities: list[int]) -> list[int]:
    """Leading-run hits of an LRU cache of each capacity (ids), over one pass."""
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacities]
    hits = [0] * len(capacities)
    for ids, lengths in _blocks(stream):
        flat = ids.tolist()  # Python ints for one block of rows only
        bounds = [0, *np.cumsum(lengths).tolist()]
        for i, cap in enumerate(capacities):
            hits[i] += _lru_walk(caches[i], cap, flat, bounds)
    return hits


def reuse_figures(stream: IdStream, lengths: np.ndarray, inputs: np.ndarray, block_size: int,
                  capacities: list[int]) -> dict[str, Any]:
    """Block reuse, infinite-cache token prefix hit and LRU hit rates (see ingest/stats.py for the
    definitions) of the ids ``stream`` gives; ``lengths`` from ``count_references``."""
    n_refs = int(lengths.sum())
    if n_refs == 0:
        return {"block_references": 0, "unique_blocks": 0, "block_reuse_fraction": None,
                "token_prefix_hit_infinite": None, "lru_hit": {str(c): None for c in capacities}}
    parts = -(-n_refs // PASS_REFS)
    first_miss = lengths.copy()  # a row without an unseen reference: its whole length is a leading run
    n_seen = distinct = 0
    for part in range(parts):
        seen, d = _first_use_pass(stream, part, parts, first_miss)
        n_seen += seen
        distinct += d
    hit_tokens = np.minimum(first_miss * block_size, inputs).sum()
    total = inputs.sum()
    hits = lru_hits(stream, capacities) if capacities else []
    return {
        "block_references": n_refs,
        "unique_blocks": distinct,
        "block_reuse_fraction": float(n_seen / n_refs),
        "token_prefix_hit_infinite": float(hit_tokens / total) if total else None,
        "lru_hit": {str(c): h / n_refs for c, h in zip(capacities, hits, strict=True)},
    }
