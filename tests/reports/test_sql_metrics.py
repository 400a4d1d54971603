"""Every SQL metric of the reports against an independent pandas/numpy computation on fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.ingest.schema import TRACE_SCHEMA, TraceMetadata
from replay.reports.metrics import (
    CDF_BINS_PER_DECADE,
    CDF_FLOOR_MS,
    SUMMARY_PERCENTILES,
    TURN_CAP,
    compute,
    falling_behind,
)
from replay.reports.slo import Slo
from replay.reports.views import build_trace_ideal, open_run
from tests.reports_fixtures import RunSpec, TraceSpec, write_run, write_trace

MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="module", params=["plain", "mtp_offload"])
def run_dir(request, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    trace = write_trace(root / "trace.parquet", TraceSpec(n_requests=1500, seed=7))
    spec = RunSpec(seed=3, mtp_k=2, offload=True) if request.param == "mtp_offload" else RunSpec(seed=3)
    return write_run(root / "run", trace, spec)


@pytest.fixture(scope="module")
def frames(run_dir):
    req = pd.read_parquet(run_dir / "requests.parquet")
    steps = pd.read_parquet(run_dir / "steps.parquet")
    # The chunk runs expanded here with numpy, independently of the `chunks` view.
    runs = pd.read_parquet(run_dir / "chunks.parquet")
    n = runs["num_steps"].to_numpy()
    first = np.repeat(runs["first_step"].to_numpy(), n)
    step = first + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    end = (steps["start_ms"] + steps["duration_ms"]).to_numpy()  # steps are 0..N-1 in a single-replica run
    chunks = pd.DataFrame({"request_id": req["request_id"].to_numpy()[np.repeat(runs["request"].to_numpy(), n)],
                           "time_ms": end[step], "tokens": np.repeat(runs["tokens"].to_numpy(), n)})
    trace_path = json.loads((run_dir / "run.json").read_text())["trace"]["path"]
    trace = pq.read_table(trace_path).to_pandas()
    return req, chunks, steps, trace


@pytest.fixture(scope="module")
def metrics(run_dir):
    run = open_run(run_dir)
    m = compute(run, Slo(ttft=500.0, tpot=20.0))
    run.con.close()
    return m


def _close(a, b, rel=1e-9):
    if a is None or (isinstance(a, float) and math.isnan(a)):
        assert b is None or (isinstance(b, float) and math.isnan(b)), (a, b)
        return
    assert b == pytest.approx(a, rel=rel, abs=1e-9), (a, b)


def _check_dist(d, values: np.ndarray):
    values = np.asarray(values, dtype=float)
    assert d.count == len(values)
    _close(values.mean(), d.mean)
    _close(values.max(), d.max)
    for p in SUMMARY_PERCENTILES:
        _close(float(np.percentile(values, p)), d.percentiles[p])
    # CDF points: the fraction of samples below each log-spaced bin edge, exact at the edges.
    edges = np.array([x for x, _ in d.cdf])
    fracs = np.array([y for _, y in d.cdf])
    assert fracs[0] == 0.0 and fracs[-1] == pytest.approx(1.0) and np.all(np.diff(fracs) > 0)
    clamped = np.maximum(values, CDF_FLOOR_MS)
    want = np.array([(clamped < e * (1 - 1e-12)).mean() for e in edges[1:]])
    np.testing.assert_allclose(fracs[1:], want, atol=1.5 / len(values))
    assert edges[-1] >= values.max() and edges[1] > clamped.min()
    steps = np.diff(np.log10(edges)) * CDF_BINS_PER_DECADE  # whole bins between edges
    assert np.allclose(steps, np.round(steps), atol=1e-9)


def test_request_latency_distributions(frames, metrics):
    req = frames[0]
    fin = req[req.status == "finished"]
    assert len(fin) < len(req)  # the fixture has rejected and unfinished requests to exclude
    for key in ("ttft", "e2e", "queue"):
        _check_dist(metrics.dists[key], fin[f"{key}_ms"].to_numpy())
    tpot = fin["tpot_ms"].dropna().to_numpy()
    assert len(tpot) < len(fin)  # one-token outputs have no TPOT
    _check_dist(metrics.dists["tpot"], tpot)


def test_itl_pooled_over_chunks_of_finished_requests(frames, metrics):
    req, chunks = frames[0], frames[1]
    fin_ids = set(req.loc[req.status == "finished", "request_id"])
    c = chunks[chunks.request_id.isin(fin_ids)].sort_values(["request_id", "time_ms"])
    gaps = c.groupby("request_id")["time_ms"].diff().dropna().to_numpy()
    assert len(chunks) > len(c)  # unfinished requests have chunks that must be excluded
    _check_dist(metrics.dists["itl"], gaps)


def test_throughput_and_counts(frames, metrics):
    req = frames[0]
    fin = req[req.status == "finished"]
    t = metrics.throughput
    duration = (fin.finish_ms.max() - req.arrival_ms.min()) / 1000.0
    assert t["requests"] == len(req)
    assert t["completed"] == len(fin)
    assert t["rejected"] == (req.status == "rejected").sum() > 0
    assert t["unfinished"] == (req.status == "unfinished").sum() > 0
    assert t["input_tokens"] == fin.input_tokens.sum()
    assert t["output_tokens"] == fin.output_tokens.sum()
    _close(duration, t["duration_s"])
    _close(len(fin) / duration, t["request_throughput"])
    _close(fin.output_tokens.sum() / duration, t["output_throughput"])
    _close((fin.input_tokens.sum() + fin.output_tokens.sum()) / duration, t["total_token_throughput"])


@pytest.mark.parametrize("slo", [Slo(ttft=500.0, tpot=20.0), Slo(ttft=100.0), Slo(tpot=12.0), Slo(e2e=800.0)])
def test_goodput_matches_vllm_rule(run_dir, frames, slo):
    req = frames[0]
    fin = req[req.status == "finished"]
    ok = np.ones(len(fin), dtype=bool)
    if slo.ttft is not None:
        ok &= fin.ttft_ms.to_numpy() <= slo.ttft
    if slo.tpot is not None:
        ok &= fin.tpot_ms.fillna(0.0).to_numpy() <= slo.tpot  # vllm: tpot 0 for one-token outputs
    if slo.e2e is not None:
        ok &= fin.e2e_ms.to_numpy() <= slo.e2e
    run = open_run(run_dir)
    m = compute(run, slo)
    run.con.close()
    duration = (fin.finish_ms.max() - req.arrival_ms.min()) / 1000.0
    assert 0 < ok.sum() < len(fin)
    assert m.goodput["good_requests"] == ok.sum()
    _close(ok.mean(), m.goodput["good_fraction"])
    _close(ok.sum() / duration, m.goodput["goodput"])


def test_preemptions_and_reuse(frames, metrics):
    req = frames[0]
    adm = req[req.status != "rejected"]
    assert metrics.preemptions["preemptions"] == adm.num_preemptions.sum() > 0
    assert metrics.preemptions["preempted_requests"] == (adm.num_preemptions > 0).sum()
    r = metrics.reuse
    assert r["prompt_tokens"] == adm.input_tokens.sum()
    assert r["gpu_hit_tokens"] == adm.cached_tokens.sum()
    assert r["cpu_hit_tokens"] == adm.cpu_hit_tokens.sum()
    _close(adm.cached_tokens.sum() / adm.input_tokens.sum(), r["gpu_hit_ratio"])
    _close(adm.cpu_hit_tokens.sum() / adm.input_tokens.sum(), r["cpu_hit_ratio"])
    _close((adm.cached_tokens.sum() + adm.cpu_hit_tokens.sum()) / adm.input_tokens.sum(), r["total_hit_ratio"])


def ideal_hits_reference(trace: pd.DataFrame, block: int) -> np.ndarray:
    """Plain-Python infinite cache: rows in arrival order (stable), leading run of earlier-seen ids."""
    order = np.argsort(trace.arrival_ms.to_numpy(), kind="stable")
    seen: set[int] = set()
    hits = np.zeros(len(trace), dtype=np.int64)
    for i in order:
        ids = trace.hash_ids.iloc[i]
        ids = [] if ids is None else [int(x) for x in ids]
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hits[i] = min(k * block, int(trace.input_tokens.iloc[i]))
        seen.update(ids)
    return hits


def test_ideal_reuse_and_by_turn(frames, metrics):
    req, _, _, trace = frames
    hits = ideal_hits_reference(trace, 512)
    assert metrics.ideal["ideal_hit_tokens"] == hits.sum()
    _close(hits.sum() / trace.input_tokens.sum(), metrics.ideal["ideal_hit_ratio"])
    # By turn: measured over admitted requests, ideal over trace rows, turns >= TURN_CAP pooled.
    adm = req[req.status != "rejected"].copy()
    key = lambda s: s.fillna(-1).clip(upper=TURN_CAP).astype(int)  # noqa: E731
    adm["k"] = key(adm.turn)
    g = adm.groupby("k")[["input_tokens", "cached_tokens", "cpu_hit_tokens"]].sum()
    tr = trace.assign(k=key(trace.turn), hit=hits).groupby("k")[["input_tokens", "hit"]].sum()
    rows = {r["turn_key"]: r for r in metrics.reuse_by_turn}
    assert set(rows) == set(g.index) | set(tr.index)
    assert -1 in rows and len(rows) > 4
    for k, r in rows.items():
        if k in g.index:
            _close(g.loc[k, "cached_tokens"] / g.loc[k, "input_tokens"], r["gpu_hit_ratio"])
            _close(g.loc[k, "cpu_hit_tokens"] / g.loc[k, "input_tokens"], r["cpu_hit_ratio"])
            assert r["requests"] == (adm.k == k).sum()
        if k in tr.index:
            _close(tr.loc[k, "hit"] / tr.loc[k, "input_tokens"], r["ideal_hit_ratio"])


def test_ideal_counts_only_earlier_rows_and_caps_at_input(tmp_path):
    """Hand-made trace: repeated ids inside one row do not hit; ties in arrival keep file order."""
    rows = [  # request_id, arrival, input_tokens, hash_ids
        ("r0", 0, 40, [1, 1, 2]),         # own earlier id does not count -> 0
        ("r1", 5, 30, [1, 2, 3]),          # 1, 2 seen -> 2 blocks = 32 > 30 -> capped 30
        ("r2", 5, 64, [1, 9, 2]),          # tie in arrival with r1: after r1; 1 seen, 9 new -> 16
        ("r3", 7, 50, None),               # no ids -> 0
        ("r4", 2, 48, [4, 1]),             # arrives before r1: 4 new -> 0
        ("r5", 9, 48, [4, 1, 2, 3]),       # all seen -> 64 capped to 48
    ]
    table = pa.table({
        "request_id": [r[0] for r in rows], "arrival_ms": [r[1] for r in rows],
        "input_tokens": pa.array([r[2] for r in rows], pa.int32()),
        "output_tokens": pa.array([5] * len(rows), pa.int32()),
        "hash_ids": pa.array([r[3] for r in rows], pa.list_(pa.uint64())),
        "session_id": pa.nulls(len(rows), pa.string()), "parent_id": pa.nulls(len(rows), pa.string()),
        "turn": pa.nulls(len(rows), pa.int32()), "delay_ms": pa.nulls(len(rows), pa.int64()),
        "priority": pa.nulls(len(rows), pa.int32()),
    }).cast(TRACE_SCHEMA)
    meta = TraceMetadata(source_format="test", source_file="hand", time_unit="ms", hash_block_size=16,
                         prefix_identity="real")
    path = tmp_path / "t.parquet"
    pq.write_table(table.replace_schema_metadata(meta.to_parquet_metadata()), path)
    out = write_run(tmp_path / "run", path, RunSpec(reject_frac=0.0, unfinished_frac=0.0))
    run = open_run(out)
    assert build_trace_ideal(run)
    got = dict(run.con.execute("SELECT request_id, ideal_hit_tokens FROM trace_ideal").fetchall())
    assert got == {"r0": 0, "r1": 30, "r2": 16, "r3": 0, "r4": 0, "r5": 48}
    assert got == dict(zip(table.column("request_id").to_pylist(),
                           ideal_hits_reference(table.to_pandas(), 16).tolist(), strict=True))


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"real Mooncake trace not present at {MOONCAKE}")
def test_ideal_reuse_on_the_mooncake_trace_matches_the_known_figure(tmp_path):
    """docs/reports.md: token-level prefix hit with an infinite cache 0.3736 on this trace."""
    recs = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    n = len(recs)
    table = pa.table({
        "request_id": [f"m{i}" for i in range(n)], "arrival_ms": [r["timestamp"] for r in recs],
        "input_tokens": pa.array([r["input_length"] for r in recs], pa.int32()),
        "output_tokens": pa.array([r["output_length"] for r in recs], pa.int32()),
        "hash_ids": pa.array([r["hash_ids"] for r in recs], pa.list_(pa.uint64())),
        "session_id": pa.nulls(n, pa.string()), "parent_id": pa.nulls(n, pa.string()),
        "turn": pa.nulls(n, pa.int32()), "delay_ms": pa.nulls(n, pa.int64()), "priority": pa.nulls(n, pa.int32()),
    }).cast(TRACE_SCHEMA)
    meta = TraceMetadata(source_format="mooncake", source_file=str(MOONCAKE), time_unit="ms",
                         hash_block_size=512, prefix_identity="real")
    path = tmp_path / "mooncake.parquet"
    pq.write_table(table.replace_schema_metadata(meta.to_parquet_metadata()), path)
    out = write_run(tmp_path / "run", path, RunSpec())
    run = open_run(out)
    assert build_trace_ideal(run)
    ratio = run.con.execute("SELECT ideal_hit_ratio FROM (" + _sql("reuse_ideal") + ")").fetchone()[0]
    assert ratio == pytest.approx(0.3736, abs=5e-5)


def _sql(name):
    from replay.reports.sqlfiles import sql

    return sql(name)


def test_mtp_acceptance(frames, metrics):
    req = frames[0]
    m = metrics.mtp
    assert m["drafts"] == req.num_drafts.sum()
    assert m["draft_tokens"] == req.num_draft_tokens.sum()
    assert m["accepted_tokens"] == req.num_accepted_tokens.sum()
    if req.num_draft_tokens.sum():
        _close(req.num_accepted_tokens.sum() / req.num_draft_tokens.sum(), m["acceptance_rate"])
        _close(1 + req.num_accepted_tokens.sum() / req.num_drafts.sum(), m["mean_acceptance_length"])
    else:
        assert m["acceptance_rate"] is None and m["mean_acceptance_length"] is None


def test_steps_summary_time_weighted(frames, metrics):
    steps = frames[2]
    w = steps.duration_ms.to_numpy()
    s = metrics.steps
    assert s["steps"] == len(steps)
    _close(w.sum(), s["busy_ms"])
    for col in ("kv_usage", "cpu_usage", "running", "waiting"):
        _close(float(np.sum(steps[col].to_numpy(dtype=float) * w) / w.sum()), s[f"{col}_mean"], rel=1e-6)
    _close(float(steps.kv_usage.max()), s["kv_usage_max"], rel=1e-6)
    assert s["waiting_max"] == steps.waiting.max()
    assert s["waiting_final"] == steps.sort_values("step").waiting.iloc[-1]
    _close(float(w[steps.kv_usage.to_numpy() >= 0.95].sum() / w.sum()), s["kv_saturated_fraction"])
    assert s["bytes_stored"] == steps.bytes_stored.sum()
    assert s["bytes_loaded"] == steps.bytes_loaded.sum()


def test_steps_over_time_buckets(frames, metrics):
    steps = frames[2].copy()
    b = metrics.bucket_ms
    steps["bucket"] = np.floor(steps.start_ms / b).astype(int)
    steps["kvw"] = steps.kv_usage.astype(float) * steps.duration_ms
    steps["ww"] = steps.waiting * steps.duration_ms
    g = steps.groupby("bucket").agg(kvw=("kvw", "sum"), dur=("duration_ms", "sum"), ww=("ww", "sum"),
                                    wmax=("waiting", "max"), pre=("preemptions", "sum"))
    got = {r["bucket"]: r for r in metrics.steps_over_time}
    assert list(got) == list(g.index)
    assert 20 <= len(got) <= 200
    for k, row in g.iterrows():
        _close(row.kvw / row.dur, got[k]["kv_usage_mean"], rel=1e-6)
        _close(row.ww / row.dur, got[k]["waiting_mean"], rel=1e-6)
        assert got[k]["waiting_max"] == row.wmax
        assert got[k]["preemptions"] == row.pre


def test_latency_over_time_and_keeping_up(frames, metrics):
    req = frames[0].copy()
    b = metrics.bucket_ms
    req["bucket"] = np.floor(req.arrival_ms / b).astype(int)
    fin = req[req.status == "finished"]
    got = {r["bucket"]: r for r in metrics.latency_over_time}
    for k, grp in req.groupby("bucket"):
        assert got[k]["arrivals"] == len(grp)
        f = fin[fin.bucket == k]
        if len(f):
            _close(float(np.percentile(f.ttft_ms, 50)), got[k]["ttft_p50"])
            _close(float(np.percentile(f.ttft_ms, 99)), got[k]["ttft_p99"])
            _close(float(np.percentile(f.queue_ms, 50)), got[k]["queue_p50"])
    done = np.floor(fin.finish_ms / b).astype(int).value_counts()
    for k, n in done.items():
        assert got[k]["completions"] == n
    lo, hi = req.arrival_ms.min(), req.arrival_ms.max()
    first = fin[fin.arrival_ms <= lo + 0.2 * (hi - lo)].ttft_ms
    last = fin[fin.arrival_ms >= hi - 0.2 * (hi - lo)].ttft_ms
    _close(float(np.percentile(first, 50)), metrics.keeping_up["ttft_p50_first_fifth"])
    _close(float(np.percentile(last, 50)), metrics.keeping_up["ttft_p50_last_fifth"])
    _close(float(fin.queue_ms.sum() / fin.ttft_ms.sum()), metrics.keeping_up["queue_share_of_ttft"])
    assert 0 < metrics.keeping_up["queue_share_of_ttft"] < 1


def test_falling_behind_rule():
    assert falling_behind({"ttft_p50_first_fifth": 50.0, "ttft_p50_last_fifth": 5000.0})
    assert not falling_behind({"ttft_p50_first_fifth": 50.0, "ttft_p50_last_fifth": 90.0})
    assert not falling_behind({"ttft_p50_first_fifth": 900.0, "ttft_p50_last_fifth": 1200.0})
    assert falling_behind({"ttft_p50_first_fifth": None, "ttft_p50_last_fifth": 1.0}) is None


def test_status_rows(frames, metrics):
    req = frames[0]
    bad = req[req.status != "finished"]
    got = {(r["status"], r["reason"]): r["requests"] for r in metrics.status}
    want = bad.assign(reason=bad.reject_reason.fillna("")).groupby(["status", "reason"]).size().to_dict()
    assert got == want
    assert any("rejected" in w for w in metrics.warnings)
    assert any("uncalibrated" in w for w in metrics.warnings)


def test_the_routed_ideal_is_an_infinite_cache_per_replica(tmp_path):
    """fleet_ideal.sql on a fleet's run: per replica, an infinite cache over the rows it served, in
    arrival order; rows rejected before the run count in the trace's ideal only."""
    from typer.testing import CliRunner

    from replay.cli import app

    trace, out, cfg = tmp_path / "synth.parquet", tmp_path / "out", tmp_path / "fleet.yaml"
    res = CliRunner().invoke(app, ["synth", "-n", "1200", "--turns-mean", "2", "--seed", "3", "-o", str(trace)])
    assert res.exit_code == 0, res.output
    cfg.write_text("kv_cache: {num_gpu_blocks: 250}\nfleet: {replicas: 3, router: kv_aware}\n")
    res = CliRunner().invoke(app, ["run", str(trace), "-c", str(cfg), "-o", str(out), "-q", "--on-error", "skip"])
    assert res.exit_code == 0, res.output
    run = open_run(out)
    rows = pq.read_table(trace).to_pandas()
    req = pq.read_table(out / "requests.parquet").to_pandas()
    assert (req.status == "rejected").sum() > 0
    block = run.trace_meta.hash_block_size
    expected = 0
    for _, served in req[req.status != "rejected"].groupby("replica"):
        mine = rows[rows.request_id.isin(served.request_id)].reset_index(drop=True)
        expected += int(ideal_hits_reference(mine, block).sum())
    routed = run.con.execute(_sql("fleet_ideal")).fetchone()
    assert routed[0] == expected > 0
    assert routed[1] == int(req[req.status != "rejected"].input_tokens.sum())
    assert build_trace_ideal(run)
    whole = run.con.execute("SELECT sum(ideal_hit_tokens) FROM trace_ideal").fetchone()[0]
    assert whole == int(ideal_hits_reference(rows, block).sum()) >= expected


def test_waiting_at_the_end_sums_each_replicas_last_step():
    """Step numbers are per replica: two replicas both end at step 2, with 3 and 7 waiting."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE VIEW steps AS SELECT * FROM (VALUES "
                "(0, 0, 1), (1, 0, 2), (2, 0, 3), (0, 1, 4), (1, 1, 5), (2, 1, 7)) v(step, replica, waiting), "
                "(SELECT 10.0 AS duration_ms, 0.5 AS kv_usage, 0.0 AS cpu_usage, 1 AS running, "
                "0 AS bytes_stored, 0 AS bytes_loaded)")
    cur = con.execute(_sql("steps_summary"))
    summary = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    assert (summary["waiting_final"], summary["waiting_max"], summary["steps"]) == (10, 7, 6)
