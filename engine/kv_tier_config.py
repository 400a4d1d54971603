"""Configuration of the KV cache tiers below GPU memory (``kv_cache.tiers``, docs/kv-tiers.md).

A tier is one store of KV blocks reached over a link: host memory over PCIe, a local disk, or a
remote pool over the network (Dynamo KVBM's G2/G3/G4, LMCache's local_cpu/local_disk/remote,
vLLM's OffloadingConnector with secondary tiers). ``host_offload`` is the first tier of the chain
when given (named ``host``); ``kv_cache.tiers`` lists the ones after it, in lookup order.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from replay.engine.strict_model import StrictModel

# The name the host_offload section takes as the chain's first tier.
HOST_OFFLOAD_TIER_NAME = "host"


class KVTierConfig(StrictModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")  # also names the requests column <name>_hit_tokens
    medium: Literal["host", "disk", "remote"]
    scope: Literal["replica", "cluster"] = "replica"  # cluster: one pool every replica of the fleet shares
    num_blocks: int | None = Field(None, gt=0)  # offload blocks (host_offload.block_size tokens each)
    size_gb: float | None = Field(None, gt=0.0)  # or a size: num_blocks = size_gb * 1e9 // block bytes
    block_size: int | None = Field(None, gt=0)  # tokens; must equal the chain's offload block size
    read_gb_per_s: float = Field(gt=0.0)  # per link (see docs/kv-tiers.md, "Links"): GB = 1e9 bytes
    write_gb_per_s: float = Field(gt=0.0)
    pool_read_gb_per_s: float | None = Field(None, gt=0.0)  # cluster scope: the pool's aggregate
    pool_write_gb_per_s: float | None = Field(None, gt=0.0)
    latency_ms: float = Field(0.0, ge=0.0)  # to first byte, per transfer
    eviction: Literal["lru"] = "lru"
    store: Literal["write_through", "on_evict"] = "write_through"
    replicas_per_node: int = Field(1, gt=0)  # disk: replicas sharing one node's disk link
    # Sizes (blocks) at which run.json reports the hit rate this tier would have had, from this one
    # run: shadow LRU stores of those sizes see the tier's writes and loads (docs/kv-tiers.md).
    size_curve: list[int] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _one_size(self) -> KVTierConfig:
        if (self.num_blocks is None) == (self.size_gb is None):
            raise ValueError(f"tier {self.name!r} needs exactly one of num_blocks or size_gb")
        if any(c <= 0 for c in self.size_curve):
            raise ValueError(f"tier {self.name!r}: size_curve sizes must be positive block counts")
        if self.scope == "replica" and (self.pool_read_gb_per_s is not None or self.pool_write_gb_per_s is not None):
            raise ValueError(f"tier {self.name!r}: pool_read_gb_per_s/pool_write_gb_per_s apply to scope cluster only")
        return self


def check_tier_chain(tiers: list[KVTierConfig], has_host_offload: bool, offload_block_size: int) -> None:
    """Chain-wide rules (ValueError naming the key): distinct names, one block size, and a first
    tier that is written through (the GPU's evictions are not a store source: vLLM, LMCache and
    KVBM all copy blocks as they are computed)."""
    seen = {HOST_OFFLOAD_TIER_NAME} if has_host_offload else set()
    for i, tier in enumerate(tiers):
        if tier.name in seen:
            what = "the host_offload tier's name" if tier.name == HOST_OFFLOAD_TIER_NAME and has_host_offload \
                else "a duplicate tier name"
            raise ValueError(f"kv_cache.tiers.{tier.name}: {what}; tier names must be distinct")
        seen.add(tier.name)
        if tier.block_size is not None and tier.block_size != offload_block_size:
            raise ValueError(f"kv_cache.tiers.{tier.name}.block_size: {tier.block_size} tokens differs from the "
                             f"chain's offload block size {offload_block_size} (host_offload.block_size, else "
                             f"kv_cache.block_size); every tier, cluster pools included, keeps blocks of one size")
        if i == 0 and not has_host_offload and tier.store == "on_evict":
            raise ValueError(f"kv_cache.tiers.{tier.name}.store: on_evict needs a tier above it; the first tier "
                             f"is written through from GPU memory")
