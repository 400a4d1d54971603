"""The report queries live as ``.sql`` files in ``reports/sql``; this loads them by name."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def sql(name: str) -> str:
    """Text of ``reports/sql/<name>.sql`` (package data, so it works from an installed wheel too)."""
    return resources.files("replay.reports").joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")
