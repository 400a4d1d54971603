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

The step that finishes requests ends the window when nothing can follow from the finish inside
that step: no closed-loop turn or concurrency slot waits on the request (the fleet says so through
``finish_is_quiet``), no running request has a G2 store due (with prompt-only stores, once every
prompt block is stored; a finish whose own stores are still in flight defers its free exactly as
update_from_output does), and the step ends no later than the next event (which must not see the
finishes early: the router reads running counts and free blocks). A waiting queue does not stop
it: the step's own schedule() still finds the queue blocked (nobody has finished before it), and
what the finish frees is first used by the next step, which goes through the scheduler. The window
then does what update_from_output does at that step's end: the requests finish in running order
and their blocks are freed; the step's row counts the requests still running. Otherwise the
finishing step goes through the scheduler, as before. This halves the steps that need the
scheduler both in a fleet of mostly idle replicas and on an overloaded replica (there each
request's last step and the admission after it did).

In a fleet whose router reads every replica at every arrival, a window bounded by the next arrival
would be cut at every arrival to any replica: with 64 replicas, nearly every window would be one
step long, and each would pay a window's setup and its rows. There the window stays open instead
(``OpenDecodeWindow``): it is decided up to the replica's own next event, and only its block
allocations, the one thing in it a router could see, are replayed as the fleet's clock passes them,
before every routing decision. A request routed to the replica ends the window where a window with
that arrival as its horizon would have ended. The window may not stay open when its allocations
could run the pool dry, or with a G2 tier (its stores and lookups are events of their own); it then
ends at the next arrival as before.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable

from replay.engine.decode_steps import NEVER, DecodeWindowSteps, StepClock, finishes_at, next_store_step
from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.scheduler import Scheduler
from replay.engine.timing.base import DecodeRun

# The longest open window (DecodeWindowReplica.max_open_steps): a window's setup costs about as much
# as timing a few dozen steps, so a few hundred bounds the waste either way.
OPEN_WINDOW_MAX_STEPS = 256


class DecodeWindowReplica:
    """What one replica's decode windows use that does not change between windows (built once
    per replica, so that starting a window passes only where it starts).

    ``decode_run(nrun)``: the timer's DecodeRun for a window of ``nrun`` requests
    (engine/timing/base.py), which times runs of steps in compiled code bit-identically to
    ``step_ms``; without it (or when it gives None) every step is timed by ``step_ms``.
    ``min_steps``: shorter windows are left to the scheduler (not worth their setup).
    ``max_open_steps``: an open window (``OpenDecodeWindow``) times its steps when it opens, and a
    request routed here may cut it short; this bounds the steps timed in vain (a window that reaches
    it closes, and the next one opens at once)."""

    __slots__ = ("sched", "step_ms", "recorder", "replica", "decode_run", "min_steps", "max_open_steps")

    def __init__(self, sched: Scheduler, step_ms: Callable[..., float], recorder: Recorder, replica: int = 0,
                 decode_run: Callable[[int], DecodeRun | None] | None = None, min_steps: int = 3,
                 max_open_steps: int | None = None) -> None:
        self.sched = sched
        self.step_ms = step_ms
        self.recorder = recorder
        self.replica = replica
        self.decode_run = decode_run
        self.min_steps = min_steps
        self.max_open_steps = OPEN_WINDOW_MAX_STEPS if max_open_steps is None else max_open_steps


class DecodeWindowStart:
    """Where one window starts and what may end it.

    ``finished``: when given, the window may end with the step that finishes requests (see the
    module doc) and appends them there, in running order, already freed; the caller records them.
    ``finish_is_quiet(r)`` says whether ``r``'s finish concerns nobody else (no closed-loop turn
    waits on it)."""

    __slots__ = ("now", "next_event_ms", "first_step", "finished", "finish_is_quiet")

    def __init__(self, now: float, next_event_ms: float, first_step: int, finished: list[Request] | None = None,
                 finish_is_quiet: Callable[[Request], bool] | None = None) -> None:
        self.now = now
        self.next_event_ms = next_event_ms
        self.first_step = first_step  # index of the window's first step (steps.parquet's step column)
        self.finished = finished
        self.finish_is_quiet = finish_is_quiet


_NO_STEPS: list[float] = []  # the durations of a window that took no step (shared, never written)


class DecodeWindowResult:
    """How far a window went: ``num_steps`` steps (0: no window, the scheduler takes the next
    step), ending at ``end_ms`` (the start time when no step was taken); ``durations`` holds the
    steps' durations first (so busy time adds them one by one, as stepping does, to the bit)."""

    __slots__ = ("end_ms", "num_steps", "durations")

    def __init__(self, end_ms: float, num_steps: int, durations: list[float]) -> None:
        self.end_ms = end_ms
        self.num_steps = num_steps
        self.durations = durations


def run_decode_window(replica: DecodeWindowReplica, start: DecodeWindowStart) -> DecodeWindowResult:
    """Fast-forward the decode-only steps that follow ``start.now``, as far as the scheduler could
    make no other decision (see the module doc)."""
    sched = replica.sched
    running = sched.running
    nrun = len(running)
    now = start.now
    if not nrun or nrun > sched.limits.max_num_batched_tokens:
        return DecodeWindowResult(now, 0, _NO_STEPS)
    max_model_len = sched.limits.max_model_len
    # Window step m finishes a request: it ends the window, or goes through the scheduler.
    m = _first_finish_step(running, max_model_len)
    if m < replica.min_steps or not sched.waiting_is_blocked():  # the queue check last: it may look up the head
        return DecodeWindowResult(now, 0, _NO_STEPS)
    finished = start.finished
    absorb = finished is not None and _finish_joins_window(sched, m, start.finish_is_quiet)
    run = replica.decode_run(nrun) if replica.decode_run is not None else None
    cap = m + 1 if absorb else m  # steps the window may take
    window = DecodeWindowSteps(sched, StepClock(now, running, cap, run, replica.step_ms))
    next_event_ms = start.next_event_ms
    limit = window.replay_events(next_event_ms)
    clock = window.clock
    clock.fill(limit, next_event_ms)
    times = clock.times
    s = bisect_left(times, next_event_ms, 0, min(limit, len(clock.durations)))
    if s > m and times[s] > next_event_ms:
        s = m  # the finishing step would end after the next event, which must not see its finishes
    if s == 0:
        window.rewind()
        return DecodeWindowResult(now, 0, _NO_STEPS)
    window.advance(s)
    num_running_after = nrun
    if s > m and finished is not None:  # the last step finished requests (update_from_output), freed
        num_running_after -= window.finish(times[s], m, finished)
    window.record(replica.recorder, replica.replica, start.first_step, s, num_running_after)
    return DecodeWindowResult(times[s], s, clock.durations)


class OpenDecodeWindow:
    """A decode window that stays open while other replicas' arrivals pass (see the module doc).

    Its steps, times and end are fixed when it opens; its allocations, the only thing in it another
    replica's router could see (they evict cached blocks and take free ones), are replayed only as
    far as the fleet's clock: ``sync(t)`` before anyone reads the replica at ``t``. A request routed
    here ends it at the first step that starts at or after the request reaches the engine
    (``truncate``); ``close`` does what the end of a window does (the finishes, the rows)."""

    __slots__ = ("replica", "start", "window", "first_finish", "num_steps", "end_ms", "next_ms")

    def __init__(self, replica: DecodeWindowReplica, start: DecodeWindowStart, window: DecodeWindowSteps,
                 first_finish: int, num_steps: int) -> None:
        self.replica = replica
        self.start = start
        self.window = window
        self.first_finish = first_finish  # the window step that finishes requests (m)
        self.num_steps = num_steps
        self.end_ms = window.clock.times[num_steps]
        self.next_ms = 0.0  # start time of the first step whose allocations are not replayed yet
        self._set_next()

    def _set_next(self) -> None:
        events = self.window.events
        s = events[0][0] if events else NEVER
        self.next_ms = self.window.clock.times[s] if s < self.num_steps else math.inf

    def sync(self, now_ms: float) -> None:
        """Replay the allocations of the steps that start before ``now_ms``."""
        self._replay_until(now_ms)
        self._set_next()

    def _replay_until(self, now_ms: float) -> None:
        if self.window.replay_until(now_ms, self.num_steps) < self.num_steps:
            raise RuntimeError("an allocation failed in an open decode window (they were counted to fit)")

    def truncate(self, ready_ms: float) -> float:
        """A request reaches this replica at ``ready_ms``: the window ends at the first step that
        starts then or later (the request joins the step after it). A finishing last step that ends
        after ``ready_ms`` stays in the window: its finishes are applied when the window closes, at
        that step's end, and no one sees them before. Returns the window's end."""
        times = self.window.clock.times
        s = bisect_left(times, ready_ms, 0, self.num_steps)
        if s < self.num_steps:
            if s == 0:
                raise RuntimeError("a request reached a replica at the instant its decode window opened")
            self.num_steps = s
            self.end_ms = times[s]
            self._set_next()
        return self.end_ms

    def close(self) -> DecodeWindowResult:
        """Take the window's steps: the rest of its allocations, the blocks decoding filled, the
        finishes of its last step (when it is the finishing one) and the rows."""
        window = self.window
        s = self.num_steps
        self._replay_until(math.inf)
        window.advance(s)
        finished = self.start.finished
        num_running_after = window.nrun
        end_ms = window.clock.times[s]
        if s > self.first_finish and finished is not None:
            num_running_after -= window.finish(end_ms, self.first_finish, finished)
        window.record(self.replica.recorder, self.replica.replica, self.start.first_step, s, num_running_after)
        return DecodeWindowResult(end_ms, s, window.clock.durations)


def open_decode_window(replica: DecodeWindowReplica, start: DecodeWindowStart) -> OpenDecodeWindow | DecodeWindowResult | None:
    """Open a window of the decode-only steps that follow ``start.now`` up to the replica's own next
    event (``start.next_event_ms``), to stay open while other replicas' arrivals pass. Its finishing
    step, when it takes it, may end after that event: the finishes are applied at the step's end
    (``close``), so nothing sees them early.

    Returns a DecodeWindowResult of no steps when no window can start (the scheduler takes the next
    step), and None when one can but may not stay open: the replica has a G2 tier, or the window's
    allocations would run the pool dry (that step needs the scheduler, which may preempt, at an
    instant found only by replaying them); run_decode_window then takes it up to the next arrival."""
    sched = replica.sched
    running = sched.running
    nrun = len(running)
    now = start.now
    if not nrun or nrun > sched.limits.max_num_batched_tokens:
        return DecodeWindowResult(now, 0, _NO_STEPS)
    m = _first_finish_step(running, sched.limits.max_model_len)
    if m < replica.min_steps or not sched.waiting_is_blocked():
        return DecodeWindowResult(now, 0, _NO_STEPS)
    if sched.offload is not None:
        return None
    finished = start.finished
    absorb = finished is not None and _finish_joins_window(sched, m, start.finish_is_quiet)
    run = replica.decode_run(nrun) if replica.decode_run is not None else None
    cap = m + 1 if absorb else m
    if cap > replica.max_open_steps:
        cap = replica.max_open_steps
    clock = StepClock(now, running, cap, run, replica.step_ms)
    horizon = start.next_event_ms  # a request on its way here: it joins the step after the window
    clock.fill(cap, horizon)
    s = bisect_left(clock.times, horizon, 0, min(cap, len(clock.durations)))
    if s == 0:
        return DecodeWindowResult(now, 0, _NO_STEPS)
    # Allocations of steps 0 .. s-1: each request takes a block every block_size steps from its
    # first boundary on; none fails while they fit in the free blocks (the free count only falls).
    kv = sched.kv
    bs = kv.block_size
    allocations = 0
    for r in running:
        first = bs * len(r.block_ids) - r.num_computed_tokens
        if first < s:
            allocations += (s - 1 - first) // bs + 1
    if allocations > kv.pool.get_num_free_blocks():
        return None
    window = DecodeWindowSteps(sched, clock)
    window.start_events()
    return OpenDecodeWindow(replica, start, window, m, s)


def _first_finish_step(running: list[Request], max_model_len: int) -> int:
    """The first window step that finishes a running request, or -1 when some request is not
    plainly decoding (it has a prompt chunk or drafts to compute, or no first token yet)."""
    m = 1 << 62
    for r in running:
        if r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1 or r.first_token_ms < 0:
            return -1
        f = finishes_at(r, max_model_len)
        if f < m:
            m = f
    return m


def _finish_joins_window(sched: Scheduler, m: int, finish_is_quiet: Callable[[Request], bool] | None) -> bool:
    """Whether the finishing step ``m`` may join the window: its finishes concern nobody but this
    replica. No closed-loop turn waits on a request that finishes there, and with a G2 tier no
    running request has a store due (a window that then ends before step ``m``, because step ``m``
    would end after the next event, must not have replayed step ``m``'s stores). Waiting requests
    stay blocked through step ``m`` (see the module doc)."""
    offload = sched.offload
    if offload is not None:
        for r in sched.running:
            if next_store_step(r, 0, offload) != NEVER:
                return False
    if finish_is_quiet is not None:
        max_model_len = sched.limits.max_model_len
        for r in sched.running:
            if finishes_at(r, max_model_len) == m and not finish_is_quiet(r):
                return False
    return True

