"""Exact fast-forward through runs of identical decode-only steps.

Between events, a busy vLLM server often runs hundreds of steps in which every running request
decodes one token and nothing else happens. Those steps differ only in their context length, so
the simulator can take them in one call: it still times every step with the step timer, records
every step and chunk, and performs every block allocation and prefix-cache registration at the
step where the scheduler would (in the same order). The outputs are byte-identical to stepping one
by one (tests/test_engine_fast_forward.py checks this).

Registering a block that decoding just filled is deferred to the request's next allocate_slots
call (its next new block, or the scheduler's next step for it): such a block ends past the prompt,
so its key is unique to the request and no other request can look it up or share it, and nobody
is admitted inside a window. The deferral is therefore invisible in every output.

A window applies only when the step-by-step scheduler could make no other decision: nothing is
waiting, no arrival or other event falls before the step starts, every running request is
decoding without drafts, the batch fits the token budget, and no request finishes inside the
window. It ends early at the first step whose block allocation would fail (that step needs the
real scheduler, which may preempt).
"""

from __future__ import annotations

import heapq

import numpy as np

from engine.recorder import Recorder
from engine.scheduler import Scheduler


def _next_alloc_step(r, base: int, bs: int) -> int:
    """Window step at which ``r`` needs a new block (it computes token number bs * held + 1)."""
    return bs * len(r.block_ids) - base


def run_decode_window(sched: Scheduler, step_ms, rec: Recorder, now: float, next_event_ms: float,
                      step_idx: int, min_steps: int = 3) -> tuple[float, int]:
    """Fast-forward decode-only steps from ``now``; returns (new now, steps taken)."""
    running = sched.running
    nrun = len(running)
    lim = sched.limits
    if not nrun or nrun > lim.max_num_batched_tokens:
        return now, 0
    max_model_len = lim.max_model_len
    m = 1 << 62
    for r in running:
        known = r.num_prompt_tokens + r.num_output_tokens
        if known - r.num_computed_tokens != 1 or r.first_token_ms < 0:
            return now, 0
        remaining = r.max_tokens - r.num_output_tokens
        to_len = max_model_len - known
        if to_len < remaining:
            remaining = to_len
        if remaining < m:
            m = remaining
    m -= 1  # the step that finishes a request goes through the scheduler
    if m < min_steps:
        return now, 0

    kv = sched.kv
    bs = kv.block_size
    pool = kv.pool
    usable = pool.num_gpu_blocks - 1
    base = [r.num_computed_tokens for r in running]
    out0 = [r.num_output_tokens for r in running]
    ctx = sum(base) + nrun  # decode attention context of the first window step
    events = [(_next_alloc_step(r, b, bs), pos) for pos, (r, b) in enumerate(zip(running, base))]
    heapq.heapify(events)
    starts: list[float] = []
    durations: list[float] = []
    ends: list[float] = []
    kv_usage: list[float] = []
    kv_used: list[int] = []
    t = now
    s = 0
    stop = False
    free = pool.get_num_free_blocks()
    while s < m and t < next_event_ms:
        while events and events[0][0] == s:
            pos = events[0][1]
            r = running[pos]
            r.num_computed_tokens = base[pos] + s
            r.num_output_tokens = out0[pos] + s
            if not kv.allocate_slots(r, 1, None, 0):
                stop = True
                break
            heapq.heapreplace(events, (_next_alloc_step(r, base[pos], bs), pos))
            free = pool.get_num_free_blocks()
        if stop:
            break
        dur = step_ms(0, 0, 0, 0, nrun, nrun, ctx, 0)
        starts.append(t)
        durations.append(dur)
        kv_usage.append(1.0 - free / usable)
        kv_used.append(usable - free)
        t += dur
        ends.append(t)
        ctx += nrun
        s += 1
    if s == 0:
        for pos, r in enumerate(running):
            r.num_computed_tokens = base[pos]
            r.num_output_tokens = out0[pos]
        return now, 0
    for pos, r in enumerate(running):
        r.num_computed_tokens = base[pos] + s
        r.num_output_tokens = out0[pos] + s
    rec.record_decode_window(step_idx, starts, durations, nrun, kv_usage, kv_used)
    idx = np.fromiter((r.idx for r in running), dtype=np.int32, count=nrun)
    rec.emit_chunk_arrays(np.tile(idx, s), np.repeat(np.array(ends), nrun), np.ones(s * nrun, np.int32))
    return t, s
