"""The fleet: a fleet of one is the single engine, copies of a trace split exactly, windows stay exact."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from replay.ingest.schema import TRACE_SCHEMA
from tests.engine_helpers import make_trace, setup_for

ROUTERS = ["round_robin", "random", "session_affinity", "least_loaded", "kv_aware", "prefix_score"]
PARQUETS = ("requests.parquet", "chunks.parquet", "steps.parquet")


class ContextTimer:
    """A step costs a base plus per scheduled token plus per token of decode context, so a step
    timed with the wrong context (or at the wrong instant) changes the output."""

    host_overhead_ms = 0.0
    uncalibrated: list[str] = []

    def step_ms(self, n_pre, pre_tok, pre_ctx, pre_work, n_dec, dec_q, dec_ctx, passes) -> float:
        return 4.0 + 0.01 * (pre_tok + dec_q) + 0.0005 * (pre_ctx + dec_ctx) + 0.2 * n_dec

    def min_step_ms(self) -> float:
        """The fleet bounds how soon a request can finish with it (one token, no context)."""
        return self.step_ms(1, 1, 0, 0, 0, 0, 0, 0)

    def breakdown(self, shape):  # pragma: no cover - not used by the engine
        raise NotImplementedError


def _rows(n: int, seed: int, *, sessions: bool, copy: int = 0) -> list[dict]:
    """Shared prefixes (a few system prompts), bursts, and optionally closed-loop session turns."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 0
    for i in range(n):
        t += int(rng.exponential(25))
        inp = int(rng.integers(20, 400))
        n_ids = -(-inp // 16)
        prefix = int(rng.integers(0, 4))
        shared = min(n_ids - 1, int(rng.integers(0, 6)))
        base = copy * 10**8
        ids = ([base + prefix * 1000 + j for j in range(shared)]
               + [base + 10**6 + i * 100 + j for j in range(n_ids - shared)])
        row = dict(request_id=f"c{copy}-r{i}", arrival_ms=t, input_tokens=inp,
                   output_tokens=int(rng.integers(1, 120)), hash_ids=ids)
        if sessions and i % 3:
            row.update(session_id=f"c{copy}-s{i // 3}", turn=i % 3 + 1, delay_ms=float(rng.integers(0, 200)))
        elif sessions:
            row.update(session_id=f"c{copy}-s{i // 3}", turn=1)
        rows.append(row)
    return rows


def _run(table, meta, data: dict, out, blocks: int, *, fast_forward: bool = True) -> dict:
    """One event loop for the whole fleet, also where its replicas could be replayed apart
    (tests/engine/test_fleet_partition.py compares the two)."""
    cfg = EngineConfig.model_validate(data)
    return replay_trace(table, meta, cfg, out, setup=setup_for(blocks, ContextTimer()),
                        fast_forward=fast_forward, check_invariants=True, replicas_apart=False).run_info


def _same_files(a, b) -> None:
    for name in PARQUETS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("offload", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_fleet_of_one_is_the_single_engine(tmp_path, router, offload):
    table, meta = make_trace(_rows(150, 3, sessions=True))
    base = {"scheduler": {"max_num_batched_tokens": 128}}
    if offload:
        base["host_offload"] = {"num_cpu_blocks": 300, "d2h_gbps": 0.05, "h2d_gbps": 0.05}
    single = _run(table, meta, base, tmp_path / "single", 80)
    fleet = _run(table, meta, {**base, "fleet": {"replicas": 1, "router": router}}, tmp_path / "fleet", 80)
    _same_files(tmp_path / "single", tmp_path / "fleet")
    assert single["totals"] == fleet["totals"]
    assert single["totals"]["preemptions"] > 0  # the small pool really preempts
    assert fleet["fleet"]["per_replica"][0]["requests"] == 150


@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_on_interleaved_copies_gives_each_replica_its_copy(tmp_path, replicas):
    rows = _rows(120, 5, sessions=False)
    single_table, meta = make_trace(rows)
    single = _run(single_table, meta, {}, tmp_path / "single", 70)
    assert single["totals"]["preemptions"] > 0
    # N copies with disjoint ids, interleaved: every row followed by its copies, same timestamps.
    copies = [_rows(120, 5, sessions=False, copy=c) for c in range(replicas)]
    fleet_rows = [copies[c][i] for i in range(len(rows)) for c in range(replicas)]
    fleet_table, fleet_meta = make_trace(fleet_rows)
    info = _run(fleet_table, fleet_meta, {"fleet": {"replicas": replicas, "router": "round_robin"}},
                tmp_path / "fleet", 70)
    one = pd.read_parquet(tmp_path / "single" / "requests.parquet")
    many = pd.read_parquet(tmp_path / "fleet" / "requests.parquet")
    one_steps = pd.read_parquet(tmp_path / "single" / "steps.parquet")
    many_steps = pd.read_parquet(tmp_path / "fleet" / "steps.parquet")
    cols = ["arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms", "cached_tokens",
            "num_preemptions", "output_tokens", "status"]
    for c in range(replicas):
        mine = many[many.request_id.str.startswith(f"c{c}-")].reset_index(drop=True)
        assert (mine.replica == c).all()
        pd.testing.assert_frame_equal(mine[cols], one[cols])
        steps = many_steps[many_steps.replica == c].drop(columns="replica").sort_values("step").reset_index(drop=True)
        pd.testing.assert_frame_equal(steps, one_steps)
    assert info["totals"]["preemptions"] == replicas * single["totals"]["preemptions"]


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("latency", [0.0, 7.5])
def test_decode_windows_stay_exact_in_a_fleet(tmp_path, router, latency):
    """Windows end where an arrival may reach the replica or another replica may release a turn:
    fast-forwarding must give the same bytes as stepping every replica one step at a time."""
    table, meta = make_trace(_rows(240, 11, sessions=True))
    data = {"fleet": {"replicas": 3, "router": router, "router_latency_ms": latency}}
    a = _run(table, meta, data, tmp_path / "ff", 90, fast_forward=True)
    b = _run(table, meta, data, tmp_path / "step", 90, fast_forward=False)
    # Rows are written as replicas produce them, and a window writes many steps at once, so the
    # row order differs between the two; every row must be the same.
    assert (tmp_path / "ff" / "requests.parquet").read_bytes() == (tmp_path / "step" / "requests.parquet").read_bytes()
    for name, key in (("chunks.parquet", ["request", "replica", "first_step"]), ("steps.parquet", ["replica", "step"])):
        x, y = (pd.read_parquet(tmp_path / d / name).sort_values(key).reset_index(drop=True) for d in ("ff", "step"))
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert a["totals"] == b["totals"]
    assert a["fleet"] == b["fleet"] or _equal_but_busy(a["fleet"], b["fleet"])


def _sorted_rows(out, name: str) -> pd.DataFrame:
    key = {"chunks.parquet": ["request", "replica", "first_step"], "steps.parquet": ["replica", "step"]}[name]
    return pd.read_parquet(out / name).sort_values(key).reset_index(drop=True)


@pytest.mark.parametrize("router", ["least_loaded", "kv_aware", "prefix_score"])
@pytest.mark.parametrize("latency", [0.0, 7.5])
@pytest.mark.parametrize("blocks,max_open_steps", [(45, 256), (400, 256), (400, 5)])
def test_open_decode_windows_stay_exact_in_a_fleet(tmp_path, monkeypatch, router, latency, blocks, max_open_steps):
    """Open-loop traffic, a router that reads every replica: windows stay open past arrivals routed
    elsewhere and are brought to each arrival before routing. The rows must be those of stepping
    every replica one step at a time and of windows cut at every arrival; in the small pool the
    windows' allocations evict the cached prefixes the router reads, and some would run it dry;
    with open windows of at most 5 steps, windows close and reopen between arrivals."""
    from replay.engine import decode_window
    monkeypatch.setattr(decode_window, "OPEN_WINDOW_MAX_STEPS", max_open_steps)
    table, meta = make_trace(_rows(300, 21, sessions=False))
    data = {"fleet": {"replicas": 4, "router": router, "router_latency_ms": latency}}
    infos = {"open": _run(table, meta, data, tmp_path / "open", blocks)}
    infos["step"] = _run(table, meta, data, tmp_path / "step", blocks, fast_forward=False)
    from replay.engine.fleet import FleetLoop
    monkeypatch.setattr(FleetLoop, "windows_stay_open", False)
    infos["cut"] = _run(table, meta, data, tmp_path / "cut", blocks)
    for other in ("step", "cut"):
        assert (tmp_path / "open" / "requests.parquet").read_bytes() == \
            (tmp_path / other / "requests.parquet").read_bytes(), other
        for name in ("chunks.parquet", "steps.parquet"):
            pd.testing.assert_frame_equal(_sorted_rows(tmp_path / "open", name), _sorted_rows(tmp_path / other, name),
                                          check_exact=True)
        assert infos["open"]["totals"] == infos[other]["totals"]
    if max_open_steps > 100:  # the open windows took steps the scheduler took when windows were cut
        assert infos["open"]["schedule_calls"] < infos["cut"]["schedule_calls"]
    if blocks == 45:
        assert infos["open"]["totals"]["preemptions"] > 0
        assert infos["open"]["totals"]["gpu_block_evictions"] > 0


@pytest.mark.parametrize("router", ["round_robin", "kv_aware"])
def test_decode_windows_stay_exact_in_a_fleet_in_concurrency_mode(tmp_path, router):
    """In a closed loop any finish releases the next request at once, to any replica."""
    table, meta = make_trace(_rows(200, 12, sessions=False))
    data = {"load": {"mode": "concurrency", "concurrency": 9}, "fleet": {"replicas": 3, "router": router}}
    a = _run(table, meta, data, tmp_path / "ff", 90, fast_forward=True)
    b = _run(table, meta, data, tmp_path / "step", 90, fast_forward=False)
    assert (tmp_path / "ff" / "requests.parquet").read_bytes() == (tmp_path / "step" / "requests.parquet").read_bytes()
    assert a["totals"] == b["totals"]


def _equal_but_busy(x: dict, y: dict) -> bool:
    """Busy time sums step durations in a different order with and without windows (float sums)."""
    def strip(d: dict) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("busy_ms", "busy_fraction")} for r in d["per_replica"]]

    return strip(x) == strip(y) and all(abs(p["busy_ms"] - q["busy_ms"]) < 1e-6 * max(1.0, p["busy_ms"])
                                        for p, q in zip(x["per_replica"], y["per_replica"]))


