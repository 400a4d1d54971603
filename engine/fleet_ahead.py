"""Replicas run ahead to the next arrival while a part of a fleet in step waits (engine/lockstep.py).

A part publishes its replicas' costs for an arrival, then waits for the other parts'. Under a router
that picks a minimum, its replicas priced above its cheapest cannot take that arrival, so until the
next arrival their run is the same whoever takes it. While it waits, the part brings them to the
next arrival's instant; what is left after the choice is the run of its cheapest replicas alone.
The outputs are the same rows (each replica's in its own order; the part's steps and chunk runs
interleave its replicas differently), and a part's order depends only on the costs, so the bytes
are the same from run to run.

``RunAhead`` is a base class of the fleet loop (engine/fleet.py), which owns the clock and the heap.
"""

from __future__ import annotations

import math

from replay.engine.core import EngineCore
from replay.engine.fleet_bounds import ReplicaBounds
from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request

# Heap phases. At one instant: step completions, then KV transfer events (disaggregated fleets,
# engine/pd_fleet.py), then arrivals (not in the heap), then begins.
COMPLETE_PHASE, TRANSFER_PHASE, BEGIN_PHASE = 0, 1, 2


class RunAhead(ReplicaBounds):
    """The loop's ``run_ahead`` (see the module doc); the loop calls ``_init_run_ahead``."""

    now: float
    live_views: list[ReplicaView]

    def _init_run_ahead(self) -> None:
        self._wake_phase = [BEGIN_PHASE] * len(self.cores)  # per replica: the phase of its heap entry
        self._ran_ahead_to = 0.0  # the latest event run_ahead took (the clock ends at the last event)

    def run_ahead(self, positions: list[int]) -> None:
        """Bring the live replicas at ``positions`` to the next arrival. Each replica's events keep
        the loop's order (completions at the next arrival's instant come before it, begins after);
        between arrivals the replicas share nothing."""
        t_next = self._next_arrival_ms()
        arrived_at = latest = self.now
        cores = [self.cores[self.live_views[pos].replica] for pos in positions]
        for core in cores:
            t, phase = core.wake_ms, self._wake_phase[core.replica]
            if t == math.inf or not (t < t_next or (t == t_next and phase == COMPLETE_PHASE)):
                continue
            core.version += 1  # its heap entry is superseded
            while t < t_next or (t == t_next and phase == COMPLETE_PHASE):
                self.now = t
                latest = max(latest, t)
                if phase == COMPLETE_PHASE:
                    t, phase = core.complete(self._on_finished), BEGIN_PHASE
                else:
                    t, completes = core.begin(t, self._horizon, self._next_event)
                    phase = COMPLETE_PHASE if completes else BEGIN_PHASE
            self._push(core, t, phase)
        self._ran_ahead_to = max(self._ran_ahead_to, latest)
        self.now = arrived_at

    # The loop's (engine/fleet.py): a heap entry for a replica, and what a finished request tells.
    def _push(self, core: EngineCore, t: float, phase: int) -> None:
        raise NotImplementedError

    def _on_finished(self, r: Request, end_ms: float, core: EngineCore) -> None:
        raise NotImplementedError
