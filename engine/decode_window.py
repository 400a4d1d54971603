"""Exact fast-forward through runs of identical decode-only steps.

Between events, a busy vLLM server often runs hundreds of steps in which every running request
decodes one token and nothing else happens. Those steps differ only in their context length, so
the simulator can take them in one call: it still times every step with the step timer, records
every step and chunk, and performs every block allocation and prefix-cache registration at the
step where the scheduler would (in the same order). The outputs are byte-identical to stepping one
by one (tests/engine/test_fast_forward.py checks this).

Registering a block that decoding just filled is deferred to the request's next new block or the
window's end, where every running request catches up: such a block ends past the prompt, so its
key is unique to the request and no other request can look it up or share it, nobody is admitted
or preempted inside a window, and cached blocks in use are not in the free queue. The deferral is
therefore invisible in every output.

A window applies only when the step-by-step scheduler could make no other decision: nobody can be
admitted (the queue is empty, or blocked until a request finishes: Scheduler.waiting_is_blocked),
no arrival or other event falls before the step starts, every running request is
decoding without drafts, the batch fits the token budget, and no request finishes before the
window's last step. It ends early at the first step whose block allocation would fail (that step
needs the real scheduler, which may preempt).

The step that finishes requests ends the window when nothing can follow from the finish but the
finish itself: the queue is empty (a finish could admit a waiting request), there is no G2 tier
(it defers frees), no closed-loop turn or concurrency slot waits on the request (the fleet says
so through ``finish_is_quiet``), and the step ends no later than the next event (which must not
see the finishes early: the router reads running counts and free blocks). The window then does
what update_from_output does at that step's end: the requests finish in running order and their
blocks are freed; the step's row counts the requests still running. Otherwise the finishing step
goes through the scheduler, as before. In a fleet of mostly idle replicas this halves the steps
that need the scheduler (each request's last step no longer does).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, islice, repeat
from typing import Final

from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.scheduler import Scheduler
from replay.engine.timing.base import DecodeRun


def _next_alloc_step(r, base: int, bs: int) -> int:
    """Window step at which ``r`` needs a new block (it computes token number bs * held + 1)."""
    return bs * len(r.block_ids) - base


def _next_store_step(r, base: int, off_bs: int) -> int:
    """Window step after which ``r``'s next offload block is full (G2 prepares its store then)."""
    return off_bs * (r.num_stored_offload_blocks + 1) - 1 - base


# Event kinds, in their order within one step (as in schedule()): allocations, the queue head's
# CPU lookup, stores.
_ALLOC: Final = 0
_LOOKUP: Final = 1
_STORE: Final = 2


