"""Paired bootstrap confidence intervals for the change in mean and p99 between two configs.

Requests are paired by request_id, so each resample draws request indices once and applies them to
both runs: the interval reflects the per-request correlation (much tighter than comparing two
independent samples). Percentile intervals (2.5%, 97.5%) from seeded resamples: deterministic.

Each resample is n draws with replacement, ``rng.integers(0, n, size=n)`` from
``numpy.random.default_rng(seed)``, one call per resample in the paired order (request_id). The
statistics only depend on how often each request was drawn, so a resample is reduced to its counts
(``np.bincount``) once and every series is read from them:

- the resampled mean of a delta is ``counts . delta / n`` (one sequential dot product instead of a
  random gather of n values per series);
- the resampled p99 of a series comes from its top tail only. We keep the TAIL_FRACTION largest
  values of the series (its "tail", sorted once, descending); every other value is smaller than (or
  equal to) every tail value, so the resample's largest order statistics are the tail values
  repeated by their counts, as long as enough draws land in the tail. A cumulative sum of the
  tail's counts locates the two order statistics numpy's linear percentile interpolates between.
  This is exact, not an approximation; when too few draws land in the tail (probability ~0 at
  TAIL_FRACTION = 3 x (1 - q)) that resample is computed in full. Below TAIL_MIN_N pairs the whole
  series is the tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

QUANTILE = 0.99
TAIL_FRACTION = 0.03
TAIL_MIN_N = 20_000  # below this the whole series is the "tail" (cheap anyway)
CI_LEVEL = 0.95
# A 95% percentile interval reads the 2.5th and 97.5th percentiles of the resampled statistics: below
# 100 resamples those are a handful of draws (with one resample, the draw itself), not an interval, so
# no interval is given (and nothing is marked significant).
MIN_RESAMPLES = 100


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


def _lerp(lo: float, hi: float, t: float) -> float:
    """numpy.percentile's linear interpolation, bit for bit (it switches form at t = 0.5)."""
    d = hi - lo
    return float(hi - d * (1 - t)) if t >= 0.5 else float(lo + d * t)


class _Tail:
    """The largest values of one series, sorted descending, for the exact resampled quantile."""

    def __init__(self, values: np.ndarray, q: float) -> None:
        n = len(values)
        self.values = values
        self.n = n
        self.q = q
        h = (n - 1) * q                       # numpy's virtual index (method 'linear')
        self.lo = math.floor(h)
        self.frac = h - self.lo
        self.need = n - self.lo               # largest order statistics the quantile reads
        k = n if n < TAIL_MIN_N else min(n, max(self.need + 1, math.ceil(TAIL_FRACTION * n)))
        top = np.argpartition(values, n - k)[n - k:] if k < n else np.arange(n)
        self.index = top[np.argsort(values[top], kind="stable")[::-1]]  # tail positions, values descending
        self.sorted_desc = values[self.index]

    def quantile(self, counts: np.ndarray) -> float:
        """The q-quantile of the resample that drew position i counts[i] times."""
        cum = np.cumsum(counts[self.index])
        if cum[-1] < self.need:  # too few draws in the tail: compute in full
            return float(np.percentile(np.repeat(self.values, counts), self.q * 100))
        # m-th largest value (1-based) = first tail position whose cumulative count reaches m.
        i_lo, i_hi = np.searchsorted(cum, [self.n - self.lo, self.n - min(self.lo + 1, self.n - 1)])
        return _lerp(self.sorted_desc[i_lo], self.sorted_desc[i_hi], self.frac)


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
    if n < 2 or r < MIN_RESAMPLES:
        return {k: PairedChange(n, 0, Interval(m, None, None), Interval(p, None, None)) for k, (m, p) in estimates.items()}
    deltas = np.stack([b - a for a, b in arrays.values()])  # one row per series
    tails = [(_Tail(a, q), _Tail(b, q)) for a, b in arrays.values()]
    rng = np.random.default_rng(seed)
    means = np.empty((len(names), r))
    pdelta = np.empty((len(names), r))
    for i in range(r):
        counts = np.bincount(rng.integers(0, n, size=n), minlength=n)
        means[:, i] = deltas @ counts.astype(np.float64) / n
        for j, (ta, tb) in enumerate(tails):
            pdelta[j, i] = tb.quantile(counts) - ta.quantile(counts)
    lo, hi = (1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100
    out = {}
    for j, k in enumerate(names):
        m_lo, m_hi = np.percentile(means[j], [lo, hi])
        p_lo, p_hi = np.percentile(pdelta[j], [lo, hi])
        m_est, p_est = estimates[k]
        out[k] = PairedChange(n, r, Interval(m_est, float(m_lo), float(m_hi)), Interval(p_est, float(p_lo), float(p_hi)))
    return out
