"""Exact quantiles of a column too large to hold twice: DuckDB's ``quantile_cont`` result, bit for bit,
from a few streamed passes instead of one in-memory sort.

``quantile_cont`` gathers every value of its column into one buffer and partially sorts it: over the
50 M pooled ITL samples of a 1 M-request run that is a 512 MB allocation DuckDB cannot spill, so a
report could not stay under its memory limit. Here the values are read in batches (DuckDB's
streaming result) and the wanted order statistics are found by radix selection on an order-preserving
integer image of each double: a histogram of the key's top 16 bits tells which bucket holds each wanted
rank; the next pass looks only inside those buckets (their next 16 bits, or their values once few
enough to sort). Memory is one batch plus a 65,536-bucket histogram per wanted bucket.

The interpolation is DuckDB's (``Interpolator<false>`` and ``InterpolateOperator`` for DOUBLE in its
source): ``RN = (n - 1) * q``, the values ``lo``, ``hi`` at ``floor(RN)`` and ``ceil(RN)`` in
ascending order, ``d = RN - floor(RN)``, and ``lo * (1 - d) + hi * d``, which the DuckDB 2.0.1 x86-64
wheel evaluates as one fused multiply-add, ``fma(lo, 1 - d, hi * d)`` (found by comparing against it:
the plain two-product sum differs in the last bit on about 15% of quantiles). The fused form is
computed exactly here (``_fma``). tests/reports/test_quantiles.py checks the order statistics exactly
and the result against ``quantile_cont``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

import numpy as np

RADIX_BITS = 16            # bits of the key resolved per pass: 65,536 buckets
COLLECT_MAX = 1 << 22      # a bucket with at most this many values (32 MB) is gathered and sorted
_SIGN = np.uint64(1 << 63)


def _keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys ordered as the doubles are (negatives flipped, positives with the sign bit set)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _value(key: int) -> float:
    bits = key & ~(1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def select_ranks(batches: Callable[[], Iterable[np.ndarray]], n: int, ranks: Iterable[int]) -> dict[int, float]:
    """The values at 0-based ``ranks`` of the ascending order of all ``n`` values ``batches()`` yields
    (called once per pass; every call must yield the same values)."""
    # Each wanted rank lives in a group: the values whose key starts with `prefix` (`known` bits long),
    # where it is the `local`-th smallest of `size` values.
    pending = {r: (0, 0, r, n) for r in sorted(set(ranks))}
    out: dict[int, float] = {}
    while pending:
        for r, (known, prefix, _, _) in list(pending.items()):
            if known == 64:  # every value of its group has the same key: that value is the answer
                out[r] = _value(prefix)
                del pending[r]
        if not pending:
            break
        groups = {(known, prefix): size for known, prefix, _, size in pending.values()}
        collect = {g for g, size in groups.items() if size <= COLLECT_MAX}
        hist = {g: np.zeros(1 << RADIX_BITS, dtype=np.int64) for g in groups if g not in collect}
        gathered: dict[tuple[int, int], list[np.ndarray]] = {g: [] for g in collect}
        for values in batches():
            keys = _keys(values)
            for known, prefix in groups:
                if known:
                    inside = (keys >> np.uint64(64 - known)) == np.uint64(prefix)
                    sel_keys, sel_values = keys[inside], values[inside]
                else:
                    sel_keys, sel_values = keys, values
                if (known, prefix) in collect:
                    gathered[(known, prefix)].append(np.array(sel_values, dtype=np.float64))
                else:
                    digit = (sel_keys >> np.uint64(64 - known - RADIX_BITS)) & np.uint64((1 << RADIX_BITS) - 1)
                    hist[(known, prefix)] += np.bincount(digit.astype(np.intp), minlength=1 << RADIX_BITS)
        for r, (known, prefix, local, _size) in list(pending.items()):
            g = (known, prefix)
            if g in collect:
                values = np.sort(np.concatenate(gathered[g]) if gathered[g] else np.empty(0))
                out[r] = float(values[local])
                del pending[r]
            else:
                cum = np.cumsum(hist[g])
                digit = int(np.searchsorted(cum, local, side="right"))
                below = int(cum[digit - 1]) if digit else 0
                pending[r] = (known + RADIX_BITS, (prefix << RADIX_BITS) | digit, local - below, int(hist[g][digit]))
    return out


def _fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once (math.fma arrives in Python 3.13): exact rational arithmetic, then one
    correctly rounded conversion."""
    if not all(map(math.isfinite, (a, b, c))):
        return a * b + c
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def interpolate(lo: float, hi: float, d: float) -> float:
    """DuckDB's linear interpolation of a DOUBLE quantile (see the module doc)."""
    return _fma(lo, 1.0 - d, hi * d)


def quantile_cont(batches: Callable[[], Iterable[np.ndarray]], n: int, probs: Sequence[float]) -> list[float] | None:
    """DuckDB's ``quantile_cont(x, probs)`` over the ``n`` non-null values ``batches()`` yields; None
    when there are none (SQL NULL)."""
    if n == 0:
        return None
    spots = []
    for q in probs:
        rn = (n - 1) * float(q)
        spots.append((rn, math.floor(rn), math.ceil(rn)))
    found = select_ranks(batches, n, {i for _, lo, hi in spots for i in (lo, hi)})
    out = []
    for rn, lo, hi in spots:
        if lo == hi:
            out.append(found[lo])
        else:
            out.append(interpolate(found[lo], found[hi], rn - lo))
    return out
