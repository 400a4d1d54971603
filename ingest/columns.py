"""Vectorised conversion of raw source columns (strings or JSON numbers) to typed arrays.

Each parser returns the converted array (null where the value was missing or bad) and a list of
``(index, reason)`` for the bad values, so one bad row never hides the others and the fast path
stays free of per-row Python for well-formed input.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.base.errors import ConfigError

BadValues = list[tuple[int, str]]

_INT_RE = r"^[+-]?[0-9]+$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_ZONE_RE = r"(Z|z|[+-][0-9]{2}:?[0-9]{2})$"

TIME_UNITS = ("s", "ms", "us", "ns", "iso")
_MS_PER_UNIT = {"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 1e-6}
# Unix-epoch clocks by magnitude: a reading in [lo, hi) of that unit is a date in 2001-2286. A column
# whose earliest value falls in one unit's band is an absolute clock in that unit (relative times
# start near 0), so a different stated unit is a mistake, never a silent 1000x stretch.
_EPOCH_BANDS = {"s": (1e9, 1e10), "ms": (1e12, 1e13), "us": (1e15, 1e16), "ns": (1e18, 1e19)}
_INT64_MAX = 2**63 - 1


def _indices(mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask).tolist()


def _repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _np_mask(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def parse_int(arr: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, BadValues]:
    """Integers from ints, integral floats or integer strings; anything else is a bad value."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.int64()), []
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            too_big = _np_mask(pc.greater(arr, pa.scalar(_INT64_MAX, pa.uint64())))
            if too_big.any():
                bad = [(i, f"{arr[i].as_py()} is out of range") for i in _indices(too_big)]
                arr = pc.if_else(pa.array(too_big), pa.scalar(None, t), arr)
                return arr.cast(pa.int64()), bad
        return arr.cast(pa.int64()), []
    if pa.types.is_floating(t):
        vals = arr.to_numpy(zero_copy_only=False)
        valid = ~np.isnan(vals)
        with np.errstate(invalid="ignore"):
            bad_mask = valid & ((np.floor(vals) != vals) | (np.abs(vals) > 2**53))
        bad = [(i, f"not an integer: {float(vals[i])!r}") for i in _indices(bad_mask)]
        out = np.where(valid & ~bad_mask, vals, 0).astype(np.int64)
        return pa.array(out, mask=~(valid & ~bad_mask)), bad
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        trimmed = pc.utf8_trim_whitespace(arr)
        trimmed = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, trimmed.type), trimmed)
        try:
            return pc.cast(trimmed, pa.int64()), []
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        ok = _np_mask(pc.match_substring_regex(trimmed, _INT_RE))
        # 19+ digit strings may overflow int64: check them one by one (rare).
        long = ok & _np_mask(pc.greater(pc.utf8_length(trimmed), 18))
        for i in _indices(long):
            if abs(int(trimmed[i].as_py())) > _INT64_MAX:
                ok[i] = False
        present = _np_mask(pc.is_valid(trimmed))
        bad_mask = present & ~ok
        bad = [(i, f"not an integer: {_repr(trimmed[i].as_py())}") for i in _indices(bad_mask)]
        cleaned = pc.if_else(pa.array(ok), trimmed, pa.scalar(None, trimmed.type))
        # Arrow's string-to-int64 cast refuses the leading "+" that _INT_RE accepts ("+12").
        cleaned = pc.replace_substring_regex(cleaned, r"^\+", "")
        return pc.cast(cleaned, pa.int64()), bad
    return pa.nulls(len(arr), pa.int64()), [(i, f"not an integer: {_repr(arr[i].as_py())}")
                                            for i in range(len(arr)) if arr[i].is_valid]


