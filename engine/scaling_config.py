"""Config of a fleet that changes over the replay: ``fleet.autoscale`` and ``fleet.admission``.

Kept apart from engine/fleet_config.py (which only names these models in ``FleetConfig``) so that the
autoscaler and admission control own their keys; docs/autoscale.md documents each key, its default
and where the default comes from (Kubernetes' HorizontalPodAutoscaler, Dynamo's SLA Planner).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from replay.engine.strict_model import StrictModel

# Defaults of ``target`` per policy (docs/autoscale.md): waiting requests per live replica, and vLLM's
# kv_cache_usage averaged over the live replicas; the SLO policy sizes to what one replica sustains
# at the SLO, times ``target`` (1.0: exactly that).
DEFAULT_TARGET = {"queue": 4.0, "kv_usage": 0.7, "slo": 1.0}


class AutoscaleConfig(StrictModel):
    """``fleet.autoscale``: replicas follow the load between ``min_replicas`` and ``max_replicas``."""

    min_replicas: int = Field(1, ge=1, le=4096)  # no scale to zero: an arrival always finds a replica
    max_replicas: int = Field(ge=1, le=4096)
    policy: Literal["queue", "kv_usage", "slo"] = "queue"
    target: float | None = Field(None, gt=0.0)  # per policy; None: DEFAULT_TARGET
    ttft_ms: float | None = Field(None, gt=0.0)  # policy slo: the TTFT objective
    tpot_ms: float | None = Field(None, gt=0.0)  # policy slo: the TPOT (ITL) objective
    interval_s: float = Field(60.0, gt=0.0)  # how often the autoscaler decides
    scale_up_delay_s: float = Field(120.0, ge=0.0)  # provisioning + weight loading; joins empty and cold
    scale_down_delay_s: float = Field(300.0, ge=0.0)  # HPA's scale-down stabilization window
    tolerance: float = Field(0.1, ge=0.0, lt=1.0)  # HPA: no change while |metric/target - 1| <= tolerance
    predictor: Literal["constant", "linear"] = "constant"  # policy slo: Dynamo's constant predictor, or a trend
    history_intervals: int = Field(3, ge=2, le=1000)  # policy slo, predictor linear: intervals fitted

    @model_validator(mode="after")
    def _consistent(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is greater than max_replicas ({self.max_replicas})")
        if self.policy == "slo":
            if self.ttft_ms is None and self.tpot_ms is None:
                raise ValueError("policy slo needs ttft_ms and/or tpot_ms (the objective to size for)")
        elif self.ttft_ms is not None or self.tpot_ms is not None:
            raise ValueError(f"ttft_ms and tpot_ms are used by policy slo only, not policy {self.policy}")
        if self.policy == "kv_usage" and self.target is not None and self.target > 1.0:
            raise ValueError(f"policy kv_usage: target {self.target} is a KV cache usage fraction in (0, 1]")
        return self

    @property
    def resolved_target(self) -> float:
        return self.target if self.target is not None else DEFAULT_TARGET[self.policy]

    @property
    def id_capacity(self) -> int:
        """Replica ids the fleet may use at once: live and provisioning ones (at most max_replicas)
        plus those still draining (at most max_replicas more: a scale-up waits for a free id beyond)."""
        return 2 * self.max_replicas


class AdmissionConfig(StrictModel):
    """``fleet.admission``: refuse a request at arrival (status ``rejected``, ``reject_reason`` says why)."""

    max_waiting_per_replica: int | None = Field(None, ge=0)  # refuse when every live replica has this many waiting
    rate: float | None = Field(None, gt=0.0)  # token bucket: requests per second admitted on average
    burst: int | None = Field(None, ge=1)  # token bucket size (default: max(1, rate) requests)
    max_predicted_wait_ms: float | None = Field(None, gt=0.0)  # refuse when the predicted queue wait exceeds it

    @model_validator(mode="after")
    def _some_bound(self) -> AdmissionConfig:
        if self.max_waiting_per_replica is None and self.rate is None and self.max_predicted_wait_ms is None:
            raise ValueError("admission needs a bound: max_waiting_per_replica, rate (a token bucket, with "
                             "optional burst) or max_predicted_wait_ms")
        if self.burst is not None and self.rate is None:
            raise ValueError("burst is the token bucket's size: give rate too")
        return self


def check_initial_replicas(replicas: int, explicit: bool, autoscale: AutoscaleConfig | None) -> None:
    """With autoscaling, ``fleet.replicas`` (when given) is the starting count, within the bounds."""
    if autoscale is None or not explicit:
        return
    if not autoscale.min_replicas <= replicas <= autoscale.max_replicas:
        raise ValueError(f"replicas ({replicas}) is the autoscaled fleet's starting size and must lie within "
                         f"min_replicas ({autoscale.min_replicas}) and max_replicas ({autoscale.max_replicas})")
