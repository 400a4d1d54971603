"""`replay sweep` end to end on a slice of the sample trace: every row equals a direct run of its config,
reruns redo only what is missing, failures are recorded, and the table does not depend on the executor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from replay.api import run as direct_run
from replay.base.errors import ReplayError, TraceError
from replay.cli import app
from replay.reports.metrics import compute, headline
from replay.reports.views import open_run
from replay.sweep.grid import parse_axes, product
from replay.sweep.runner import SweepOptions, SweepSession
from replay.sweep.slo import parse_sweep_slo
from replay.sweep.summary import METRIC_COLUMNS
from tests.sweep_helpers import SAMPLE

GRID = ["load.max_requests=120", "scheduler.max_num_seqs=4,64", "kv_cache.num_gpu_blocks=60,1200,6000"]
SLO = "ttft_p99=1500,tpot_p99=50"


def _sweep(outdir: Path, *extra: str) -> None:
    args = ["sweep", str(SAMPLE), "-o", str(outdir), "--slo", SLO, "-q"]
    for g in GRID:
        args += ["--grid", g]
    result = CliRunner().invoke(app, args + list(extra))
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sw"
    _sweep(out, "-j", "2")
    return out


def _rows(sweepdir: Path) -> list[dict]:
    return pq.read_table(sweepdir / "sweep.parquet").to_pylist()


def test_table_has_one_row_per_config_with_every_column(swept):
    rows = _rows(swept)
    assert len(rows) == 6
    names = pq.read_schema(swept / "sweep.parquet").names
    assert names[:3] == ["load.max_requests", "scheduler.max_num_seqs", "kv_cache.num_gpu_blocks"]
    assert set(METRIC_COLUMNS) <= set(names) and {"config_hash", "outdir", "error"} <= set(names)
    assert [(r["scheduler.max_num_seqs"], r["kv_cache.num_gpu_blocks"]) for r in rows] == [
        (4, 60), (4, 1200), (4, 6000), (64, 60), (64, 1200), (64, 6000)]


def test_summary_columns_cover_every_headline_metric(swept):
    rows = _rows(swept)
    ok = next(r for r in rows if r["error"] is None)
    run = open_run(swept / ok["outdir"])
    keys = {row.key for row in headline(compute(run, parse_sweep_slo(SLO).goodput))}
    run.con.close()
    assert keys - {"ideal_hit_ratio"} <= set(METRIC_COLUMNS)  # the ideal depends on the trace only


def test_every_row_matches_a_direct_run_of_its_config(swept, tmp_path):
    slo = parse_sweep_slo(SLO)
    for i, row in enumerate(_rows(swept)):
        overrides = [f"{k}={row[k]}" for k in ("load.max_requests", "scheduler.max_num_seqs",
                                                "kv_cache.num_gpu_blocks")]
        if row["error"] is not None:
            with pytest.raises(TraceError) as exc:
                direct_run(SAMPLE, None, overrides=overrides, outdir=tmp_path / f"d{i}")
            assert str(exc.value).split(": ", 1)[1] in row["error"]
            assert row["outdir"] is None and row["completed"] is None
            continue
        res = direct_run(SAMPLE, None, overrides=overrides, outdir=tmp_path / f"d{i}")
        for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
            assert (swept / row["outdir"] / name).read_bytes() == (res.outdir / name).read_bytes(), name
        run = open_run(res.outdir)
        want = {r.key: r.value for r in headline(compute(run, slo.goodput))}
        run.con.close()
        for key, value in want.items():
            if key in METRIC_COLUMNS:
                assert row[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        assert row["gpus"] == 1
        assert row["slo_met"] == (row["ttft_p99"] <= 1500 and row["tpot_p99"] <= 50 and row["rejected"] == 0)
        assert row["goodput_per_gpu"] == row["goodput"]
    assert {r["slo_met"] for r in _rows(swept) if r["error"] is None} == {True, False}  # the SLO discriminates


def test_rerun_redoes_only_what_is_missing(swept, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(swept, copy)
    before = (copy / "sweep.parquet").read_bytes()
    opts = SweepOptions(workers=1)
    points = product(parse_axes(GRID))
    session = SweepSession.open(SAMPLE, None, copy, parse_sweep_slo(SLO), opts)
    session.run_points(points)
    assert session.counts["ran"] == 0 and session.counts["reused"] == 6
    # an interrupted sweep: one result record never written, one run directory lost
    records = sorted((copy / "results").glob("*.json"))
    assert len(records) == 6
    records[0].unlink()
    ok_key = next(json.loads(p.read_text())["key"] for p in records[1:] if json.loads(p.read_text())["error"] is None)
    shutil.rmtree(copy / "runs" / ok_key)
    session = SweepSession.open(SAMPLE, None, copy, parse_sweep_slo(SLO), opts)
    results = session.run_points(points)
    assert session.counts["ran"] == 2
    session.write_table(parse_axes(GRID), results)
    assert (copy / "sweep.parquet").read_bytes() == before
    # a failed config is kept as failed unless asked to retry it
    session = SweepSession.open(SAMPLE, None, copy, parse_sweep_slo(SLO), SweepOptions(workers=1, retry_failed=True))
    session.run_points(points)
    assert session.counts["ran"] == 2  # the two configs with 60 KV blocks


def test_inline_and_pool_give_byte_identical_tables(swept, tmp_path):
    out = tmp_path / "inline"
    _sweep(out, "-j", "1")
    assert (out / "sweep.parquet").read_bytes() == (swept / "sweep.parquet").read_bytes()


def test_summary_only_keeps_no_run_directories(swept, tmp_path):
    out = tmp_path / "summary"
    _sweep(out, "--summary-only", "-j", "1")
    assert not any((out / "runs").iterdir())
    a, b = _rows(out), _rows(swept)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k != "outdir"} == {k: v for k, v in rb.items() if k != "outdir"}
    assert all(r["outdir"] is None for r in a)


def test_no_partial_files_and_foreign_directories_refused(swept, tmp_path):
    assert not [p for p in swept.rglob("*") if p.name.endswith((".tmp", ".old"))]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["sweep", str(SAMPLE), "-o", str(foreign), "--grid", "seed=1,2", "-q"])
    assert result.exit_code == 2
    assert "not a sweep directory" in result.output
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_bad_grid_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(SAMPLE), "-o", str(tmp_path / "x"), "--grid", "x=9..1"])
    assert result.exit_code == 2
    assert "LOW <= HIGH" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_an_invalid_combination_is_recorded_and_the_sweep_goes_on(tmp_path):
    session = SweepSession.open(SAMPLE, None, tmp_path / "s", parse_sweep_slo(None), SweepOptions(workers=1))
    points = product(parse_axes(["load.max_requests=20", "kv_cache.num_gpu_blocks=2000",
                                 "kv_cache.kv_cache_size_tokens=null,50000"]))
    results = session.run_points(points)
    assert results[0].error is None and results[0].metrics["completed"] == 20
    assert "num_gpu_blocks or kv_cache_size_tokens" in results[1].error
    session.write_table(parse_axes(["kv_cache.kv_cache_size_tokens=null,50000"]), results)
    rows = _rows(tmp_path / "s")
    assert rows[1]["config_hash"] is None and rows[1]["error"]


def test_sql_views_span_runs_with_a_config_column(swept):
    from replay.reports.sweep_views import open_sweep

    sweep = open_sweep(swept)
    try:
        by_config = dict(sweep.con.execute(
            "SELECT s.config_hash, count(r.request_id) FROM sweep s JOIN requests r ON r.config = s.config_hash "
            "GROUP BY ALL").fetchall())
        steps = dict(sweep.con.execute("SELECT config, count(*) FROM steps GROUP BY ALL").fetchall())
    finally:
        sweep.con.close()
    ok = [r for r in _rows(swept) if r["error"] is None]
    assert by_config == {r["config_hash"]: 120 for r in ok}
    for r in ok:
        assert steps[r["config_hash"]] == pq.read_metadata(swept / r["outdir"] / "steps.parquet").num_rows


def test_sql_and_report_commands_read_a_sweep_directory(swept, tmp_path):
    res = CliRunner().invoke(app, ["sql", str(swept), "SELECT count(*) AS n FROM sweep WHERE error IS NULL", "--csv"])
    assert res.exit_code == 0 and res.output.split() == ["n", "4"]
    md = tmp_path / "rep" / "report.md"
    res = CliRunner().invoke(app, ["report", str(swept), "-o", str(md)])
    assert res.exit_code == 0, res.output
    text = md.read_text()
    for section in ("Configs ranked by goodput per GPU", "Best config per SLO", "Failed configs", "pareto.png",
                    "by_scheduler_max_num_seqs.png", "by_kv_cache_num_gpu_blocks.png"):
        assert section in text
    assert "by_load_max_requests" not in text  # a one-value key is a setting, not a varied key
    assert (md.parent / "report_files" / "pareto.png").is_file()


def test_a_sweep_dir_of_another_trace_is_refused(swept, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(SAMPLE.read_text().splitlines()[:30]) + "\n")
    with pytest.raises(ReplayError, match="another trace"):
        SweepSession.open(other, None, swept, parse_sweep_slo(None), SweepOptions(workers=1))


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_leftovers(tmp_path):
    """SIGKILL the sweep's driver mid-way: its pool workers exit on their own, no sweep.parquet is
    written, and the rerun cleans the dead writers' temp directories, keeps the finished configs and
    runs the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "killed"
    grid = ["--grid", "load.max_requests=60", "--grid", "scheduler.max_num_seqs=2,4,8,16"]
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "replay.cli", "sweep", str(SAMPLE), *grid, "-o", str(out),
                             "-q", "-j", "2"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "results").is_dir() and any((out / "results").glob("*.json")):
            break
        time.sleep(0.05)
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, "pool workers outlived their driver"
    done_before = len(list((out / "results").glob("*.json")))
    assert 1 <= done_before < 4 and not (out / "sweep.parquet").exists()
    session = SweepSession.open(SAMPLE, None, out, parse_sweep_slo(None), SweepOptions(workers=1))
    assert not [p for p in out.rglob("*") if p.name.endswith((".tmp", ".old"))]  # dead writers' leftovers gone
    axes = parse_axes(["load.max_requests=60", "scheduler.max_num_seqs=2,4,8,16"])
    results = session.run_points(product(axes))
    assert session.counts["reused"] == done_before and session.counts["ran"] == 4 - done_before
    assert all(r.error is None for r in results)
    assert len({r.key for r in results}) == 4 and all(r.metrics["completed"] == 60 for r in results)


