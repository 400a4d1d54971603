"""`replay diff`: a run against itself shows zero change, a slower config loses, different traces are
refused, and the paired bootstrap is exact and deterministic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from replay.base.errors import ReplayError
from replay.cli import app
from replay.reports import bootstrap as bs
from replay.reports.diff import diff_runs, write_diff
from replay.reports.metrics import compute
from replay.reports.slo import Slo
from replay.reports.views import open_run
from tests.reports_fixtures import RunSpec, TraceSpec, make_pair, write_run, write_trace

runner = CliRunner()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("pair"), n_requests=1500, seed=4)


def test_diff_of_a_run_with_itself_shows_zero_change(pair, tmp_path):
    a, _ = pair
    d = diff_runs(a, a, slo=Slo(ttft=500), resamples=200)
    write_diff(d, tmp_path / "self.md")
    assert d.config_changes == []
    assert d.comparisons and all(c.row_a.value == c.value_b for c in d.comparisons)
    assert {c.winner for c in d.comparisons} <= {"tie", ""}
    for change in d.paired.values():
        for iv in (change.mean_delta, change.p99_delta):
            assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    assert d.top_requests == [] and d.top_sessions == []
    text = (tmp_path / "self.md").read_text()
    assert "The configs are identical." in text
    assert "B is better on 0 metrics, A on 0" in text
    assert "No paired request regressed." in text


def test_slower_config_loses_with_significant_paired_deltas(pair, tmp_path):
    a, b = pair
    d = diff_runs(a, b, resamples=300)
    write_diff(d, tmp_path / "d.md", json_path=tmp_path / "d.json")
    assert d.config_changes == [("scheduler.max_num_seqs", 1024, 256)]
    by_key = {c.key: c for c in d.comparisons}
    assert by_key["ttft_mean"].winner == "A" and by_key["e2e_p99"].winner == "A"
    ttft = d.paired["ttft"]
    assert ttft.mean_delta.low > 0 and ttft.mean_delta.excludes_zero
    assert ttft.mean_delta.low <= ttft.mean_delta.estimate <= ttft.mean_delta.high
    # Paired sample and top movers against pandas.
    ra, rb = pd.read_parquet(a / "requests.parquet"), pd.read_parquet(b / "requests.parquet")
    j = ra.merge(rb, on="request_id", suffixes=("_a", "_b"))
    j = j[(j.status_a == "finished") & (j.status_b == "finished")]
    assert ttft.n == len(j)
    assert ttft.mean_delta.estimate == pytest.approx((j.ttft_ms_b - j.ttft_ms_a).mean(), rel=1e-9)
    p99 = np.percentile(j.ttft_ms_b, 99) - np.percentile(j.ttft_ms_a, 99)
    assert ttft.p99_delta.estimate == pytest.approx(p99, rel=1e-9)
    j = j.assign(delta=j.e2e_ms_b - j.e2e_ms_a)
    worst = j.sort_values("delta", ascending=False).request_id.head(10).tolist()
    assert [r["request_id"] for r in d.top_requests if r["direction"] == "regressed"] == worst
    sess = j.dropna(subset=["session_id_a"]).groupby("session_id_a").delta.sum().sort_values(ascending=False)
    got = [r for r in d.top_sessions if r["direction"] == "regressed"]
    assert [r["session_id"] for r in got] == sess.index[:10].tolist()
    assert got[0]["e2e_delta_total"] == pytest.approx(sess.iloc[0], rel=1e-9)
    text = (tmp_path / "d.md").read_text()
    for part in ("## Config differences", "`scheduler.max_num_seqs`", "## Paired per-request deltas",
                 "## Requests that regressed most", "## Sessions that improved most", "## Reuse and preemptions",
                 "d_files/ttft_cdf.png"):
        assert part in text
    for png in ("ttft_cdf", "itl_cdf", "tpot_cdf", "e2e_cdf"):
        assert (tmp_path / "d_files" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    out = json.loads((tmp_path / "d.json").read_text())
    assert out["paired"]["ttft"]["n"] == ttft.n


def test_diff_metrics_equal_each_runs_own_report_metrics(pair):
    """The diff computes both runs side by side and B borrows A's ideal: every metric is still the one
    `replay report` computes for that run alone."""
    a, b = pair
    d = diff_runs(a, b, resamples=10)
    for outdir, got in zip((a, b), d.metrics, strict=True):
        run = open_run(outdir)
        try:
            alone = compute(run, None)
        finally:
            run.con.close()
        assert got.to_json() == alone.to_json()


def test_diff_is_deterministic(pair, tmp_path):
    a, b = pair
    for name in ("x", "y"):
        write_diff(diff_runs(a, b, resamples=100, seed=3), tmp_path / f"{name}.md", charts=False)
    assert (tmp_path / "x.md").read_text() == (tmp_path / "y.md").read_text()


def test_diff_refuses_different_traces(pair, tmp_path):
    a, _ = pair
    other = write_trace(tmp_path / "other.parquet", TraceSpec(n_requests=300, seed=99))
    c = write_run(tmp_path / "c", other, RunSpec())
    with pytest.raises(ReplayError, match="different traces"):
        diff_runs(a, c)
    res = runner.invoke(app, ["diff", str(a), str(c), "-o", str(tmp_path / "x.md")])
    assert res.exit_code == 2 and "refusing to diff" in res.output
    nofp = tmp_path / "nofp"
    shutil.copytree(a, nofp)
    info = json.loads((nofp / "run.json").read_text())
    del info["trace"]["fingerprint"]
    (nofp / "run.json").write_text(json.dumps(info))
    with pytest.raises(ReplayError, match="no trace.fingerprint"):
        diff_runs(a, nofp)
    # a run from before the v2 fingerprint, of the same trace: the schemes cannot be compared
    from replay.ingest.fingerprint import legacy_fingerprint

    older = tmp_path / "older"
    shutil.copytree(a, older)
    info = json.loads((older / "run.json").read_text())
    info["trace"]["fingerprint"] = legacy_fingerprint(info["trace"]["path"])
    (older / "run.json").write_text(json.dumps(info))
    with pytest.raises(ReplayError, match=f"{older} was replayed by an older replay.*replay it again"):
        diff_runs(older, a)


def test_cli_diff_prints_the_summary(pair, tmp_path):
    a, b = pair
    res = runner.invoke(app, ["diff", str(a), str(b), "-o", str(tmp_path / "c.md"), "--name-a", "big",
                              "--name-b", "small", "--resamples", "100", "--no-charts"])
    assert res.exit_code == 0, res.output
    assert "replay diff: big vs small" in res.output and "Mean TTFT" in res.output
    assert (tmp_path / "c.md").is_file() and not (tmp_path / "c_files").exists()
    res = runner.invoke(app, ["diff", str(a), "-o", str(tmp_path / "c.md")])
    assert res.exit_code == 2 and "two OUTDIRs" in res.output


def test_tail_quantile_is_exact():
    """The resampled p99 from the tail's counts equals numpy's on the same draws (the tail argument is
    exact), for several sizes so the interpolation weight takes values on both sides of 0.5."""
    rng = np.random.default_rng(0)
    for n in (50_000, 50_003, 21_111, 1_000):
        values = np.concatenate([rng.lognormal(3, 1, n - 100), np.full(100, 7.0)])  # ties too
        tail = bs._Tail(values, 0.99)
        assert (len(tail.index) < n) == (n >= bs.TAIL_MIN_N)
        for _ in range(20):
            idx = rng.integers(0, n, size=n)
            assert tail.quantile(np.bincount(idx, minlength=n)) == np.percentile(values[idx], 99)
    # Too few draws in the tail: the full computation takes over, still exact.
    values = np.arange(30_000, dtype=float)
    tail = bs._Tail(values, 0.99)
    idx = np.zeros(30_000, dtype=np.intp)
    idx[:10] = 29_999
    assert tail.quantile(np.bincount(idx, minlength=30_000)) == np.percentile(values[idx], 99)


def _naive_paired_bootstrap(a, b, resamples, seed, q=0.99):
    """The textbook paired percentile bootstrap on the same draws (one rng.integers call per resample)."""
    rng = np.random.default_rng(seed)
    means, p99s = [], []
    for _ in range(resamples):
        idx = rng.integers(0, len(a), size=len(a))
        means.append((b[idx] - a[idx]).mean())
        p99s.append(np.percentile(b[idx], q * 100) - np.percentile(a[idx], q * 100))
    levels = [(1 - bs.CI_LEVEL) / 2 * 100, (1 + bs.CI_LEVEL) / 2 * 100]
    return np.percentile(means, levels), np.percentile(p99s, levels)


@pytest.mark.parametrize("n", [30_000, 5_000])
def test_bootstrap_equals_the_textbook_paired_bootstrap(n):
    """Same seed, same draws: the counts-based bootstrap gives the naive one's intervals (p99 exactly,
    means up to summation rounding), with and without the tail shortcut."""
    rng = np.random.default_rng(1)
    a = rng.lognormal(4, 1, n)
    b = a * 1.05 + rng.normal(0, 3, n)
    got = bs.paired_bootstrap({"x": (a, b)}, resamples=150, seed=2)["x"]
    (m_lo, m_hi), (p_lo, p_hi) = _naive_paired_bootstrap(a, b, 150, 2)
    assert got.resamples == 150 and got.n == n
    assert got.mean_delta.estimate == pytest.approx((b - a).mean(), rel=1e-12)
    assert (got.mean_delta.low, got.mean_delta.high) == (pytest.approx(m_lo, rel=1e-9), pytest.approx(m_hi, rel=1e-9))
    assert (got.p99_delta.low, got.p99_delta.high) == (p_lo, p_hi)
    assert got.p99_delta.estimate == np.percentile(b, 99) - np.percentile(a, 99)
    again = bs.paired_bootstrap({"x": (a, b)}, resamples=150, seed=2)["x"]
    assert again == got


def test_shortcut_reports_missing_api_or_runs(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", TraceSpec(n_requests=50, seed=1))
    (tmp_path / "a.yaml").write_text("scheduler:\n  max_num_seqs: 64\n")
    (tmp_path / "b.yaml").write_text("scheduler:\n  max_num_seqs: 8\n")
    args = ["diff", str(trace), "-a", str(tmp_path / "a.yaml"), "-b", str(tmp_path / "b.yaml"),
            "-o", str(tmp_path / "s.md"), "--no-charts", "--resamples", "100"]
    try:
        import replay.api  # noqa: F401
    except ImportError:
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "replay.api" in res.output
        return
    res = runner.invoke(app, args)  # pragma: no cover - depends on the engine being present
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s_runs" / "a" / "run.json").is_file()
    assert "`scheduler.max_num_seqs`" in (tmp_path / "s.md").read_text()


def test_runs_of_different_slices_of_one_trace_keep_their_own_ideal(tmp_path):
    """The infinite-cache ideal covers the rows a run replayed: two runs of one trace cut by
    load.max_requests at 20 and 60 rows do not share A's (B got A's 20-row figure)."""
    from replay.reports.diff import diff_runs
    from replay.reports.metrics import compute
    from replay.reports.views import open_run
    from tests.cli_helpers import write_sample_run, write_sample_trace

    trace = write_sample_trace(tmp_path / "t.parquet", rows=60)
    a = write_sample_run(tmp_path / "a", trace, "--set", "load.max_requests=20")
    b = write_sample_run(tmp_path / "b", trace)
    d = diff_runs(a, b)
    for side, out in zip(d.metrics, (a, b)):
        run = open_run(out)
        try:
            assert side.ideal == compute(run).ideal
        finally:
            run.con.close()
    assert d.metrics[0].ideal != d.metrics[1].ideal
