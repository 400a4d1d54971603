"""One vLLM engine replica (vLLM's EngineCore): scheduler, KV cache, G2 offload, step timer.

The fleet loop (engine/fleet.py) owns the clock, the arrivals and the router. A replica acts at two
kinds of instants: ``begin`` (its scheduler builds a step, or a decode window fast-forwards) and
``complete`` (the step's output is applied at its end). Splitting a step in two keeps every
replica's state exact at any instant the router looks at it: a step's allocations exist from its
start, its tokens and finishes from its end, as in vLLM.

A replica never runs ahead of an instant that could concern it: a decode window stops at the
horizon the fleet gives it (the next arrival that may be routed here, its own G2 events, and the
earliest time another replica could release a closed-loop turn). When the fleet says so
(``lazy_windows``), a window instead stays open past other replicas' arrivals
(engine/decode_window.py, ``OpenDecodeWindow``): the fleet brings it to each arrival's instant
(``sync_open_windows``) before its router reads anything, and ``complete`` closes it at its end.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from replay.base.errors import ReplayError
from replay.engine.block_pool_checks import PoolInvariantError
from replay.engine.decode_window import (
    DecodeWindowReplica,
    DecodeWindowResult,
    DecodeWindowStart,
    OpenDecodeWindow,
    open_decode_window,
    run_decode_window,
)
from replay.engine.recorder import Recorder
from replay.engine.request import Request
from replay.engine.row_runs import StepRow
from replay.engine.scheduler import Scheduler, SchedulerOutput
from replay.engine.timing.base import StepTimer

# Arrival kinds, in the order the waiting queue receives a batch of them (engine/fleet.py).
OPEN, DYNAMIC = 0, 1

# How many times the running set may be emptied by preemption (its only request preempting itself)
# with no token emitted and no request finished on the replica before the replay stops as a livelock.
STARVED_PREEMPTIONS_MAX = 1000


class InvariantError(ReplayError):
    """A --check invariant failed: the engine's own state is inconsistent (a bug, never bad input)."""


