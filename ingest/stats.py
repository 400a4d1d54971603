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

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replay.base.duckdb_conn import connect

from . import reuse
from .reuse import IdStream
from .schema import METADATA_PREFIX

_IDS_TYPE = pa.list_(pa.uint64())

_SUMMARY_SQL = resources.files("replay.ingest").joinpath("sql/trace_summary.sql").read_text(encoding="utf-8")


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
    con = connect()  # memory-limited, spills: count(DISTINCT session_id) over 10 M rows
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


def _arrival_order(table: pa.Table) -> pa.Array | None:
    """The row order by arrival (stable: ties keep file order), or None when the rows already are in it
    (every ingested trace), so no reordered copy is made."""
    arrival = table.column("arrival_ms").to_numpy()
    if len(arrival) > 1 and not bool(np.all(arrival[1:] >= arrival[:-1])):
        return pc.sort_indices(table.select(["arrival_ms"]), sort_keys=[("arrival_ms", "ascending")])
    return None


def table_ids(ids: pa.ChunkedArray | pa.Array, order: pa.Array | None) -> IdStream:
    """A stream over an in-memory ``hash_ids`` column, reordered by ``order`` one block at a time."""
    def stream():
        if order is None:
            yield ids
            return
        for start in range(0, len(order), reuse.BLOCK_ROWS):
            yield ids.take(order.slice(start, reuse.BLOCK_ROWS))
    return stream


def parquet_ids(path: str | Path) -> Callable[[pa.Array | None], IdStream]:
    """Streams over a canonical Parquet file's ``hash_ids`` column, one block of rows at a time. A file
    out of arrival order (not written by ingest) has its column read whole and reordered in memory."""
    def for_order(order: pa.Array | None) -> IdStream:
        if order is not None:
            column = pq.read_table(path, columns=["hash_ids"]).column(0).cast(_IDS_TYPE)
            return table_ids(column, order)

        def stream():
            with pq.ParquetFile(path) as pf:
                for batch in pf.iter_batches(batch_size=reuse.BLOCK_ROWS, columns=["hash_ids"]):
                    yield batch.column(0).cast(_IDS_TYPE)
        return stream
    return for_order


def trace_stats(table: pa.Table, lru_blocks: tuple[int, ...] | list[int] = (), *,
                block_size: int | None = None,
                hash_ids: Callable[[pa.Array | None], IdStream] | None = None) -> dict[str, Any]:
    """The ``replay inspect`` figures of a canonical trace table.

    ``block_size`` (tokens per hash id) defaults to the table's ``replay.hash_block_size`` metadata
    (present on tables from ``read_trace``/``load_trace``). Reuse figures are None when the trace has
    no hash ids: reuse is unknown, not zero. ``hash_ids`` (given the arrival order, or None when the
    rows are in it) streams the ids when ``table`` was read without them (``parquet_ids``).
    """
    out = _summary(table)
    input_total = out.pop("_input_total")
    bs = block_size or _block_size_from(table)
    order = _arrival_order(table) if table.num_rows else None
    stream = hash_ids(order) if hash_ids is not None else table_ids(table.column("hash_ids"), order)
    lengths, null_rows = reuse.count_references(stream)
    has_ids = table.num_rows > 0 and null_rows < table.num_rows
    out["hash_block_size"] = bs if has_ids else None
    if not has_ids:
        out.update({"block_references": 0, "unique_blocks": 0, "block_reuse_fraction": None,
                    "token_prefix_hit_infinite": None,
                    "lru_hit": {str(c): None for c in lru_blocks}})
        return out
    if bs is None:
        raise ValueError("trace_stats: the table has hash ids but no hash_block_size metadata; pass block_size=")
    inputs = table.column("input_tokens")
    inputs = (inputs if order is None else inputs.take(order)).to_numpy().astype(np.int64)
    figures = reuse.reuse_figures(stream, lengths, inputs, bs, [int(c) for c in lru_blocks])
    lru = figures.pop("lru_hit")
    out.update(figures)
    out["input_tokens_total"] = input_total
    out["lru_hit"] = lru
    return out
