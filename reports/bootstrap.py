"""Paired bootstrap confidence intervals for the change in mean and p99 between two configs.

Requests are paired by request_id, so each resample draws request indices once and applies them to
both runs: the interval reflects the per-request correlation (much tighter than comparing two
independent samples). Percentile intervals (2.5%, 97.5%) from seeded resamples: deterministic.

Speed: at 1M pairs a naive p99 per resample sorts a million values. A resample's p99 only depends on
the draws that land in the top tail of each run, so we keep the indices of the union U of the top
TAIL_FRACTION of every series and take the resample's order statistics from the draws that hit U.
This is exact, not an approximation: every draw outside a series' tail is smaller than (or equal to)
every tail value of that series, so the top order statistics come from the tail draws as long as
enough draws land in the tail; when they do not (probability ~0 at TAIL_FRACTION = 3 x (1 - q)),
that resample falls back to the full computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

QUANTILE = 0.99
TAIL_FRACTION = 0.03
TAIL_MIN_N = 20_000  # below this, resamples are computed in full (cheap anyway)
CI_LEVEL = 0.95


def default_resamples(n: int) -> int:
    """1000 resamples up to 100k pairs, fewer above so a 1M-pair diff stays within seconds (min 200)."""
    if n <= 100_000:
        return 1000
    return max(200, int(1000 * 100_000 / n))


@dataclass(frozen=True)
class Interval:
    estimate: float | None
    low: float | None
    high: float | None

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


@dataclass(frozen=True)
class PairedChange:
    n: int
    resamples: int
    mean_delta: Interval   # mean(B - A)
    p99_delta: Interval    # p99(B) - p99(A)


def _order_stat_quantile(top_desc: np.ndarray, n: int, q: float) -> float:
    """numpy 'linear' percentile of a size-n sample from its largest values sorted descending."""
    h = (n - 1) * q
    lo = math.floor(h)
    frac = h - lo
    v_lo = top_desc[n - 1 - lo]
    v_hi = top_desc[n - 1 - min(lo + 1, n - 1)]
    return float(v_lo + frac * (v_hi - v_lo))


class _Tail:
    """Top-tail membership of one series, for the exact fast resampled quantile."""

    def __init__(self, values: np.ndarray, q: float) -> None:
        n = len(values)
        self.values = values
        self.n = n
        self.need = n - math.floor((n - 1) * q)  # largest order statistics the quantile reads
        k = min(n, max(self.need + 1, math.ceil(TAIL_FRACTION * n)))
        self.mask = np.zeros(n, dtype=bool)
        self.mask[np.argpartition(values, n - k)[n - k:]] = True

    def quantile(self, idx: np.ndarray, hits: np.ndarray, q: float) -> float:
        """Resampled quantile from the draws ``hits`` (indices into U) of the draw array ``idx``."""
        in_tail = self.mask[hits]
        if int(in_tail.sum()) < self.need:  # too few draws in the tail: compute in full
            return float(np.percentile(self.values[idx], q * 100))
        vals = self.values[hits[in_tail]]
        top = np.partition(vals, len(vals) - self.need)[len(vals) - self.need:]
        return _order_stat_quantile(np.sort(top)[::-1], self.n, q)


def paired_bootstrap(pairs: dict[str, tuple[np.ndarray, np.ndarray]], *, resamples: int | None = None,
                     seed: int = 0, q: float = QUANTILE) -> dict[str, PairedChange]:
    """For each name -> (a, b) paired arrays (same length, same pairing): CIs for mean(b - a) and
    quantile_q(b) - quantile_q(a). All series share the resampled indices (one paired resample)."""
    names = list(pairs)
    arrays = {k: (np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)) for k, (a, b) in pairs.items()}
    n = len(next(iter(arrays.values()))[0]) if arrays else 0
    if n == 0:
        empty = Interval(None, None, None)
        return {k: PairedChange(0, 0, empty, empty) for k in names}
    estimates = {k: (float((b - a).mean()), float(np.percentile(b, q * 100) - np.percentile(a, q * 100)))
                 for k, (a, b) in arrays.items()}
    r = resamples if resamples is not None else default_resamples(n)
    if n < 2 or r <= 0:
        return {k: PairedChange(n, 0, Interval(m, None, None), Interval(p, None, None)) for k, (m, p) in estimates.items()}
    fast = n >= TAIL_MIN_N
    u = n
    if fast:
        # Relabel so the union of all tails comes first: a draw hits a tail iff its index < u.
        tails = {k: (_Tail(a, q), _Tail(b, q)) for k, (a, b) in arrays.items()}
        union = np.zeros(n, dtype=bool)
        for ta, tb in tails.values():
            union |= ta.mask | tb.mask
        perm = np.concatenate([np.flatnonzero(union), np.flatnonzero(~union)])
        u = int(union.sum())
        arrays = {k: (a[perm], b[perm]) for k, (a, b) in arrays.items()}
        for ta, tb in tails.values():
            for t in (ta, tb):
                t.values, t.mask = t.values[perm], t.mask[perm]
    deltas = {k: b - a for k, (a, b) in arrays.items()}
    rng = np.random.default_rng(seed)
    means = {k: np.empty(r) for k in names}
    pdelta = {k: np.empty(r) for k in names}
    for i in range(r):
        idx = rng.integers(0, n, size=n)  # intp: np.take would convert narrower indices
        hits = idx[idx < u] if fast else idx
        for k in names:
            means[k][i] = np.take(deltas[k], idx).mean()
            if fast:
                ta, tb = tails[k]
                pdelta[k][i] = tb.quantile(idx, hits, q) - ta.quantile(idx, hits, q)
            else:
                a, b = arrays[k]
                pdelta[k][i] = np.percentile(np.take(b, idx), q * 100) - np.percentile(np.take(a, idx), q * 100)
    lo, hi = (1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100
    out = {}
    for k in names:
        m_lo, m_hi = np.percentile(means[k], [lo, hi])
        p_lo, p_hi = np.percentile(pdelta[k], [lo, hi])
        m_est, p_est = estimates[k]
        out[k] = PairedChange(n, r, Interval(m_est, float(m_lo), float(m_hi)), Interval(p_est, float(p_lo), float(p_hi)))
    return out
