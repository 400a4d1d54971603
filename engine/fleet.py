"""The fleet loop: one simulated clock, the arrivals, the router, and N engine replicas.

A single replica is a fleet of one (no second simulator). Events are taken in time order; at one
instant, step completions come first, then arrivals, then replicas beginning their next step, so an
arrival that lands exactly when a step ends is seen by the step that starts then, and a request
routed at time t sees every replica as it is at t: allocations of steps in flight (made when the
step was scheduled) but not their tokens (applied at the step's end).

Decode windows (engine/decode_window.py) let a replica fast-forward through decode-only steps; the
fleet gives each one a horizon it must not pass:
- its own G2 events and requests already routed to it (router latency);
- the next arrival that may be routed to it: any arrival for routers that read replica state;
  for order-only routers (round robin) and request-only routers (random, session affinity) the
  next arrival that will be its own;
- when closed-loop arrivals exist (session turns with delay_ms, concurrency mode), the earliest
  instant another replica could finish a request, plus the smallest turn delay: a turn released
  then could be routed here.
So no replica's state is ever ahead of an instant at which it is read or changed.

A fleet that changes over the replay (engine/fleet_scaling.py, engine/admission.py) plugs in through
two narrow hooks: a controller whose events (autoscaler decisions, replicas joining) ride the
closed-loop arrival queue under a negative row, and an admission gate asked before routing. Routers
then see only the live replicas (``live_views``). Without them the loop is the fixed fleet's.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Callable
from itertools import chain
from typing import Protocol

import numpy as np

from replay.engine.arrivals import ArrivalPlan
from replay.engine.block_keys import BlockKeys
from replay.engine.core import DYNAMIC, OPEN, EngineCore
from replay.engine.recorder import Recorder
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router
from replay.engine.trace_input import TraceArrays, shared_lead_within

ProgressFn = Callable[[float, int], None]

# Heap phases. At one instant: step completions, then KV transfer events (disaggregated fleets,
# engine/pd_fleet.py), then arrivals (not in the heap), then begins.
_COMPLETE, TRANSFER_PHASE, _BEGIN = 0, 1, 2

CONTROL_EVENT = -1  # the row of a controller event in the closed-loop arrival queue


class FleetControl(Protocol):
    """An autoscaling controller (engine/fleet_scaling.py): told of arrivals and finishes, acting
    at the instants it asks for with ``FleetLoop.wake_control_at``."""

    def start(self, loop: FleetLoop) -> None: ...

    def act(self, now: float, loop: FleetLoop) -> None: ...

    def arrived(self, idx: int) -> None: ...

    def request_finished(self, core: EngineCore, end_ms: float) -> None: ...


class ArrivalGate(Protocol):
    """Admission control (engine/admission.py): a reason to refuse a request, or None."""

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None: ...


class FleetLoop:
    def __init__(self, trace: TraceArrays, plan: ArrivalPlan, cores: list[EngineCore], router: Router | None,
                 recorder: Recorder, *, block_size: int, hash_lookahead: int, rejected: dict[int, str],
                 router_latency_ms: float = 0.0, progress: ProgressFn | None = None,
                 control: FleetControl | None = None, admission: ArrivalGate | None = None) -> None:
        self.control = control
        self.admission = admission
        self.num_rejected_at_arrival = 0  # refused by admission control
        self.trace = trace
        self.plan = plan
        self.cores = cores
        self.router = router
        self.views = [ReplicaView(core) for core in cores]  # all a router may read of the replicas
        self.live_views = list(self.views)  # the replicas a router may choose from (by id)
        self.rec = recorder
        self.block_size = block_size
        self.hash_lookahead = hash_lookahead
        self.rejected = rejected
        self.latency = router_latency_ms
        self.progress = progress
        self.num_done = 0
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []  # (time, phase, seq, replica, version)
        self._seq = 0
        self._dynamic: list[tuple[float, int, int]] = []  # (ready_ms, seq, idx): closed-loop releases
        self._dyn_seq = 0
        self._conc_next = 0
        self._open_times = plan.open_times.tolist()
        self._open_order = plan.open_order.tolist()
        self._open_ptr = 0
        self._predict = self._prediction_mode()
        # Closed-loop turns waiting on a request in flight: _parents[target][holder] lists
        # (delay, seq, parent) for parents on replica ``holder`` whose next turn, or a turn after it,
        # will be routed to ``target`` (-1: not known before routing). A turn's release time is
        # bounded below by its parent's earliest finish (_earliest_finish) plus its delay.
        # Concurrency mode releases the next request at any finish, with no delay, to any replica.
        self._parents: dict[int, dict[int, list[tuple[float, int, Request]]]] = {}  # (delay, seq, parent)
        self._parent_slots: dict[int, list[list]] = {}  # parent row -> the lists holding its entries
        timer = cores[0].timer
        self._min_step_ms = timer.min_step_ms() if hasattr(timer, "min_step_ms") else 0.0
        self._tokens_per_step = 1 + cores[0].spec_k
        self._max_model_len = cores[0].sched.limits.max_model_len
        self._chain_targets = None
        if self._predict == "static" and plan.dependents:
            self._chain_targets = self._targets_of_chains(plan.dependents, router)
        # Parents not routed yet (trace-timed rows whose later turns are closed-loop): per target,
        # their positions in the open order and the suffix minimum of their earliest release.
        self._future: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if plan.dependents and self._predict in ("offset", "static"):
            self._future = self._future_releases()
        # Decode windows may take a step that finishes requests, unless a finish releases a request
        # (concurrency mode) or a closed-loop turn waits on it (it could be routed anywhere).
        if not plan.concurrency:
            deps = plan.dependents
            quiet = (lambda r: r.idx not in deps) if deps else None
            self._finish_quiet = quiet
            for core in cores:
                core.on_finished = self._on_finished
                core.finish_is_quiet = quiet
        # Leading ids another request could hit, per row: counted within each replica's own rows
        # when the routing is known in advance (engine/trace_input.shared_lead_within).
        self._shared_lead = trace.shared_lead
        targets = self._targets_in_advance()
        if targets is not None:
            self._shared_lead = shared_lead_within(np.asarray(trace.hash_values, dtype=np.uint64),
                                                   trace.hash_offsets, targets)
        self._own_positions: list[np.ndarray] = []
        if self._predict == "static":
            targets = router.static_targets(plan.open_order)
            self._own_positions = [np.flatnonzero(targets == r) for r in range(len(cores))]

    def _future_releases(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """A parent arriving at t cannot finish before t + latency + one step per batch of its
        output tokens; its turn is released a delay later. Keyed by the turn chain's targets
        (-1 when the router cannot tell), without the parent's own replica (static routers)."""
        plan = self.plan
        trace = self.trace
        per_target: dict[int, dict[int, float]] = {}
        chains = self._chain_targets
        owners = (self.router.static_targets(np.asarray(self._open_order, dtype=np.int64)).tolist()
                  if chains is not None else None)
        for pos, row in enumerate(self._open_order):
            deps = plan.dependents.get(row)
            if not deps:
                continue
            out = int(trace.output_tokens[row])
            base = (self._open_times[pos] + self.latency
                    + -(-out // self._tokens_per_step) * self._min_step_ms)
            own = owners[pos] if owners is not None else None
            for dep, delay in deps:
                for target in (chains[dep] if chains is not None else (-1,)):
                    if target == own:
                        continue
                    slot = per_target.setdefault(target, {})
                    value = base + delay
                    if value < slot.get(pos, math.inf):
                        slot[pos] = value
        future = {}
        for target, slot in per_target.items():
            positions = np.array(sorted(slot), dtype=np.int64)
            values = np.array([slot[p] for p in positions.tolist()], dtype=np.float64)
            future[target] = (positions, np.minimum.accumulate(values[::-1])[::-1])
        return future

    def _future_bound(self, core: EngineCore) -> float:
        t = math.inf
        for target in (core.replica, -1):
            entry = self._future.get(target)
            if entry is not None:
                positions, suffix_min = entry
                k = int(np.searchsorted(positions, self._open_ptr))
                if k < len(positions) and suffix_min[k] < t:
                    t = float(suffix_min[k])
        return t

    @staticmethod
    def _targets_of_chains(dependents: dict[int, list[tuple[int, float]]], router: Router) -> dict[int, tuple]:
        """For each closed-loop turn, the replicas it or any later turn released after it will be
        routed to (request-only routers): a turn not yet released can only reach those."""
        children: dict[int, list[int]] = {}
        for parent, deps in dependents.items():
            children[parent] = [d for d, _ in deps]
        rows = sorted({d for deps in dependents.values() for d, _ in deps}, reverse=True)
        targets = dict(zip(rows, router.static_targets(np.array(rows, dtype=np.int64)).tolist()))
        chain: dict[int, frozenset] = {}
        for d in rows:  # a turn's later turns are later rows: each chain is complete when reached
            reach = {targets[d]}
            for c in children.get(d, ()):
                reach |= chain[c]
            chain[d] = frozenset(reach)
        return {d: tuple(sorted(r)) for d, r in chain.items()}

    def _targets_in_advance(self) -> np.ndarray | None:
        """Every trace row's replica (-1: never replayed) when routing depends on the row alone, or
        on open-loop arrival order alone (round robin without closed-loop arrivals); else None."""
        n = len(self.trace)
        if self._predict == "static":
            return self.router.static_targets(np.arange(n, dtype=np.int64))
        if self._predict == "offset" and not self.plan.dependents and not self.plan.concurrency:
            targets = np.full(n, -1, dtype=np.int64)
            order = np.asarray(self._open_order, dtype=np.int64)
            first = np.array([self.router.next_open_offset(r) for r in range(len(self.cores))], dtype=np.int64)
            position_replica = np.empty(len(self.cores), dtype=np.int64)
            position_replica[first % len(self.cores)] = np.arange(len(self.cores))
            targets[order] = position_replica[np.arange(len(order)) % len(self.cores)]
            return targets
        return None

    def _prediction_mode(self) -> str:
        """How far a replica may look ahead for its own next arrival (see the module doc)."""
        router = self.router
        if self.control is not None:  # replicas come and go: any arrival may go anywhere
            return "any"
        if len(self.cores) == 1 or router is None:
            return "single"
        if router.reads_replica_state or self.rejected or self.admission is not None:  # a rejected row is routed nowhere
            return "any"
        if router.static_targets(np.empty(0, np.int64)) is not None:
            return "static"
        if router.next_open_offset(0) is not None:
            return "offset"
        return "any"

    # -- arrivals ------------------------------------------------------------------------------------
    def _push_dynamic(self, ready_ms: float, idx: int) -> None:
        self._dyn_seq += 1
        heapq.heappush(self._dynamic, (ready_ms, self._dyn_seq, idx))

    def make_request(self, idx: int, time_ms: float) -> Request:
        """Trace row ``idx`` as a request arriving at ``time_ms``."""
        t = self.trace
        off = t.hash_offsets
        inp = int(t.input_tokens[idx])
        start, end = int(off[idx]), int(off[idx + 1])
        # The request's own ids as Python ints (the trace keeps them as one uint64 array).
        keys = BlockKeys(t.hash_values[start:end].tolist(), 0, end - start, t.hash_block_size,
                         self.block_size, inp, idx, self.hash_lookahead, int(self._shared_lead[idx]))
        return Request(idx, t.request_id[idx], time_ms, inp, int(t.output_tokens[idx]), keys,
                       t.session_id[idx], int(t.turn[idx]) if t.turn[idx] >= 0 else None,
                       int(t.priority[idx]))

    def _arrive(self, idx: int, time_ms: float, kind: int) -> None:
        control = self.control
        if control is not None:
            if idx == CONTROL_EVENT:
                control.act(time_ms, self)
                return
            control.arrived(idx)
        reason = self.rejected.get(idx)
        if reason is not None:
            self.rec.request_rejected(idx, time_ms, reason)
            self._request_done(idx, time_ms)
            return
        req = self.make_request(idx, time_ms)
        if self.admission is not None:
            refused = self.admission.refuse(req, self.live_views, time_ms)
            if refused is not None:
                self.num_rejected_at_arrival += 1
                self.rec.request_rejected(idx, time_ms, refused)
                self._request_done(idx, time_ms)
                return
        if self._predict == "single":
            rid = 0
        else:
            live = self.live_views
            rid = live[self.router.route(req, live, time_ms)].replica
        self.rec.replica[idx] = rid
        self.register_parent(req, rid)
        self.deliver(req, self.cores[rid], time_ms + self.latency, kind)

    def register_parent(self, req: Request, rid: int) -> None:
        """A request whose finish releases closed-loop turns, now held by replica ``rid``: it bounds
        the decode windows of the replicas its turns may reach (see _release_bound)."""
        idx = req.idx
        deps = self.plan.dependents.get(idx)
        if deps and self._predict != "single":
            chains = self._chain_targets
            for dep, delay in deps:
                for target in (chains[dep] if chains is not None else (-1,)):
                    if target != rid:  # only another replica's finish can cut a window (see _release_bound)
                        self._seq += 1
                        entries = self._parents.setdefault(target, {}).setdefault(rid, [])
                        insort(entries, (delay, self._seq, req))  # sorted by delay: scans stop early
                        self._parent_slots.setdefault(idx, []).append(entries)

    def deliver(self, req: Request, core: EngineCore, ready: float, kind: int) -> None:
        """Hand ``req`` to ``core``, reaching its queue at ``ready``."""
        self._seq += 1
        core.receive(req, ready, kind, self._seq)
        self.wake(core, ready)

    def wake(self, core: EngineCore, t: float) -> None:
        """Make ``core`` act at ``t`` (or when its step in flight completes) if it would not act sooner."""
        if core.pending is None:  # a replica with a step in flight begins again when it completes
            t_wake = max(t, core.now)
            if t_wake < core.wake_ms:
                self._push(core, t_wake, _BEGIN)

    def _request_done(self, idx: int, time_ms: float) -> None:
        self.num_done += 1
        plan = self.plan
        for dep, delay in plan.dependents.get(idx, ()):
            self._push_dynamic(time_ms + delay, dep)
        if plan.concurrency:
            self._start_next_concurrent(time_ms)

    def _start_next_concurrent(self, time_ms: float) -> None:
        order = self.plan.concurrency_order
        if self._conc_next < len(order):
            idx = int(order[self._conc_next])
            self._conc_next += 1
            self._push_dynamic(time_ms, idx)

    def _on_finished(self, r: Request, end_ms: float, core: EngineCore) -> None:
        if self.router is not None and self._predict != "single":
            self.router.request_finished(r, core.replica)
        slots = self._parent_slots.pop(r.idx, None)
        if slots:  # its turns are known arrivals from now on
            for entries in slots:
                entries[:] = [e for e in entries if e[2] is not r]
        self._request_done(r.idx, end_ms)
        if self.control is not None:
            self.control.request_finished(core, end_ms)

    # -- replicas joining and leaving (engine/fleet_scaling.py) -------------------------------------
    def wake_control_at(self, time_ms: float) -> None:
        """The controller acts at ``time_ms`` (after step completions, with closed-loop arrivals)."""
        self._push_dynamic(time_ms, CONTROL_EVENT)

    def install_replica(self, core: EngineCore) -> None:
        """A new replica joins, live: a new id, or a retired replica's id given to a new engine."""
        rid = core.replica
        view = ReplicaView(core)
        if rid < len(self.cores):
            core.version = self.cores[rid].version + 1  # the old engine's heap entries stay stale
            self.cores[rid] = core
            self.views[rid] = view
        else:
            self.cores.append(core)
            self.views.append(view)
        if not self.plan.concurrency:
            core.on_finished = self._on_finished
            core.finish_is_quiet = self._finish_quiet
        insort(self.live_views, view, key=lambda v: v.replica)
        if self.router is not None:
            self.router.replica_started(rid)

    def remove_live_replica(self, replica: int) -> None:
        """The replica leaves the router (it drains: what it holds still runs)."""
        self.live_views = [v for v in self.live_views if v.replica != replica]

    # -- what bounds a replica -----------------------------------------------------------------------
    def _next_arrival_ms(self) -> float:
        t = self._open_times[self._open_ptr] if self._open_ptr < len(self._open_times) else math.inf
        if self._dynamic and self._dynamic[0][0] < t:
            t = self._dynamic[0][0]
        return t

    def _next_arrival_for(self, core: EngineCore) -> float:
        mode = self._predict
        if mode in ("single", "any"):
            return self._next_arrival_ms()
        ptr = self._open_ptr
        if mode == "static":
            own = self._own_positions[core.replica]
            k = int(np.searchsorted(own, ptr))
            pos = int(own[k]) if k < len(own) else len(self._open_times)
        else:
            pos = ptr + self.router.next_open_offset(core.replica)
        t = self._open_times[pos] if pos < len(self._open_times) else math.inf
        # A closed-loop arrival in between may go anywhere, and shifts round robin's order after it.
        if self._dynamic and self._dynamic[0][0] < t:
            t = self._dynamic[0][0]
        return t

    def _earliest_finish(self, holder: EngineCore, r: Request) -> float:
        """No sooner than ``holder``'s next event plus one step per remaining batch of tokens
        after the first (a step emits at most 1 + k tokens and lasts at least min_step_ms)."""
        left = r.max_tokens - r.num_output_tokens
        to_len = self._max_model_len - r.num_prompt_tokens - r.num_output_tokens
        if to_len < left:
            left = to_len
        steps = -(-left // self._tokens_per_step) - 1
        return holder.wake_ms + (steps * self._min_step_ms if steps > 0 else 0.0)

    def _release_bound(self, core: EngineCore) -> float:
        """Earliest instant a closed-loop arrival for ``core`` could appear because another replica
        finished a request: when that request can finish at the soonest, plus the turn's delay,
        over the requests in flight whose next turn, or a turn after it, may come here. A finish
        on ``core`` itself happens at a step it takes outside any window, and the turn it releases
        is then a known arrival, which bounds the next window."""
        if self._predict == "single":
            return math.inf
        cores = self.cores
        earliest = self._earliest_finish
        t = math.inf
        if self.plan.concurrency:  # any finish anywhere releases the next request at once
            for other in cores:
                if other is core or other.wake_ms >= t:
                    continue
                for r in chain(other.sched.running, other.sched.waiting, (e[3] for e in other.inbox)):
                    f = earliest(other, r)
                    if f < t:
                        t = f
            return t
        if self._future:
            t = self._future_bound(core)
        for target in (core.replica, -1):
            by_holder = self._parents.get(target)
            if not by_holder:
                continue
            for holder, entries in by_holder.items():
                if holder == core.replica or not entries:
                    continue
                other = cores[holder]
                wake = other.wake_ms
                for delay, _, r in entries:  # by increasing delay
                    if wake + delay >= t:
                        break
                    f = earliest(other, r) + delay
                    if f < t:
                        t = f
        return t

    def _horizon(self, core: EngineCore) -> float:
        h = core.own_next_event_ms()
        a = self._next_arrival_for(core)
        if a < h:
            h = a
        b = self._release_bound(core)
        return b if b < h else h

    def _next_event(self, core: EngineCore) -> float:
        """The next instant anything could change for ``core`` (nothing could run at ``now``)."""
        t = core.own_next_event_ms()
        a = self._next_arrival_ms()
        return a if a < t else t

    # -- the clock -----------------------------------------------------------------------------------
    def push_transfer_event(self, t: float, version: int) -> None:
        """Schedule a KV transfer event (disaggregated fleets); ``version`` lets later ones supersede it."""
        self._seq += 1
        heapq.heappush(self._heap, (t, TRANSFER_PHASE, self._seq, -1, version))

    def transfer_event(self, t: float, version: int) -> None:
        """A KV transfer event at ``t`` (only disaggregated fleets push them: engine/pd_fleet.py)."""
        raise NotImplementedError

    def _push(self, core: EngineCore, t: float, phase: int) -> None:
        core.version += 1
        if t == math.inf:
            core.wake_ms = math.inf
            return
        core.wake_ms = t
        self._seq += 1
        heapq.heappush(self._heap, (t, phase, self._seq, core.replica, core.version))

    def run_recorded(self) -> None:
        """Run to the end and close the recorder; on any failure abort it, so no half output stays."""
        try:
            self.run()
        except BaseException:
            self.rec.abort()
            raise
        self.rec.close()

    def run(self) -> None:
        plan = self.plan
        if self.control is not None:
            self.control.start(self)
        if plan.concurrency:
            for _ in range(plan.concurrency):
                self._start_next_concurrent(0.0)
        heap = self._heap
        dynamic = self._dynamic
        cores = self.cores
        open_times = self._open_times
        open_order = self._open_order
        n_open = len(open_times)
        horizon = self._horizon
        next_event = self._next_event
        on_finished = self._on_finished
        progress = self.progress
        last_progress = -1.0
        inf = math.inf
        while True:
            ptr = self._open_ptr
            t_open = open_times[ptr] if ptr < n_open else inf
            t_dyn = dynamic[0][0] if dynamic else inf
            t_arr = t_open if t_open <= t_dyn else t_dyn
            if heap and (heap[0][0] < t_arr or (heap[0][0] == t_arr and heap[0][1] < _BEGIN)):
                t, phase, _, rid, version = heapq.heappop(heap)
                if phase == TRANSFER_PHASE:
                    self.now = t
                    self.transfer_event(t, version)
                    continue
                core = cores[rid]
                if version != core.version:
                    continue  # superseded by an earlier wake-up
                while True:
                    self.now = t
                    if progress is not None and t - last_progress > 1000.0:
                        last_progress = t
                        progress(t, self.num_done)
                    if phase == _COMPLETE:
                        t = core.complete(on_finished)
                        phase = _BEGIN
                    else:
                        t, completes = core.begin(t, horizon, next_event)
                        phase = _COMPLETE if completes else _BEGIN
                    # While this replica's next act comes before any other event, take it at once
                    # (no heap round trip): the order is the heap's, ties included.
                    ptr = self._open_ptr
                    t_arr = open_times[ptr] if ptr < n_open else inf
                    if dynamic and dynamic[0][0] < t_arr:
                        t_arr = dynamic[0][0]
                    if t != inf and (not heap or t < heap[0][0]) and (
                            t < t_arr or (t == t_arr and phase == _COMPLETE)):
                        core.wake_ms = t
                        continue
                    self._push(core, t, phase)
                    break
                continue
            if t_arr == inf:
                break
            if t_open <= t_dyn:
                self._open_ptr = ptr + 1
                self.now = t_open
                self._arrive(open_order[ptr], t_open, OPEN)
            else:
                ready, _, idx = heapq.heappop(dynamic)
                self.now = ready
                self._arrive(idx, ready, DYNAMIC)
        for core in cores:
            core.drain_unfinished()
        if progress is not None:
            progress(self.now, self.num_done)
