"""``sweep.parquet``: one row per config, the varied keys first, then every summary metric.

Built by the driver from the stored records in grid order with a fixed schema, and written with
fixed Parquet options and no wall-clock values, so the bytes depend only on the trace, the configs
and the tool version, never on which executor ran them or in what order they finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.atomic import atomic_path
from replay.base.parquet_io import CHECKSUMS
from replay.sweep.grid import Axis
from replay.sweep.summary import METRIC_COLUMNS

_ARROW = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string()}
TAIL_COLUMNS = ("config_hash", "outdir", "error")


def _axis_type(axis: Axis) -> str:
    labels = [v.label for v in axis.values]
    if all(isinstance(v, bool) for v in labels):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        return "int"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in labels):
        return "float"
    return "str"


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "float":
        return float(value)
    if kind == "str" and not isinstance(value, str):
        return json.dumps(value)
    return value


def sweep_schema(axes: list[Axis]) -> pa.Schema:
    fields = [pa.field(a.key, _ARROW[_axis_type(a)]) for a in axes]
    fields += [pa.field(k, _ARROW[kind]) for k, kind in METRIC_COLUMNS.items()]
    fields += [pa.field(k, pa.string()) for k in TAIL_COLUMNS]
    return pa.schema(fields)


def build_table(axes: list[Axis], rows: list[dict[str, Any]]) -> pa.Table:
    """``rows``: per config, the point's labels by key, ``metrics`` (or None) and the tail columns."""
    schema = sweep_schema(axes)
    kinds = {a.key: _axis_type(a) for a in axes} | METRIC_COLUMNS | dict.fromkeys(TAIL_COLUMNS, "str")
    columns: dict[str, list] = {f.name: [] for f in schema}
    for row in rows:
        metrics = row.get("metrics") or {}
        for name in columns:
            value = row["labels"].get(name) if name in row["labels"] else metrics.get(name, row.get(name))
            columns[name].append(_cell(value, kinds[name]))
    return pa.Table.from_pydict(columns, schema=schema)


def write_table(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=True, **CHECKSUMS)
