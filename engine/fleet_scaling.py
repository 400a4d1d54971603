"""An autoscaled fleet's replicas over time: provisioning, joining, draining, retiring.

The fleet loop (engine/fleet.py) hands this controller its own events (ticks and joins, ordered with
closed-loop arrivals on its clock) and every arrival and finish; the controller decides through the
``Autoscaler`` (engine/autoscale.py) and changes which replicas the router sees. What it does, and
which Kubernetes / Dynamo behaviour each step follows (docs/autoscale.md):

- Every ``interval_s`` from t = 0 it reads the live replicas (waiting requests, KV usage) and the
  arrivals of the interval, and asks the autoscaler for a replica count.
- Scale-up starts replicas at once; each joins ``scale_up_delay_s`` later (provisioning and weight
  loading), as a new engine: empty, with a cold prefix cache; routers see it from then on.
  It takes the lowest replica id no live, starting or draining replica holds, and numbers its steps
  on from the last engine that held that id.
- Scale-down first cancels replicas still starting, the most recent first (a ReplicaSet deletes
  not-ready pods first), then drains live ones, the most recently joined first: a draining replica
  leaves the router at once and keeps serving what it holds (the waiting ones included) until it is
  empty, then retires (Dynamo revokes the worker's lease, the worker finishes its streams and exits).
- A replica is billed from its start to its retirement (or cancellation, or the end of the replay):
  a GPU is held while it boots and while it drains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from replay.engine.autoscale import Autoscaler, ScalingSignals, SloPolicy
from replay.engine.core import EngineCore
from replay.engine.replica_view import ReplicaView
from replay.engine.scaling_config import AutoscaleConfig
from replay.engine.trace_input import TraceArrays


class FleetLoop(Protocol):
    """What the controller uses of engine/fleet.py's FleetLoop (which knows nothing of this module)."""

    live_views: list[ReplicaView]
    num_done: int
    num_rejected_at_arrival: int

    def wake_control_at(self, time_ms: float) -> None: ...

    def install_replica(self, core: EngineCore) -> None: ...

    def remove_live_replica(self, replica: int) -> None: ...

PROVISIONING, LIVE, DRAINING, RETIRED, CANCELLED = "provisioning", "live", "draining", "retired", "cancelled"


@dataclass
class ReplicaLife:
    """One replica from its start to its end (an id may serve several lives, one after another)."""

    replica: int
    started_ms: float
    joined_ms: float | None = None
    drain_ms: float | None = None
    ended_ms: float | None = None  # retired, or cancelled before joining
    state: str = PROVISIONING
    core: EngineCore | None = None


@dataclass(frozen=True)
class ScalingRow:
    """One row of scaling.parquet: the fleet at one autoscaler decision."""

    time_ms: float
    live: int
    provisioning: int
    draining: int
    desired: int
    arrivals: int  # in the interval that ends here
    rejected: int  # refused by admission control in that interval
    waiting: int  # over all replicas still serving (live and draining)
    running: int
    kv_usage: float  # mean over the live replicas
    predicted_rate: float  # policy slo: requests/s predicted for the next interval (else NaN)
    pool: str | None = None  # a disaggregated fleet's pool (prefill or decode); None: the whole fleet


CoreFactory = Callable[[int], EngineCore]
IdleFn = Callable[[EngineCore], bool]


