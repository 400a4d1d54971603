"""bench.compare --reps: both sides run alternately, the speed is the ratio of the median walls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import bench.compare.compare as cmp
from bench.compare.report import markdown

RUN_OURS = cmp.run_ours  # before the fixture replaces it


@pytest.fixture
def fake_sides(monkeypatch, tmp_path):
    """compare() with its trace preparation, translation and both simulators replaced: each side's
    runs take the walls listed, and the order of runs is recorded."""
    order: list[str] = []
    walls = {"ours": [3.0, 9.0, 4.0], "peer": [10.0, 12.0, 30.0]}

    def side(name):
        def run(*_args):
            order.append(name)
            wall = walls[name][sum(1 for o in order if o == name) - 1]
            return {"status": "ok", "command": name, "metrics": {},
                    "process": {"wall_s": wall, "peak_rss_tree_mib": 1.0}}
        return run

    monkeypatch.setattr(cmp, "prepare", lambda *a, **k: SimpleNamespace(
        peer_path=tmp_path / "p.jsonl", peer_block_size=16, ours_path=tmp_path / "o.parquet", rows=1, notes=[]))
    monkeypatch.setattr(cmp, "translate", lambda *a, **k: SimpleNamespace(peer={"k": 1}, notes=[]))
    monkeypatch.setattr(cmp, "run_peer", side("peer"))
    monkeypatch.setattr(cmp, "run_ours", side("ours"))
    monkeypatch.setattr(cmp, "versions", lambda: {})
    return order, cmp.Job(name="t", trace=tmp_path / "t.parquet", config=cmp.REPO_ROOT / "bench/compare/configs/reuse.yaml",
                          workdir=tmp_path)


def test_reps_alternate_and_take_the_median_walls(fake_sides):
    order, job = fake_sides
    result = cmp.compare(job, reps=3)
    assert order == ["peer", "ours", "ours", "peer", "peer", "ours"]
    assert result["ours"]["process"]["wall_s"] == 4.0 and result["peer"]["process"]["wall_s"] == 12.0
    assert result["speed"]["ours_over_peer_wall"] == pytest.approx(4.0 / 12.0)
    assert result["speed"]["pair_ratios"] == pytest.approx([0.3, 0.75, 4.0 / 30.0])
    assert result["ours"]["process"]["wall_s_runs"] == [3.0, 9.0, 4.0]
    assert "pair ratios 0.300, 0.750, 0.133" in markdown(result)


def test_one_rep_is_one_run_each(fake_sides):
    order, job = fake_sides
    result = cmp.compare(job)
    assert order == ["peer", "ours"]
    assert result["speed"]["ours_over_peer_wall"] == pytest.approx(0.3) and "reps" not in result["speed"]


def test_overrides_reach_the_config_and_our_command(fake_sides, monkeypatch, tmp_path):
    """--set changes our config (and so what AISimulate is translated from) and is passed to `replay run`."""
    _, job = fake_sides
    seen = {}
    monkeypatch.setattr(cmp, "translate", lambda cfg, traffic: seen.setdefault("cfg", cfg) and SimpleNamespace(
        peer={"k": 1}, notes=[]))
    job.overrides = ["timing.host_overhead_ms=0", "load.max_requests=7"]
    result = cmp.compare(job)
    assert seen["cfg"].timing.host_overhead_ms == 0 and seen["cfg"].load.max_requests == 7
    assert result["config"]["overrides"] == job.overrides

    commands = []
    monkeypatch.setattr(cmp, "ours_available", lambda: (True, ""))
    monkeypatch.setattr(cmp, "run_measured", lambda command, **_: commands.append(command) or SimpleNamespace(
        timed_out=True, returncode=-9, stderr_path=str(tmp_path / "missing"), to_dict=lambda: {}))
    side = RUN_OURS(job, tmp_path / "t.parquet")
    assert commands[0][-4:] == ["--set", "timing.host_overhead_ms=0", "--set", "load.max_requests=7"]
    assert side["command"].endswith("--set timing.host_overhead_ms=0 --set load.max_requests=7")


def test_set_needs_a_result_name(capsys):
    from bench.compare.__main__ import main

    with pytest.raises(SystemExit):
        main(["--workload", "reuse-20k-8rps", "--set", "timing.host_overhead_ms=0"])
    assert "--set needs --name" in capsys.readouterr().err
