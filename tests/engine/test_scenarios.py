"""Hand-checked vLLM V1 scheduler scenarios on tiny pools (block size 16, fixed 10 ms steps).

Each expected number is worked out in the comments from vLLM's rules (vLLM's v1/core/sched/scheduler.py);
the debug invariants (block conservation, ref counts, budget) run on every step.
"""

from __future__ import annotations

import pytest

from tests.engine_helpers import FixedTimer, run_small

BIG = {"scheduler": {"max_num_batched_tokens": 1000}}


def by_id(reqs):
    return reqs.set_index("request_id")


def test_exact_prefix_hits_and_last_token_rule(tmp_path):
    # r0: 64 tokens, ids [1,2,3,4]; finishes at 20 ms. r1 at 30 ms shares ids [1,2,3] then diverges:
    # hits = 3 blocks = 48 tokens. r2 at 60 ms is identical to r0: the last token is never a hit,
    # so only (64 - 1) // 16 = 3 blocks hit (48 tokens), not 4.
    rows = [dict(input_tokens=64, output_tokens=2, hash_ids=[1, 2, 3, 4]),
            dict(arrival_ms=30, input_tokens=64, output_tokens=2, hash_ids=[1, 2, 3, 9]),
            dict(arrival_ms=60, input_tokens=64, output_tokens=2, hash_ids=[1, 2, 3, 4])]
    reqs, _, _, info = run_small(rows, tmp_path, num_gpu_blocks=64, config=BIG)
    r = by_id(reqs)
    assert list(r.cached_tokens) == [0, 48, 48]
    assert info["totals"]["prefix_hit_tokens"] == 96
    assert info["totals"]["prefix_query_tokens"] == 192


def test_partial_last_trace_block_is_not_a_hit(tmp_path):
    # Trace blocks of 64 tokens, engine blocks of 16. r0 = 100 tokens, ids [5, 6] (id 6 names the
    # partial second trace block, tokens 64..99). r1 = 80 tokens with ids [5, 7]: only trace block 5
    # is shared, i.e. engine blocks 0..3 (64 tokens).
    rows = [dict(input_tokens=100, output_tokens=1, hash_ids=[5, 6]),
            dict(arrival_ms=50, input_tokens=80, output_tokens=1, hash_ids=[5, 7])]
    reqs, _, _, _ = run_small(rows, tmp_path, num_gpu_blocks=64, config=BIG, hash_block_size=64)
    assert list(reqs.cached_tokens) == [0, 64]


def test_eviction_is_lru_and_tail_first(tmp_path):
    # Pool of 7 blocks = 6 usable, free queue [1..6]. r0 (48 tokens, ids 1,2,3) takes blocks 1,2,3
    # and frees them in reverse: queue [4,5,6,3,2,1]. r1 (64 tokens, 4 new ids) pops 4,5,6 and 3,
    # evicting r0's LAST block (key 3). r2 (64 tokens, ids 1,2,3,11) then hits 1 and 2 only: 32 tokens.
    rows = [dict(input_tokens=48, output_tokens=1, hash_ids=[1, 2, 3]),
            dict(arrival_ms=20, input_tokens=64, output_tokens=1, hash_ids=[7, 8, 9, 10]),
            dict(arrival_ms=40, input_tokens=64, output_tokens=1, hash_ids=[1, 2, 3, 11])]
    reqs, _, _, info = run_small(rows, tmp_path, num_gpu_blocks=7, config=BIG)
    assert list(reqs.cached_tokens) == [0, 0, 32]
    assert info["totals"]["gpu_block_evictions"] >= 1
    # With one block less needed by r1 (48 tokens), nothing of r0 is evicted: r2 hits all 3 blocks.
    rows[1] = dict(arrival_ms=20, input_tokens=48, output_tokens=1, hash_ids=[7, 8, 9])
    reqs, _, _, _ = run_small(rows, tmp_path / "b", num_gpu_blocks=7, config=BIG)
    assert list(reqs.cached_tokens) == [0, 0, 48]


