"""A small sweep on a local Ray started with two CPUs (as CI runs it): same table bytes as the local pool,
and the trace travels once through the object store."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from replay.cli import app
from tests.sweep_helpers import SAMPLE

pytestmark = pytest.mark.slow  # minutes: `pytest -m slow` (.ci/run runs it)

ray = pytest.importorskip("ray", reason="Ray is the optional extra '.[ray]' (the README's test command installs it)")

GRID = ["load.max_requests=60", "scheduler.max_num_seqs=2,32", "kv_cache.num_gpu_blocks=40,3000"]


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for the session: two CPUs, no dashboard (starting Ray is the slow part)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def _sweep(out: Path, *extra: str) -> None:
    args = ["sweep", str(SAMPLE), "-o", str(out), "--slo", "ttft_p99=2000", "-q"]
    for g in GRID:
        args += ["--grid", g]
    res = CliRunner().invoke(app, args + list(extra))
    assert res.exit_code == 0, res.output


def test_ray_sweep_matches_the_local_pool_byte_for_byte(local_ray, tmp_path):
    _sweep(tmp_path / "ray", "--ray", "auto")
    _sweep(tmp_path / "pool", "-j", "1")
    a = (tmp_path / "ray" / "sweep.parquet").read_bytes()
    assert a == (tmp_path / "pool" / "sweep.parquet").read_bytes()
    # the run directories the Ray tasks wrote are the ordinary `replay run` outputs
    runs = sorted(p.name for p in (tmp_path / "ray" / "runs").iterdir())
    assert runs == sorted(p.name for p in (tmp_path / "pool" / "runs").iterdir()) and len(runs) == 2


def test_ray_executor_puts_the_trace_once(local_ray, monkeypatch, tmp_path):
    from replay.sweep import executors
    from replay.sweep.slo import parse_sweep_slo

    puts = []
    real_put = local_ray.put
    monkeypatch.setattr(local_ray, "put", lambda obj, **kw: puts.append(type(obj).__name__) or real_put(obj, **kw))
    path = tmp_path / "t.parquet"
    assert CliRunner().invoke(app, ["ingest", str(SAMPLE), "-o", str(path)]).exit_code == 0
    ex = executors.RayExecutor("auto", str(path), parse_sweep_slo(None))
    assert puts == ["WorkerTrace"]  # one put; every task gets the same object reference
    assert ex.workers == 2
    ex.close()
    assert ray.is_initialized()  # it joined the session's Ray, so it does not shut it down