@pytest.mark.parametrize("sessions", [True, False])  # open-loop traffic: windows stay open past arrivals
def test_fleet_runs_are_deterministic_and_use_every_replica(tmp_path, sessions):
    table, meta = make_trace(_rows(200, 2, sessions=sessions))
    data = {"fleet": {"replicas": 4, "router": "kv_aware", "router_options": {"router_temperature": 0.5}}}
    _run(table, meta, data, tmp_path / "a", 200)
    _run(table, meta, data, tmp_path / "b", 200)
    _same_files(tmp_path / "a", tmp_path / "b")
    reqs = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert sorted(reqs.replica.unique()) == [0, 1, 2, 3]
    steps = pd.read_parquet(tmp_path / "a" / "steps.parquet")
    assert sorted(steps.replica.unique()) == [0, 1, 2, 3]
    # Every replica numbers its own steps from 0 without gaps.
    for _, g in steps.groupby("replica"):
        assert g.step.sort_values().tolist() == list(range(len(g)))


def test_session_affinity_keeps_every_turn_on_one_replica(tmp_path):
    table, meta = make_trace(_rows(150, 4, sessions=True))
    _run(table, meta, {"fleet": {"replicas": 4, "router": "session_affinity"}}, tmp_path / "o", 200)
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert (reqs.groupby("session_id").replica.nunique() == 1).all()
    assert reqs.replica.nunique() > 1