def parse_float(arr: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, BadValues]:
    """Floats from numbers or numeric strings."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.float64()), []
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        out = arr.cast(pa.float64())
        vals = out.to_numpy(zero_copy_only=False)
        # A NaN the source wrote (JSON's non-standard NaN) is a bad value, not a missing one.
        bad_mask = np.isinf(vals) | (_np_mask(pc.is_valid(out)) & np.isnan(vals))
        if bad_mask.any():
            out = pc.if_else(pa.array(bad_mask), pa.scalar(None, pa.float64()), out)
        return out, [(i, f"not a finite number: {float(vals[i])!r}") for i in _indices(bad_mask)]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        trimmed = pc.utf8_trim_whitespace(arr)
        trimmed = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, trimmed.type), trimmed)
        ok = _np_mask(pc.match_substring_regex(trimmed, _FLOAT_RE))
        present = _np_mask(pc.is_valid(trimmed))
        bad_mask = present & ~ok
        bad = [(i, f"not a number: {_repr(trimmed[i].as_py())}") for i in _indices(bad_mask)]
        cleaned = pc.if_else(pa.array(ok), trimmed, pa.scalar(None, trimmed.type)) if bad else trimmed
        return pc.cast(cleaned, pa.float64()), bad
    return pa.nulls(len(arr), pa.float64()), [(i, f"not a number: {_repr(arr[i].as_py())}")
                                              for i in range(len(arr)) if arr[i].is_valid]


def _iso_to_ns(arr: pa.Array) -> pa.Array:
    """ISO-8601 strings to int64 ns since the epoch; zone-less values are taken as UTC."""
    try:
        return pc.cast(arr, pa.timestamp("ns")).cast(pa.int64())
    except pa.ArrowInvalid:
        pass
    try:
        return pc.cast(arr, pa.timestamp("ns", tz="UTC")).cast(pa.int64())
    except pa.ArrowInvalid:
        pass
    zoned = pc.fill_null(pc.match_substring_regex(arr, _ZONE_RE), False)
    naive_part = pc.filter(arr, pc.invert(zoned))
    zoned_part = pc.filter(arr, zoned)
    naive_ns = pc.cast(naive_part, pa.timestamp("ns")).cast(pa.int64()).fill_null(0).to_numpy()
    zoned_ns = pc.cast(zoned_part, pa.timestamp("ns", tz="UTC")).cast(pa.int64()).fill_null(0).to_numpy()
    mask = _np_mask(zoned)
    out = np.empty(len(arr), dtype=np.int64)
    out[~mask] = naive_ns
    out[mask] = zoned_ns
    valid = _np_mask(pc.is_valid(arr))
    return pa.array(out, mask=~valid)


def _python_iso(text: str) -> int:
    """Fallback per-value parse (Python 3.11 reads 7-digit fractions and ``Z``); ns since the epoch."""
    dt = datetime.fromisoformat(text.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def epoch_unit_of(value: float) -> str | None:
    """The unit in which ``value`` reads as a Unix-epoch time in 2001-2286, or None."""
    for unit, (lo, hi) in _EPOCH_BANDS.items():
        if lo <= abs(value) < hi:
            return unit
    return None


def unit_contradiction(vals: np.ndarray, valid: np.ndarray, unit: str, unit_given: bool = True) -> str | None:
    """Why numeric times contradict ``unit`` (an epoch clock in another unit), or None.
    ``unit_given``: the unit came from --time-unit (else the format fixes it, and the flag cannot help)."""
    if not valid.any():
        return None
    first = float(np.min(vals[valid]))
    seen = epoch_unit_of(first)
    if seen is None or seen == unit:
        return None
    when = datetime.fromtimestamp(first / {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[seen], tz=UTC)
    if unit_given:
        fix = f"use --time-unit {seen}"
    else:
        fix = (f"this format's times are {unit}: convert them, or read the file as generic JSONL/CSV "
               f"(--format jsonl|csv --map arrival=... --time-unit {seen})")
    return (f"time unit contradicts the values: {first:.0f} reads as epoch {seen} ({when:%Y-%m-%d}), "
            f"not {unit}; {fix}")


def parse_time_ms(arr: pa.Array | pa.ChunkedArray, unit: str, unit_given: bool = True) -> tuple[pa.Array, BadValues]:
    """Arrival times in whole milliseconds (int64).

    ``iso``: ISO-8601 strings, ms since the Unix epoch (floored, so a 7-digit fraction loses only
    sub-ms digits). ``s``/``ms``/``us``/``ns``: numbers in that unit, rounded to the nearest ms; an
    epoch clock in another unit (``unit_contradiction``) makes every value bad.
    """
    if unit not in TIME_UNITS:
        raise ConfigError(f"unknown time unit {unit!r}; use one of {', '.join(TIME_UNITS)}")
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if unit == "iso":
        if pa.types.is_timestamp(arr.type):
            return pc.divide(arr.cast(pa.timestamp("ns", tz=arr.type.tz)).cast(pa.int64()), 1_000_000), []
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return pa.nulls(len(arr), pa.int64()), [
                (i, f"not an ISO-8601 timestamp: {_repr(arr[i].as_py())}") for i in range(len(arr)) if arr[i].is_valid
            ]
        trimmed = pc.utf8_trim_whitespace(arr)
        trimmed = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, trimmed.type), trimmed)
        bad: BadValues = []
        try:
            ns = _iso_to_ns(trimmed)
        except pa.ArrowInvalid:
            values: list[int | None] = []
            for i, text in enumerate(trimmed.to_pylist()):
                if text is None:
                    values.append(None)
                    continue
                try:
                    values.append(_python_iso(text))
                except ValueError:
                    values.append(None)
                    bad.append((i, f"unparseable timestamp: {_repr(text)}"))
            ns = pa.array(values, pa.int64())
        vals = ns.fill_null(0).to_numpy()
        valid = _np_mask(pc.is_valid(ns))
        ms = np.floor_divide(vals, 1_000_000)
        return pa.array(ms, mask=~valid), bad
    values_f, bad = parse_float(arr)
    bad = [(i, r.replace("not a number", "unparseable timestamp")) for i, r in bad]
    vals = values_f.to_numpy(zero_copy_only=False)
    valid = ~np.isnan(vals)
    wrong_unit = unit_contradiction(vals, valid, unit, unit_given)
    if wrong_unit is not None:
        return pa.nulls(len(vals), pa.int64()), [(i, wrong_unit) for i in _indices(valid)]
    ms = np.rint(np.where(valid, vals, 0) * _MS_PER_UNIT[unit])
    too_big = valid & (np.abs(ms) > 2**62)
    bad += [(i, f"timestamp out of range: {float(vals[i])!r}") for i in _indices(too_big)]
    valid &= ~too_big
    return pa.array(np.where(valid, ms, 0).astype(np.int64), mask=~valid), bad


def ms_to_iso(ms: int) -> str:
    """Epoch ms to an ISO-8601 UTC string (for the trace's ``start_time`` metadata)."""
    dt = datetime.fromtimestamp(ms / 1000.0, tz=UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
