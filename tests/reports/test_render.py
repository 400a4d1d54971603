"""`replay report` and `replay sql`: the markdown renders, charts are valid PNGs, output is deterministic,
and bad input gets a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from replay.base.errors import ReplayError
from replay.cli import app
from replay.reports.report import write_report
from replay.reports.slo import Slo, parse_slo
from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("render")
    trace = write_trace(root / "trace.parquet", TraceSpec(n_requests=1200, seed=11))
    return write_run(root / "run", trace, RunSpec(seed=5, mtp_k=2, offload=True))


def test_report_renders_with_all_sections_and_valid_charts(run_dir, tmp_path):
    out = tmp_path / "rep" / "report.md"
    res = write_report(run_dir, out, slo=Slo(ttft=500, tpot=50), json_path=tmp_path / "m.json")
    text = out.read_text()
    for heading in ("## Summary", "## Warnings", "## Latency", "## Prefix reuse", "## Scheduler", "## Over time",
                    "## Provenance", "## Config"):
        assert heading in text
    assert "Serving Benchmark Result" in text and "Request goodput (req/s)" in text
    assert "numpy.percentile" in text
    assert "MTP acceptance rate" in text and "CPU (G2) hits" in text
    assert "uncalibrated timing constants" in text
    assert set(res.charts) == {"ttft_cdf", "itl_cdf", "latency_over_time", "queue_depth", "kv_usage", "reuse_by_turn",
                               "fleet_over_time"}  # an SLO given: attainment per window
    for name, path in res.charts.items():
        assert f"](report_files/{path.name})" in text, name
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        img = mpimg.imread(path)
        assert img.shape[0] >= 400 and img.shape[1] >= 600
        assert img[..., :3].std() > 0.05  # not blank
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["dists"]["ttft"]["count"] == res.metrics.dists["ttft"].count
    assert metrics["goodput"]["good_requests"] == res.metrics.goodput["good_requests"]


def test_report_is_deterministic(run_dir, tmp_path):
    a = write_report(run_dir, tmp_path / "a" / "r.md")
    b = write_report(run_dir, tmp_path / "b" / "r.md")
    assert a.markdown.read_text() == b.markdown.read_text()
    for name in a.charts:
        assert a.charts[name].read_bytes() == b.charts[name].read_bytes(), name


def test_report_without_trace_says_the_ideal_is_unavailable(run_dir, tmp_path):
    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    info = json.loads((moved / "run.json").read_text())
    info["trace"]["path"] = str(tmp_path / "gone.parquet")
    (moved / "run.json").write_text(json.dumps(info))
    res = write_report(moved, tmp_path / "r.md", charts=False)
    text = res.markdown.read_text()
    assert res.metrics.ideal is None
    assert "trace not found" in text and "The ideal is unavailable" in text
    assert not (tmp_path / "r_files").exists()


def test_report_uses_the_outdir_trace_copy_when_the_path_moved(run_dir, tmp_path):
    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    shutil.copy(json.loads((run_dir / "run.json").read_text())["trace"]["path"], moved / "trace.parquet")
    info = json.loads((moved / "run.json").read_text())
    info["trace"]["path"] = "/nonexistent/trace.parquet"
    (moved / "run.json").write_text(json.dumps(info))
    res = write_report(moved, tmp_path / "r.md", charts=False)
    assert res.metrics.ideal is not None


def test_bad_outdirs_get_clear_errors(run_dir, tmp_path):
    with pytest.raises(ReplayError, match="no run.json"):
        write_report(tmp_path, tmp_path / "r.md")
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "chunks.parquet").unlink()
    with pytest.raises(ReplayError, match=r"chunks\.parquet: missing"):
        write_report(broken, tmp_path / "r.md")
    shutil.copy(run_dir / "chunks.parquet", broken / "chunks.parquet")
    table = pq.read_table(broken / "requests.parquet").drop_columns(["ttft_ms"])
    pq.write_table(table, broken / "requests.parquet")
    with pytest.raises(ReplayError, match=r"requests\.parquet: field 'ttft_ms' missing"):
        write_report(broken, tmp_path / "r.md")
    (broken / "run.json").write_text("{not json")
    with pytest.raises(ReplayError, match=r"run\.json: cannot read"):
        write_report(broken, tmp_path / "r.md")
    assert not (tmp_path / "r.md").exists()


def test_slo_parsing():
    assert parse_slo("ttft=500,tpot=50") == Slo(ttft=500.0, tpot=50.0)
    assert parse_slo("ttft:300, e2el:2000") == Slo(ttft=300.0, e2e=2000.0)
    assert parse_slo(None) is None
    for bad, msg in (("ttfx=5", "key one of"), ("ttft=abc", "not a number"), ("tpot=-1", "positive")):
        with pytest.raises(ReplayError, match=msg):
            parse_slo(bad)


def test_cli_report_and_sql(run_dir, tmp_path):
    out = tmp_path / "cli.md"
    res = runner.invoke(app, ["report", str(run_dir), "-o", str(out), "--slo", "ttft=500"])
    assert res.exit_code == 0, res.output
    assert out.is_file() and (tmp_path / "cli_files" / "ttft_cdf.png").is_file()
    res = runner.invoke(app, ["report", str(run_dir), "-o", str(out), "--slo", "bogus=1"])
    assert res.exit_code == 2 and "--slo" in res.output

    res = runner.invoke(app, ["sql", str(run_dir), "SELECT status, count(*) AS n FROM requests GROUP BY ALL ORDER BY n DESC",
                              "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    total = pq.read_metadata(run_dir / "requests.parquet").num_rows
    assert sum(r["n"] for r in rows) == total and rows[0]["status"] == "finished"
    res = runner.invoke(app, ["sql", str(run_dir), "SELECT count(*) AS n FROM trace", "--csv"])
    assert res.exit_code == 0 and res.stdout.splitlines() == ["n", str(total)]
    res = runner.invoke(app, ["sql", str(run_dir), "SELECT count(*) AS gaps FROM itl_gaps WHERE itl_ms IS NOT NULL"])
    assert res.exit_code == 0 and "gaps" in res.stdout
    res = runner.invoke(app, ["sql", str(run_dir), "SELECT * FROM no_such_view"])
    assert res.exit_code == 2 and "query failed" in res.output
