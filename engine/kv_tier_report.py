"""run.json's ``kv_tiers`` section: per tier of the chain, hits, bytes, evictions, link use.

A cluster tier is one pool: its figures are counted once, not once per replica. Link utilization is
the share of the simulated span a link was busy, averaged over the tier's distinct links (per
replica, per node or the pool's aggregate, engine/kv_links.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replay.engine.config import EngineConfig
from replay.engine.kv_tier_config import HOST_OFFLOAD_TIER_NAME
from replay.engine.kv_tiers import KVTier, TierChain

if TYPE_CHECKING:
    from replay.engine.core import EngineCore


def tier_names(config: EngineConfig) -> list[str]:
    """The chain's tier names (G2 first when present); empty without ``kv_cache.tiers``."""
    if not config.kv_cache.tiers:
        return []
    head = [HOST_OFFLOAD_TIER_NAME] if config.host_offload is not None else []
    return head + [t.name for t in config.kv_cache.tiers]


def _chains(cores: list[EngineCore]) -> list[TierChain]:
    out = []
    for c in cores:
        lower = c.offload.lower if c.offload is not None else None
        if lower is not None:
            out.append(lower)
    return out


def tier_summary(cores: list[EngineCore], prefix_query_tokens: int, span_ms: float) -> list[dict]:
    """One entry per tier below G2 (G2's own figures stay in ``totals``)."""
    chains = _chains(cores)
    if not chains:
        return []
    out = []
    for i, first in enumerate(chains[0].tiers):
        objs: dict[int, KVTier] = {}
        links: dict[int, object] = {}
        for chain in chains:
            tier = chain.tiers[i]
            objs.setdefault(id(tier), tier)
            for link in chain.links[i].read + chain.links[i].write:
                links.setdefault(id(link), link)
        tiers = list(objs.values())
        hit = sum(t.hit_tokens for t in tiers)
        read = sum(t.blocks_read for t in tiers)
        written = sum(t.blocks_written for t in tiers)
        cfg = first.cfg
        util = {}
        for link in links.values():
            kind = link.name.rsplit(".", 1)[-1]  # read, write, pool_read, pool_write
            util.setdefault(kind, []).append(link.busy_ms / span_ms if span_ms > 0 else 0.0)
        curve = []
        for k, size in enumerate(cfg.size_curve):
            blocks = sum(t.shadow_hit_blocks[k] for t in tiers)
            curve.append({"num_blocks": size, "hit_tokens": blocks * first.store.stride,
                          "hit_rate": blocks * first.store.stride / prefix_query_tokens if prefix_query_tokens else 0.0})
        entry = {
            "name": cfg.name,
            "medium": cfg.medium,
            "scope": cfg.scope,
            "store": cfg.store,
            "num_blocks": first.capacity,
            "pools": len(tiers),
            "hit_tokens": hit,
            "hit_rate": hit / prefix_query_tokens if prefix_query_tokens else 0.0,
            "blocks_read": read,
            "blocks_written": written,
            "bytes_read": read * first.block_bytes,
            "bytes_written": written * first.block_bytes,
            "evictions": sum(t.evictions for t in tiers),
            "writes_dropped": sum(t.writes_dropped for t in tiers),
            "blocks_held": sum(len(t.store) for t in tiers),
            "link_utilization": {k: round(sum(v) / len(v), 6) for k, v in sorted(util.items())},
        }
        if curve:
            entry["size_curve"] = curve
        out.append(entry)
    return out