class FleetScaler:
    """Carries out the autoscaler's targets on a fleet loop (see the module doc)."""

    def __init__(self, cfg: AutoscaleConfig, autoscaler: Autoscaler, new_core: CoreFactory, trace: TraceArrays,
                 total_requests: int, initial_cores: list[EngineCore], *, pool: str | None = None,
                 replica_offset: int = 0, idle: IdleFn | None = None) -> None:
        """``pool``, ``replica_offset``: one pool of a disaggregated fleet, whose replica ids (what its
        router and its rows name) are the engines' fleet numbers less the offset. ``idle``: when a
        draining replica may retire (default: nothing queued or running on it)."""
        self.cfg = cfg
        self.pool = pool
        self.offset = replica_offset
        self.idle = idle or _idle
        self.autoscaler = autoscaler
        self.new_core = new_core
        self.trace = trace
        self.total = total_requests
        self.interval_ms = cfg.interval_s * 1000.0
        self.delay_ms = cfg.scale_up_delay_s * 1000.0
        self.next_tick_ms = self.interval_ms
        self.lives: list[ReplicaLife] = []
        self.current: dict[int, ReplicaLife] = {}  # id -> its life while provisioning, live or draining
        for core in initial_cores:
            life = ReplicaLife(core.replica - replica_offset, 0.0, joined_ms=0.0, state=LIVE, core=core)
            self.lives.append(life)
            self.current[life.replica] = life
        self.rows: list[ScalingRow] = []
        self._arrivals = 0
        self._arrival_in = 0
        self._arrival_out = 0
        self._rejected_seen = 0

    # -- what the fleet loop tells it ----------------------------------------------------------------
    def start(self, loop: FleetLoop) -> None:
        loop.wake_control_at(self.next_tick_ms)

    def arrived(self, idx: int) -> None:
        self._arrivals += 1
        self._arrival_in += int(self.trace.input_tokens[idx])
        self._arrival_out += int(self.trace.output_tokens[idx])

    def request_finished(self, core: EngineCore, end_ms: float) -> None:
        life = self.current.get(core.replica - self.offset)
        if life is not None and life.state == DRAINING and life.core is core and self.idle(core):
            self._retire(life, end_ms)

    def act(self, now: float, loop: FleetLoop) -> None:
        """A controller event is due: joins first, then the decision if a tick is due."""
        for life in [lf for lf in self.current.values() if lf.state == PROVISIONING
                     and lf.started_ms + self.delay_ms <= now]:
            self._join(life, now, loop)
        if now >= self.next_tick_ms:
            self._tick(now, loop)
            self.next_tick_ms += self.interval_ms
            if loop.num_done < self.total:
                loop.wake_control_at(self.next_tick_ms)

    # -- decisions -----------------------------------------------------------------------------------
    def _signals(self, now: float, loop: FleetLoop) -> ScalingSignals:
        live = loop.live_views
        provisioning = sum(1 for lf in self.current.values() if lf.state == PROVISIONING)
        n = self._arrivals
        return ScalingSignals(
            now_ms=now, live=len(live), provisioning=provisioning,
            waiting=sum(v.num_waiting for v in live),
            kv_usage=sum(v.kv_usage() for v in live) / len(live),
            arrivals=n, mean_input_tokens=self._arrival_in / n if n else 0.0,
            mean_output_tokens=self._arrival_out / n if n else 0.0, interval_ms=self.interval_ms)

    def _tick(self, now: float, loop: FleetLoop) -> None:
        s = self._signals(now, loop)
        desired = self.autoscaler.desired(s)
        current = s.live + s.provisioning
        if desired > current:
            for _ in range(desired - current):
                if not self._provision(now, loop):
                    break
        elif desired < current:
            self._scale_down(current - desired, now, loop)
        rejected = loop.num_rejected_at_arrival
        policy = self.autoscaler.policy
        prediction = policy.last_prediction if isinstance(policy, SloPolicy) else None
        states = [lf.state for lf in self.current.values()]
        self.rows.append(ScalingRow(
            time_ms=now, live=states.count(LIVE), provisioning=states.count(PROVISIONING),
            draining=states.count(DRAINING), desired=desired, arrivals=s.arrivals,
            rejected=rejected - self._rejected_seen,
            waiting=sum(lf.core.num_waiting for lf in self.current.values() if lf.core is not None),
            running=sum(lf.core.num_running for lf in self.current.values() if lf.core is not None),
            kv_usage=s.kv_usage, predicted_rate=prediction[0] if prediction else float("nan"), pool=self.pool))
        self._rejected_seen = rejected
        self._arrivals = self._arrival_in = self._arrival_out = 0

    def _provision(self, now: float, loop: FleetLoop) -> bool:
        rid = next((i for i in range(self.cfg.id_capacity) if i not in self.current), None)
        if rid is None:  # every id is live, starting or still draining: retry at the next decision
            return False
        life = ReplicaLife(rid, now)
        self.lives.append(life)
        self.current[rid] = life
        if self.delay_ms == 0.0:
            self._join(life, now, loop)
        else:
            loop.wake_control_at(now + self.delay_ms)
        return True

    def _join(self, life: ReplicaLife, now: float, loop: FleetLoop) -> None:
        core = self.new_core(life.replica)
        # A reused replica id continues its earlier engines' step numbers: (replica, step) names
        # one step in steps.parquet, which the chunk runs and the reports' ITL join on.
        core.step_idx = core.first_step = max((lf.core.step_idx for lf in self.lives
                                               if lf.replica == life.replica and lf.core is not None), default=0)
        loop.install_replica(core)
        life.core = core
        life.joined_ms = now
        life.state = LIVE

    def _scale_down(self, count: int, now: float, loop: FleetLoop) -> None:
        starting = sorted((lf for lf in self.current.values() if lf.state == PROVISIONING),
                          key=lambda lf: (lf.started_ms, lf.replica), reverse=True)
        for life in starting[:count]:
            life.state = CANCELLED
            life.ended_ms = now
            del self.current[life.replica]
        count -= min(count, len(starting))
        live = sorted((lf for lf in self.current.values() if lf.state == LIVE),
                      key=lambda lf: (lf.joined_ms, lf.replica), reverse=True)
        for life in live[:count]:
            life.state = DRAINING
            life.drain_ms = now
            loop.remove_live_replica(life.replica)
            if life.core is not None and self.idle(life.core):
                self._retire(life, now)

    def _retire(self, life: ReplicaLife, now: float) -> None:
        life.state = RETIRED
        life.ended_ms = now
        del self.current[life.replica]

    # -- results ------------------------------------------------------------------------------------
    def replica_ms(self, end_ms: float) -> float:
        """Replica-milliseconds held (started to ended, or to ``end_ms`` for those still up)."""
        return sum((lf.ended_ms if lf.ended_ms is not None else end_ms) - lf.started_ms for lf in self.lives)

    def cores(self) -> list[EngineCore]:
        """Every engine that served, one per life, in the order they joined."""
        return [lf.core for lf in self.lives if lf.core is not None]


def _idle(core: EngineCore | None) -> bool:
    return core is not None and not core.inbox and not core.sched.has_unfinished()