class EngineCore:
    """Per-replica state and its two step halves. Plain attributes: the fleet loop reads them."""

    def __init__(self, replica: int, scheduler: Scheduler, timer: StepTimer, recorder: Recorder, *,
                 fast_forward: bool = True, check_invariants: bool = False) -> None:
        self.replica = replica
        # The id errors name: the fleet's, also when this replica is replayed apart as a fleet of
        # one (engine/fleet_partition.py), where ``replica`` is 0.
        self.global_replica = replica
        self.sched = scheduler
        self.timer = timer
        self.rec = recorder
        self.offload = scheduler.offload
        self.kv_pool = scheduler.kv.pool
        self.spec_k = scheduler.limits.num_spec_tokens
        self.ff_ok = fast_forward and self.spec_k == 0
        # False on a P/D prefill replica: the token it samples is discarded (the proxy asks for
        # max_tokens=1 and streams the decode replica's tokens), and its finishes are handoffs.
        self.emits_tokens = True
        self.check_invariants = check_invariants
        # What its decode windows use (decode_run: the timer's compiled window timing, if any).
        self.windows = DecodeWindowReplica(scheduler, timer.step_ms, recorder, replica,
                                           getattr(timer, "decode_run", None))
        self.now = 0.0  # this replica's clock: the end of its step or window in flight
        self.step_idx = 0
        # The step number it started at: 0, or (an autoscaled fleet reusing a replica id) the next
        # after the earlier engine's, so that (replica, step) names one step; it took step_idx - first_step.
        self.first_step = 0
        self.schedule_calls = 0  # steps built by the scheduler (the rest are decode windows'); run.json
        self.idle_spins = 0
        # Livelock guard: preemptions that emptied the running set since a step last emitted a
        # token or finished a request (begin; reset by complete and decode windows).
        self.starved_preemptions = 0
        self.busy_ms = 0.0  # total duration of its steps
        self.inbox: list[tuple[float, int, int, Request]] = []  # routed, not yet queued: (ready, kind, seq, req)
        self.pending: tuple[SchedulerOutput, float, float] | None = None  # step in flight: (out, start, dur)
        # Decode windows may end with a step that finishes requests (engine/decode_window.py) when
        # the fleet says who to tell (on_finished) and which finishes concern nobody else.
        self.on_finished: Callable[[Request, float, EngineCore], None] | None = None
        self.finish_is_quiet: Callable[[Request], bool] | None = None
        # Who hears of first tokens (routers that count a request as prefill load until then).
        self.on_first_token: Callable[[Request], None] | None = None
        # Decode windows stay open past other replicas' arrivals (set by the fleet loop, which then
        # syncs them before routing); the window open now, closed by complete().
        self.lazy_windows = False
        self.open_window: OpenDecodeWindow | None = None
        self.wake_ms = math.inf  # time of this replica's live entry in the fleet's event heap
        self.version = 0  # bumps when that entry is superseded (older heap entries are then ignored)

    # -- state the fleet reads (routers read it through engine/replica_view.py) -----------------------
    @property
    def num_waiting(self) -> int:
        return len(self.sched.waiting) + len(self.inbox)

    @property
    def num_running(self) -> int:
        return len(self.sched.running)

    def kv_usage(self) -> float:
        pool = self.kv_pool
        return 1.0 - pool.get_num_free_blocks() / (pool.num_gpu_blocks - 1)

    def own_next_event_ms(self) -> float:
        """The next instant this replica must act at without any new arrival: G2 completions and
        requests routed here that are still on their way (router latency)."""
        t = self.offload.next_event_ms() if self.offload is not None else math.inf
        for ready, _, _, _ in self.inbox:
            if ready < t:
                t = ready
        return t

    # -- arrivals ----------------------------------------------------------------------------------
    def receive(self, req: Request, ready_ms: float, kind: int, seq: int) -> None:
        self.inbox.append((ready_ms, kind, seq, req))

    def _take_inbox(self, now: float) -> None:
        """Queue the routed requests that have reached the engine by ``now``: trace-timed arrivals
        first, then closed-loop ones, each in routing order (the single engine's release order)."""
        inbox = self.inbox
        if len(inbox) == 1:
            if inbox[0][0] <= now:
                self.sched.add_request(inbox.pop()[3])
            return
        due = [e for e in inbox if e[0] <= now]
        if not due:
            return
        self.inbox = [e for e in inbox if e[0] > now]
        due.sort(key=lambda e: (e[1], e[2]))
        add = self.sched.add_request
        for e in due:
            add(e[3])

    # -- the two halves of a step ------------------------------------------------------------------
    def begin(self, now: float, horizon: Callable[[EngineCore], float],
              next_event: Callable[[EngineCore], float]) -> tuple[float, bool]:
        """Act at ``now``: queue arrivals, then a decode window, a step, or nothing.

        Returns (when to act next, whether that is a step's completion); math.inf = nothing to do
        until a request is routed here. ``horizon(self)`` bounds a decode window; ``next_event(self)``
        is the next instant anything could change for this replica (used when nothing can run).
        """
        self.now = now
        if self.inbox:
            self._take_inbox(now)
        sched = self.sched
        offload = self.offload
        if offload is not None:
            offload.advance(now)
        if not sched.has_unfinished():
            return self.own_next_event_ms(), False
        if self.ff_ok:
            on_finished = self.on_finished
            finished: list[Request] | None = [] if on_finished is not None else None
            opened = None
            if self.lazy_windows:
                opened = open_decode_window(self.windows, DecodeWindowStart(
                    now, self.own_next_event_ms(), self.step_idx, finished, self.finish_is_quiet))
                if isinstance(opened, OpenDecodeWindow):
                    self.open_window = opened
                    return opened.end_ms, True  # complete() closes it
            if opened is None:
                window = run_decode_window(self.windows, DecodeWindowStart(
                    now, horizon(self), self.step_idx, finished, self.finish_is_quiet))
                if window.num_steps:
                    return self._took_window(window, finished), False
        out = sched.schedule(now)
        self.schedule_calls += 1
        if out.total_tokens == 0:
            nxt = next_event(self)
            if out.num_preempted == 0 and nxt == math.inf:
                if sched.held_requests:
                    return math.inf, False  # P/D prefill replica: a decode replica's read frees blocks
                raise ReplayError(self.stuck_message(now))
            # A step that only preempted retries at once, as vLLM's engine loop calls schedule()
            # again (the preempted request waits now, and may fit); one that did nothing waits for
            # the next event that could change anything.
            retry = now if out.num_preempted else max(now, nxt)
            self.idle_spins = self.idle_spins + 1 if retry <= now else 0
            if self.idle_spins > 4 + len(sched.running):
                raise ReplayError(self.stuck_message(now))
            if out.num_preempted and not sched.running:
                # The only running request preempted itself: the blocks it needs are held outside
                # the running set (waiting requests with a KV load, which cannot be preempted). If
                # that keeps happening while nothing is emitted, the holders take turns starving
                # each other (vLLM 0.11 has no load reservation) and the replay would never end.
                self.starved_preemptions += 1
                if self.starved_preemptions > STARVED_PREEMPTIONS_MAX:
                    raise ReplayError(self.livelock_message(now))
            return retry, False
        self.idle_spins = 0
        passes = self.spec_k if self.spec_k and out.num_decode_reqs + out.num_prefill_reqs else 0
        dur = self.timer.step_ms(out.num_prefill_reqs, out.prefill_tokens, out.prefill_ctx_tokens,
                                 out.prefill_attn_work, out.num_decode_reqs, out.decode_query_tokens,
                                 out.decode_ctx_tokens, passes)
        end = now + dur
        if offload is not None:
            offload.step_executed(now, end)
        self.pending = (out, now, dur)
        self.now = end
        return end, True

    def _took_window(self, window: DecodeWindowResult, finished: list[Request] | None) -> float:
        """A decode window took its steps, and its last step finished ``finished`` (already
        freed): tell the recorder and the fleet."""
        num_steps = window.num_steps
        end_ms = window.end_ms
        self.step_idx += num_steps
        self.starved_preemptions = 0  # a decode window's steps emit tokens
        busy = self.busy_ms
        durations = window.durations
        for j in range(num_steps):  # one by one, as stepping adds them: the same bits either way
            busy += durations[j]
        self.busy_ms = busy
        self.now = end_ms
        on_finished = self.on_finished
        if finished and on_finished is not None:
            for r in finished:
                self.rec.request_finished(r)
                on_finished(r, end_ms, self)
        if self.check_invariants:
            self.check(None)
        return end_ms

    def complete(self, on_finished: Callable[[Request, float, EngineCore], None]) -> float:
        """Apply the step in flight at its end, or close the open decode window; returns that end
        (the replica acts again then)."""
        window = self.open_window
        if window is not None:
            self.open_window = None
            result = window.close()
            return self._took_window(result, window.start.finished)
        pending = self.pending
        if pending is None:
            raise RuntimeError(f"replica {self.global_replica}: complete() with no step in flight")
        out, start, dur = pending
        self.pending = None
        end = start + dur
        sched = self.sched
        rec = self.rec
        finished: list[Request] = []
        chunk_reqs: list[Request] = []
        chunk_tokens: list[int] = []
        drafts, accepted = sched.update_from_output(out, end, finished, chunk_reqs, chunk_tokens)
        firsts = sched.first_token_reqs
        if firsts:
            sched.first_token_reqs = []
            on_first_token = self.on_first_token
            if on_first_token is not None:
                for r in firsts:
                    on_first_token(r)
        emits = self.emits_tokens
        if chunk_reqs and emits:
            rec.emit_chunks(chunk_reqs, self.step_idx, self.replica, chunk_tokens)
        if chunk_reqs or finished:
            self.starved_preemptions = 0
        for r in finished:
            if emits:
                rec.request_finished(r)
            on_finished(r, end, self)
        pool = self.kv_pool
        free = pool.get_num_free_blocks()
        usable = pool.num_gpu_blocks - 1
        offload = self.offload
        if offload is not None:
            stored, loaded, cpu_used, cpu_usage = offload.step_stats()
        else:
            stored = loaded = cpu_used = 0
            cpu_usage = 0.0
        rec.record_step(StepRow(step=self.step_idx, start_ms=start, duration_ms=dur, scheduled_tokens=out.total_tokens,
                                prefill_tokens=out.prefill_tokens, prefill_requests=out.num_prefill_reqs,
                                decode_requests=out.num_decode_reqs, running=len(sched.running),
                                waiting=len(sched.waiting), preemptions=out.num_preempted,
                                kv_usage=1.0 - free / usable, kv_blocks_used=usable - free, draft_tokens=drafts,
                                accepted_tokens=accepted, bytes_stored=stored, bytes_loaded=loaded,
                                cpu_blocks_used=cpu_used, cpu_usage=cpu_usage), self.replica)
        self.step_idx += 1
        self.busy_ms += dur
        if self.check_invariants:
            self.check(out)
        return end

    def drain_unfinished(self) -> None:
        """Record what is still in flight when the replay stops."""
        for r in list(self.sched.running) + list(self.sched.waiting) + [e[3] for e in self.inbox]:
            self.rec.request_unfinished(r)

    # -- the end of a replay -------------------------------------------------------------------------
    def release(self) -> None:
        """The replay is over and its outputs are written: empty the KV stores whose linked runs
        would otherwise wait for the cyclic garbage collector (engine/cpu_store.py, ``release``)."""
        if self.offload is not None:
            self.offload.release()

    # -- diagnostics ---------------------------------------------------------------------------------
    def _no_progress(self, now: float) -> str:
        """The opening both stop messages share: when, and where in a fleet."""
        where = f" on replica {self.global_replica}" if self.global_replica else ""
        return f"the replay cannot make progress at t={now:.1f} ms{where}"

    def stuck_message(self, now: float) -> str:
        sched = self.sched
        head = sched.waiting.peek() if sched.waiting else None
        what = f"request {head.request_id!r} ({head.num_tokens} tokens)" if head else "no request"
        return (f"{self._no_progress(now)}: {what} does not fit in the KV "
                f"cache ({self.kv_pool.get_num_free_blocks()} free blocks) and nothing else can run")

    def livelock_message(self, now: float) -> str:
        holders = [r.request_id for r in self.sched.waiting if r.block_ids]
        return (f"{self._no_progress(now)}: the only running request was "
                f"preempted {self.starved_preemptions} times with no token emitted since, because waiting "
                f"requests holding KV blocks ({', '.join(map(repr, holders[:5])) or 'none'}; G2 loads cannot "
                f"be preempted) leave it no room, and they starve each other in turn "
                f"({self.kv_pool.get_num_free_blocks()} free blocks; semantics 0.33 reserves blocks for loads)")

    def check(self, out: SchedulerOutput | None) -> None:
        """--check: block conservation, ref counts, budget. Raises (survives python -O)."""
        sched = self.sched
        lim = sched.limits
        if out is not None and out.total_tokens > lim.max_num_batched_tokens:
            raise InvariantError(f"replica {self.global_replica}: token budget exceeded ({out.total_tokens})")
        if len(sched.running) > lim.max_num_seqs:
            raise InvariantError(f"replica {self.global_replica}: max_num_seqs exceeded ({len(sched.running)})")
        holders: dict[int, int] = {}
        in_use_keys: dict[int, int | None] = {}
        reqs = list(sched.running) + [r for r in sched.waiting if r.block_ids]
        if self.offload is not None:
            reqs += self.offload.requests_holding_blocks()
        reqs += sched.held_requests.values()
        for r in reqs:
            keys = r.keys.block_keys(0, sched.kv.num_registered_blocks(r))
            for j, b in enumerate(r.block_ids):
                holders[b] = holders.get(b, 0) + 1
                key = keys[j] if j < len(keys) else None
                if in_use_keys.get(b) is None:
                    in_use_keys[b] = key
        try:
            self.kv_pool.check_invariants(in_use_keys, holders)
        except (PoolInvariantError, AssertionError) as exc:
            raise InvariantError(f"replica {self.global_replica}: KV block invariant failed: {exc}") from None


def sync_open_windows(cores: list[EngineCore], now_ms: float) -> None:
    """Bring every replica's open decode window to ``now_ms``: the allocations of its steps that
    start before then are made, so what a router reads of any replica at ``now_ms`` is exact."""
    for core in cores:
        window = core.open_window
        if window is not None and window.next_ms < now_ms:
            window.sync(now_ms)
