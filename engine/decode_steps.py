"""The steps of one decode window (engine/decode_window.py says when a window applies and how far
it may go): its step clock, timed in batches as the window's events reach them, and the replay of
its events in step order: block allocations, the blocked queue head's CPU lookup, G2 stores.
``DecodeWindowSteps`` also does what the end of a window does: the blocks decoding filled, the
finishes of its last step, the rows it recorded."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import accumulate, islice, repeat
from typing import Final

from replay.engine.offload import OffloadManager
from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.row_runs import ChangePoints, WindowRows
from replay.engine.scheduler import Scheduler
from replay.engine.timing.base import DecodeRun


def next_alloc_step(r, base: int, bs: int) -> int:
    """Window step at which ``r`` needs a new block (it computes token number bs * held + 1)."""
    return bs * len(r.block_ids) - base


NEVER: Final = 1 << 62  # a window step no window reaches


def next_store_step(r, base: int, offload: OffloadManager) -> int:
    """Window step after which ``r``'s next offload block is full (G2 prepares its store then).
    With offload_prompt_only nothing past the prompt is stored, and a decoding request has computed
    its whole prompt: it stores at once the blocks a full CPU pool refused (if any), then never."""
    off_bs = offload.block_size
    if offload.prompt_only:
        prompt_blocks = (r.num_prompt_tokens - offload.lookahead) // off_bs
        return 0 if r.num_stored_offload_blocks < prompt_blocks else NEVER
    return off_bs * (r.num_stored_offload_blocks + 1) - 1 - base


# Event kinds, in their order within one step (as in schedule()): allocations, the queue head's
# CPU lookup, stores.
_ALLOC: Final = 0
_LOOKUP: Final = 1
_STORE: Final = 2


class StepClock:
    """The window's step times. A step's duration depends only on its context, so they are
    computed in batches (doubling) as the events reach them. times[s] is when step s starts,
    times[s + 1] when it ends, each the previous plus a duration, exactly as stepping adds them."""

    __slots__ = ("nrun", "cap", "ctx0", "run", "step_ms", "durations", "times", "batch")

    def __init__(self, now: float, running: list[Request], cap: int, run: DecodeRun | None,
                 step_ms: Callable[..., float]) -> None:
        nrun = len(running)
        self.nrun = nrun
        self.cap = cap  # steps the window may take
        self.ctx0 = sum([r.num_computed_tokens for r in running]) + nrun  # decode context of step 0
        self.run = run
        self.step_ms = step_ms
        self.durations: list[float] = []
        self.times = [now]
        self.batch = 16

    def extend(self) -> None:
        """Time the next batch of steps (never past the window's cap)."""
        durations = self.durations
        times = self.times
        nrun = self.nrun
        k = min(self.batch, self.cap - len(durations))
        c = self.ctx0 + len(durations) * nrun
        run = self.run
        if run is not None:
            run.extend(c, k, durations, times)
        else:
            new = list(map(self.step_ms, repeat(0, k), repeat(0, k), repeat(0, k), repeat(0, k), repeat(nrun, k),
                           repeat(nrun, k), range(c, c + k * nrun, nrun), repeat(0, k)))
            durations.extend(new)
            times.extend(islice(accumulate(new, initial=times[-1]), 1, None))
        self.batch *= 2

    def fill(self, limit: int, next_event_ms: float) -> None:
        """Time steps until step ``limit`` or the first that ends at or after the next event."""
        durations = self.durations
        times = self.times
        while len(durations) < limit and times[-1] < next_event_ms:
            self.extend()


class DecodeWindowSteps:
    """One window in progress: its requests' counts at the start, the step clock, and the change
    points of the columns that change only at events (for the recorder)."""

    __slots__ = ("sched", "running", "nrun", "clock", "base", "out0", "free_blocks", "bytes_stored",
                 "cpu_blocks_used", "events", "head", "head_local")

    def __init__(self, sched: Scheduler, clock: StepClock) -> None:
        self.sched = sched
        self.running = sched.running  # the list at the start (a finish at the end makes a new one)
        self.nrun = len(self.running)
        self.clock = clock
        self.base = [r.num_computed_tokens for r in self.running]
        self.out0 = [r.num_output_tokens for r in self.running]
        # Set from step 0 on as replay_events meets the events.
        self.free_blocks = ChangePoints()  # free GPU blocks after each step's allocations
        self.bytes_stored = ChangePoints()  # at the steps that started G2 stores
        # CPU blocks used after each step's stores; None without a G2 tier
        self.cpu_blocks_used: ChangePoints | None = None
        self.events: list[tuple[int, int, int]] = []  # (step, kind, position in running), a heap
        self.head: Request | None = None  # the blocked queue head a G2 window looks up at each step
        self.head_local = 0  # its GPU hit blocks

    def replay_events(self, next_event_ms: float) -> int:
        """Replay the window's events in step order: block allocations (a request crossing a block
        boundary), the blocked head's CPU lookup, G2 stores. Returns how many steps the window may
        take: ``cap``, or the first step whose allocation fails (it needs the real scheduler, which
        may preempt)."""
        if not self.start_events():
            return 0
        return self.replay_until(next_event_ms, self.clock.cap)

    def start_events(self) -> bool:
        """Queue each request's first event; False when no window may start (a G2 copy is in flight
        while a blocked queue head is looked up at every step)."""
        sched = self.sched
        running = self.running
        base = self.base
        clock = self.clock
        lim = sched.limits
        nrun = len(running)
        kv = sched.kv
        bs = kv.block_size
        offload = sched.offload
        # next_alloc_step, inlined: this runs for every running request of every window.
        events = [(bs * len(r.block_ids) - b, _ALLOC, pos) for pos, (r, b) in enumerate(zip(running, base))]
        if offload is not None:
            # A store refused earlier (CPU pool full) is due again at once: clamp to step 0.
            for pos, (r, b) in enumerate(zip(running, base)):
                due = next_store_step(r, b, offload)
                if due != NEVER:
                    events.append((max(0, due), _STORE, pos))
            # A blocked queue head is looked up on the CPU tier at every step (after the step's
            # allocations, before its stores), which moves its held keys to the LRU tail; only a step
            # that follows stores can change anything, so the window replays the lookup then.
            # A P/D decode replica's head that is to read its prompt from a prefill replica is not
            # looked up on the CPU tier (schedule_waiting: the read replaces the lookup).
            head = sched.waiting.peek() if sched.waiting else None
            if (head is not None and not head.do_remote_prefill and nrun < lim.max_num_seqs
                    and lim.max_num_batched_tokens > nrun):
                # Its lookup is skipped (HIT_PENDING) when it meets a block whose copy is in flight,
                # and whether it does changes as copies complete and as the window's allocations
                # evict the head's GPU hits: no window while a copy is in flight, and the window
                # ends after a step that starts one.
                if offload.copies_in_flight(clock.times[0]):
                    return False
                self.head = head
                self.head_local = kv.get_computed_blocks(head)[1]
                events.append((0, _LOOKUP, -1))
            cpu_blocks_used = ChangePoints()
            cpu_blocks_used.set(0, len(offload.store))
            self.cpu_blocks_used = cpu_blocks_used
        heapq.heapify(events)
        self.events = events
        self.free_blocks.set(0, kv.pool.get_num_free_blocks())
        return True

    def replay_until(self, next_event_ms: float, limit: int) -> int:
        """Replay the queued events of the steps before ``limit`` that start before
        ``next_event_ms``; returns ``limit``, or the first step whose allocation fails or after
        which the window must end (see replay_events)."""
        sched = self.sched
        running = self.running
        base = self.base
        out0 = self.out0
        clock = self.clock
        durations = clock.durations
        times = clock.times
        cap = clock.cap
        kv = sched.kv
        bs = kv.block_size
        pool = kv.pool
        offload = sched.offload
        events = self.events
        head = self.head
        free_blocks = self.free_blocks
        bytes_stored = self.bytes_stored
        cpu_blocks_used = self.cpu_blocks_used
        storing: list[int] = []
        while events and events[0][0] < limit:
            s, kind, pos = events[0]
            while s >= len(durations) and len(durations) < cap and times[-1] < next_event_ms:
                clock.extend()
            if s >= len(durations) or times[s] >= next_event_ms:
                break  # step s starts at or after the next event: the window ends before it
            if kind == _ALLOC:
                r = running[pos]
                r.num_computed_tokens = base[pos] + s
                r.num_output_tokens = out0[pos] + s
                if not kv.allocate_slots(r, 1, None, 0):
                    limit = s  # this step needs the real scheduler (it may preempt)
                    break
                heapq.heapreplace(events, (next_alloc_step(r, base[pos], bs), _ALLOC, pos))
                free_blocks.set(s, pool.get_num_free_blocks())
                continue
            heapq.heappop(events)
            if kind == _LOOKUP:
                if offload.get_num_new_matched_tokens(head, self.head_local, times[s]) < 0:
                    # the head's prefix is still being copied: the scheduler skips it at step s and
                    # may admit a request behind it, which a window cannot
                    limit = s
                    break
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
                nxt = next_store_step(r, base[pos], offload)
                if nxt != NEVER:
                    heapq.heappush(events, (nxt if nxt > s else s + 1, _STORE, pos))  # a refused store retries
            storing = []
            offload.step_executed(times[s], times[s + 1])
            stored, _, cpu_used, _ = offload.step_stats()
            if stored:
                bytes_stored.set(s, stored)
            assert cpu_blocks_used is not None  # start_events set it: stores come only with a G2 tier
            cpu_blocks_used.set(s, cpu_used)
            if head is not None:
                if stored:
                    limit = s + 1  # a copy is in flight from now on (see above)
                    break
                heapq.heappush(events, (s + 1, _LOOKUP, -1))
        return limit

    def rewind(self) -> None:
        """No step was taken: the requests' counts go back to the window's start."""
        base = self.base
        out0 = self.out0
        for pos, r in enumerate(self.running):
            r.num_computed_tokens = base[pos]
            r.num_output_tokens = out0[pos]

    def advance(self, s: int) -> None:
        """Every request has decoded ``s`` tokens; the blocks decoding filled are registered now
        (see the module doc)."""
        base = self.base
        out0 = self.out0
        kv = self.sched.kv
        bs = kv.block_size
        caching = kv.enable_caching
        for pos, r in enumerate(self.running):
            r.num_computed_tokens = base[pos] + s
            r.num_output_tokens = out0[pos] + s
            if caching and r.num_computed_tokens // bs > r.num_cached_blocks:
                kv.allocate_slots(r, 0, None, 0)

    def finish(self, end_ms: float, m: int, finished: list[Request]) -> int:
        """The window's last step ``m`` finished requests: finish and free them as
        update_from_output does at that step's end; returns how many."""
        sched = self.sched
        done = sched.finish_decoded(end_ms, sched.limits.max_model_len, finished)
        self.free_blocks.set(m, sched.kv.pool.get_num_free_blocks())
        return done

    def record(self, rec: Recorder, replica: int, first_step: int, s: int, running_after: int) -> None:
        """The window's ``s`` step rows and their chunks (one token per request per step)."""
        sched = self.sched
        clock = self.clock
        times = clock.times
        offload = sched.offload
        rec.record_decode_window(WindowRows(
            first_step, times[:s], clock.durations[:s], self.nrun, len(sched.waiting),
            sched.kv.pool.num_gpu_blocks - 1, self.free_blocks, self.bytes_stored, self.cpu_blocks_used,
            offload.num_cpu_blocks if offload is not None else 0, replica, running_after))
        rec.emit_decode_chunks(self.running, first_step, s, replica)


def finishes_at(r: Request, max_model_len: int) -> int:
    """Window step (from now) whose token is ``r``'s last: its length limit or the model's."""
    known = r.num_prompt_tokens + r.num_output_tokens
    remaining = r.max_tokens - r.num_output_tokens
    to_len = max_model_len - known
    return (to_len if to_len < remaining else remaining) - 1