def test_router_latency_delays_the_queue_not_the_arrival(tmp_path):
    table, meta = make_trace([dict(arrival_ms=0, input_tokens=32, output_tokens=2, hash_ids=[1, 2])])
    base = _run(table, meta, {"fleet": {"replicas": 2}}, tmp_path / "a", 50)
    late = _run(table, meta, {"fleet": {"replicas": 2, "router_latency_ms": 25.0}}, tmp_path / "b", 50)
    a = pd.read_parquet(tmp_path / "a" / "requests.parquet").iloc[0]
    b = pd.read_parquet(tmp_path / "b" / "requests.parquet").iloc[0]
    assert a.arrival_ms == b.arrival_ms == 0.0
    assert b.first_scheduled_ms == 25.0 and b.ttft_ms == pytest.approx(a.ttft_ms + 25.0)
    assert base["totals"]["finished"] == late["totals"]["finished"] == 1


def test_fleet_config_is_validated():
    from replay.base.errors import ConfigError
    from replay.engine.config import validate_config

    with pytest.raises(ConfigError, match="unknown key"):
        validate_config({"fleet": {"replicas": 2, "router": "kv_aware", "router_options": {"overlap": 1}}}, "t")
    with pytest.raises(ConfigError, match="router"):
        validate_config({"fleet": {"replicas": 2, "router": "dynamo"}}, "t")
    with pytest.raises(ConfigError, match="replicas"):
        validate_config({"fleet": {"replicas": 0}}, "t")
    with pytest.raises(ConfigError, match="unknown key"):
        validate_config({"fleet": {"replicas": 2, "routr": "random"}}, "t")
    cfg = validate_config({}, "t", ["fleet.replicas=4", "fleet.router=least_loaded",
                                     "fleet.router_options.stats_update_ms=0"])
    assert cfg.fleet.replicas == 4 and cfg.fleet.router_options == {"stats_update_ms": 0}


