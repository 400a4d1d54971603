"""chunks.parquet stores runs; the `chunks` and `itl_gaps` views and the report's ITL must be exactly
what one row per chunk gave. The reference here is the engine's own emission stream, caught as it
happens (every request the scheduler emits for, at the step's end time; every running request at
each step end of a decode window), i.e. the rows the recorder wrote before runs, on replays with
decode windows, MTP, preemptions, a G2 tier, fleets, a disaggregated fleet, a fleet of clusters and a
load.window slice."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import replay.engine.decode_steps as decode_steps
from replay.api import run as replay_run
from replay.engine.scheduler import Scheduler
from replay.reports.metrics import PROBS, itl_row
from replay.reports.views import open_run, read_chunks
from tests.sweep_helpers import SAMPLE

CASES = {
    "single": [],
    "mtp": ["speculative.method=mtp", "speculative.num_speculative_tokens=2",
            "speculative.acceptance_rates=[0.8,0.4]", "speculative.drafter=synthetic"],
    "preemption": ["kv_cache.num_gpu_blocks=1000"],
    "g2": ["kv_cache.num_gpu_blocks=1500", "host_offload.num_cpu_blocks=20000"],
    "fleet": ["fleet.replicas=4", "fleet.router=kv_aware"],
    "fleet_mtp": ["fleet.replicas=3", "fleet.router=round_robin", "speculative.method=mtp",
                  "speculative.num_speculative_tokens=1", "speculative.acceptance_rates=[0.7]", "speculative.drafter=synthetic",
                  "kv_cache.num_gpu_blocks=1200"],
    "disaggregated": ["fleet.mode=disaggregated", "fleet.prefill.replicas=1", "fleet.decode.replicas=2"],
    "clusters": ["fleet.replicas=4", "fleet.clusters=2", "fleet.router=kv_aware"],
    "window": ["load.window=00:00:20-00:02:00"],  # a slice: requests.parquet does not start at trace row 0
}


# The reference taps the scheduler and the decode window from Python: a compiled engine calls them
# natively, past the taps (the suite runs the source; tests/engine/test_native_core.py checks that
# the compiled engine writes the same bytes).
_SOURCE_ENGINE = decode_steps.__file__.endswith(".py") and hasattr(Scheduler.update_from_output, "__code__")


def _replay_with_emissions(tmp_path: Path, overrides: list[str], monkeypatch) -> tuple[Path, list[tuple]]:
    """Replay the first 300 sample requests; returns the outdir and every chunk as emitted
    (request_id, time_ms, tokens)."""
    emitted: list[tuple] = []
    update = Scheduler.update_from_output

    def spy_update(self, out, end_ms, finished, chunk_reqs, chunk_tokens):
        result = update(self, out, end_ms, finished, chunk_reqs, chunk_tokens)
        for j, r in enumerate(chunk_reqs):
            if r.do_remote_decode:  # a prefill replica of a disaggregated fleet: its token is not output
                continue
            emitted.append((r.request_id, end_ms, chunk_tokens[j] if chunk_tokens else 1))
        return result

    window_cls = decode_steps.DecodeWindowSteps
    record = window_cls.record

    def spy_record(self, rec, replica, first_step, s, running_after):
        for t in self.clock.times[1:s + 1]:
            emitted.extend((r.request_id, t, 1) for r in self.running)
        return record(self, rec, replica, first_step, s, running_after)

    monkeypatch.setattr(Scheduler, "update_from_output", spy_update)
    monkeypatch.setattr(window_cls, "record", spy_record)
    out = tmp_path / "out"
    replay_run(SAMPLE, None, overrides=["load.max_requests=300", *overrides], outdir=out, on_error="skip")
    monkeypatch.undo()
    return out, emitted


@pytest.mark.skipif(not _SOURCE_ENGINE, reason="the emission taps need the engine run from source")
@pytest.mark.parametrize("case", list(CASES))
def test_views_and_report_equal_one_row_per_chunk(tmp_path, monkeypatch, case):
    out, emitted = _replay_with_emissions(tmp_path, CASES[case], monkeypatch)
    want = pa.table({"request_id": [e[0] for e in emitted], "time_ms": [e[1] for e in emitted],
                     "tokens": pa.array([e[2] for e in emitted], pa.int32())})
    got = read_chunks(out)
    key = [("time_ms", "ascending"), ("request_id", "ascending")]
    assert got.sort_by(key).equals(want.sort_by(key))  # the `chunks` view, row for row
    # Runs, not chunks; under MTP a run ends where the accepted token count changes.
    runs = pq.read_metadata(out / "chunks.parquet").num_rows
    assert runs < len(emitted) / (1.2 if "mtp" in case else 20)

    con = duckdb.connect()
    con.register("emitted", want)
    run = open_run(out)
    con.register("req", run.con.sql("SELECT request_id, status FROM requests").to_arrow_table())
    gaps = "SELECT time_ms - lag(time_ms) OVER (PARTITION BY request_id ORDER BY time_ms) AS g FROM emitted " \
           "SEMI JOIN (SELECT request_id FROM req WHERE status = 'finished') USING (request_id) QUALIFY g IS NOT NULL"
    want_gaps = np.sort(np.array(con.execute(gaps).fetchnumpy()["g"]))
    got_gaps = np.sort(run.con.sql("SELECT itl_ms FROM itl_gaps").fetchnumpy()["itl_ms"])
    assert np.array_equal(got_gaps, want_gaps)  # the `itl_gaps` view: the same samples, bit for bit

    row, _ = itl_row(run, histograms=False)
    q, n, mean, top = con.execute(f"SELECT quantile_cont(g, $p), count(g), fsum(g) / count(g), max(g) FROM ({gaps})",
                                  {"p": list(PROBS)}).fetchall()[0]
    assert row["itl_quantiles"] == q and row["itl_count"] == n and row["itl_max"] == top
    assert row["itl_mean"] == pytest.approx(mean, rel=1e-13)
    info_chunks = run.info["totals"]["chunks"]
    run.con.close()
    assert info_chunks == len(emitted)
    if case == "preemption":
        assert int(run_preemptions(out)) > 0
    if case in ("mtp", "fleet_mtp"):
        assert max(e[2] for e in emitted) > 1


def run_preemptions(out: Path) -> int:
    return pq.read_table(out / "requests.parquet").column("num_preemptions").to_numpy().sum()
