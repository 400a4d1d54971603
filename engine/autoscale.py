"""Autoscaling policies: how many replicas the fleet wants, from what it saw over the last interval.

One small class per policy behind ``ScalingPolicy.recommend`` (a pure function of the signals), and
``Autoscaler``, which turns recommendations into a target the way Kubernetes' HorizontalPodAutoscaler
does (pkg/controller/podautoscaler/horizontal.go): clamp to [min, max], and for scale-down take the
highest recommendation of the last ``scale_down_delay_s`` (its stabilization window), so a brief dip
does not drain replicas that the next minute needs again. Scale-up takes effect at once (HPA's
default scale-up window is 0). engine/fleet_scaling.py carries the target out.

Policies:
- ``queue``: HPA on a per-pod metric, the waiting requests per live replica (what llm-d's and
  KServe's autoscalers scale vLLM on): desired = ceil(live * (waiting / live) / target), unchanged
  while the ratio is within ``tolerance`` of 1 (HPA's 10%).
- ``kv_usage``: the same on vLLM's kv_cache_usage averaged over the live replicas (Dynamo's
  load-based planner scales decode workers on it).
- ``slo``: Dynamo's SLA Planner: predict the next interval's request count, mean input and output
  lengths from the last intervals (constant predictor: the last interval; linear: a least-squares
  trend over ``history_intervals``), and size the fleet as predicted rate / the rate one replica
  sustains at the SLO for those lengths (engine/slo_capacity.py, from the engine's own step timer).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from replay.engine.scaling_config import AutoscaleConfig
from replay.engine.slo_capacity import ReplicaCapacity


@dataclass(frozen=True)
class ScalingSignals:
    """What the autoscaler reads at one decision instant (the metrics a Prometheus scrape gives)."""

    now_ms: float
    live: int  # replicas serving (routers see them)
    provisioning: int  # replicas started, not yet serving
    waiting: int  # requests waiting over the live replicas (their queues and requests on their way)
    kv_usage: float  # mean kv_cache_usage over the live replicas
    arrivals: int  # requests that arrived in the last interval (admitted or not)
    mean_input_tokens: float  # of those arrivals (0 when none)
    mean_output_tokens: float
    interval_ms: float


class ScalingPolicy:
    """One autoscaling rule: the replica count it recommends (not yet clamped or stabilized)."""

    name = ""

    def recommend(self, s: ScalingSignals) -> int:
        raise NotImplementedError


class _RatioPolicy(ScalingPolicy):
    """HPA's rule for one per-replica metric with a target value and a tolerance."""

    def __init__(self, target: float, tolerance: float) -> None:
        self.target = target
        self.tolerance = tolerance

    def metric(self, s: ScalingSignals) -> float:
        raise NotImplementedError

    def recommend(self, s: ScalingSignals) -> int:
        current = s.live + s.provisioning  # HPA counts pods that are starting as replicas
        ratio = self.metric(s) / self.target
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return math.ceil(round(s.live * ratio, 9))  # rounding: 4 * 0.3 / 0.3 is 4, not 5


class QueuePolicy(_RatioPolicy):
    name = "queue"

    def metric(self, s: ScalingSignals) -> float:
        return s.waiting / s.live


class KvUsagePolicy(_RatioPolicy):
    name = "kv_usage"

    def metric(self, s: ScalingSignals) -> float:
        return s.kv_usage


class LoadPredictor:
    """Dynamo's load predictors, on the per-interval series the planner scrapes: ``constant``
    (the next interval is the last) or ``linear`` (a least-squares line through the last k)."""

    def __init__(self, kind: str, history: int) -> None:
        self.kind = kind
        self.values: deque[float] = deque(maxlen=history if kind == "linear" else 1)

    def add(self, value: float) -> None:
        self.values.append(value)

    def predict(self) -> float:
        v = self.values
        if not v:
            return 0.0
        if self.kind == "constant" or len(v) < 2:
            return v[-1]
        n = len(v)
        mean_x = (n - 1) / 2.0
        mean_y = sum(v) / n
        sxx = sum((i - mean_x) ** 2 for i in range(n))
        slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(v)) / sxx
        return max(0.0, mean_y + slope * (n - mean_x))  # one interval past the last


class SloPolicy(ScalingPolicy):
    """Dynamo's SLA Planner for an aggregated pool: predicted load / what one replica sustains."""

    name = "slo"

    def __init__(self, capacity: ReplicaCapacity, target: float, predictor: str, history: int) -> None:
        self.capacity = capacity
        self.target = target
        self.requests = LoadPredictor(predictor, history)
        self.isl = LoadPredictor(predictor, history)
        self.osl = LoadPredictor(predictor, history)
        self.last_prediction: tuple[float, float, float] | None = None  # (req/s, isl, osl)

    def recommend(self, s: ScalingSignals) -> int:
        self.requests.add(float(s.arrivals))
        if s.arrivals:  # lengths are only observed when requests came
            self.isl.add(s.mean_input_tokens)
            self.osl.add(s.mean_output_tokens)
        rate = self.requests.predict() * 1000.0 / s.interval_ms
        isl, osl = self.isl.predict(), self.osl.predict()
        self.last_prediction = (rate, isl, osl)
        if rate <= 0.0:
            return 0
        per_replica = self.capacity.requests_per_s(max(1, round(isl)), max(1, round(osl)))
        return math.ceil(round(rate / (per_replica * self.target), 9))


def build_policy(cfg: AutoscaleConfig, capacity: ReplicaCapacity | None) -> ScalingPolicy:
    if cfg.policy == "queue":
        return QueuePolicy(cfg.resolved_target, cfg.tolerance)
    if cfg.policy == "kv_usage":
        return KvUsagePolicy(cfg.resolved_target, cfg.tolerance)
    if capacity is None:
        raise ValueError("policy slo needs the replica capacity model")
    return SloPolicy(capacity, cfg.resolved_target, cfg.predictor, cfg.history_intervals)


class Autoscaler:
    """Recommendations -> the replica count to run: clamped, scale-down stabilized (see module doc)."""

    def __init__(self, cfg: AutoscaleConfig, policy: ScalingPolicy) -> None:
        self.cfg = cfg
        self.policy = policy
        self.window_ms = cfg.scale_down_delay_s * 1000.0
        self._recent: deque[tuple[float, int]] = deque()  # (time, clamped recommendation)

    def desired(self, s: ScalingSignals) -> int:
        cfg = self.cfg
        rec = min(max(self.policy.recommend(s), cfg.min_replicas), cfg.max_replicas)
        recent = self._recent
        recent.append((s.now_ms, rec))
        while recent and recent[0][0] < s.now_ms - self.window_ms:
            recent.popleft()
        current = s.live + s.provisioning
        if rec >= current:
            return rec
        return min(current, max(r for _, r in recent))  # scale down no lower than the window's highest