def test_preemption_victim_and_resume(tmp_path):
    # 6 usable blocks. A (32 prompt + 40 out) starts at 0; B (same sizes) arrives at 5 ms and is
    # admitted at step 1 (10 ms). Each decode adds a token; B takes its 3rd block at step 2 (pool now
    # full: A 3 + B 3). At step 17 (170 ms) A needs its 4th block (computed 48): FCFS preempts the
    # last admitted request, B. B's prompt blocks stay cached, but re-admission needs 3 blocks
    # (2 evictable hits + 1 new) with only 2 free: head-of-line blocked until A finishes at 400 ms.
    # Meanwhile A's 5th block (at 64 tokens) evicts B's second prompt block, so at step 40 B hits one
    # block and recomputes 48 - 16 = 32 tokens.
    rows = [dict(input_tokens=32, output_tokens=40, hash_ids=[1, 2]),
            dict(arrival_ms=5, input_tokens=32, output_tokens=40, hash_ids=[3, 4])]
    reqs, _, steps, info = run_small(rows, tmp_path, num_gpu_blocks=7, config=BIG)
    r = by_id(reqs)
    assert r.loc["r0", "num_preemptions"] == 0 and r.loc["r1", "num_preemptions"] == 1
    assert r.loc["r0", "finish_ms"] == 400.0
    pre = steps[steps.preemptions > 0]
    assert list(pre.step) == [17] and list(pre.start_ms) == [170.0]
    # No admissions in the step that preempted: step 17 runs A alone.
    assert steps.loc[17, "scheduled_tokens"] == 1 and steps.loc[17, "waiting"] == 1
    assert steps.loc[40, "prefill_tokens"] == 32
    assert r.loc["r1", "output_tokens"] == 40
    assert r.loc["r1", "cached_tokens"] == 0  # hits are counted once, at first admission
    assert info["totals"]["preemptions"] == 1


def test_chunked_prefill_boundaries(tmp_path):
    # Budget 32: a 100-token prompt runs as chunks 32, 32, 32, 4; the first token comes at the end of
    # the 4th step (40 ms). Non-final chunks emit nothing.
    rows = [dict(input_tokens=100, output_tokens=3)]
    reqs, chunks, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                                       config={"scheduler": {"max_num_batched_tokens": 32}})
    assert list(steps.prefill_tokens[:4]) == [32, 32, 32, 4]
    assert reqs.loc[0, "first_token_ms"] == 40.0
    assert list(chunks.time_ms) == [40.0, 50.0, 60.0]
    assert reqs.loc[0, "tpot_ms"] == 10.0


def test_budget_sharing_running_first(tmp_path):
    # A (20 tokens) is decoding when B (100 tokens) arrives; with a budget of 32 the step gives A its
    # 1 decode token first and B a 31-token chunk.
    rows = [dict(input_tokens=20, output_tokens=10),
            dict(arrival_ms=5, input_tokens=100, output_tokens=2)]
    _, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                               config={"scheduler": {"max_num_batched_tokens": 32}})
    s1 = steps.loc[1]
    assert s1.scheduled_tokens == 32 and s1.decode_requests == 1 and s1.prefill_tokens == 31


def test_long_prefill_threshold_caps_chunks(tmp_path):
    rows = [dict(input_tokens=100, output_tokens=1), dict(input_tokens=100, output_tokens=1)]
    _, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                               config={"scheduler": {"max_num_batched_tokens": 1000,
                                                     "long_prefill_token_threshold": 40}})
    assert list(steps.prefill_tokens) == [80, 80, 40]


def test_long_prefill_threshold_is_off_for_a_lone_request(tmp_path):
    # vLLM 0.33 schedule(): with one eligible request there is nobody to protect.
    rows = [dict(input_tokens=100, output_tokens=1)]
    _, _, steps, _ = run_small(rows, tmp_path / "a", num_gpu_blocks=64,
                               config={"scheduler": {"max_num_batched_tokens": 1000,
                                                     "long_prefill_token_threshold": 40}})
    assert list(steps.prefill_tokens) == [100]


def test_head_of_line_blocking(tmp_path):
    # 6 usable blocks. A holds 3 (48 tokens, long output). B (80 tokens = 5 blocks) cannot fit and
    # blocks C (16 tokens) behind it although C would fit: C waits until B is admitted.
    rows = [dict(input_tokens=47, output_tokens=30),
            dict(arrival_ms=5, input_tokens=80, output_tokens=1),
            dict(arrival_ms=6, input_tokens=16, output_tokens=1)]
    reqs, _, _, _ = run_small(rows, tmp_path, num_gpu_blocks=7, config=BIG)
    r = by_id(reqs)
    assert r.loc["r1", "first_scheduled_ms"] >= r.loc["r0", "finish_ms"]
    assert r.loc["r2", "first_scheduled_ms"] >= r.loc["r1", "first_scheduled_ms"]


