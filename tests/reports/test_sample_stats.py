"""The streamed statistics (reports/sample_stats.py) against numpy's over the whole array, exactly:
every result must be the same double (same sign of zero, NaN where numpy gives NaN), whatever the
size and however the values arrive in batches."""

from __future__ import annotations

import json
import math
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.reports import export as export_mod
from replay.reports import quantiles, sample_stats
from replay.reports.export import export
from replay.reports.sample_stats import SampleSpill, stats_of
from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace

SIZES = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 127, 128, 129, 130, 136, 255, 256, 257, 1000, 8191, 8192, 8193,
         65_535, 65_536, 65_537, 100_003, 300_001]
KINDS = ["wide", "lognormal", "rounded", "equal", "negative", "extremes", "subnormal"]


def _numpy(a: np.ndarray) -> dict[str, float]:
    """What the export computed before: numpy over the whole array."""
    if not len(a):
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
            "p99": float(np.percentile(a, 99))}


def _same(x: float, y: float) -> bool:
    """The same double: ``==`` plus the sign of zero; NaN matches NaN."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def _assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    bad = {k: (got[k], want[k]) for k in want if not _same(got[k], want[k])}
    assert not bad, bad


def _data(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "wide":  # magnitudes over 26 decades, both signs: the summation order shows
        return rng.standard_normal(n) * np.exp(rng.uniform(-30.0, 30.0, n))
    if kind == "lognormal":  # latency-like
        return rng.lognormal(2.0, 1.0, n)
    if kind == "rounded":  # many ties, zeros
        return np.round(rng.normal(0.0, 5.0, n), 1)
    if kind == "equal":
        return np.full(n, 0.1)
    if kind == "negative":
        return -rng.lognormal(0.0, 2.0, n)
    if kind == "extremes":  # huge and tiny together: sums overflow or cancel
        return rng.choice([1e308, -1e308, 1e300, 1e-300, -2.5e-310, 3.0, -0.5], n)
    return rng.choice([5e-324, 1e-310, -3e-320, 2.2250738585072014e-308], n)  # subnormal


def _spill(a: np.ndarray, rng: np.random.Generator) -> SampleSpill:
    """The values added in random batches (empty ones included)."""
    spill = SampleSpill()
    cuts = np.sort(rng.integers(0, len(a) + 1, int(rng.integers(0, 12))))
    for lo, hi in zip([0, *cuts], [*cuts, len(a)], strict=True):
        spill.add(a[lo:hi])
    return spill


@pytest.mark.parametrize("kind", KINDS)
def test_equals_numpy_at_every_size(kind):
    rng = np.random.default_rng(len(kind))
    for n in SIZES:
        a = _data(kind, n, rng)
        with np.errstate(over="ignore", invalid="ignore"):
            want = _numpy(a)
            _assert_same(stats_of(a), want)
            spill = _spill(a, rng)
            try:
                assert spill.n == n
                _assert_same(spill.stats(), want)
            finally:
                spill.close()


@pytest.mark.parametrize("unit", [128, 200, 1024])
def test_small_units_walk_the_tree_from_the_root(unit, monkeypatch):
    # UNIT is the largest subtree summed at once; below it the root's splits are walked one by one.
    monkeypatch.setattr(sample_stats, "UNIT", unit)
    monkeypatch.setattr(sample_stats, "READ_BATCH", 333)
    monkeypatch.setattr(quantiles, "COLLECT_MAX", 5)  # order statistics resolved by radix passes
    rng = np.random.default_rng(unit)
    for n in (129, 255, 256, 1000, 8193, 20_011):
        a = _data("wide", n, rng)
        _assert_same(stats_of(a), _numpy(a))


def test_large_sample_through_a_spill():
    rng = np.random.default_rng(7)
    a = _data("wide", 2_000_003, rng)
    spill = _spill(a, rng)
    try:
        _assert_same(spill.stats(), _numpy(a))
    finally:
        spill.close()


def test_sums_are_add_reduce_with_signed_zeros():
    # The reduction starts from +0.0: an all -0.0 sample sums to +0.0; fewer than 8 start from -0.0.
    for n in (1, 2, 7, 8, 9, 200):
        for a in (np.full(n, -0.0), np.full(n, 0.0), np.where(np.arange(n) % 2, -0.0, 0.0)):
            got = sample_stats.pairwise_sum(lambda lo, m, a=a: a[lo:lo + m], n)
            assert _same(got, float(np.add.reduce(a))), (n, a[:4])
        for a in (np.full(n, -0.0), np.full(n, 0.0)):  # one sign of zero: the order statistics too
            _assert_same(stats_of(a), _numpy(a))
    assert _same(sample_stats.pairwise_sum(lambda lo, m: np.empty(0), 0), float(np.add.reduce(np.empty(0))))


def test_nan_and_infinities():
    rng = np.random.default_rng(3)
    for n in (1, 2, 9, 300):
        base = rng.lognormal(0.0, 1.0, n)
        for special in (math.nan, math.inf, -math.inf):
            a = base.copy()
            a[int(rng.integers(0, n))] = special
            with np.errstate(invalid="ignore"):
                _assert_same(stats_of(a), _numpy(a))


_FLOATS = st.floats(width=64, allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_FLOATS, max_size=700), cuts=st.lists(st.integers(0, 700), max_size=8),
       unit=st.sampled_from([128, 136, 1 << 16]))
def test_property_sums_equal_numpy(values, cuts, unit):
    # Any doubles, -0.0 included: sum, mean and std, batched anyhow.
    a = np.array(values, dtype=np.float64)
    with mock.patch.object(sample_stats, "UNIT", unit), np.errstate(all="ignore"):
        spill = SampleSpill()
        try:
            edges = sorted(c % (len(a) + 1) for c in cuts)
            for lo, hi in zip([0, *edges], [*edges, len(a)], strict=True):
                spill.add(a[lo:hi])
            if not len(a):
                _assert_same(spill.stats(), _numpy(a))
                return
            mu = sample_stats.mean(spill.read, spill.n)
            assert _same(mu, float(a.mean()))
            assert _same(sample_stats.std(spill.read, spill.n, mu), float(a.std()))
        finally:
            spill.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_FLOATS.map(lambda x: 0.0 if x == 0 else x), max_size=700),
       cuts=st.lists(st.integers(0, 700), max_size=8), unit=st.sampled_from([128, 1 << 16]),
       collect_max=st.sampled_from([1, 1 << 22]))
def test_property_all_statistics_equal_numpy(values, cuts, unit, collect_max):
    # Every statistic, for samples without -0.0 (see the module doc on the sign of a selected zero).
    a = np.array(values, dtype=np.float64)
    with mock.patch.object(sample_stats, "UNIT", unit), mock.patch.object(quantiles, "COLLECT_MAX", collect_max), \
            np.errstate(all="ignore"):
        spill = SampleSpill()
        try:
            edges = sorted(c % (len(a) + 1) for c in cuts)
            for lo, hi in zip([0, *edges], [*edges, len(a)], strict=True):
                spill.add(a[lo:hi])
            _assert_same(spill.stats(), _numpy(a))
        finally:
            spill.close()


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40).map(lambda v: [x or 0.0 for x in v]),
       repeat=st.integers(1, 400))
def test_property_many_ties(values, repeat):
    # Few distinct values repeated: order statistics inside long runs of equal keys.
    a = np.tile(np.array(values, dtype=np.float64), repeat)
    _assert_same(stats_of(a), _numpy(a))


class _InMemory:
    """The export's statistics as they were before the spill: numpy over the concatenated samples."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []

    def add(self, values: np.ndarray) -> None:
        self.parts.append(np.asarray(values, dtype=np.float64))

    def stats(self) -> dict[str, float]:
        return _numpy(np.concatenate(self.parts) if self.parts else np.empty(0))

    def close(self) -> None:
        pass


def test_vllm_bench_export_bytes_equal_numpy_statistics(tmp_path: Path, monkeypatch) -> None:
    trace = write_trace(tmp_path / "trace.parquet", TraceSpec(n_requests=700, seed=11))
    outdir = write_run(tmp_path / "run", trace, RunSpec(seed=3))
    monkeypatch.setattr(sample_stats, "UNIT", 256)  # the tree walked from its root on about 20 k gaps
    monkeypatch.setattr(quantiles, "COLLECT_MAX", 64)
    streamed = export(outdir, "vllm-bench", tmp_path / "streamed.json").read_bytes()
    monkeypatch.setattr(export_mod, "SampleSpill", _InMemory)
    in_memory = export(outdir, "vllm-bench", tmp_path / "numpy.json").read_bytes()
    assert streamed == in_memory
    doc = json.loads(streamed)
    assert sum(map(len, doc["itls"])) > 10_000 and doc["p99_itl_ms"] > doc["median_itl_ms"] > 0
