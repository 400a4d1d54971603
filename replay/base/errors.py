"""User-facing errors: each names where the problem is (file, line or row, field)."""

from __future__ import annotations


class ReplayError(Exception):
    """An error the CLI prints without a traceback: the message says what to fix."""


class ConfigError(ReplayError):
    """A config file or override that cannot be used."""


class TraceError(ReplayError):
    """A trace that cannot be read or replayed."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None, row: int | None = None) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if row is not None:  # a Parquet trace's row, 1-based
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message)
        self.path, self.line, self.field, self.row = path, line, field, row
