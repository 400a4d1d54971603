"""The ``fleet`` section of the engine config: replicas behind a router, disaggregated pools, clusters
behind a global balancer, autoscaling and admission (docs/fleet.md, docs/disagg.md, docs/autoscale.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from replay.engine.pd_config import KVTransferConfig, PoolConfig
from replay.engine.router_options import OPTIONS_BY_ROUTER
from replay.engine.scaling_config import AdmissionConfig, AutoscaleConfig, check_initial_replicas
from replay.engine.strict_model import StrictModel

RouterName = Literal["round_robin", "random", "least_loaded", "session_affinity", "kv_aware", "prefix_score"]
# How a global balancer in front of clusters picks one (engine/clusters.py): from the request alone,
# so that the clusters replay independently.
GlobalRouterName = Literal["round_robin", "random", "session_hash", "prefix_hash"]


class FleetConfig(StrictModel):
    """Data-parallel replicas of the engine configured around it, behind one router (docs/fleet.md)."""

    replicas: int = Field(1, gt=0, le=4096)
    router: RouterName = "round_robin"
    router_options: dict[str, Any] = Field(default_factory=dict)  # per router; unknown keys rejected
    router_latency_ms: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # arrival -> replica queue
    # Disaggregated prefill/decode (docs/disagg.md): two pools, ``router`` picks the decode replica.
    mode: Literal["aggregated", "disaggregated"] = "aggregated"
    prefill: PoolConfig | None = None
    decode: PoolConfig | None = None
    kv_transfer: KVTransferConfig | None = None
    prefill_router: RouterName = "round_robin"
    prefill_router_options: dict[str, Any] = Field(default_factory=dict)
    local_prefill_max_tokens: int | None = Field(None, ge=0)  # prefill on the decode replica up to this
    prefill_queue_max: int | None = Field(None, ge=0)  # ... or when more requests wait for prefill
    # A fleet over a day (engine/scaling_config.py, docs/autoscale.md): absent, the fleet is fixed.
    autoscale: AutoscaleConfig | None = None
    admission: AdmissionConfig | None = None
    gpu_cost_per_hour: float | None = Field(None, ge=0.0)  # per GPU (a replica has tensor_parallel_size)
    # K clusters of replicas / K replicas each, every cluster behind its own `router`; a global
    # balancer picks the cluster (docs/fleet.md, "Clusters").
    clusters: int = Field(1, gt=0, le=4096)
    global_router: GlobalRouterName = "round_robin"

    @model_validator(mode="after")
    def _cluster_sizes(self) -> FleetConfig:
        if self.replicas % self.clusters:
            raise ValueError(f"fleet.replicas ({self.replicas}) must be a multiple of fleet.clusters "
                             f"({self.clusters}): every cluster has replicas / clusters replicas")
        if self.clusters > 1 and (self.autoscale is not None or self.admission is not None):
            raise ValueError("fleet.autoscale and fleet.admission apply to a fleet of one cluster (per cluster "
                             "is not modeled yet)")
        if self.clusters > 1 and self.mode == "disaggregated":
            raise ValueError("fleet.clusters > 1 is not supported with fleet.mode disaggregated (yet): "
                             "replay each disaggregated cluster as its own fleet")
        return self

    @model_validator(mode="after")
    def _router_options(self) -> FleetConfig:
        check_initial_replicas(self.replicas, "replicas" in self.model_fields_set, self.autoscale)
        _check_router_options("router_options", self.router, self.router_options)
        _check_router_options("prefill_router_options", self.prefill_router, self.prefill_router_options)
        return self

    @model_validator(mode="after")
    def _pools(self) -> FleetConfig:
        pd_keys = ("prefill", "decode", "kv_transfer", "prefill_router", "prefill_router_options",
                   "local_prefill_max_tokens", "prefill_queue_max")
        if self.mode == "disaggregated" and (self.autoscale is not None or self.admission is not None):
            raise ValueError("a disaggregated fleet scales per pool (fleet.prefill.autoscale, fleet.decode.autoscale);"
                             " fleet.autoscale and fleet.admission apply to an aggregated fleet")
        if self.mode == "aggregated":  # (a dumped config carries the defaults: only other values count)
            given = [k for k in pd_keys if getattr(self, k) != FleetConfig.model_fields[k].get_default(
                call_default_factory=True)]
            if given:
                raise ValueError(f"fleet.{given[0]} needs fleet.mode: disaggregated")
            return self
        for pool in ("prefill", "decode"):
            if getattr(self, pool) is None:
                raise ValueError(f"fleet.mode disaggregated needs fleet.{pool} (at least {{replicas: N}})")
            getattr(self, pool).check_objective(pool)
        if self.replicas != 1:
            raise ValueError("fleet.replicas: a disaggregated fleet sizes its pools with fleet.prefill.replicas "
                             "and fleet.decode.replicas")
        if self.kv_transfer is None:
            self.kv_transfer = KVTransferConfig()
        return self

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disaggregated"


def _check_router_options(key: str, router: str, options: dict[str, Any]) -> None:
    try:
        OPTIONS_BY_ROUTER[router].model_validate(options)
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: "
                        f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}" for e in exc.errors())
        what = "router_options" if key == "router_options" else f"{key}"
        raise ValueError(f"{what} for router {router!r}: {bad}") from None
