"""The "cannot make progress" stop: a replica whose queue head can never fit, with nothing running
and nothing to wait for, must stop the replay with one clear error naming the head, not spin."""

from __future__ import annotations

import math

import pytest

from replay.base.errors import ReplayError
from replay.engine.block_keys import BlockKeys
from replay.engine.config import EngineConfig
from replay.engine.core import EngineCore
from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.scheduler_factory import build_scheduler
from tests.engine_helpers import FixedTimer, make_trace


def _core(tmp_path, num_gpu_blocks: int) -> EngineCore:
    from replay.engine.trace_input import trace_arrays

    sched = build_scheduler(EngineConfig(), num_gpu_blocks, 1 << 20)
    table, meta = make_trace([dict(arrival_ms=0, input_tokens=160, output_tokens=4, hash_ids=list(range(10)))])
    rec = Recorder(trace_arrays(table, meta.hash_block_size), tmp_path)
    return EngineCore(0, sched, FixedTimer(), rec, check_invariants=True)


def _request(idx: int, tokens: int) -> Request:
    ids = list(range(100 * (idx + 1), 100 * (idx + 1) + tokens // 16))
    return Request(idx, f"r{idx}", 0.0, tokens, 4, BlockKeys(ids, 0, len(ids), 16, 16, tokens, idx))


def test_a_head_that_can_never_fit_stops_the_replay_with_its_name(tmp_path):
    core = _core(tmp_path, num_gpu_blocks=12)  # 11 usable blocks
    # Blocks held by nobody the scheduler can free (a leaked or stranded allocation): 8 of 11.
    holder = _request(1, 128)
    assert core.sched.kv.allocate_slots(holder, 128)
    core.sched.add_request(_request(0, 160))  # needs 10 blocks for its prompt: 3 are free
    with pytest.raises(ReplayError, match=r"cannot make progress at t=0.0 ms: request 'r0' \(160 tokens\) "
                                          r"does not fit in the KV cache \(3 free blocks\)"):
        core.begin(0.0, horizon=lambda c: math.inf, next_event=lambda c: math.inf)
    core.rec.abort()


def test_a_head_waiting_for_an_event_is_not_stuck(tmp_path):
    core = _core(tmp_path, num_gpu_blocks=12)
    holder = _request(1, 128)
    assert core.sched.kv.allocate_slots(holder, 128)
    core.sched.add_request(_request(0, 160))
    # Something can still change at t=50 ms (an arrival, a G2 completion): wait for it.
    nxt, completes = core.begin(0.0, horizon=lambda c: math.inf, next_event=lambda c: 50.0)
    assert (nxt, completes) == (50.0, False)
    core.rec.abort()


def test_a_step_that_only_preempted_retries_at_once(tmp_path):
    # One replica, 11 usable blocks, MTP k=2: the long request's decode with its draft lookahead fills
    # the cache and preempts itself (a step with no tokens). vLLM's engine loop calls schedule() again
    # at once; the replica must not sit idle until the next arrival, 5 s later.
    from tests.engine_helpers import run_small

    rows = [dict(arrival_ms=0, input_tokens=31, output_tokens=144, hash_ids=[100, 101]),
            dict(arrival_ms=5000, input_tokens=20, output_tokens=2, hash_ids=[1, 2])]
    cfg = {"speculative": {"num_speculative_tokens": 2, "expected_accepted_tokens": 0.7, "drafter": "synthetic"}}
    reqs, _, steps, info = run_small(rows, tmp_path, num_gpu_blocks=12, config=cfg, timer=FixedTimer(5.0, 0.01, 1e-4))
    assert info["totals"]["preemptions"] >= 1
    first = reqs[reqs.request_id == "r0"].iloc[0]
    assert first.status == "finished" and first.finish_ms < 5000.0
    # No gap between steps while the first request runs (each step starts when the last ended or sooner).
    busy = steps[steps.start_ms < first.finish_ms].sort_values("start_ms")
    ends = (busy.start_ms + busy.duration_ms).to_numpy()
    assert (busy.start_ms.to_numpy()[1:] <= ends[:-1] + 1e-9).all()


def test_loads_that_starve_the_only_running_request_in_turn_stop_the_replay(tmp_path):
    # vLLM 0.11 rules (no load reservation), MTP (0.11 drops the last GPU hit block, so a preempted
    # request finds that block on the CPU and reloads: a one-block G2 load that re-pins its cached
    # blocks) and 39 usable blocks for two requests needing 29 and 21. Each preempted request
    # comes back as a load holding its blocks; the other, running alone, cannot grow and preempts
    # itself; then the roles swap, forever, with no token emitted. The replay must stop, not spin.
    from tests.engine_helpers import run_small

    rows = [dict(arrival_ms=1, input_tokens=325, output_tokens=131, hash_ids=list(range(21))),
            dict(arrival_ms=2, input_tokens=258, output_tokens=64, hash_ids=list(range(1000, 1017)))]
    cfg = {"semantics": "0.11", "scheduler": {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 16},
           "speculative": {"num_speculative_tokens": 1, "expected_accepted_tokens": 0.7, "drafter": "synthetic"},
           "host_offload": {"num_cpu_blocks": 200}}
    with pytest.raises(ReplayError, match=r"cannot make progress .* the only running request was preempted "
                                          r"1001 times with no token emitted since"):
        run_small(rows, tmp_path, num_gpu_blocks=40, config=cfg, timer=FixedTimer(5.0, 0.01, 1e-4))
    # vLLM 0.33 rules reserve blocks for loads and gate admission on the full prompt: it completes.
    reqs, _, _, _ = run_small(rows, tmp_path / "v033", num_gpu_blocks=40, config=cfg | {"semantics": "0.33"},
                              timer=FixedTimer(5.0, 0.01, 1e-4))
    assert (reqs.status == "finished").all()