def test_no_fleet_key_writes_no_replica_column(tmp_path):
    table, meta = make_trace(_rows(30, 1, sessions=False))
    _run(table, meta, {}, tmp_path / "a", 200)
    _run(table, meta, {"fleet": {"replicas": 2}}, tmp_path / "b", 200)
    assert "replica" not in pa.parquet.read_schema(tmp_path / "a" / "requests.parquet").names
    assert pa.parquet.read_schema(tmp_path / "b" / "requests.parquet").field("replica").type == pa.int32()
    assert TRACE_SCHEMA.get_field_index("replica") == -1


def test_fleet_report_section_and_views(tmp_path):
    from replay.reports.report import write_report
    from replay.reports.views import open_run

    table, meta = make_trace(_rows(200, 8, sessions=True))
    _run(table, meta, {"fleet": {"replicas": 3, "router": "kv_aware"}}, tmp_path / "fleet", 120)
    _run(table, meta, {}, tmp_path / "single", 120)
    result = write_report(tmp_path / "fleet", tmp_path / "fleet" / "report.md")
    text = (tmp_path / "fleet" / "report.md").read_text()
    assert "## Fleet" in text and "3 replicas behind the `kv_aware` router" in text
    assert (tmp_path / "fleet" / "report_files" / "fleet_load.png").is_file()
    f = result.metrics.fleet
    assert sum(r["requests"] for r in f["per_replica"]) == 200
    assert [r["replica"] for r in f["per_replica"]] == [0, 1, 2]
    reuse = result.metrics.reuse["gpu_hit_ratio"]
    routed = f["routed_ideal"]["routed_ideal_hit_ratio"]
    ideal = result.metrics.ideal["ideal_hit_ratio"]
    assert 0 < reuse <= routed <= ideal
    assert f["busy_imbalance"] >= 1.0
    # Disaggregated: a prompt's cache is its prefill replica's, so the routed ideal is measured
    # there (grouped by decode replica it fell below the hits achieved).
    pd_cfg = {"fleet": {"mode": "disaggregated", "router": "random", "prefill_router": "kv_aware",
                        "prefill": {"replicas": 3}, "decode": {"replicas": 3}}}
    _run(table, meta, pd_cfg, tmp_path / "pd", 400)
    pd_result = write_report(tmp_path / "pd", tmp_path / "pd" / "report.md")
    pd_routed = pd_result.metrics.fleet["routed_ideal"]["routed_ideal_hit_ratio"]
    assert 0 < pd_result.metrics.reuse["gpu_hit_ratio"] <= pd_routed <= pd_result.metrics.ideal["ideal_hit_ratio"]
    # A single-engine run has no fleet section, but its views still have a replica column (0).
    single = write_report(tmp_path / "single", tmp_path / "single" / "report.md")
    assert single.metrics.fleet is None and "## Fleet" not in (tmp_path / "single" / "report.md").read_text()
    run = open_run(tmp_path / "single")
    assert run.con.execute("SELECT DISTINCT replica FROM steps").fetchall() == [(0,)]
    assert run.con.execute("SELECT count(*) FROM requests WHERE replica = 0").fetchone()[0] == 200
    run.con.close()