def run_decode_window(sched: Scheduler, step_ms, rec: Recorder, now: float, next_event_ms: float,
                      step_idx: int, min_steps: int = 3, replica: int = 0,
                      decode_run: Callable[[int], DecodeRun | None] | None = None,
                      finished: list[Request] | None = None,
                      finish_is_quiet: Callable[[Request], bool] | None = None) -> tuple[float, int]:
    """Fast-forward decode-only steps from ``now``; returns (new now, steps taken).

    ``decode_run(nrun)``: the timer's DecodeRun for a window of ``nrun`` requests
    (engine/timing/base.py), which times runs of steps in compiled code bit-identically to
    ``step_ms``; without it (or when it gives None) every step is timed by ``step_ms``.

    ``finished``: when given, the window may end with the step that finishes requests (see the
    module doc) and appends them there, in running order, already freed; the caller records them.
    ``finish_is_quiet(r)`` says whether ``r``'s finish concerns nobody else (no closed-loop turn
    waits on it)."""
    running = sched.running
    nrun = len(running)
    lim = sched.limits
    if not nrun or nrun > lim.max_num_batched_tokens:
        return now, 0
    max_model_len = lim.max_model_len
    m = 1 << 62  # window step m finishes a request: it ends the window, or goes through the scheduler
    for r in running:
        if r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1 or r.first_token_ms < 0:
            return now, 0
        f = _finishes_at(r, max_model_len)
        if f < m:
            m = f
    if m < min_steps or not sched.waiting_is_blocked():  # the queue check last: it may look up the head
        return now, 0
    # The finishing step joins the window when its finishes concern nobody but this replica: nobody
    # waits (a finish could admit them), no G2 tier (its frees are deferred), no closed-loop turn.
    absorb = finished is not None and not sched.waiting and sched.offload is None
    if absorb and finish_is_quiet is not None:
        for r in running:
            if _finishes_at(r, max_model_len) == m and not finish_is_quiet(r):
                absorb = False
                break

    kv = sched.kv
    bs = kv.block_size
    pool = kv.pool
    offload = sched.offload
    usable = pool.num_gpu_blocks - 1
    base = [r.num_computed_tokens for r in running]
    out0 = [r.num_output_tokens for r in running]
    ctx0 = sum(base) + nrun  # decode attention context of the first window step
    cap = m + 1 if absorb else m  # steps the window may take

    # Step times: a step's duration depends only on its context, so they are computed in batches
    # (doubling) as the events below reach them. times[s] is when step s starts, times[s + 1] when
    # it ends, each the previous plus a duration, exactly as stepping adds them. A step runs if it
    # starts before the next event.
    durations: list[float] = []
    times = [now]
    run = decode_run(nrun) if decode_run is not None else None
    batch = [16]

    def extend() -> None:
        k = min(batch[0], cap - len(durations))
        c = ctx0 + len(durations) * nrun
        if run is not None:
            run.extend(c, k, durations, times)
        else:
            new = list(map(step_ms, repeat(0, k), repeat(0, k), repeat(0, k), repeat(0, k), repeat(nrun, k),
                           repeat(nrun, k), range(c, c + k * nrun, nrun), repeat(0, k)))
            durations.extend(new)
            times.extend(islice(accumulate(new, initial=times[-1]), 1, None))
        batch[0] *= 2

    limit = cap

    # Then the events, in step order: block allocations (a request crossing a block boundary), the
    # blocked head's CPU lookup, G2 stores. Columns that change only at events are filled in runs.
    # _next_alloc_step, inlined: this runs for every running request of every window.
    events = [(bs * len(r.block_ids) - b, _ALLOC, pos) for pos, (r, b) in enumerate(zip(running, base))]
    head = None
    if offload is not None:
        off_bs = offload.block_size
        # A store refused earlier (CPU pool full) is due again at once: clamp to step 0.
        events += [(max(0, _next_store_step(r, b, off_bs)), _STORE, pos)
                   for pos, (r, b) in enumerate(zip(running, base))]
        # A blocked queue head is looked up on the CPU tier at every step (after the step's
        # allocations, before its stores), which moves its held keys to the LRU tail; only a step
        # that follows stores can change anything, so the window replays the lookup then.
        if sched.waiting and nrun < lim.max_num_seqs and lim.max_num_batched_tokens > nrun:
            head = sched.waiting.peek()
            head_local = kv.get_computed_blocks(head)[1]
            events.append((0, _LOOKUP, -1))
        stored_at: list[tuple[int, int]] = []  # (step, bytes stored)
        cpu_changes = [(0, len(offload.store))]  # (first step, CPU blocks used) after stores
    heapq.heapify(events)
    free_changes = [(0, pool.get_num_free_blocks())]  # (first step, free blocks) after allocations
    storing: list[int] = []
    while events and events[0][0] < limit:
        s, kind, pos = events[0]
        while s >= len(durations) and len(durations) < cap and times[-1] < next_event_ms:
            extend()
        if s >= len(durations) or times[s] >= next_event_ms:
            break  # step s starts at or after the next event: the window ends before it
        if kind == _ALLOC:
            r = running[pos]
            r.num_computed_tokens = base[pos] + s
            r.num_output_tokens = out0[pos] + s
            if not kv.allocate_slots(r, 1, None, 0):
                limit = s  # this step needs the real scheduler (it may preempt)
                break
            heapq.heapreplace(events, (_next_alloc_step(r, base[pos], bs), _ALLOC, pos))
            free = pool.get_num_free_blocks()
            if free_changes[-1][0] == s:
                free_changes[-1] = (s, free)
            else:
                free_changes.append((s, free))
            continue
        heapq.heappop(events)
        if kind == _LOOKUP:
            offload.get_num_new_matched_tokens(head, head_local, times[s])
            continue
        storing.append(pos)  # prepared after this step's allocations, with the step's tokens
        if events and events[0][0] == s:
            continue  # more stores at this step
        # The step's stores, in running order, as schedule() passes its scheduled requests.
        for pos in storing:
            r = running[pos]
            r.num_computed_tokens = base[pos] + s + 1  # schedule() has counted the step's token
            r.num_output_tokens = out0[pos] + s
        offload.prepare_stores([running[pos] for pos in storing], times[s])
        for pos in storing:
            r = running[pos]
            r.num_computed_tokens = base[pos] + s
            nxt = _next_store_step(r, base[pos], off_bs)
            heapq.heappush(events, (nxt if nxt > s else s + 1, _STORE, pos))  # a refused store retries
        storing = []
        offload.step_executed(times[s], times[s + 1])
        stored, _, cpu_used, _ = offload.step_stats()
        if stored:
            stored_at.append((s, stored))
        cpu_changes.append((s, cpu_used))
        if head is not None:
            heapq.heappush(events, (s + 1, _LOOKUP, -1))
    while len(durations) < limit and times[-1] < next_event_ms:
        extend()
    s = bisect_left(times, next_event_ms, 0, min(limit, len(durations)))
    if s > m and times[s] > next_event_ms:
        s = m  # the finishing step would end after the next event, which must not see its finishes
    if s == 0:
        for pos, r in enumerate(running):
            r.num_computed_tokens = base[pos]
            r.num_output_tokens = out0[pos]
        return now, 0
    caching = kv.enable_caching
    for pos, r in enumerate(running):
        r.num_computed_tokens = base[pos] + s
        r.num_output_tokens = out0[pos] + s
        if caching and r.num_computed_tokens // bs > r.num_cached_blocks:
            kv.allocate_slots(r, 0, None, 0)  # register the blocks decoding filled (see module doc)
    num_running_after = nrun
    if s > m and finished is not None:  # the last step finished requests (update_from_output), freed
        done = sched.finish_decoded(times[s], max_model_len, finished)
        num_running_after -= done
        free_after = pool.get_num_free_blocks()
        if free_changes[-1][0] == m:
            free_changes[-1] = (m, free_after)
        else:
            free_changes.append((m, free_after))
    waiting = len(sched.waiting)
    starts = times[:s]
    ends = times[1:s + 1]
    if offload is not None:
        rec.record_decode_window(step_idx, starts, durations[:s], nrun, waiting, free_changes, usable,
                                 stored_at, cpu_changes, offload.num_cpu_blocks, replica=replica)
    else:
        rec.record_decode_window(step_idx, starts, durations[:s], nrun, waiting, free_changes, usable,
                                 replica=replica, last_running=num_running_after)
    rec.emit_decode_chunks([r.idx for r in running], ends)
    return times[s], s


def _finishes_at(r: Request, max_model_len: int) -> int:
    """Window step (from now) whose token is ``r``'s last: its length limit or the model's."""
    known = r.num_prompt_tokens + r.num_output_tokens
    remaining = r.max_tokens - r.num_output_tokens
    to_len = max_model_len - known
    return (to_len if to_len < remaining else remaining) - 1
