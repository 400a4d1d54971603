"""Mean, median, standard deviation and 99th percentile of a sample too large to hold in memory:
numpy's ``mean``, ``median``, ``std`` and ``percentile(a, 99)`` bit for bit, from streamed passes.

Why: ``replay export --format vllm-bench`` prints these four statistics of every pooled ITL gap. A
1 M-request replay has about 220 M of them, 1.76 GB as float64: held in numpy they take the command
past its 2 GB budget. Here the values are appended to an anonymous temp file
(:class:`SampleSpill`) and each statistic reads them back in pieces, so memory stays at one piece.

What is reproduced (numpy 2.4.6, the version in our venv; read in its source):

* ``np.add.reduce`` of a contiguous float64 array (``numpy/_core/src/umath/loops_utils.h.src``,
  ``pairwise_sum``): fewer than 8 values are added in order starting from -0.0; up to 128 values
  (``PW_BLOCKSIZE``) go to 8 accumulators (value ``i`` to accumulator ``i % 8`` for the first
  ``n - n % 8`` values), combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the
  rest added in order; more than 128 values are split at ``n // 2`` rounded down to a multiple of 8
  and the two halves' sums added. The reduction adds that sum to its identity, +0.0 (so an all -0.0
  sample sums to +0.0); over the whole array at once, no chunking at the buffer size (checked
  against ``np.add.reduce`` up to 50 M values).
* ``np.mean`` (``numpy/_core/_methods.py``, ``_mean``): that sum divided by the count.
* ``np.std`` (``_methods.py``, ``_var`` and ``_std``, ddof 0): the mean as above, each value's
  ``subtract`` then ``square``, their pairwise sum divided by the count, then ``sqrt``.
* ``np.median`` (``numpy/lib/_function_base_impl.py``, ``_median``): the middle order statistic, or
  the mean (pairwise sum, so ``a + b``, then ``/ 2``) of the two middle ones; NaN if any value is NaN.
* ``np.percentile(a, 99)`` (same file: ``percentile``, ``_quantile``, ``_get_indexes``, ``_lerp``,
  method ``linear``): ``q = 99 / 100``, virtual index ``(n - 1) * q``, previous index its floor
  (both indexes the last value when the virtual index is at least ``n - 1``, the previous then
  counting as -1 for the weight), weight ``t = index - previous``, and ``a + (b - a) * t``, or
  ``b - (b - a) * (1 - t)`` when ``t >= 0.5``; NaN if any value is NaN.

The order statistics come from ``reports/quantiles.py``'s ``select_ranks`` (exact radix selection).
One thing it cannot copy: numpy's partition leaves equal-comparing -0.0 and +0.0 in an order that
depends on its algorithm and the input order, while the radix order puts -0.0 first; so a sample
holding both zeros where an order statistic falls may differ in the sign of that zero. Export
samples are durations and gaps computed by subtraction (``x - x`` is +0.0), so they hold no -0.0.
tests/reports/test_sample_stats.py compares every statistic with numpy's with ``==``.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Callable, Iterator

import numpy as np

from replay.reports.quantiles import select_ranks

PW_BLOCKSIZE = 128   # numpy's pairwise summation leaf size (loops_utils.h.src)
UNIT = 1 << 16       # a subtree of the summation tree at most this big is read and summed at once (512 KB)
READ_BATCH = 1 << 20  # values per batch of an order-statistics pass (8 MB)

# read(lo, m): the sample's values [lo, lo + m) as a float64 array.
Reader = Callable[[int, int], np.ndarray]


def _split(m: int) -> int:
    """Size of the left half of a pairwise node of m > 128 values: m // 2 down to a multiple of 8."""
    half = m // 2
    return half - half % 8


def _block_sums(x: np.ndarray) -> np.ndarray:
    """numpy's 8-accumulator sum of each row of x (8 <= row length <= 128)."""
    s = x.shape[1]
    full = s - s % 8
    r = x[:, :8].copy()
    for i in range(8, full, 8):
        r += x[:, i:i + 8]
    res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
    for i in range(full, s):
        res += x[:, i]
    return res


class _Plan:
    """The pairwise tree of m > 128 values, level by level from the root: where each leaf block
    starts, and for each level which nodes are split (their value is the sum of the next level's
    pair) and which are leaves (their value is a block sum)."""

    def __init__(self, m: int) -> None:
        sizes, starts = np.array([m], dtype=np.int64), np.array([0], dtype=np.int64)
        leaf_sizes, leaf_starts = [], []
        self.levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (split pos, leaf pos, leaf index)
        n_leaves = 0
        while len(sizes):
            split = sizes > PW_BLOCKSIZE
            leaf = ~split
            k = int(leaf.sum())
            self.levels.append((np.flatnonzero(split), np.flatnonzero(leaf), np.arange(n_leaves, n_leaves + k)))
            leaf_sizes.append(sizes[leaf])
            leaf_starts.append(starts[leaf])
            n_leaves += k
            s, o = sizes[split], starts[split]
            half = s // 2
            half -= half % 8
            sizes = np.column_stack([half, s - half]).ravel()
            starts = np.column_stack([o, o + half]).ravel()
        all_sizes, all_starts = np.concatenate(leaf_sizes), np.concatenate(leaf_starts)
        self.n_leaves = n_leaves
        # Leaves grouped by size: (their indexes among all leaves, the gather index of their values).
        self.groups = []
        for size in np.unique(all_sizes):
            which = np.flatnonzero(all_sizes == size)
            self.groups.append((which, all_starts[which][:, None] + np.arange(size)))

    def total(self, v: np.ndarray) -> float:
        leaves = np.empty(self.n_leaves)
        for which, gather in self.groups:
            leaves[which] = _block_sums(v[gather])
        below = np.empty(0)
        for split_pos, leaf_pos, leaf_idx in reversed(self.levels):
            vals = np.empty(len(split_pos) + len(leaf_pos))
            vals[leaf_pos] = leaves[leaf_idx]
            vals[split_pos] = below[0::2] + below[1::2]
            below = vals
        return float(below[0])