def test_full_prompt_gate_versus_v011(tmp_path):
    # 6 usable blocks, budget 16. A (20 tokens) holds 2 blocks; B has a 64-token prompt (4 blocks).
    # At step 1 (10 ms) A's last 4 prompt tokens leave 12 of budget, and the full-prompt gate sees
    # 4 free blocks for B's 4: B is admitted with a 12-token chunk. With a watermark of
    # int(0.5 * 7) = 3 blocks, B needs 4 + 3 = 7 > 4 while A runs, so it waits for A to finish.
    rows = [dict(input_tokens=20, output_tokens=20),
            dict(arrival_ms=5, input_tokens=64, output_tokens=1)]
    cfg = {"scheduler": {"max_num_batched_tokens": 16}}
    reqs, _, _, _ = run_small(rows, tmp_path / "a", num_gpu_blocks=7, config=cfg)
    assert by_id(reqs).loc["r1", "first_scheduled_ms"] == 10.0
    cfg_wm = {"scheduler": {"max_num_batched_tokens": 16, "watermark": 0.5}}
    reqs, _, _, _ = run_small(rows, tmp_path / "b", num_gpu_blocks=7, config=cfg_wm)
    r = by_id(reqs)
    assert r.loc["r1", "first_scheduled_ms"] >= r.loc["r0", "finish_ms"]


def test_v011_over_admission_then_tail_preemption(tmp_path):
    # 0.11: admission checks only the first chunk. A 96-token prompt (6 blocks) is admitted beside a
    # running request with 2 free blocks, then preempted when its later chunks do not fit.
    rows = [dict(input_tokens=48, output_tokens=40),
            dict(arrival_ms=5, input_tokens=96, output_tokens=1)]
    cfg = {"semantics": "0.11", "scheduler": {"max_num_batched_tokens": 16}}
    reqs, _, _, _ = run_small(rows, tmp_path / "a", num_gpu_blocks=7, config=cfg)
    assert by_id(reqs).loc["r1", "num_preemptions"] >= 1
    reqs, _, _, _ = run_small(rows, tmp_path / "b", num_gpu_blocks=7,
                              config={"scheduler": {"max_num_batched_tokens": 16}})
    assert by_id(reqs).loc["r1", "num_preemptions"] == 0  # 0.33 gate: waits instead


def test_max_num_seqs_caps_admissions(tmp_path):
    rows = [dict(input_tokens=16, output_tokens=5) for _ in range(3)]
    reqs, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                                  config={"scheduler": {"max_num_batched_tokens": 1000, "max_num_seqs": 2}})
    r = by_id(reqs)
    assert r.loc["r2", "first_scheduled_ms"] == r.loc["r0", "finish_ms"]
    assert steps.running.max() == 2


def test_priority_policy_admits_and_preempts_by_priority(tmp_path):
    rows = [dict(input_tokens=16, output_tokens=2, priority=5),
            dict(arrival_ms=1, input_tokens=16, output_tokens=2, priority=1),
            dict(arrival_ms=2, input_tokens=16, output_tokens=2, priority=3)]
    cfg = {"scheduler": {"max_num_batched_tokens": 1000, "max_num_seqs": 1, "policy": "priority"}}
    reqs, _, _, _ = run_small(rows, tmp_path, num_gpu_blocks=64, config=cfg)
    order = reqs.sort_values("first_scheduled_ms").request_id.tolist()
    assert order == ["r0", "r1", "r2"]  # r0 first (alone at t=0), then priority 1 before 3


def test_priority_preemption_victim_is_worst_priority(tmp_path):
    # Same sizes as test_preemption_victim_and_resume, but the earlier request has the worse priority:
    # under the priority policy the victim is A (priority 9), not the last admitted.
    rows = [dict(input_tokens=32, output_tokens=40, hash_ids=[1, 2], priority=9),
            dict(arrival_ms=5, input_tokens=32, output_tokens=40, hash_ids=[3, 4], priority=0)]
    cfg = {"scheduler": {"max_num_batched_tokens": 1000, "policy": "priority"}}
    reqs, _, _, _ = run_small(rows, tmp_path, num_gpu_blocks=7, config=cfg)
    r = by_id(reqs)
    assert r.loc["r0", "num_preemptions"] >= 1 and r.loc["r1", "num_preemptions"] == 0


def test_closed_loop_session_turn(tmp_path):
    # Turn 2 carries delay_ms = 100: it is ready 100 ms after turn 1 finishes (its trace timestamp
    # of 5 ms is ignored); TTFT is measured from that ready time.
    rows = [dict(input_tokens=16, output_tokens=3, session_id="s", turn=1),
            dict(arrival_ms=5, input_tokens=32, output_tokens=1, session_id="s", turn=2, delay_ms=100)]
    reqs, _, _, info = run_small(rows, tmp_path, num_gpu_blocks=64, config=BIG)
    r = by_id(reqs)
    assert r.loc["r0", "finish_ms"] == 30.0
    assert r.loc["r1", "arrival_ms"] == 130.0 and r.loc["r1", "ttft_ms"] == 10.0
    assert "closed-loop" in info["session_delay_rule"]