def test_set_overrides_the_base_config(tmp_path):
    session = SweepSession.open(SAMPLE, None, tmp_path / "s", parse_sweep_slo(None), SweepOptions(workers=1),
                                overrides=["load.max_requests=10"])
    (res,) = session.run_points(product(parse_axes(["scheduler.max_num_seqs=8"])))
    assert res.config["load"]["max_requests"] == 10 and res.metrics["completed"] == 10


def test_gpus_are_fleet_replicas_times_tensor_parallel_size(tmp_path):
    session = SweepSession.open(SAMPLE, None, tmp_path / "s", parse_sweep_slo(None), SweepOptions(workers=1),
                                overrides=["load.max_requests=30"])
    axes = parse_axes(["fleet.replicas=1,2", "tensor_parallel_size=1,2"])
    results = session.run_points(product(axes))
    assert [r.metrics["gpus"] for r in results] == [1, 2, 2, 4]
    for r in results:
        m = r.metrics
        assert m["output_throughput_per_gpu"] == pytest.approx(m["output_throughput"] / m["gpus"], rel=1e-15)


def test_sql_on_a_sweep_reads_the_sweep_directory_only(swept, tmp_path):
    outside = tmp_path / "x.csv"
    outside.write_text("a\n1\n")
    res = CliRunner().invoke(app, ["sql", str(swept), f"SELECT * FROM read_csv('{outside}')"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_an_autoscaled_base_config_sweeps_as_it_runs(tmp_path):
    """An autoscaled fleet without fleet.replicas starts at min_replicas: the sweep must not write the
    default replicas: 1 into its configs (it then read as set, outside min..max, and every point failed)."""
    res = CliRunner().invoke(app, ["sweep", str(SAMPLE), "--set", "load.max_requests=60",
                                   "--set", "fleet.autoscale.min_replicas=2", "--set", "fleet.autoscale.max_replicas=3",
                                   "--grid", "scheduler.max_num_seqs=8,16", "-o", str(tmp_path / "sw"), "-j", "1"])
    assert res.exit_code == 0, res.output
    table = pq.read_table(tmp_path / "sw" / "sweep.parquet")
    assert table.column("error").null_count == table.num_rows == 2
    direct = direct_run(SAMPLE, None, overrides=["load.max_requests=60", "fleet.autoscale.min_replicas=2",
                                                 "fleet.autoscale.max_replicas=3", "scheduler.max_num_seqs=8"],
                        outdir=tmp_path / "direct", progress=False)
    assert json.loads((Path(direct.outdir) / "run.json").read_text())["totals"]["finished"] == 60


def test_a_rerun_under_another_slo_recomputes_the_slo_columns(tmp_path):
    """Stored summaries carry the SLO they were made under: a rerun of the same grid under another
    --slo recomputes slo_met and goodput (from the kept outdirs, without replaying), as a fresh sweep
    under that SLO gives them."""
    args = ["sweep", str(SAMPLE), "--set", "load.max_requests=120", "--grid", "scheduler.max_num_seqs=8,32", "-j", "1", "-q"]
    cols = ["scheduler.max_num_seqs", "slo_met", "goodput", "good_fraction"]
    for first, second in (("ttft_p99=100000", "ttft_p99=120,ttft=60"), ("ttft_p99=120,ttft=60", "ttft_p99=100000")):
        sw = tmp_path / f"sw-{len(first)}"
        assert CliRunner().invoke(app, [*args, "-o", str(sw), "--slo", first]).exit_code == 0
        res = CliRunner().invoke(app, [*args, "-o", str(sw), "--slo", second])
        assert res.exit_code == 0, res.output
        fresh = tmp_path / f"fresh-{len(first)}"
        assert CliRunner().invoke(app, [*args, "-o", str(fresh), "--slo", second]).exit_code == 0
        assert pq.read_table(sw / "sweep.parquet", columns=cols) == pq.read_table(fresh / "sweep.parquet", columns=cols)


def test_a_refused_sweep_leaves_the_sweep_directory_as_it_was(tmp_path):
    sw = tmp_path / "sw"
    base = ["sweep", str(SAMPLE), "--set", "load.max_requests=40", "-o", str(sw), "-j", "1", "-q"]
    assert CliRunner().invoke(app, [*base, "--grid", "scheduler.max_num_seqs=8"]).exit_code == 0
    before = (sw / "sweep.json").read_bytes()
    res = CliRunner().invoke(app, [*base, "--grid", "fleet.replicas=0"])
    assert res.exit_code == 2 and "no combination of the grid is a valid config" in res.output
    assert (sw / "sweep.json").read_bytes() == before


def test_on_error_skip_results_are_not_reused_without_it(tmp_path):
    sw = tmp_path / "sw"
    base = ["sweep", str(SAMPLE), "--set", "load.max_requests=100", "--set", "max_model_len=4096",
            "--grid", "scheduler.max_num_seqs=8", "-o", str(sw), "-j", "1", "-q"]
    assert CliRunner().invoke(app, [*base, "--on-error", "skip"]).exit_code == 0
    skipped = pq.read_table(sw / "sweep.parquet")
    assert skipped["error"].null_count == 1 and skipped["rejected"].to_pylist()[0] > 0
    assert CliRunner().invoke(app, base).exit_code == 0
    failed = pq.read_table(sw / "sweep.parquet")
    assert failed["error"].null_count == 0 and "can never be replayed" in failed["error"].to_pylist()[0]


def test_an_autoscaled_config_counts_the_gpus_it_may_hold():
    from replay.sweep.summary import gpus_used

    assert gpus_used({"fleet": {"replicas": 1, "autoscale": {"min_replicas": 1, "max_replicas": 4}}}) == 4
    assert gpus_used({"tensor_parallel_size": 2, "fleet": {"replicas": 3, "autoscale": None}}) == 6
    pools = {"mode": "disaggregated", "prefill": {"replicas": 1, "autoscale": {"max_replicas": 3}},
             "decode": {"replicas": 2, "tensor_parallel_size": 2}}
    assert gpus_used({"fleet": pools}) == 3 + 4


def test_a_sweep_directory_refuses_another_canonical_trace(tmp_path):
    """A canonical trace is read in place (no copy in SWEEPDIR): sweep.json's fingerprint is what
    tells another trace apart."""
    from tests.sweep_helpers import write_canonical

    rows = [{"request_id": f"r{i}", "arrival_ms": 10 * i, "input_tokens": 32, "output_tokens": 4,
             "hash_ids": [i, i + 1]} for i in range(20)]
    a = write_canonical(rows, tmp_path / "a.parquet")
    b = write_canonical(rows[:10], tmp_path / "b.parquet")
    sw = tmp_path / "sw"
    base = ["--grid", "scheduler.max_num_seqs=8", "-o", str(sw), "-j", "1", "-q"]
    assert CliRunner().invoke(app, ["sweep", str(a), *base]).exit_code == 0
    res = CliRunner().invoke(app, ["sweep", str(b), *base])
    assert res.exit_code == 2 and "holds a sweep of another trace" in res.output
    assert CliRunner().invoke(app, ["sweep", str(a), *base]).exit_code == 0
