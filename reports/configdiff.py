"""Flatten nested config dumps into dotted keys and list the keys whose values differ."""

from __future__ import annotations

from typing import Any

_MISSING = object()
NOT_SET = "(not set)"  # the key exists on one side only (e.g. a section that is null on the other)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a None section stays one key."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key in sorted(data):
        name = f"{prefix}.{key}" if prefix else str(key)
        value = data[key]
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def differing(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every leaf whose values differ. A section that is
    null on one side and set on the other is one row holding the whole section; absent -> NOT_SET."""
    rows = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            rows += differing(va, vb, name)
        elif va != vb:
            rows.append((name, NOT_SET if va is _MISSING else va, NOT_SET if vb is _MISSING else vb))
    return rows
