"""Trace-replay analyzer for LLM serving: ingest -> Parquet trace -> engine -> Parquet results -> reports.

One installed package. Its subpackages read bottom-up the way data flows (docs/architecture.md):
``replay.base`` (errors, atomic writes, DuckDB) -> ``replay.ingest`` (the trace schema) ->
``replay.engine`` -> ``replay.reports`` -> the CLI and Python API (``replay.cli``, ``replay.api``).
``replay.engine``, ``replay.ingest`` and ``replay.reports`` live in the repository's top-level
folders engine/, ingest/ and reports/ (mapped by the build, pyproject.toml).
"""

from replay.base.version import __version__

__all__ = ["__version__"]
