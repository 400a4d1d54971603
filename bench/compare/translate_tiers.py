"""Translate ``kv_cache.tiers`` into AISimulate's G3 and shared-G2 settings, or refuse.

AISimulate (aisimulate 0.13.0.dev, its config models) has two shapes beyond a per-rank G2:
- ``g3_offload`` {scope worker_local | cluster_shared, num_g3_blocks (per worker, or the pool's
  total), latency_to_first_byte_ms, read/write_bandwidth_gbps, shared_read/write_bandwidth_gbps},
  which needs ``host_offload``: our G2 plus one tier after it;
- ``host_offload.scope: cluster_shared`` (one deployment-wide G2 pool of ``num_host_blocks``, with
  shared_d2h/h2d_bandwidth_gbps): our chain without ``host_offload`` and one host tier of cluster
  scope.
Anything else is refused, naming the key. Both sides take bandwidths in GB/s (the G2 translation
already maps ``d2h_gbps`` one to one). Where we give no pool aggregate, the peer's shared
bandwidth is set far above any link (it has no "unbounded").
"""

from __future__ import annotations

from typing import Any

from replay.engine.config import EngineConfig

UNBOUNDED_GBPS = 1.0e6  # the peer's shared bandwidth when ours has no aggregate link


class TierTranslationError(ValueError):
    """A tier setting AISimulate cannot reproduce; the message names the key."""


def _refuse(key: str, value: Any, why: str) -> TierTranslationError:
    return TierTranslationError(f"{key}={value!r} cannot be translated to AISimulate: {why}")


def translate_tiers(cfg: EngineConfig, kv_peer: dict[str, Any], notes: list[str]) -> None:
    """Add the peer's G3 / shared-G2 keys for ``cfg``'s tiers to ``kv_peer`` (its kv_cache)."""
    tiers = cfg.kv_cache.tiers
    if not tiers:
        return
    if len(tiers) > 1:
        raise _refuse("kv_cache.tiers", [t.name for t in tiers], "the peer has at most one tier after G2 (g3_offload)")
    t = tiers[0]
    key = f"kv_cache.tiers.{t.name}"
    if t.num_blocks is None:
        raise _refuse(f"{key}.size_gb", t.size_gb, "give num_blocks (the peer counts blocks)")
    if t.medium == "disk" and t.scope == "replica" and t.replicas_per_node != 1:
        raise _refuse(f"{key}.replicas_per_node", t.replicas_per_node, "the peer gives every worker its own G3 link")
    if t.store != "write_through":
        raise _refuse(f"{key}.store", t.store, "the peer's tiers are written through")
    shared_read = t.pool_read_gb_per_s or UNBOUNDED_GBPS
    shared_write = t.pool_write_gb_per_s or UNBOUNDED_GBPS
    if cfg.host_offload is not None:
        kv_peer["g3_offload"] = {
            "scope": "worker_local" if t.scope == "replica" else "cluster_shared",
            "num_g3_blocks": t.num_blocks,
            "latency_to_first_byte_ms": t.latency_ms,
            "read_bandwidth_gbps": t.read_gb_per_s,
            "write_bandwidth_gbps": t.write_gb_per_s,
            "shared_read_bandwidth_gbps": shared_read,
            "shared_write_bandwidth_gbps": shared_write,
        }
        notes.append(f"tier {t.name} -> g3_offload scope {kv_peer['g3_offload']['scope']}")
        return
    if t.medium != "host" or t.scope != "cluster":
        raise _refuse(key, f"{t.medium}/{t.scope}", "without host_offload the peer's only match is a cluster-scope "
                                                     "host tier (host_offload.scope cluster_shared)")
    kv_peer["host_offload"] = {
        "scope": "cluster_shared",
        "num_host_blocks": t.num_blocks,
        "d2h_bandwidth_gbps": t.write_gb_per_s,
        "h2d_bandwidth_gbps": t.read_gb_per_s,
        "shared_d2h_bandwidth_gbps": shared_write,
        "shared_h2d_bandwidth_gbps": shared_read,
        "latency_to_first_byte_ms": t.latency_ms,
    }
    notes.append(f"tier {t.name} -> host_offload scope cluster_shared")
