"""Guards that must not go quiet: real-trace tests fail in CI when the traces are missing, the G2
copy latency is priced, and `--check` invariants are real checks (not asserts stripped by -O)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import require_shared
from tests.engine_helpers import FixedTimer  # noqa: F401  (imported by the -O script below)

ROOT = Path(__file__).resolve().parents[2]


def test_missing_shared_trace_fails_in_ci_and_skips_locally(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "trace.jsonl"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI always has it"):
        require_shared(missing)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_shared(missing)


def test_host_offload_latency_is_paid_once_per_transfer(tmp_path):
    """Same store-then-load scenario as test_offload_store_then_load_full_hit_recomputes_one_token,
    with latency_us = 2000: A's one 3-block store batch takes 2 + 3 x 10 ms from 10 ms (ready at 42,
    still before B arrives at 50); B's one 3-block load runs 50 -> 50 + 2 + 30 = 82 ms. Zeroing or
    ignoring latency_us gives 80 / 30 instead (the latency-free test pins those)."""
    from tests.engine.test_mtp_offload import offload, run_offload

    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=50, input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3])]
    reqs, _, info = run_offload(rows, tmp_path, caching=False, host=offload(latency_us=2000.0))
    b = reqs.loc["r1"]
    assert b.cpu_hit_tokens == 47
    assert b.load_wait_ms == 32.0 and b.first_scheduled_ms == 82.0
    assert info["config"]["host_offload"]["latency_us"] == 2000.0


_CORRUPT_RUN = textwrap.dedent("""
    import sys
    from pathlib import Path
    from replay.engine.config import EngineConfig
    from replay.engine.run import replay_trace
    from replay.engine.scheduler import Scheduler
    from tests.engine_helpers import make_trace, setup_for

    original = Scheduler.schedule
    def schedule(self, now):  # plant a bug: one block vanishes from the free count after step 1
        out = original(self, now)
        if not getattr(self, "_planted", False) and out.total_tokens:
            self._planted = True
            self.kv.pool.num_free -= 1
        return out
    Scheduler.schedule = schedule
    table, meta = make_trace([dict(arrival_ms=i * 3, input_tokens=40, output_tokens=20,
                                   hash_ids=[100 * i + j for j in range(3)]) for i in range(6)])
    try:
        replay_trace(table, meta, EngineConfig(), Path(sys.argv[1]), setup=setup_for(64),
                     check_invariants=True)
    except Exception as exc:
        print(type(exc).__name__, exc)
        sys.exit(3)
    sys.exit(0)
""")


@pytest.mark.slow
@pytest.mark.parametrize("optimize", [False, True], ids=["python", "python -O"])
def test_check_invariants_catch_a_planted_bug(tmp_path, optimize):
    """`--check` must stop a run whose block accounting is broken, with or without `python -O`."""
    script = tmp_path / "corrupt.py"
    script.write_text(_CORRUPT_RUN)
    cmd = [sys.executable, *(["-O"] if optimize else []), str(script), str(tmp_path / "out")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "free blocks counted" in res.stdout, res.stdout
    assert not (tmp_path / "out").exists()  # the failed run left no output


@pytest.mark.parametrize("preset,expected", [(None, "1"), ("4", "4")])
def test_cli_keeps_openblas_to_one_thread_unless_told(preset, expected):
    # Before any command imports numpy; a user's own setting wins.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    code = "import sys, os, replay.cli; print('numpy' in sys.modules, os.environ['OPENBLAS_NUM_THREADS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", expected]


def test_api_run_checks_its_arguments(tmp_path):
    from replay.api import run
    from replay.base.errors import ConfigError
    from tests.cli_helpers import write_sample_trace

    trace = write_sample_trace(tmp_path / "t.parquet", rows=10)
    with pytest.raises(ConfigError, match="on_error must be 'fail' or 'skip'"):
        run(trace, None, on_error="bogus", outdir=tmp_path / "x")
    result = run(trace, None, overrides="scheduler.max_num_seqs=4", outdir=tmp_path / "one")
    assert result.info["config"]["scheduler"]["max_num_seqs"] == 4
