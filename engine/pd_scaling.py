"""Autoscaled pools of a disaggregated fleet: one controller per pool (docs/autoscale.md).

Dynamo's SLA Planner scales a disaggregated deployment's prefill and decode workers apart
(planner: prefill_planner and decode_planner, run side by side by disagg_planner): each pool has its
own policy, bounds, delays and replica ids, and its own router sees only its live replicas. Here each
autoscaled pool gets a ``FleetScaler`` (engine/fleet_scaling.py), unchanged, that sees the pool as
its whole fleet through a ``PoolControl``: the pool's live views, a control event of its own on the
loop's clock, joins and drains in the pool's fleet slots (prefill slots first, decode after them).

What differs from an aggregated fleet is when a draining replica may retire
(``PDFleetLoop.replica_idle``): a prefill replica holds a finished prompt's blocks until the decode
side has read them (vLLM's ``delay_free_blocks`` until ``finished_sending``), so it retires only
when no read from it is in flight; a decode replica retires only when no prompt bound for it is
still prefilling elsewhere and no read into it is in flight (the request is on its way to it).
"""

from __future__ import annotations

from collections.abc import Callable

from replay.engine.autoscale import Autoscaler, build_policy
from replay.engine.core import EngineCore
from replay.engine.fleet_scaling import FleetScaler
from replay.engine.pd_fleet import PDFleetLoop
from replay.engine.replica_view import ReplicaView
from replay.engine.scaling_config import AutoscaleConfig
from replay.engine.slo_capacity import ReplicaCapacity
from replay.engine.trace_input import TraceArrays

POOL_EVENT_ROWS = {"prefill": -1, "decode": -2}  # rows of each pool's control events in the arrival queue


class PoolControl:
    """One autoscaled pool: the fleet a ``FleetScaler`` drives (its FleetLoop protocol), on the P/D loop."""

    def __init__(self, loop: PDFleetLoop, pool: str, cfg: AutoscaleConfig, capacity: ReplicaCapacity | None,
                 new_core: Callable[[int], EngineCore], trace: TraceArrays, total_requests: int) -> None:
        self.loop = loop
        self.pool = pool
        self.row = POOL_EVENT_ROWS[pool]
        self.offset = 0 if pool == "prefill" else loop.num_prefill
        cores = loop.prefill_cores if pool == "prefill" else loop.decode_cores
        live = len(self.live_views)
        self.scaler = FleetScaler(cfg, Autoscaler(cfg, build_policy(cfg, capacity)),
                                  lambda local: new_core(self.offset + local), trace, total_requests,
                                  cores[:live], pool=pool, replica_offset=self.offset, idle=loop.replica_idle)
        self.num_rejected_at_arrival = 0  # a disaggregated fleet has no admission control

    # -- the FleetLoop protocol a FleetScaler drives -------------------------------------------------
    @property
    def live_views(self) -> list[ReplicaView]:
        return self.loop.prefill_views if self.pool == "prefill" else self.loop.decode_views

    @property
    def num_done(self) -> int:
        return self.loop.num_done

    def wake_control_at(self, time_ms: float) -> None:
        self.loop._push_dynamic(time_ms, self.row)

    def install_replica(self, core: EngineCore) -> None:
        self.loop.install_pool_replica(core)

    def remove_live_replica(self, replica: int) -> None:
        self.loop.remove_pool_replica(self.pool, replica)

    # -- what the P/D loop tells it ------------------------------------------------------------------
    def start(self) -> None:
        self.scaler.start(self)

    def act(self, now: float) -> None:
        self.scaler.act(now, self)

    def arrived(self, idx: int) -> None:
        self.scaler.arrived(idx)

    def replica_maybe_idle(self, core: EngineCore, t: float) -> None:
        if (core.replica < self.loop.num_prefill) == (self.pool == "prefill"):
            self.scaler.request_finished(core, t)


def attach_pool_controls(loop: PDFleetLoop, controls: list[PoolControl]) -> None:
    """Hand the loop its pools' controllers, indexed by their event rows (-1 prefill, -2 decode)."""
    by_row: list[PoolControl | None] = [None, None]
    for control in controls:
        by_row[-1 - control.row] = control
    loop.pool_controls = [c if c is not None else _NoControl() for c in by_row] if controls else []


class _NoControl:
    """A fixed pool beside an autoscaled one: it never wakes, and ignores arrivals and finishes."""

    def start(self) -> None:
        pass

    def act(self, now: float) -> None:
        pass

    def arrived(self, idx: int) -> None:
        pass

    def replica_maybe_idle(self, core: EngineCore, t: float) -> None:
        pass


def pool_scalers(loop: PDFleetLoop) -> dict[str, FleetScaler]:
    """The autoscaled pools' scalers, by pool name (empty for a fixed disaggregated fleet)."""
    return {c.pool: c.scaler for c in loop.pool_controls if isinstance(c, PoolControl)}