def test_trace_speedup_scales_arrivals(tmp_path):
    rows = [dict(input_tokens=16, output_tokens=1), dict(arrival_ms=1000, input_tokens=16, output_tokens=1)]
    reqs, _, _, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                              config={"load": {"mode": "trace_timestamps", "speedup": 4.0}})
    assert list(reqs.arrival_ms) == [0.0, 250.0]


def test_concurrency_mode_keeps_n_in_flight(tmp_path):
    rows = [dict(arrival_ms=i * 1000, input_tokens=16, output_tokens=2) for i in range(5)]
    reqs, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=64,
                                  config={"load": {"mode": "concurrency", "concurrency": 2}})
    r = by_id(reqs)
    assert list(r.arrival_ms[:2]) == [0.0, 0.0]
    assert r.loc["r2", "arrival_ms"] == r.loc["r0", "finish_ms"]
    assert steps.running.max() <= 2


def test_unreplayable_requests_fail_before_work_or_are_marked(tmp_path):
    from replay.base.errors import TraceError

    rows = [dict(input_tokens=16, output_tokens=1), dict(input_tokens=200, output_tokens=1)]
    with pytest.raises(TraceError, match="r1.*KV blocks"):
        run_small(rows, tmp_path / "a", num_gpu_blocks=8, config=BIG)
    assert not (tmp_path / "a" / "out").exists()  # nothing written
    reqs, _, _, info = run_small(rows, tmp_path / "b", num_gpu_blocks=8, config=BIG, on_error="skip")
    r = by_id(reqs)
    assert r.loc["r1", "status"] == "rejected" and "KV blocks" in r.loc["r1", "reject_reason"]
    assert r.loc["r0", "status"] == "finished" and info["totals"]["rejected"] == 1


def test_max_model_len_rejects_too_long(tmp_path):
    from replay.base.errors import TraceError
    from replay.engine.config import EngineConfig
    from replay.engine.run import replay_trace
    from tests.engine_helpers import make_trace, setup_for

    table, meta = make_trace([dict(input_tokens=100, output_tokens=50)])
    with pytest.raises(TraceError, match="max_model_len 120"):
        replay_trace(table, meta, EngineConfig(), tmp_path / "o", setup=setup_for(64, max_model_len=120))


def test_step_shape_reaches_the_timer(tmp_path):
    # One 40-token prompt in chunks of 32 and 8 over a 32-token computed prefix, then decodes.
    timer = FixedTimer()
    run_small([dict(input_tokens=40, output_tokens=2)], tmp_path, num_gpu_blocks=64, timer=timer,
              config={"scheduler": {"max_num_batched_tokens": 32}})
    first, second, third = timer.calls[:3]
    assert first[:4] == (1, 32, 0, 32 * 33 // 2)
    assert second[:4] == (1, 8, 32, 8 * 32 + 8 * 9 // 2)
    assert third[4:7] == (1, 1, 41)  # one decode, one query token, attends to 41 tokens


def test_identical_outputs_for_identical_runs(tmp_path):
    rows = [dict(arrival_ms=i * 7, input_tokens=30 + i, output_tokens=5 + i % 3, hash_ids=[1, 2, 100 + i][: (30 + i + 15) // 16])
            for i in range(20)]
    run_small(rows, tmp_path / "a", num_gpu_blocks=20, config=BIG)
    run_small(rows, tmp_path / "b", num_gpu_blocks=20, config=BIG)
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        assert (tmp_path / "a" / "out" / name).read_bytes() == (tmp_path / "b" / "out" / name).read_bytes()


def test_priority_preemption_of_an_earlier_request_does_not_skip_the_next(tmp_path):
    # Blocks of 16 tokens, 7 usable. A (priority 5) runs first; B and C (priority 0) join at step 1:
    # A 3 blocks + B 2 + C 2 = all 7. At step 2 B needs a 3rd block: the victim is A (worst priority),
    # which sits BEFORE B in running; the list shifts, and vLLM steps its index back so that C is
    # still scheduled in the same step (with a block A freed). Both B and C decode at step 2.
    rows = [dict(input_tokens=32, output_tokens=48, priority=5),
            dict(arrival_ms=1, input_tokens=32, output_tokens=48, priority=0),
            dict(arrival_ms=1, input_tokens=32, output_tokens=48, priority=0)]
    cfg = {"scheduler": {"max_num_batched_tokens": 1000, "policy": "priority"}, "kv_cache": {"block_size": 16}}
    reqs, _, steps, _ = run_small(rows, tmp_path, num_gpu_blocks=8, config=cfg)
    s2 = steps.loc[2]
    assert s2.preemptions == 1 and s2.decode_requests == 2 and s2.running == 2
    assert by_id(reqs).loc["r0", "num_preemptions"] >= 1
