"""The decode-window fast path must not change a single byte of the output."""

from __future__ import annotations

import numpy as np
import pytest

from replay.engine.config import EngineConfig
from replay.engine.run import replay_trace
from tests.engine_helpers import FixedTimer, make_trace, setup_for


def _busy_trace(n: int, seed: int):
    """Shared prefixes, varied lengths, bursts: preemptions, evictions and many decode windows."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 0
    for i in range(n):
        t += int(rng.exponential(40))
        inp = int(rng.integers(20, 400))
        n_ids = -(-inp // 16)
        prefix = int(rng.integers(0, 4))
        shared = min(n_ids - 1, int(rng.integers(0, 6)))
        ids = [prefix * 1000 + j for j in range(shared)] + [10**6 + i * 100 + j for j in range(n_ids - shared)]
        rows.append(dict(arrival_ms=t, input_tokens=inp, output_tokens=int(rng.integers(1, 120)), hash_ids=ids))
    return make_trace(rows)


@pytest.mark.parametrize("blocks,budget,cpu_blocks,prompt_only", [
    (60, 64, None, True), (400, 256, None, True), (60, 64, 80, True), (60, 64, 80, False), (120, 128, 30, True),
    (120, 128, 30, False), pytest.param(400, 256, 5000, False, marks=pytest.mark.slow)])
def test_fast_forward_is_byte_identical(tmp_path, blocks, budget, cpu_blocks, prompt_only):
    table, meta = _busy_trace(150, seed=blocks)
    data = {"scheduler": {"max_num_batched_tokens": budget}, "kv_cache": {"offload_prompt_only": prompt_only}}
    # G2 stores happen inside decode windows (generated blocks, or prompt blocks a full CPU pool
    # refused earlier); a tiny CPU pool refuses some of them
    if cpu_blocks:
        data["host_offload"] = {"num_cpu_blocks": cpu_blocks, "d2h_gbps": 0.05, "h2d_gbps": 0.05}
    cfg = EngineConfig.model_validate(data)
    outs = []
    for ff in (True, False):
        out = tmp_path / f"ff{ff}"
        # per_ctx_ms: step times depend on the decode context, so a window step timed with the
        # context of a neighbouring step changes the bytes (a context-blind timer would not see it)
        info = replay_trace(table, meta, cfg, out, setup=setup_for(blocks, FixedTimer(5.0, 0.01, 1e-4)),
                            fast_forward=ff, check_invariants=True).run_info
        outs.append((out, info))
    (a, ia), (b, ib) = outs
    assert ia["totals"] == ib["totals"]
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    if blocks == 60:
        assert ia["totals"]["preemptions"] > 0  # the small pool really exercises preemption


@pytest.mark.parametrize("blocks", [300, 5000])
def test_decode_windows_time_few_steps_they_do_not_take(tmp_path, blocks):
    # Window step times are computed in batches as events reach them; a window cut short (an
    # allocation that needs the scheduler, the next arrival) must not have timed many more steps.
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    rows, t = [], 0
    for i in range(200):
        t += int(rng.exponential(50))
        inp = int(rng.integers(20, 400))
        rows.append(dict(arrival_ms=t, input_tokens=inp, output_tokens=int(rng.integers(500, 3000)),
                         hash_ids=[10**6 + i * 100 + j for j in range(-(-inp // 16))]))
    table, meta = make_trace(rows, 16)
    cfg = EngineConfig.model_validate({"scheduler": {"max_num_batched_tokens": 256}})
    timer = FixedTimer(5.0, 0.01)
    replay_trace(table, meta, cfg, tmp_path / "out", setup=setup_for(blocks, timer))
    steps = pq.read_metadata(tmp_path / "out" / "steps.parquet").num_rows
    assert steps > 5000
    assert len(timer.calls) <= 2.5 * steps, (len(timer.calls), steps)


def _finishing_pair(tmp_path, max_num_seqs: int, third: bool, ff: bool = True, host_offload: dict | None = None):
    """Two requests decoding together (A: 8 tokens, B: 30); optionally a third one that must wait;
    ``host_offload``: with a G2 tier of that config."""
    import pyarrow.parquet as pq

    rows = [dict(arrival_ms=0, input_tokens=40, output_tokens=8, hash_ids=[1, 2, 3]),
            dict(arrival_ms=0, input_tokens=40, output_tokens=30, hash_ids=[7, 8, 9])]
    if third:
        rows.append(dict(arrival_ms=0, input_tokens=40, output_tokens=5, hash_ids=[11, 12, 13]))
    table, meta = make_trace(rows, 16)
    data: dict = {"scheduler": {"max_num_seqs": max_num_seqs}}
    if host_offload is not None:
        data["host_offload"] = host_offload
    cfg = EngineConfig.model_validate(data)
    out = tmp_path / f"out{ff}"
    summary = replay_trace(table, meta, cfg, out, setup=setup_for(200, FixedTimer(5.0, 0.01, 1e-4)),
                           fast_forward=ff, check_invariants=True)
    # run.json counts the scheduler's calls (compiled callers would not see a patched method)
    calls = summary.run_info["schedule_calls"]
    return calls, pq.read_table(out / "steps.parquet").to_pandas(), pq.read_table(out / "requests.parquet").to_pandas()


def test_a_window_ends_with_the_step_that_finishes_a_request(tmp_path):
    # Step 0 prefills both; A's 8th token comes at step 7 and B's 30th at step 29. Nobody waits, so
    # each finishing step is a window's last: the scheduler builds step 0 only.
    calls, steps, reqs = _finishing_pair(tmp_path, max_num_seqs=8, third=False)
    assert calls == 1
    assert len(steps) == 30
    assert steps.running.tolist() == [2] * 7 + [1] + [1] * 21 + [0]  # counted after the step's finishes
    assert steps.decode_requests.tolist()[1:] == [2] * 7 + [1] * 22
    assert reqs.finish_ms.tolist() == [steps.start_ms[7] + steps.duration_ms[7], steps.start_ms[29] + steps.duration_ms[29]]
    assert steps.kv_blocks_used.tolist()[7] == 3  # A's 3 blocks (40 + 8 tokens) are free after its last step
    calls_b, steps_b, reqs_b = _finishing_pair(tmp_path, max_num_seqs=8, third=False, ff=False)
    assert steps.equals(steps_b) and reqs.equals(reqs_b)
    assert calls_b == 30  # stepping one by one, the scheduler builds every step


def test_a_finish_that_admits_a_waiting_request_ends_a_window_too(tmp_path):
    # C waits for a seat (max_num_seqs 2). A's finishing step 7 is still a window's last: its own
    # schedule() finds C blocked (nobody has finished yet); the seat A frees is first used by step 8,
    # C's prefill, which the scheduler builds. Same bytes as stepping one by one.
    calls, steps, reqs = _finishing_pair(tmp_path, max_num_seqs=2, third=True)
    assert steps.running.tolist()[7] == 1 and steps.waiting.tolist()[7] == 1
    assert steps.prefill_requests.tolist()[8] == 1  # C's prefill, the step after A's finish
    assert calls == 2  # step 0 and C's prefill at step 8; A's and C's last steps end windows
    calls_b, steps_b, reqs_b = _finishing_pair(tmp_path, max_num_seqs=2, third=True, ff=False)
    assert steps.equals(steps_b) and reqs.equals(reqs_b)
    assert calls_b == len(steps_b)


@pytest.mark.parametrize("d2h_gbps", [50.0, 1e-6])
def test_with_g2_a_finishing_step_joins_the_window_once_the_prompts_are_stored(tmp_path, d2h_gbps):
    # A G2 tier storing prompt blocks only: both prompts (2 full blocks each) are offered at step 0,
    # and nothing after, so each finishing step is a window's last, as without G2, and the scheduler
    # builds step 0 only. With a link so slow that A's store is still in flight when A finishes,
    # its blocks wait for the store (the free is deferred) exactly as stepping one by one has them wait.
    g2 = {"num_cpu_blocks": 100, "d2h_gbps": d2h_gbps, "h2d_gbps": 50.0}
    calls, steps, reqs = _finishing_pair(tmp_path, max_num_seqs=8, third=False, host_offload=g2)
    assert calls == 1
    calls_b, steps_b, reqs_b = _finishing_pair(tmp_path, max_num_seqs=8, third=False, ff=False, host_offload=g2)
    assert steps.equals(steps_b) and reqs.equals(reqs_b)
    assert calls_b == 30
    a_blocks_free = steps.kv_blocks_used.tolist()[7] == 3  # B's 3 blocks only: A's were freed at its finish
    assert a_blocks_free == (d2h_gbps > 1)
