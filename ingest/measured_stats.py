"""What a trace says was measured, and its labels: the ``replay inspect`` lines for the optional
columns (``replay.ingest.schema.OPTIONAL_SCHEMA``). Absent columns are left out, never shown as zero."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import LABEL_COLUMNS, MEASURED_COLUMNS

TOP_LABELS = 5


def _dist(values: np.ndarray) -> dict[str, Any]:
    return {"count": int(values.size), "mean": float(values.mean()),
            "p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)),
            "p99": float(np.percentile(values, 99))}


def measured_summary(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Per measured column present: how many requests have it and its distribution (lists pooled)."""
    out: dict[str, dict[str, Any]] = {}
    for name in MEASURED_COLUMNS:
        if name not in table.column_names:
            continue
        col = table.column(name)
        if pa.types.is_list(col.type):
            rows = int(table.num_rows - col.null_count)
            col = pc.list_flatten(col)
        else:
            rows = int(table.num_rows - col.null_count)
        values = col.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        if rows == 0 or values.size == 0:
            continue
        out[name] = {"requests": rows, **_dist(values)}
    return out


def label_summary(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Per label column with values: distinct values and the most frequent ones (ties by value)."""
    out: dict[str, dict[str, Any]] = {}
    for name in LABEL_COLUMNS:
        if name not in table.column_names or table.column(name).null_count == table.num_rows:
            continue
        counts = pc.value_counts(table.column(name).drop_null().cast(pa.string())).to_pylist()
        counts.sort(key=lambda c: (-c["counts"], c["values"]))
        out[name] = {"distinct": len(counts), "requests": int(table.num_rows - table.column(name).null_count),
                     "top": [[c["values"], int(c["counts"])] for c in counts[:TOP_LABELS]]}
    return out
