"""run.json's ``kv_tiers`` section: per tier of the chain, hits, bytes, evictions, link use.

A cluster tier is one pool: its figures are counted once, not once per replica (a fleet of clusters
has one per cluster: ``pools`` counts them). Link utilization is the share of the simulated span a
link was busy, averaged over the tier's distinct links (per replica, per node or the pool's
aggregate, engine/kv_links.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay.engine.config import EngineConfig
from replay.engine.kv_links import Link
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


@dataclass
class TierFigures:
    """One configured tier's counters over its distinct stores and links (plain numbers, so a
    cluster's figures travel from a Ray worker and add up with the other clusters')."""

    name: str
    medium: str
    scope: str
    store: str
    num_blocks: int
    block_bytes: int
    stride: int  # tokens per block
    pools: int
    hit_tokens: int
    blocks_read: int
    blocks_written: int
    evictions: int
    writes_dropped: int
    blocks_held: int
    link_busy_ms: dict[str, list[float]]  # link kind -> busy time of each distinct link
    size_curve: list[int]
    shadow_hit_blocks: list[int]

    def add(self, other: TierFigures) -> None:
        """Count ``other`` (the same tier in another cluster) in."""
        self.pools += other.pools
        self.hit_tokens += other.hit_tokens
        self.blocks_read += other.blocks_read
        self.blocks_written += other.blocks_written
        self.evictions += other.evictions
        self.writes_dropped += other.writes_dropped
        self.blocks_held += other.blocks_held
        for kind, busy in other.link_busy_ms.items():
            self.link_busy_ms.setdefault(kind, []).extend(busy)
        self.shadow_hit_blocks = [a + b for a, b in zip(self.shadow_hit_blocks, other.shadow_hit_blocks)]


def tier_figures(cores: list[EngineCore]) -> list[TierFigures]:
    """Per tier below G2, its counters summed over its distinct objects (a cluster tier once)."""
    chains = _chains(cores)
    if not chains:
        return []
    out = []
    for i, first in enumerate(chains[0].tiers):
        objs: dict[int, KVTier] = {}
        links: dict[int, Link] = {}
        for chain in chains:
            tier = chain.tiers[i]
            objs.setdefault(id(tier), tier)
            for link in chain.links[i].read + chain.links[i].write:
                links.setdefault(id(link), link)
        tiers = list(objs.values())
        busy: dict[str, list[float]] = {}
        for link in links.values():
            busy.setdefault(link.name.rsplit(".", 1)[-1], []).append(link.busy_ms)  # read, write, pool_*
        cfg = first.cfg
        out.append(TierFigures(
            name=cfg.name, medium=cfg.medium, scope=cfg.scope, store=cfg.store, num_blocks=first.capacity,
            block_bytes=first.block_bytes, stride=first.store.stride, pools=len(tiers),
            hit_tokens=sum(t.hit_tokens for t in tiers), blocks_read=sum(t.blocks_read for t in tiers),
            blocks_written=sum(t.blocks_written for t in tiers), evictions=sum(t.evictions for t in tiers),
            writes_dropped=sum(t.writes_dropped for t in tiers), blocks_held=sum(len(t.store) for t in tiers),
            link_busy_ms=busy, size_curve=list(cfg.size_curve),
            shadow_hit_blocks=[sum(t.shadow_hit_blocks[k] for t in tiers) for k in range(len(cfg.size_curve))]))
    return out


def tier_summary(figures: list[TierFigures], prefix_query_tokens: int, span_ms: float) -> list[dict]:
    """One entry per tier below G2 (G2's own figures stay in ``totals``)."""
    out = []
    for f in figures:
        util = {kind: round(sum(b / span_ms if span_ms > 0 else 0.0 for b in busy) / len(busy), 6)
                for kind, busy in sorted(f.link_busy_ms.items())}
        curve = []
        for size, blocks in zip(f.size_curve, f.shadow_hit_blocks):
            curve.append({"num_blocks": size, "hit_tokens": blocks * f.stride,
                          "hit_rate": blocks * f.stride / prefix_query_tokens if prefix_query_tokens else 0.0})
        entry = {
            "name": f.name,
            "medium": f.medium,
            "scope": f.scope,
            "store": f.store,
            "num_blocks": f.num_blocks,
            "pools": f.pools,
            "hit_tokens": f.hit_tokens,
            "hit_rate": f.hit_tokens / prefix_query_tokens if prefix_query_tokens else 0.0,
            "blocks_read": f.blocks_read,
            "blocks_written": f.blocks_written,
            "bytes_read": f.blocks_read * f.block_bytes,
            "bytes_written": f.blocks_written * f.block_bytes,
            "evictions": f.evictions,
            "writes_dropped": f.writes_dropped,
            "blocks_held": f.blocks_held,
            "link_utilization": util,
        }
        if curve:
            entry["size_curve"] = curve
        out.append(entry)
    return out
