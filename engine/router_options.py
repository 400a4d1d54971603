"""Per-router options (``fleet.router_options``): pydantic models that reject unknown keys.

Defaults are the sources' own defaults; each names where it comes from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("tier_weights", check_fields=False)
    @classmethod
    def _unit_weights(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, w in v.items() if not 0.0 <= w <= 1.0]
        if bad:
            raise ValueError(f"tier_weights.{bad[0]}: a weight is a fraction of a GPU hit, in [0, 1]")
        return v


class NoOptions(_Options):
    pass


class SessionAffinityOptions(_Options):
    # Points on the hash ring, in all: Envoy's ring_hash minimum_ring_size default (1024).
    ring_size: int = Field(1024, gt=0, le=1 << 23)


class LeastLoadedOptions(_Options):
    # vLLM's DP coordinator publishes engine stats every stats_update_interval_ms (100 ms, 0.33).
    stats_update_ms: float = Field(100.0, ge=0.0, allow_inf_nan=False)
    # API server processes sharing the engines (vLLM --api-server-count, default 1).
    client_count: int = Field(1, gt=0)


class KvAwareOptions(_Options):
    # Dynamo KvRouterConfig defaults: overlap_score_weight 1.0, router_temperature 0.0.
    overlap_score_weight: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    router_temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    kv_events: bool = True
    # Approximate mode (kv_events: false): Dynamo's router_ttl_secs 120 and a 2^20-block tree cap.
    ttl_s: float = Field(120.0, gt=0.0, allow_inf_nan=False)
    max_tree_blocks: int = Field(1 << 20, gt=0)
    # Credit for a hit in a KV tier after the GPU, per tier name ("host" = G2), as a fraction of a
    # GPU hit: Dynamo's --router-host-cache-hit-weight 0.75 and --router-disk-cache-hit-weight 0.25.
    # Empty (default): tiers are not weighed (the router sees GPU hits only).
    tier_weights: dict[str, float] = Field(default_factory=dict)


class PrefixScoreOptions(_Options):
    # llm-d EPP default profile weights (pkg/epp/config/loader/defaults.go).
    queue_weight: float = Field(2.0, ge=0.0, allow_inf_nan=False)
    kv_cache_utilization_weight: float = Field(2.0, ge=0.0, allow_inf_nan=False)
    prefix_cache_weight: float = Field(3.0, ge=0.0, allow_inf_nan=False)
    # llm-d's approximate prefix producer: at most 256 blocks per request, per-server LRU sized
    # to the engine's KV blocks when auto-tuned (null here = the engine's num_gpu_blocks).
    max_prefix_blocks: int = Field(256, gt=0)
    lru_capacity_blocks: int | None = Field(None, gt=0)
    precise: bool = False
    # A block found in a KV tier after the GPU scores this fraction of a matched block, per tier
    # name ("host" = G2); empty (default): tiers are not weighed.
    tier_weights: dict[str, float] = Field(default_factory=dict)


OPTIONS_BY_ROUTER: dict[str, type[_Options]] = {
    "round_robin": NoOptions,
    "random": NoOptions,
    "session_affinity": SessionAffinityOptions,
    "least_loaded": LeastLoadedOptions,
    "kv_aware": KvAwareOptions,
    "prefix_score": PrefixScoreOptions,
}
