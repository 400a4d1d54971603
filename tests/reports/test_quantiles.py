"""The streamed exact quantiles (reports/quantiles.py) against a full sort and DuckDB's quantile_cont,
and the report's pooled ITL percentiles against quantile_cont over the same samples."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from replay.reports import quantiles
from replay.reports.metrics import PROBS, compute
from replay.reports.views import open_run
from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace

LEVELS = [0.0, 0.001, 0.25, 0.333, 0.5, 0.7777, 0.9, 0.95, 0.99, 1.0]


def _data(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "lognormal":
        return rng.lognormal(2.0, 1.0, n)
    if kind == "rounded":  # many ties, negatives and zeros
        return np.round(rng.normal(0.0, 5.0, n), 1)
    if kind == "four-values":  # a group of identical keys must be resolved to all 64 bits
        return rng.choice([0.0, 1.5, 2.25, -3.0], n)
    return rng.standard_cauchy(n) * 1e3  # wide exponent range


def _batches(x: np.ndarray, size: int = 97):
    def gen():
        for i in range(0, len(x), size):
            yield x[i:i + size]
    return gen


@pytest.mark.parametrize("collect_max", [1, 50, 1 << 22])
@pytest.mark.parametrize("kind", ["lognormal", "rounded", "four-values", "cauchy"])
def test_order_statistics_equal_a_full_sort(kind, collect_max, monkeypatch):
    monkeypatch.setattr(quantiles, "COLLECT_MAX", collect_max)  # 1: every rank resolved by radix passes
    rng = np.random.default_rng(len(kind) * 7 + collect_max)
    for n in (1, 2, 3, 500, 2999):
        x = _data(kind, n, rng)
        ranks = sorted({0, n - 1, n // 2, (n * 9) // 10, int(rng.integers(0, n))})
        got = quantiles.select_ranks(_batches(x), n, ranks)
        assert got == {r: float(v) for r, v in zip(ranks, np.sort(x)[ranks], strict=True)}


@pytest.mark.parametrize("collect_max", [4, 1 << 22])
@pytest.mark.parametrize("kind", ["lognormal", "rounded", "four-values", "cauchy"])
def test_quantile_cont_equals_duckdb(kind, collect_max, monkeypatch):
    monkeypatch.setattr(quantiles, "COLLECT_MAX", collect_max)
    rng = np.random.default_rng(len(kind) + collect_max)
    con = duckdb.connect()
    for _ in range(25):
        n = int(rng.integers(1, 3000))
        x = _data(kind, n, rng)
        con.register("t", {"x": x})
        want = con.execute("SELECT quantile_cont(x, $p) FROM t", {"p": LEVELS}).fetchall()[0][0]
        assert quantiles.quantile_cont(_batches(x), n, LEVELS) == want


def test_no_values_is_null():
    assert quantiles.quantile_cont(_batches(np.empty(0)), 0, LEVELS) is None


def test_report_itl_percentiles_are_quantile_cont_of_the_samples(tmp_path):
    trace = write_trace(tmp_path / "trace.parquet", TraceSpec(n_requests=800, seed=5))
    outdir = write_run(tmp_path / "run", trace, RunSpec(seed=2))
    run = open_run(outdir)
    try:
        want = run.con.execute("SELECT quantile_cont(itl_ms, $p) FROM itl_gaps WHERE itl_ms IS NOT NULL",
                               {"p": list(PROBS)}).fetchall()[0][0]
        dist = compute(run).dists["itl"]
    finally:
        run.con.close()
    assert dist.count > 10_000
    assert [dist.percentiles[round(p * 100)] for p in PROBS] == want


def test_itl_from_runs_equals_itl_from_chunk_rows(tmp_path):
    """The report's ITL from the chunk runs (never expanded) equals the one from the same chunks stored
    one row per chunk (the layout before runs, still read): count, max, quantiles and histogram
    exactly, the mean to the last bits (both compensated sums, in different orders)."""
    import shutil

    import pyarrow.parquet as pq

    import replay.reports.metrics as metrics
    from replay.engine.output_schema import CHUNK_ROWS_SCHEMA
    from replay.reports.views import read_chunks

    trace = write_trace(tmp_path / "trace.parquet", TraceSpec(n_requests=600, seed=9))
    outdir = write_run(tmp_path / "run", trace, RunSpec(seed=4, mtp_k=2))
    rows_dir = tmp_path / "rows"
    shutil.copytree(outdir, rows_dir)
    pq.write_table(read_chunks(outdir).cast(CHUNK_ROWS_SCHEMA), rows_dir / "chunks.parquet")

    def itl(path):
        run = open_run(path)
        try:
            return metrics.itl_row(run, histograms=True)
        finally:
            run.con.close()

    (runs_row, runs_hists), (rows_row, rows_hists) = itl(outdir), itl(rows_dir)
    assert runs_hists == rows_hists and runs_row["itl_count"] > 5_000
    assert {k: runs_row[k] for k in ("itl_count", "itl_max", "itl_quantiles")} == \
        {k: rows_row[k] for k in ("itl_count", "itl_max", "itl_quantiles")}
    assert runs_row["itl_mean"] == pytest.approx(rows_row["itl_mean"], rel=1e-13)