def test_diff_of_two_routers_names_the_fleet_first(tmp_path):
    from replay.reports.diff import diff_runs, render_diff

    table, meta = make_trace(_rows(120, 9, sessions=False))
    _run(table, meta, {"fleet": {"replicas": 2, "router": "round_robin"}}, tmp_path / "a", 120)
    _run(table, meta, {"fleet": {"replicas": 2, "router": "kv_aware"}}, tmp_path / "b", 120)
    text = render_diff(diff_runs(tmp_path / "a", tmp_path / "b"), {})
    assert text.index("## Fleet") < text.index("## Verdict")
    assert "| router **(differs)** | round_robin | kv_aware |" in text
    config = text[text.index("## Config differences"):]
    assert config.index("fleet.router") < config.index("| key |") + 200


@pytest.mark.slow
def test_kv_aware_reuses_at_least_as_much_as_blind_routers_on_mooncake(mooncake_trace, tmp_path):
    """The issue's bar on real traffic: Dynamo's router with KV events reaches a fleet prefix reuse
    at least as high as round robin and session affinity (1,500 Mooncake rows, 4 replicas)."""
    from replay.api import run

    hits = {}
    for router in ("round_robin", "session_affinity", "kv_aware"):
        res = run(mooncake_trace, overrides=["load.max_requests=1500", "fleet.replicas=4", f"fleet.router={router}",
                                             "scheduler.max_num_seqs=256"], outdir=tmp_path / router)
        hits[router] = res.info["prefix_hit_rate"]
        assert res.info["totals"]["finished"] == 1500
    assert hits["kv_aware"] >= hits["round_robin"]
    assert hits["kv_aware"] >= hits["session_affinity"]


def test_rejected_rows_keep_their_requested_output_length(tmp_path):
    rows = [dict(arrival_ms=0, input_tokens=40, output_tokens=7, hash_ids=[1, 2, 3]),
            dict(arrival_ms=1, input_tokens=4000, output_tokens=9, hash_ids=list(range(10, 260)))]
    table, meta = make_trace(rows)
    cfg = EngineConfig.model_validate({"fleet": {"replicas": 2}})
    info = replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(64, ContextTimer()),
                        on_error="skip").run_info
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet").set_index("request_id")
    assert reqs.loc["r1", "status"] == "rejected" and reqs.loc["r1", "output_tokens"] == 9
    assert pd.isna(reqs.loc["r1", "replica"]) and reqs.loc["r0", "replica"] == 0
    assert info["totals"]["output_tokens"] == 7 and info["totals"]["rejected"] == 1


