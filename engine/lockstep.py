"""Replicas in step: one fleet behind a cost-picking router, its replicas split over processes.

Behind ``kv_aware`` or ``least_loaded`` every arrival reads every replica, so the replicas cannot be
replayed apart (engine/fleet_partition.py). Yet between two arrivals they share nothing: each replica's run depends
on the requests it gets, and the router's choice on each replica's cost, which that replica's own
state and what the router keeps of that replica alone give (``Router.picks_by_cost``). So the fleet
is split into parts of consecutive replicas, each replayed by its own process over every arrival of
the trace. At each arrival every part prices its own replicas, the parts swap their costs through
memory shared before the fork (``CostExchange``), and every part chooses over the whole fleet's costs
as the single loop's router would (the same seeded stream, the same rotation): they all choose the
same replica, whose
part takes the request while the others pass it by. Every choice, and so every request's result, is
the single loop's (tests/engine/test_lockstep.py).

The parts wait for each other at every arrival by spinning on a counter (giving the CPU away every
64 looks, and sleeping once a wait has lasted some 8,000 looks). A part that fails tells the others,
which stop; a part whose process died is seen by the others within a second.

The swap relies on stores becoming visible in program order, which x86-64 guarantees; elsewhere the
fleet stays in one loop (``lockstep_supported``).
"""

from __future__ import annotations

import mmap
import os
import platform
import time
from array import array
from collections.abc import Callable

from replay.base.errors import ReplayError
from replay.base.processes import pid_alive
from replay.engine.arrivals import ArrivalPlan
from replay.engine.clusters import ClusterPlan
from replay.engine.config import EngineConfig
from replay.engine.fleet_partition import why_not_one_pool, why_replicas_meet, why_too_many_for_parts
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers import ROUTERS, Router

# At most this many parts: each part's recorder spans the trace (as a replica's replayed apart does).
MAX_LOCKSTEP_PARTS = 8
# Looks at a peer's counter between two hand-overs of the CPU (os.sched_yield, which also lets this
# process's writer thread take the interpreter).
_SPINS_PER_YIELD = 64
# After this many looks (about a millisecond), a part waits by sleeping: spinning would take the
# core from the very peer it waits for when there are more processes than cores.
_SPINS_BEFORE_SLEEP = 1 << 13
_SLEEP_S = 50e-6
_CHECK_PEERS_EVERY_S = 0.5
_START_GRACE_S = 60.0  # how long a part waits for a peer process that has not started


class PeerStopped(ReplayError):
    """Another part of a replay in step failed or died: this part's replay cannot go on."""


def router_picks_by_cost(config: EngineConfig) -> bool:
    """Whether the fleet's router chooses the best of per-replica costs (``Router.picks_by_cost``),
    so that its replicas can run in step."""
    return config.fleet is not None and ROUTERS[config.fleet.router].picks_by_cost


