"""bench/bench_day.py end to end on a small day: both legs of `compare` run and report (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compare_runs_the_autoscaled_and_the_static_leg(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the synthesized day goes here, not to the shared temp
    subprocess.run([sys.executable, str(ROOT / "bench" / "bench_day.py"), "compare", "--requests", "5000",
                    "--window", "13:00-13:30", "--results", str(tmp_path / "results")],
                   cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "results" / "day-compare-5000.json").read_text())
    auto, static = result["autoscaled"], result["static_at_max"]
    assert auto["requests"] == static["requests"] > 0
    assert auto["finished"] == static["finished"] == auto["requests"]
    assert static["mean_replicas"] == 32.0 and static["live_min_max"] == [None, None]
    assert 4 <= auto["live_min_max"][0] <= auto["live_min_max"][1] <= 32
    assert static["gpu_hours"] > auto["gpu_hours"] > 0
    assert 0.0 <= auto["attainment"] <= 1.0 and 0.0 <= static["attainment"] <= 1.0