def _pair_rows(n: int, seed: int) -> list[dict]:
    """Rows 4k, 4k + 1 and 4k + 2 start with the same ids, row 4k + 3 shares nothing. Under round
    robin over two replicas, rows 4k and 4k + 2 meet on one replica (the second can hit the first),
    while row 4k + 1's copy is alone on the other: nobody there can hit it."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for i in range(n):
        t += int(rng.exponential(20))
        lead = [5 * 10**6 + (i // 4) * 100 + j for j in range(3)] if i % 4 < 3 else []
        own = [10**7 + i * 100 + j for j in range(int(rng.integers(1, 5)))]
        ids = lead + own
        rows.append(dict(request_id=f"r{i}", arrival_ms=t, input_tokens=16 * len(ids) - int(rng.integers(0, 8)),
                         output_tokens=int(rng.integers(1, 80)), hash_ids=ids))
    return rows


@pytest.mark.parametrize("router", ["round_robin", "random", "session_affinity"])
def test_blocks_shared_only_with_other_replicas_are_private_and_change_nothing(tmp_path, monkeypatch, router):
    """With routing known in advance, a row's ids shared only with rows served elsewhere name blocks
    nobody on its replica can hit (engine/trace_ids.shared_lead_within): they are kept out of the
    prefix-cache map like any private block. The outputs must be those of counting every row."""
    import replay.engine.fleet as fleet_module
    from replay.engine.trace_ids import shared_lead, shared_lead_within

    table, meta = make_trace(_pair_rows(200, 5))
    data = {"scheduler": {"max_num_batched_tokens": 96}, "fleet": {"replicas": 2, "router": router}}
    seen = []
    monkeypatch.setattr(fleet_module, "shared_lead_within",
                        lambda flat, off, groups: seen.append(shared_lead_within(flat, off, groups)) or seen[-1])
    within = _run(table, meta, data, tmp_path / "within", 40)
    assert len(seen) == 1
    monkeypatch.setattr(fleet_module, "shared_lead_within", lambda flat, off, groups: shared_lead(flat, off))
    everyone = _run(table, meta, data, tmp_path / "all", 40)
    assert (tmp_path / "within" / "requests.parquet").read_bytes() == (tmp_path / "all" / "requests.parquet").read_bytes()
    for name, key in (("chunks.parquet", ["request", "replica", "first_step"]), ("steps.parquet", ["replica", "step"])):
        x, y = (pd.read_parquet(tmp_path / d / name).sort_values(key).reset_index(drop=True) for d in ("within", "all"))
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert within["totals"] == everyone["totals"]
    assert within["totals"]["preemptions"] > 0  # private blocks of preempted requests are registered then
    assert within["totals"]["prefix_hit_tokens"] > 0
    flat = np.array([i for r in _pair_rows(200, 5) for i in r["hash_ids"]], dtype=np.uint64)
    assert seen[0].sum() < shared_lead(flat, np.cumsum([0] + [len(r["hash_ids"]) for r in _pair_rows(200, 5)])).sum()


def test_shared_lead_within_counts_only_rows_of_the_same_group():
    from replay.engine.trace_ids import shared_lead_within

    # rows: [1,2] [1,2,3] [1,9] [4] ; groups 0, 1, 0, -1
    flat = np.array([1, 2, 1, 2, 3, 1, 9, 4], dtype=np.uint64)
    offsets = np.array([0, 2, 5, 7, 8])
    assert shared_lead_within(flat, offsets, np.array([0, 1, 0, -1])).tolist() == [1, 0, 1, 0]
    assert shared_lead_within(flat, offsets, np.array([0, 0, 0, 0])).tolist() == [2, 2, 1, 0]


@pytest.mark.parametrize("fleet", [
    {"replicas": 3, "router": "kv_aware"},
    {"mode": "disaggregated", "prefill": {"replicas": 2}, "decode": {"replicas": 2},
     "router": "kv_aware", "prefill_router": "kv_aware", "local_prefill_max_tokens": 64},
], ids=["aggregated", "disaggregated"])
def test_kv_aware_counts_prefill_load_until_the_first_token(tmp_path, monkeypatch, fleet):
    """At every arrival kv_aware's prefill load is exactly the uncached tokens of the requests it
    routed that have no first token yet (the fleet tells it of each first token, on either pool),
    and nothing is left counted when the replay ends."""
    from replay.engine.routers.kv_aware import KvAwareRouter

    routed: dict[tuple[int, int], object] = {}
    routers: list[KvAwareRouter] = []
    route = KvAwareRouter.route

    def checked_route(self, req, replicas, now_ms):
        if self not in routers:
            routers.append(self)
        totals = [0] * self.n
        for idx, load in self.prefilling.items():
            assert routed[id(self), idx].first_token_ms < 0  # settled as soon as its first token is out
            totals[load.replica] += load.tokens
        assert totals == self.prefill_tokens
        pending = [r for (rid, _), r in routed.items() if rid == id(self) and r.first_token_ms < 0]
        assert {r.idx for r in pending} == set(self.prefilling)
        routed[id(self), req.idx] = req
        return route(self, req, replicas, now_ms)

    monkeypatch.setattr(KvAwareRouter, "route", checked_route)
    table, meta = make_trace(_rows(200, 5, sessions=True))
    _run(table, meta, {"fleet": fleet}, tmp_path / "out", 60)
    assert len(routers) == (2 if "prefill" in fleet else 1)
    assert all(not r.prefilling and not any(r.prefill_tokens) for r in routers)
    # Every request finished gave back the prompt blocks it was counted with.
    assert all(not r.active_runs and all(a.num_blocks == 0 and not a.lengths for a in r.active) for r in routers)
