"""Trace figures for ``replay inspect``: load shape, lengths and the prefix reuse an ideal cache would see.

Definitions (rows in arrival order; see docs/trace-schema.md):

* ``block_reuse_fraction``: hash-id references whose id appeared in an earlier row / all references.
* ``token_prefix_hit_infinite``: sum over rows of ``min(k * block_size, input_tokens)`` / all input
  tokens, ``k`` being the row's leading run of ids seen in earlier rows (an infinite prefix cache).
* ``lru_hit[C]``: with an LRU cache of ``C`` ids, each row's leading run of ids present in the
  cache at the row's start / all references; then the row's ids are touched in order (misses
  inserted, the least recently used evicted).
"""

from __future__ import annotations

from collections import OrderedDict
from importlib import resources
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import METADATA_PREFIX

_SUMMARY_SQL = resources.files("ingest").joinpath("sql/trace_summary.sql").read_text(encoding="utf-8")


def _block_size_from(table: pa.Table) -> int | None:
    meta = table.schema.metadata or {}
    raw = meta.get((METADATA_PREFIX + "hash_block_size").encode())
    if raw is None:
        return None
    import json

    value = json.loads(raw)
    return int(value) if value else None


def _summary(table: pa.Table) -> dict[str, Any]:
    cols = table.select(["arrival_ms", "input_tokens", "output_tokens", "session_id"])
    con = duckdb.connect()
    try:
        con.register("trace", cols)
        cur = con.execute(_SUMMARY_SQL)
        names = [d[0] for d in cur.description]
        row = dict(zip(names, cur.fetchone(), strict=True))
    finally:
        con.close()
    n = int(row["rows"])
    span = float(row["span_s"] or 0.0)

    def pct(q: list[float] | None, mx: int | None, mean: float | None) -> dict[str, float | None]:
        q = q or [None, None, None]
        return {"mean": mean, "p50": q[0], "p90": q[1], "p99": q[2], "max": mx}

    return {
        "rows": n,
        "span_s": span,
        "mean_rate_rps": (n / span) if span > 0 else None,
        "interarrival_cv": row["interarrival_cv"],
        "input_tokens": pct(row["input_q"], row["input_max"], row["input_mean"]),
        "output_tokens": pct(row["output_q"], row["output_max"], row["output_mean"]),
        "sessions": int(row["sessions"]),
        "_input_total": int(row["input_total"] or 0),
    }


# Rows per block of the reuse passes: the per-reference temporaries (row numbers, hit flags, Python
# ints of the LRU walk) exist for one block at a time, so a 10 M-row trace's 73 M references never
# have a full-length int64 (or list) copy (issue 16: inspect peaked at 5.6 GB).
BLOCK_ROWS = 1 << 18


