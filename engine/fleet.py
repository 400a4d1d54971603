"""The fleet loop: one simulated clock, the arrivals, the router, and N engine replicas.

A single replica is a fleet of one (no second simulator). Events are taken in time order; at one
instant, step completions come first, then arrivals, then replicas beginning their next step, so an
arrival that lands exactly when a step ends is seen by the step that starts then, and a request
routed at time t sees every replica as it is at t: allocations of steps in flight (made when the
step was scheduled) but not their tokens (applied at the step's end).

Decode windows (engine/decode_window.py) let a replica fast-forward through decode-only steps up to
a horizon that no arrival, finish elsewhere or closed-loop release could cut short: the base class
ReplicaBounds (engine/fleet_bounds.py) computes it; this module owns the clock, the arrival queue,
the routing and the step events. When only the router reads the replicas, a window is not cut at
arrivals routed elsewhere: it stays open, and the loop brings every open window to an arrival's
instant before routing it (``sync_open_windows``).

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
from typing import Protocol

import numpy as np

from replay.engine.arrivals import ArrivalPlan
from replay.engine.block_keys import BlockKeys
from replay.engine.core import DYNAMIC, OPEN, EngineCore, sync_open_windows
from replay.engine.fleet_ahead import BEGIN_PHASE, COMPLETE_PHASE, TRANSFER_PHASE, RunAhead
from replay.engine.page_release import ConsumedPrefix
from replay.engine.recorder import Recorder
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router
from replay.engine.trace_ids import shared_lead_within
from replay.engine.trace_input import TraceArrays
from replay.engine.whole_table_index import WholeTableIndex

ProgressFn = Callable[[float, int], None]

CONTROL_EVENT = -1  # the row of a controller event in the closed-loop arrival queue
# Open arrivals between two hand-backs of the hash ids of rows already arrived (release_ids_before).
_RELEASE_EVERY = 65_536


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


class FleetLoop(RunAhead):
    """The clock over the arrivals and every replica's step events (see the module doc)."""

    windows_stay_open = True  # may decode windows stay open past other replicas' arrivals (see __init__)

    def __init__(self, trace: TraceArrays, plan: ArrivalPlan, cores: list[EngineCore], router: Router | None,
                 recorder: Recorder, *, block_size: int, hash_lookahead: int, rejected: dict[int, str],
                 router_latency_ms: float = 0.0, progress: ProgressFn | None = None,
                 control: FleetControl | None = None, admission: ArrivalGate | None = None,
                 shared_lead: np.ndarray | None = None) -> None:
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
        # False: a part of a fleet in step other than the first (engine/lockstep.py): rows refused up
        # front still arrive (an arrival is an instant a stalled replica acts again, as in the single
        # loop) but are recorded by the first part.
        self.records_refused = True
        self.latency = router_latency_ms
        self.progress = progress
        self.num_done = 0
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []  # (time, phase, seq, replica, version)
        self._seq = 0
        self._dynamic: list[tuple[float, int, int]] = []  # (ready_ms, seq, idx): closed-loop releases
        self._dyn_seq = 0
        self._conc_next = 0
        # Read through memoryviews (an item is a Python float or int, as from a list) rather than
        # lists: 10 M arrivals as lists took 690 MB of Python objects beside the plan's arrays.
        times = np.ascontiguousarray(plan.open_times, dtype=np.float64)
        order = np.ascontiguousarray(plan.open_order, dtype=np.int64)
        self._open_times = memoryview(times)
        self._open_order = memoryview(order)
        self._open_consumed = (ConsumedPrefix(times), ConsumedPrefix(order))
        self._open_ptr = 0
        # Hand back the hash ids of rows already arrived: for the owner of a trace no other replay
        # reads (run_fleet's caller says so); see _may_release_ids.
        self.release_consumed_ids = False
        self._init_bounds()
        self._init_run_ahead()
        # Decode windows may take a step that finishes requests, unless a finish releases a request
        # (concurrency mode) or a closed-loop turn waits on it (it could be routed anywhere).
        if not plan.concurrency:
            deps = plan.dependents
            quiet = (lambda r: r.idx not in deps) if deps else None
            self._finish_quiet = quiet
            for core in cores:
                core.on_finished = self._on_finished
                core.finish_is_quiet = quiet
        # Decode windows stay open past arrivals routed elsewhere (engine/decode_window.py) when
        # every replica is read only by the router, at arrivals: no admission control or autoscaler
        # reads it at other instants, no closed-loop release depends on a running request's progress,
        # and no G2 tier has events of its own.
        self._lazy = (self.windows_stay_open and self._predict == "any" and control is None and admission is None
                      and not plan.dependents and not plan.concurrency and all(c.offload is None for c in cores))
        for core in cores:
            core.lazy_windows = self._lazy
        # A router that reads every replica's prefix cache at every arrival asks one index of the
        # replicas' whole tables (engine/block_hash_map.py) in a fleet whose replicas stay put.
        if (self.windows_stay_open and router is not None and router.reads_prefix_caches and control is None
                and len(cores) > 1):
            index = WholeTableIndex()
            for core in cores:
                core.kv_pool.cached_block_hash_to_block.join_index(index)
        self.first_token_routers: list[Router] = []  # routers told of every first token
        self.hear_first_tokens(router)
        # Leading ids another request could hit, per row: counted within each replica's own rows
        # when the routing is known in advance (engine/trace_ids.shared_lead_within), or as the
        # caller counted them (``shared_lead``: a fleet replayed replica by replica).
        self._shared_lead = trace.shared_lead if shared_lead is None else shared_lead
        targets = self._targets_in_advance() if shared_lead is None else None
        if targets is not None:
            self._shared_lead = shared_lead_within(trace.hash_values, trace.hash_offsets, targets)

    # -- arrivals ------------------------------------------------------------------------------------
    def _push_dynamic(self, ready_ms: float, idx: int) -> None:
        self._dyn_seq += 1
        heapq.heappush(self._dynamic, (ready_ms, self._dyn_seq, idx))

    def _may_release_ids(self) -> bool:
        """Whether the rows before the next open arrival are done with (their hash ids may be handed
        back): asked for, open arrivals only (no closed-loop turns, which come back to earlier rows;
        no concurrency mode), in row order."""
        plan = self.plan
        if not self.release_consumed_ids or plan.dependents or plan.concurrency:
            return False
        order = np.asarray(self._open_order)
        return bool(len(order) < 2 or (order[1:] > order[:-1]).all())

    def _release_before(self, ptr: int) -> None:
        """Every open arrival before position ``ptr`` has arrived: hand back the memory of their
        rows' ids and of the plan's positions before it (engine/page_release.py)."""
        row = self._open_order[ptr]
        self.trace.release_ids_before(row)
        for consumed in self._open_consumed:
            consumed.release_before(ptr)
        self.rec.write_settled_requests(row)
        self.rec.release_unused_memory()

    def make_request(self, idx: int, time_ms: float) -> Request:
        """Trace row ``idx`` as a request arriving at ``time_ms``."""
        t = self.trace
        if idx < t.ids_released_row:
            raise RuntimeError(f"trace row {idx}: its hash ids were handed back (release_ids_before)")
        # ndarray.item: a Python int at once (int(a[i]) makes a NumPy scalar first; this runs per arrival).
        off = t.hash_offsets
        inp = t.input_tokens.item(idx)
        start, end = off.item(idx), off.item(idx + 1)
        # The request's own ids as Python ints (the trace keeps them as one uint64 array).
        keys = BlockKeys(t.hash_values[start:end].tolist(), 0, end - start, t.hash_block_size,
                         self.block_size, inp, idx, self.hash_lookahead, self._shared_lead.item(idx))
        turn = t.turn.item(idx)
        return Request(idx, t.request_id[idx], time_ms, inp, t.output_tokens.item(idx), keys,
                       t.session_id[idx], turn if turn >= 0 else None, t.priority.item(idx))

    def _arrive(self, idx: int, time_ms: float, kind: int) -> None:
        control = self.control
        if control is not None:
            if idx == CONTROL_EVENT:
                control.act(time_ms, self)
                return
            control.arrived(idx)
        reason = self.rejected.get(idx)
        if reason is not None:
            if self.records_refused:
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
            if self._lazy:  # the router reads every replica as it is now
                sync_open_windows(self.cores, time_ms)
            live = self.live_views
            pos = self.router.route(req, live, time_ms)
            if pos is None:  # another process's replicas take it (a fleet in step: engine/lockstep.py)
                return
            rid = live[pos].replica
        self.rec.replica[idx] = rid
        self.register_parent(req, rid)
        self.deliver(req, self.cores[rid], time_ms + self.latency, kind)

    def deliver(self, req: Request, core: EngineCore, ready: float, kind: int) -> None:
        """Hand ``req`` to ``core``, reaching its queue at ``ready``."""
        self._seq += 1
        core.receive(req, ready, kind, self._seq)
        self.wake(core, ready)

    def wake(self, core: EngineCore, t: float) -> None:
        """Make ``core`` act at ``t`` (or when its step in flight completes) if it would not act sooner."""
        window = core.open_window
        if window is not None:  # it ends at the first of its steps that starts at ``t`` or later
            end = window.truncate(t)
            if end < core.wake_ms:
                self._push(core, end, COMPLETE_PHASE)
            return
        if core.pending is None:  # a replica with a step in flight begins again when it completes
            t_wake = max(t, core.now)
            if t_wake < core.wake_ms:
                self._push(core, t_wake, BEGIN_PHASE)

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

    def hear_first_tokens(self, router: Router | None) -> None:
        """Tell ``router`` of every first token on any replica, if it asks to be told."""
        if router is not None and router.hears_first_tokens:
            self.first_token_routers.append(router)
            for core in self.cores:
                core.on_first_token = self._on_first_token

    def _on_first_token(self, r: Request) -> None:
        for router in self.first_token_routers:
            router.request_first_token(r)

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
            self._wake_phase.append(BEGIN_PHASE)
        if not self.plan.concurrency:
            core.on_finished = self._on_finished
            core.finish_is_quiet = self._finish_quiet
        if self.first_token_routers:
            core.on_first_token = self._on_first_token
        insort(self.live_views, view, key=lambda v: v.replica)
        if self.router is not None:
            self.router.replica_started(rid)

    def remove_live_replica(self, replica: int) -> None:
        """The replica leaves the router (it drains: what it holds still runs)."""
        self.live_views = [v for v in self.live_views if v.replica != replica]

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
        self._wake_phase[core.replica] = phase
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
        release_every = _RELEASE_EVERY if self._may_release_ids() else 0
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
            if heap and (heap[0][0] < t_arr or (heap[0][0] == t_arr and heap[0][1] < BEGIN_PHASE)):
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
                    if phase == COMPLETE_PHASE:
                        t = core.complete(on_finished)
                        phase = BEGIN_PHASE
                    else:
                        t, completes = core.begin(t, horizon, next_event)
                        phase = COMPLETE_PHASE if completes else BEGIN_PHASE
                    # While this replica's next act comes before any other event, take it at once
                    # (no heap round trip): the order is the heap's, ties included.
                    ptr = self._open_ptr
                    t_arr = open_times[ptr] if ptr < n_open else inf
                    if dynamic and dynamic[0][0] < t_arr:
                        t_arr = dynamic[0][0]
                    if t != inf and (not heap or t < heap[0][0]) and (
                            t < t_arr or (t == t_arr and phase == COMPLETE_PHASE)):
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
                if release_every and (ptr + 1) % release_every == 0 and ptr + 1 < n_open:
                    self._release_before(ptr + 1)
            else:
                ready, _, idx = heapq.heappop(dynamic)
                self.now = ready
                self._arrive(idx, ready, DYNAMIC)
        self.now = max(self.now, self._ran_ahead_to)
        for core in cores:
            core.drain_unfinished()
        if progress is not None:
            progress(self.now, self.num_done)
