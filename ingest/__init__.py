"""Ingest: any common request-trace format -> one canonical, validated Parquet trace.

Public API: ``convert``, ``load_trace``, ``trace_stats`` (see ``ingest.api``) and the schema
contract in ``ingest.schema``.
"""

from .api import IngestResult, convert, load_trace, trace_stats
from .schema import TRACE_SCHEMA, TraceMetadata, is_canonical_trace, read_trace, read_trace_metadata

__all__ = ["IngestResult", "convert", "load_trace", "trace_stats", "TRACE_SCHEMA", "TraceMetadata",
           "is_canonical_trace", "read_trace", "read_trace_metadata"]