def _ordered_ids(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(dense id per reference, row offsets, input tokens, distinct ids) with rows in arrival order.

    Dense ids number the distinct hash ids (Arrow's hash-based dictionary encoding, int32 indices):
    every figure depends only on which references share an id, never on the numbering. A trace
    already in arrival order (every ingested trace) is read as is, without a reordered copy."""
    ids, inputs = table.column("hash_ids"), table.column("input_tokens")
    arrival = table.column("arrival_ms").to_numpy()
    if len(arrival) > 1 and not bool(np.all(arrival[1:] >= arrival[:-1])):
        order = pc.sort_indices(table, sort_keys=[("arrival_ms", "ascending")])  # stable: ties keep file order
        ids, inputs = ids.take(order), inputs.take(order)
    inputs = inputs.to_numpy().astype(np.int64)
    if ids.null_count:
        ids = ids.fill_null([])
    lengths = pc.list_value_length(ids).fill_null(0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    encoded = pc.dictionary_encode(pc.list_flatten(ids))  # one dictionary shared by every chunk
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    dense = np.concatenate([c.indices.to_numpy() for c in chunks]) if chunks else np.empty(0, np.int32)
    distinct = len(chunks[0].dictionary) if chunks else 0
    return dense, offsets, inputs, distinct


def _row_blocks(offsets: np.ndarray):
    """(first row, end row, first reference, end reference) of each block of BLOCK_ROWS rows."""
    n_rows = len(offsets) - 1
    for r0 in range(0, n_rows, BLOCK_ROWS):
        r1 = min(r0 + BLOCK_ROWS, n_rows)
        yield r0, r1, int(offsets[r0]), int(offsets[r1])


def _leading_runs(seen: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the number of leading True values in its slice of ``seen`` (``offsets`` index ``seen``):
    the distance from the row's start to its first miss, or the row's length if it has none."""
    starts, ends = offsets[:-1], offsets[1:]
    misses = np.flatnonzero(~seen)
    if not len(misses):
        return ends - starts
    k = np.searchsorted(misses, starts)
    first_miss = misses[np.minimum(k, len(misses) - 1)]
    first_miss = np.where(k < len(misses), first_miss, ends)
    return np.minimum(first_miss, ends) - starts


def reuse_figures(dense: np.ndarray, offsets: np.ndarray, inputs: np.ndarray, block_size: int,
                  distinct: int | None = None) -> dict[str, Any]:
    """Block reuse and infinite-cache token prefix hit (vectorised, one block of rows at a time)."""
    n_refs = len(dense)
    if n_refs == 0:
        return {"block_references": 0, "unique_blocks": 0, "block_reuse_fraction": None,
                "token_prefix_hit_infinite": None}
    distinct = int(dense.max()) + 1 if distinct is None else distinct
    lengths = np.diff(offsets)
    row_type = np.int32 if len(lengths) < np.iinfo(np.int32).max else np.int64
    first_row = np.full(distinct, np.iinfo(row_type).max, dtype=row_type)  # the first row using each id
    for r0, r1, lo, hi in _row_blocks(offsets):
        np.minimum.at(first_row, dense[lo:hi], np.repeat(np.arange(r0, r1, dtype=row_type), lengths[r0:r1]))
    runs = np.empty(len(lengths), dtype=np.int64)
    n_seen = 0
    for r0, r1, lo, hi in _row_blocks(offsets):
        seen = first_row[dense[lo:hi]] < np.repeat(np.arange(r0, r1, dtype=row_type), lengths[r0:r1])
        n_seen += int(seen.sum())
        runs[r0:r1] = _leading_runs(seen, offsets[r0:r1 + 1] - lo)
    hit_tokens = np.minimum(runs * block_size, inputs).sum()
    total = inputs.sum()
    return {
        "block_references": int(n_refs),
        "unique_blocks": int(distinct),
        "block_reuse_fraction": float(n_seen / n_refs),
        "token_prefix_hit_infinite": float(hit_tokens / total) if total else None,
    }


def lru_hit_rate(dense: np.ndarray, offsets: np.ndarray, capacity: int) -> float | None:
    """Leading-run hits in an LRU cache of ``capacity`` ids / all references (see module doc)."""
    n_refs = len(dense)
    if n_refs == 0:
        return None
    cache: OrderedDict[int, None] = OrderedDict()
    move, evict = cache.move_to_end, cache.popitem
    hits = 0
    for r0, r1, lo, hi in _row_blocks(offsets):
        flat = dense[lo:hi].tolist()  # Python ints for one block of rows only
        bounds = (offsets[r0:r1 + 1] - lo).tolist()
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
    return hits / n_refs


def trace_stats(table: pa.Table, lru_blocks: tuple[int, ...] | list[int] = (), *,
                block_size: int | None = None) -> dict[str, Any]:
    """The ``replay inspect`` figures of a canonical trace table.

    ``block_size`` (tokens per hash id) defaults to the table's ``replay.hash_block_size`` metadata
    (present on tables from ``read_trace``/``load_trace``). Reuse figures are None when the trace has
    no hash ids: reuse is unknown, not zero.
    """
    out = _summary(table)
    input_total = out.pop("_input_total")
    bs = block_size or _block_size_from(table)
    has_ids = table.num_rows > 0 and table.column("hash_ids").null_count < table.num_rows
    out["hash_block_size"] = bs if has_ids else None
    if not has_ids:
        out.update({"block_references": 0, "unique_blocks": 0, "block_reuse_fraction": None,
                    "token_prefix_hit_infinite": None,
                    "lru_hit": {str(c): None for c in lru_blocks}})
        return out
    if bs is None:
        raise ValueError("trace_stats: the table has hash ids but no hash_block_size metadata; pass block_size=")
    dense, offsets, inputs, distinct = _ordered_ids(table)
    figures = reuse_figures(dense, offsets, inputs, bs, distinct)
    out.update(figures)
    out["input_tokens_total"] = input_total
    out["lru_hit"] = {str(c): lru_hit_rate(dense, offsets, int(c)) for c in lru_blocks}
    return out
