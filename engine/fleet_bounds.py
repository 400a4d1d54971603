"""What bounds a replica's decode windows in the fleet loop (engine/fleet.py).

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

``ReplicaBounds`` is the fleet loop's base class: it owns the prediction of which arrivals are whose
and the registry of closed-loop parents in flight; the loop owns the clock, the arrival queue and
the routing that these bounds read.
"""

from __future__ import annotations

import math
from bisect import insort
from itertools import chain

import numpy as np

from replay.engine.arrivals import ArrivalPlan
from replay.engine.core import EngineCore
from replay.engine.request import Request
from replay.engine.routers.base import Router
from replay.engine.trace_input import TraceArrays


class ReplicaBounds:
    """Horizons for the fleet loop's replicas (see the module doc). The loop sets the attributes
    annotated here before calling ``_init_bounds``; the arrival queue's head is its own."""

    trace: TraceArrays
    plan: ArrivalPlan
    cores: list[EngineCore]
    router: Router | None
    rejected: dict[int, str]
    latency: float
    control: object | None
    admission: object | None
    _seq: int
    _dynamic: list[tuple[float, int, int]]
    _open_times: memoryview  # float64, items read as Python floats
    _open_order: memoryview  # int64, items read as Python ints
    _open_ptr: int

    def _init_bounds(self) -> None:
        plan = self.plan
        cores = self.cores
        router = self.router
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
        # Static routing: each replica's positions in the open order (its own next arrival).
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
        if router is None or (len(self.cores) == 1 and not router.passes_some_requests):
            return "single"
        if router.reads_replica_state or self.rejected or self.admission is not None:  # a rejected row is routed nowhere
            return "any"
        if router.static_targets(np.empty(0, np.int64)) is not None:
            return "static"
        if router.next_open_offset(0) is not None:
            return "offset"
        return "any"

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
