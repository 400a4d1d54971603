"""Config of a disaggregated fleet: the prefill and decode pools and the KV transfer between them.

Kept apart from engine/fleet_config.py (which only adds the keys to ``fleet``) so the P/D keys read as one
piece; docs/disagg.md documents every key and its source. The pools' engine overrides are merged
into the surrounding engine config by ``EngineConfig.pool_config``; only the keys named here may
differ between pools (the model may not: a prefill pool's KV must be the decode pool's KV).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from replay.engine.scaling_config import AutoscaleConfig, check_initial_replicas
from replay.engine.strict_model import StrictModel

# Engine sections a pool may override (the rest of the config is shared by both pools).
POOL_OVERRIDE_KEYS = ("hardware", "tensor_parallel_size", "scheduler", "kv_cache", "host_offload", "speculative")


class PoolConfig(StrictModel):
    """One pool: how many replicas, and the engine keys it sets differently from the shared config
    (null: as shared). Sections (scheduler, kv_cache, ...) are merged key by key into the shared
    ones; ``host_offload: false`` or ``speculative: false`` turns that feature off for this pool."""

    replicas: int = Field(1, gt=0, le=4096)
    hardware: str | None = None
    tensor_parallel_size: int | None = Field(None, gt=0)
    scheduler: dict[str, Any] | None = None
    kv_cache: dict[str, Any] | None = None
    host_offload: dict[str, Any] | Literal[False] | None = None
    speculative: dict[str, Any] | Literal[False] | None = None
    # This pool over a day (docs/autoscale.md, "Disaggregated fleets"): absent, its size is fixed.
    autoscale: AutoscaleConfig | None = None
    gpu_cost_per_hour: float | None = Field(None, ge=0.0)  # per GPU of this pool (default: fleet.gpu_cost_per_hour)

    @model_validator(mode="after")
    def _starting_size(self) -> PoolConfig:
        check_initial_replicas(self.replicas, "replicas" in self.model_fields_set, self.autoscale)
        return self

    def check_objective(self, pool: str) -> None:
        """Dynamo's SLA Planner sizes the prefill pool for TTFT and the decode pool for ITL: a pool's
        ``slo`` policy needs its own objective (and only that one)."""
        cfg = self.autoscale
        if cfg is None or cfg.policy != "slo":
            return
        own, other = ("ttft_ms", "tpot_ms") if pool == "prefill" else ("tpot_ms", "ttft_ms")
        if getattr(cfg, own) is None or getattr(cfg, other) is not None:
            raise ValueError(f"fleet.{pool}.autoscale: policy slo sizes the {pool} pool for {own} only "
                             f"(give {own}, not {other})")

    @property
    def initial_replicas(self) -> int:
        """Replicas at t = 0: ``replicas``; autoscaled, ``min_replicas`` unless replicas was given."""
        if self.autoscale is not None and "replicas" not in self.model_fields_set:
            return self.autoscale.min_replicas
        return self.replicas

    @property
    def id_capacity(self) -> int:
        """Replica ids (and fleet slots) this pool may use at once."""
        return self.autoscale.id_capacity if self.autoscale is not None else self.replicas

    def overrides(self) -> dict[str, Any]:
        """The engine keys this pool sets, for merging (False: the feature off, as None)."""
        out: dict[str, Any] = {}
        for key in POOL_OVERRIDE_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = None if value is False else value
        return out


class KVTransferConfig(StrictModel):
    """The prefill -> decode KV transfer (vLLM's NixlConnector reads). Defaults: one 400 Gb/s NIC
    per replica (NVIDIA ConnectX-7, 50 GB/s of payload at line rate), no fixed latency."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=True,
                              ser_json_inf_nan="constants")  # an .inf bandwidth survives run.json

    bandwidth_gb_per_s: float = 50.0  # per link: a replica's egress (prefill) or ingress (decode); inf allowed
    latency_ms: float = Field(0.0, ge=0.0)  # fixed cost per transfer (handshake, notification), after its bytes
    bytes_per_token: int | Literal["auto"] = "auto"  # auto: the model's KV per token, all layers and heads
    timing_mode: Literal["destination_missing", "full_prompt"] = "destination_missing"
    # Where a decode replica loads the prompt from (docs/disagg.md, "KV tiers"): ``prefill``, all of
    # it over the P->D link (vLLM's NIXL, Dynamo with KVBM on the prefill workers); ``cluster_tier``,
    # the blocks a cluster-scope KV tier holds from that tier, the rest over the P->D link (Mooncake
    # Store, LMCache's shared-storage P/D).
    decode_source: Literal["prefill", "cluster_tier"] = "prefill"

    @field_validator("bandwidth_gb_per_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if math.isnan(v) or v <= 0:
            raise ValueError(f"must be > 0 GB/s (got {v}); use .inf for an instantaneous link")
        return v

    @field_validator("latency_ms")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number of milliseconds")
        return v

    @field_validator("bytes_per_token")
    @classmethod
    def _positive_bytes(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v <= 0:
            raise ValueError("must be > 0 (or auto)")
        return v
