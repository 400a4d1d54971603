"""G2 where only one pool of a disaggregated fleet has it, and a G2 too full to take every store
above a tier chain: fast-forward changes nothing, the chain is written once, run.json adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from replay.api import prepare_any_trace
from replay.engine.config import EngineConfig
from replay.engine.run import replay_prepared
from replay.engine.run_setup import resolve_setup

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"


def _replay(tmp_path: Path, name: str, data: dict, **kwargs) -> dict:
    cfg = EngineConfig.model_validate(data)
    setup = resolve_setup(cfg)
    prepared = prepare_any_trace(SAMPLE, cfg, setup)
    return replay_prepared(prepared, cfg, tmp_path / name, setup=setup, **kwargs).run_info


def _pd_decode_g2(decode_replicas: int) -> dict:
    # A small CPU pool on the decode replicas only: it refuses stores, and its LRU order matters.
    return {"scheduler": {"max_num_batched_tokens": 256, "max_num_seqs": 8},
            "kv_cache": {"num_gpu_blocks": 1000}, "load": {"speedup": 3, "max_requests": 150},
            "fleet": {"mode": "disaggregated", "prefill": {"replicas": 1},
                      "decode": {"replicas": decode_replicas,
                                 "host_offload": {"num_cpu_blocks": 300, "d2h_gbps": 2}}}}


def test_decode_windows_do_not_look_up_a_head_that_reads_from_prefill(tmp_path):
    # A decode replica's queue head that will read its prompt from a prefill replica is never looked
    # up in its G2 (the scheduler does not); a window that did touched the CPU LRU and changed which
    # blocks it evicted later, and from there every time.
    data = _pd_decode_g2(2)
    fast = _replay(tmp_path, "ff", data)
    _replay(tmp_path, "step", data, fast_forward=False)
    keys = {"requests": None, "steps": ["pool", "replica", "step"], "chunks": ["replica", "request", "first_step"]}
    for name, key in keys.items():
        a, b = (pd.read_parquet(tmp_path / d / f"{name}.parquet") for d in ("ff", "step"))
        if key:
            a, b = (x.sort_values(key).reset_index(drop=True) for x in (a, b))
        pd.testing.assert_frame_equal(a, b, obj=name)
    assert fast["totals"]["cpu_store_skipped_full"] > 0  # the CPU pool was full at times


def test_g2_totals_count_the_pool_that_has_it(tmp_path):
    # G2 on the decode pool only (no top-level host_offload): run.json still adds up its stores.
    info = _replay(tmp_path, "d", _pd_decode_g2(1))
    steps = pd.read_parquet(tmp_path / "d" / "steps.parquet")
    assert info["totals"]["bytes_stored"] == int(steps.bytes_stored.sum()) > 0
    assert info["totals"]["num_cpu_blocks"] == 300


def test_a_prefill_pool_without_g2_beside_a_decode_pool_with_it(tmp_path):
    # host_offload at the top, turned off for the prefill pool: core 0 (a prefill replica) has no G2.
    data = {"kv_cache": {"num_gpu_blocks": 1000}, "host_offload": {"num_cpu_blocks": 300},
            "load": {"max_requests": 30},
            "fleet": {"mode": "disaggregated", "prefill": {"replicas": 1, "host_offload": False},
                      "decode": {"replicas": 2}}}
    info = _replay(tmp_path, "pd", data)
    assert info["totals"]["finished"] == 30
    assert info["totals"]["cpu_blocks_stored"] > 0
    assert json.loads((tmp_path / "pd" / "run.json").read_text())["totals"] == info["totals"]


def test_a_store_g2_refuses_reaches_the_chain_once(tmp_path):
    # A CPU pool so small and slow that it refuses most stores (they are retried at later steps),
    # above a write-through tier: each block is written to the tier once, when G2 takes it, not
    # once per refused attempt (which queued millions of writes and ran the link past 100%).
    data = {"scheduler": {"max_num_batched_tokens": 256, "max_num_seqs": 8},
            "kv_cache": {"num_gpu_blocks": 900, "tiers": [
                {"name": "pool", "medium": "remote", "scope": "replica", "num_blocks": 3000,
                 "read_gb_per_s": 2, "write_gb_per_s": 2, "latency_ms": 1.0}]},
            "host_offload": {"num_cpu_blocks": 300, "d2h_gbps": 1, "h2d_gbps": 1},
            "load": {"max_requests": 60}}
    info = _replay(tmp_path, "t", data)
    tier = info["kv_tiers"][0]
    assert info["totals"]["cpu_store_skipped_full"] > 0
    assert tier["blocks_written"] <= info["totals"]["cpu_blocks_stored"]
    assert tier["link_utilization"]["write"] <= 1.0


def test_requests_holding_blocks_are_served_before_a_preempted_one(tmp_path):
    # vLLM 0.33 keeps waiting requests that hold KV blocks (a finished CPU load) in their own queue,
    # served first; a preempted request re-enters behind them. With one queue and the preempted
    # request at the head, a replica with loads done and nothing running stopped ("cannot make
    # progress", 171 of 299 blocks free): the loads' blocks were never reached.
    from typer.testing import CliRunner

    from replay.cli import app

    trace = tmp_path / "synth.parquet"
    res = CliRunner().invoke(app, ["synth", "-n", "5000", "--turns-mean", "1", "-o", str(trace)])
    assert res.exit_code == 0, res.output
    data = {"kv_cache": {"num_gpu_blocks": 250}, "host_offload": {"num_cpu_blocks": 400},
            "load": {"max_requests": 800}}
    cfg = EngineConfig.model_validate(data)
    setup = resolve_setup(cfg)
    prepared = prepare_any_trace(trace, cfg, setup, on_error="skip")
    info = replay_prepared(prepared, cfg, tmp_path / "o", setup=setup).run_info
    assert info["totals"]["unfinished"] == 0 and info["totals"]["preemptions"] > 0


def test_the_fcfs_queue_keeps_block_holders_first():
    from types import SimpleNamespace

    from replay.engine.request import RequestStatus
    from replay.engine.waiting_queue import FCFSQueue

    def req(name: str, computed: int = 0, status: RequestStatus = RequestStatus.WAITING):
        return SimpleNamespace(name=name, num_computed_tokens=computed, status=status)

    q = FCFSQueue()
    for r in (req("loading", status=RequestStatus.WAITING_FOR_REMOTE_KVS), req("loaded", computed=64),
              req("new")):
        q.add(r)
    q.prepend(req("preempted", status=RequestStatus.PREEMPTED))  # behind the two holding blocks
    q.prepend(req("skipped-load", status=RequestStatus.WAITING_FOR_REMOTE_KVS))  # at the very head
    assert [r.name for r in q] == ["skipped-load", "loading", "loaded", "preempted", "new"]


def test_the_priority_queue_keeps_block_holders_first():
    from types import SimpleNamespace

    from replay.engine.request import RequestStatus
    from replay.engine.waiting_queue import PriorityQueue

    def req(name: str, priority: int, arrival: float, computed: int = 0,
            status: RequestStatus = RequestStatus.WAITING):
        return SimpleNamespace(name=name, priority=priority, arrival_ms=arrival, idx=int(arrival),
                               num_computed_tokens=computed, status=status)

    q = PriorityQueue()
    q.add(req("new-urgent", 0, 5.0))
    q.add(req("new", 2, 1.0))
    q.prepend(req("loaded", 3, 4.0, computed=64))  # a finished load: its blocks are held
    q.prepend(req("loading", 1, 6.0, status=RequestStatus.WAITING_FOR_REMOTE_KVS))
    q.prepend(req("preempted", 1, 0.0, status=RequestStatus.PREEMPTED))  # by its key, among the others
    # vLLM 0.33: kv_holding_waiting (by priority, arrival) is drained before waiting.
    assert [r.name for r in q] == ["loading", "loaded", "new-urgent", "preempted", "new"]
    assert len(q) == 5 and q.peek().name == "loading"
    assert [q.pop().name for _ in range(5)] == ["loading", "loaded", "new-urgent", "preempted", "new"]
    assert not q


def test_priority_block_holders_are_served_before_better_priorities(tmp_path):
    # With one heap by (priority, arrival), a request whose CPU load had finished sat behind
    # better-priority requests that did not fit, and with nothing running the replay stopped
    # ("cannot make progress" at t=62 s on this trace): vLLM serves the block holders first.
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from replay.cli import app

    trace = tmp_path / "synth.parquet"
    res = CliRunner().invoke(app, ["synth", "-n", "3000", "--turns-mean", "1", "--seed", "1", "-o", str(trace)])
    assert res.exit_code == 0, res.output
    table = pq.read_table(trace)
    priorities = pa.array(np.random.default_rng(1).integers(0, 4, len(table)).astype(np.int32))
    pq.write_table(table.set_column(table.schema.get_field_index("priority"), "priority", priorities), trace)
    data = {"kv_cache": {"num_gpu_blocks": 200}, "host_offload": {"num_cpu_blocks": 300},
            "load": {"max_requests": 200}, "scheduler": {"policy": "priority"}}
    cfg = EngineConfig.model_validate(data)
    setup = resolve_setup(cfg)
    prepared = prepare_any_trace(trace, cfg, setup, on_error="skip")
    info = replay_prepared(prepared, cfg, tmp_path / "o", setup=setup).run_info
    assert info["totals"]["unfinished"] == 0 and info["totals"]["preemptions"] > 0