def lockstep_supported() -> bool:
    """Whether this machine orders stores as the cost swap needs (x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def why_not_lockstep(config: EngineConfig, plan: ArrivalPlan, workers: int | None = None) -> str | None:
    """Why this fleet cannot be replayed in step by several processes (None: it can); ``workers``:
    the processes the user named (fleet_partition.why_too_many_for_parts)."""
    why = why_not_one_pool(config)
    if why is not None:
        return why
    fleet = config.fleet
    assert fleet is not None
    if not router_picks_by_cost(config):
        return f"fleet.router {fleet.router} is not one that picks the best of the replicas' costs"
    why = why_replicas_meet(config)
    if why is not None:
        return why
    if plan.dependents:
        return "a closed-loop turn is released by a request that may run on another replica"
    if fleet.router_options.get("tier_weights"):
        return "the router's tier_weights read lower KV tiers"
    why = why_too_many_for_parts(plan, workers)
    if why is not None:
        return why
    if not lockstep_supported():
        return f"this machine ({platform.machine()}) does not order stores as the replicas' swap needs"
    return None


def part_bounds(replicas: int, parts: int) -> list[int]:
    """The first replica id of each part, and the fleet's size last: consecutive ids, the first
    parts one larger when the replicas do not divide evenly."""
    base, extra = divmod(replicas, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


class CostExchange:
    """The parts' costs at each arrival, in memory shared by the processes forked after it is made.

    Layout (int64 words, then float64): a stop flag, each part's count of arrivals priced, each
    part's process id, each part's count when its replay ended, then two slots of the fleet's costs
    (arrival k uses slot k % 2: a part may be one arrival ahead of a peer still reading the previous
    slot, never two)."""

    def __init__(self, bounds: list[int]) -> None:
        self.bounds = bounds
        self.parts = len(bounds) - 1
        self.replicas = bounds[-1]
        words = 1 + 3 * self.parts
        self._mem = mmap.mmap(-1, 8 * (words + 2 * self.replicas))
        self.head = memoryview(self._mem)[:8 * words].cast("q")
        self.slots = memoryview(self._mem)[8 * words:].cast("d")
        for q in range(self.parts):
            self.head[1 + 2 * self.parts + q] = -1  # not ended
        self.creator = os.getpid()  # the replay's main process (its parts in workers watch it)

    def seat(self, part: int) -> ExchangeSeat:
        return ExchangeSeat(self, part)

    def stop(self) -> None:
        """Tell every part to stop (one failed)."""
        self.head[0] = 1


class ExchangeSeat:
    """One part's end of the exchange (used only in that part's process)."""

    def __init__(self, exchange: CostExchange, part: int) -> None:
        self.exchange = exchange
        self.part = part
        self.lo = exchange.bounds[part]
        self.hi = exchange.bounds[part + 1]
        self.count = 0

    def start(self) -> None:
        """This process takes the seat (called in it, before the first arrival)."""
        ex = self.exchange
        ex.head[1 + ex.parts + self.part] = os.getpid()

    def finish(self) -> None:
        """This part has routed its last arrival (a peer still waiting for it has a bug to report)."""
        ex = self.exchange
        ex.head[1 + 2 * ex.parts + self.part] = self.count

    def publish(self, costs: list[float]) -> None:
        """Publish this part's costs for the next arrival."""
        ex = self.exchange
        k = self.count = self.count + 1
        base = (k & 1) * ex.replicas
        ex.slots[base + self.lo:base + self.hi] = array("d", costs)
        ex.head[1 + self.part] = k

    def collect(self) -> list[float]:
        """The whole fleet's costs for the arrival last published, once every part has published."""
        ex = self.exchange
        head = ex.head
        k = self.count
        for q in range(ex.parts):
            if q != self.part and head[1 + q] < k:
                self._wait(q, k)
        base = (k & 1) * ex.replicas
        return ex.slots[base:base + ex.replicas].tolist()

    def _wait(self, q: int, k: int) -> None:
        head = self.exchange.head
        spins = 0
        checked = time.monotonic()
        waited_from = checked
        while head[1 + q] < k:
            spins += 1
            if spins % _SPINS_PER_YIELD == 0:
                if spins < _SPINS_BEFORE_SLEEP:
                    os.sched_yield()
                else:  # a long wait, or more processes than free cores: sleep rather than spin
                    time.sleep(_SLEEP_S)
                if head[0]:
                    raise PeerStopped("another process of this replay failed")
                now = time.monotonic()
                if now - checked > _CHECK_PEERS_EVERY_S:
                    checked = now
                    self._check_peer(q, now - waited_from)

    def _check_peer(self, q: int, waited_s: float) -> None:
        ex = self.exchange
        pid = ex.head[1 + ex.parts + q]
        ended = ex.head[1 + 2 * ex.parts + q]
        if ended >= 0 and ended == ex.head[1 + q]:
            raise RuntimeError(f"part {q} of the replay routed {ended} arrivals and ended; part {self.part} routes "
                               "more: the parts did not see the same arrivals")
        if os.getpid() != ex.creator and os.getppid() != ex.creator:
            raise PeerStopped("the replay's main process stopped")
        if pid == 0:
            if waited_s > _START_GRACE_S:
                raise PeerStopped(f"part {q} of the replay never started")
            return
        if not pid_alive(pid):
            raise PeerStopped(f"the process replaying part {q} stopped")

    def abandon(self) -> None:
        """This part failed: the others stop."""
        self.exchange.stop()


class LockstepRouter(Router):
    """A part's router: prices the part's replicas with the fleet's router (``inner``, whose replica
    ids are the part's, from 0), swaps costs with the other parts (running the replicas that cannot
    be chosen on to the next arrival while it waits), chooses over the whole fleet as
    the single loop's router would (``inner`` draws from the single loop's seeded stream), and
    records the request on its replica only when it is one of the part's. ``route`` returns None
    when another part takes the request."""

    def __init__(self, inner: Router, seat: ExchangeSeat) -> None:
        super().__init__(inner.ctx, inner.options)
        self.inner = inner
        self.seat = seat
        self.name = inner.name
        self.reads_replica_state = inner.reads_replica_state
        self.hears_first_tokens = inner.hears_first_tokens
        self.reads_prefix_caches = inner.reads_prefix_caches
        self.passes_some_requests = True
        # The fleet loop's run_ahead (engine/fleet_ahead.py): while the other parts price an
        # arrival, this part's replicas priced above its cheapest (which a router picking a minimum
        # cannot choose) run on to the next arrival.
        self.run_ahead: Callable[[list[int]], None] | None = None
        self._picks_a_minimum = inner.picks_a_minimum()

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int | None:  # type: ignore[override]
        inner = self.inner
        quote = inner.quote(req, replicas, now_ms)
        seat = self.seat
        seat.publish(quote.costs)
        if self.run_ahead is not None and self._picks_a_minimum:
            best = min(quote.costs)
            cannot_win = [pos for pos, cost in enumerate(quote.costs) if cost > best]
            if cannot_win:
                self.run_ahead(cannot_win)
        costs = seat.collect()
        chosen = inner.choose(costs) - seat.lo
        if not 0 <= chosen < len(replicas):
            return None
        inner.commit(req, replicas[chosen].replica, quote, chosen, now_ms)
        return chosen

    def request_finished(self, req: Request, replica: int) -> None:
        self.inner.request_finished(req, replica)

    def request_first_token(self, req: Request) -> None:
        self.inner.request_first_token(req)

    def replica_started(self, replica: int) -> None:
        self.inner.replica_started(replica)  # (fleets in step are fixed today: why_replicas_meet)


def lockstep_plans(plan: ArrivalPlan, rejected: dict[int, str], bounds: list[int]) -> list[ClusterPlan]:
    """Each part's share of the replay: the whole plan (every part prices every request, and sees
    every arrival as the single loop does, refused rows included); part 0 alone records the rows
    refused up front (``FleetLoop.records_refused``)."""
    return [ClusterPlan(cluster=p, replica_offset=bounds[p], replicas=bounds[p + 1] - bounds[p], plan=plan,
                        rejected=rejected) for p in range(len(bounds) - 1)]
