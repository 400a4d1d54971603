"""Number formatting shared by the markdown and terminal outputs (display only, never rounding data)."""

from __future__ import annotations

import math
from typing import Any

DASH = "—"


def num(value: Any, unit: str = "") -> str:
    """A value for a table cell, with precision chosen by unit."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return DASH
    if unit == "ratio":
        return f"{value:.4f}"
    if unit == "pct":
        return f"{value:.1%}"
    if unit == "count":
        return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
    if unit in ("ms", "s", "req/s", "tok/s"):
        a = abs(value)
        if a >= 100:
            return f"{value:,.1f}"
        if a >= 1:
            return f"{value:,.2f}"
        return f"{value:.3g}"
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def change(a: Any, b: Any, unit: str) -> tuple[str, str]:
    """(absolute change, relative change) of B against A, as cells."""
    if a is None or b is None:
        return DASH, DASH
    delta = b - a
    sign = "+" if delta > 0 else ""
    absolute = sign + num(delta, unit) if delta != 0 else "0"
    if delta == 0:
        return absolute, "0.0%"
    if a == 0:
        return absolute, DASH
    return absolute, f"{delta / abs(a):+.1%}"


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A GitHub markdown table; align is one char per column (l or r), default first l, rest r."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)