@functools.lru_cache(maxsize=16)
def _plan(m: int) -> _Plan:
    return _Plan(m)


def _pairwise(v: np.ndarray) -> float:
    """numpy's ``pairwise_sum`` of v (held at once)."""
    m = len(v)
    if m < 8:
        res = -0.0
        for x in v.tolist():
            res += x
        return res
    if m <= PW_BLOCKSIZE:
        return float(_block_sums(v[None, :])[0])
    return _plan(m).total(v)


def pairwise_sum(read: Reader, n: int, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """``np.add.reduce`` of the n values ``read`` gives (each passed through ``transform`` first, an
    elementwise map): numpy's summation tree walked from the root, each subtree of at most UNIT
    values read and summed at once."""

    def node(lo: int, m: int) -> float:
        if m <= max(UNIT, PW_BLOCKSIZE):  # numpy splits only above PW_BLOCKSIZE
            v = read(lo, m)
            return _pairwise(v if transform is None else transform(v))
        half = _split(m)
        left = node(lo, half)
        return left + node(lo + half, m - half)

    return 0.0 + (node(0, n) if n else -0.0)  # the reduction's identity, +0.0, plus the tree's sum


def mean(read: Reader, n: int) -> float:
    """``np.mean`` of the n values (n > 0)."""
    return pairwise_sum(read, n) / n


def std(read: Reader, n: int, mu: float) -> float:
    """``np.std`` of the n values (n > 0) whose ``np.mean`` is ``mu``."""
    m = np.float64(mu)
    sq = pairwise_sum(read, n, lambda v: np.square(np.subtract(v, m)))
    return math.sqrt(sq / n)


def _batches(read: Reader, n: int) -> Callable[[], Iterator[np.ndarray]]:
    def gen() -> Iterator[np.ndarray]:
        for lo in range(0, n, READ_BATCH):
            yield read(lo, min(READ_BATCH, n - lo))
    return gen


def median_and_p99(read: Reader, n: int, has_nan: bool) -> tuple[float, float]:
    """``np.median`` and ``np.percentile(a, 99)`` of the n values (n > 0); ``has_nan``: any is NaN."""
    if has_nan:
        return math.nan, math.nan
    mid = [n // 2 - 1, n // 2] if n % 2 == 0 else [(n - 1) // 2]
    vi = (n - 1) * (99 / 100)
    prev = math.floor(vi)
    if vi >= n - 1:
        prev = -1
        ranks = (n - 1, n - 1)
    else:
        ranks = (prev, prev + 1)
    found = select_ranks(_batches(read, n), n, [*mid, *ranks])
    median = (0.0 + _pairwise(np.array([found[r] for r in mid]))) / len(mid)  # np.mean of the middle value(s)
    a, b, t = found[ranks[0]], found[ranks[1]], vi - prev
    diff = b - a
    p99 = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    return median, p99


def sample_stats(read: Reader, n: int, has_nan: bool) -> dict[str, float]:
    """mean, median, std and p99 of the n values (all 0.0 for an empty sample, as the export writes
    them); ``has_nan``: any value is NaN."""
    if not n:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}
    mu = mean(read, n)
    sd = std(read, n, mu)
    median, p99 = median_and_p99(read, n, has_nan)
    return {"mean": mu, "median": median, "std": sd, "p99": p99}


class SampleSpill:
    """Float64 samples appended to an anonymous temp file (gone when closed), and their statistics
    as numpy computes them over the whole array, read back in passes."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()
        self.n = 0
        self._has_nan = False

    def add(self, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values, dtype=np.float64)
        if len(v):
            self._file.write(memoryview(v).cast("B"))
            self.n += len(v)
            self._has_nan = self._has_nan or bool(np.isnan(v).any())

    def read(self, lo: int, m: int) -> np.ndarray:
        out = np.empty(m, dtype=np.float64)
        self._file.seek(lo * 8)
        got = self._file.readinto(memoryview(out).cast("B"))
        if got != m * 8:
            raise OSError(f"sample spill file: read {got} of {m * 8} bytes at value {lo}")
        return out

    def stats(self) -> dict[str, float]:
        """``sample_stats`` of the values added so far."""
        self._file.flush()
        return sample_stats(self.read, self.n, self._has_nan)

    def close(self) -> None:
        self._file.close()


def stats_of(values: np.ndarray) -> dict[str, float]:
    """``sample_stats`` of an array in memory."""
    a = np.ascontiguousarray(values, dtype=np.float64)
    return sample_stats(lambda lo, m: a[lo:lo + m], len(a), bool(np.isnan(a).any()))
