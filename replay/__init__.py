"""Trace-replay analyzer for LLM serving: ingest -> Parquet trace -> engine -> Parquet results -> reports."""

__version__ = "0.1.0"
