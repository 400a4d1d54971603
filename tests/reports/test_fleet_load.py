"""The fleet's load over time: a step is split over the time buckets it overlaps, so a replica is
never more than fully busy in a bucket, and the buckets add up to its busy time."""

from __future__ import annotations

import pytest

from replay.reports.fleet import fleet_metrics
from replay.reports.views import open_run
from tests.engine_helpers import FixedTimer, run_small


@pytest.mark.parametrize("bucket_ms", [3.0, 7.0, 1000.0])
def test_busy_fraction_stays_within_the_bucket(tmp_path, bucket_ms):
    # Steps of about 5 ms: with 3 ms buckets every step crosses a boundary (counted whole in the
    # bucket it started in, a bucket read 1.7 busy).
    rows = [dict(arrival_ms=i * 3, input_tokens=200, output_tokens=30, hash_ids=list(range(100 * i, 100 * i + 13)))
            for i in range(12)]
    _, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=200, config={"fleet": {"replicas": 2}},
                               timer=FixedTimer(5.0, 0.01, 1e-4))
    load = fleet_metrics(open_run(tmp_path / "out"), bucket_ms, False)["load_over_time"]
    assert max(x["busy_fraction"] for x in load) <= 1.0 + 1e-12
    for replica in (0, 1):
        mine = steps[steps.replica == replica].duration_ms.sum()
        assert sum(x["busy_fraction"] for x in load if x["replica"] == replica) * bucket_ms == pytest.approx(mine)
