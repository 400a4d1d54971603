"""Ingest: any common request-trace format -> one canonical, validated Parquet trace.

Public API: ``convert``, ``load_trace``, ``trace_stats`` (see ``replay.ingest.api``) and the schema
contract in ``replay.ingest.schema``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import IngestResult, convert, load_trace, trace_stats
    from .schema import TRACE_SCHEMA, TraceMetadata, is_canonical_trace, read_trace, read_trace_metadata

__all__ = ["IngestResult", "convert", "load_trace", "trace_stats", "TRACE_SCHEMA", "TraceMetadata",
           "is_canonical_trace", "read_trace", "read_trace_metadata"]

# Resolved on first use (PEP 562): ``replay.ingest.api`` pulls in the readers, pandas and DuckDB (about
# 0.3 s), which ``replay run`` of a canonical Parquet trace never needs; it only reads ``replay.ingest.schema``.
_LAZY = {"IngestResult": "api", "convert": "api", "load_trace": "api", "trace_stats": "api",
         "TRACE_SCHEMA": "schema", "TraceMetadata": "schema", "is_canonical_trace": "schema",
         "read_trace": "schema", "read_trace_metadata": "schema"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
