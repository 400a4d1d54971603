"""Per-replica totals for run.json: what each replica did, and how evenly the router spread work."""

from __future__ import annotations

import numpy as np

from replay.engine.core import EngineCore
from replay.engine.recorder import Recorder


def fleet_summary(cores: list[EngineCore], recorder: Recorder, selected: np.ndarray, span_ms: float,
                  replica_offset: int = 0) -> dict:
    """``replica_offset``: the first core's fleet number (a disaggregated fleet's decode pool numbers
    its replicas after the prefill pool's; requests name them within the pool)."""
    replica_of = recorder.replica[selected]
    finished = recorder.status[selected] == 0
    per_replica: list[dict] = []
    by_id: dict[int, dict] = {}
    for core in cores:
        s = core.sched
        earlier = by_id.get(core.replica)
        if earlier is not None:  # an autoscaled fleet gave this id to a new engine: one row per id
            earlier["steps"] += core.step_idx - core.first_step
            earlier["busy_ms"] += core.busy_ms
            earlier["busy_fraction"] = earlier["busy_ms"] / span_ms if span_ms > 0 else 0.0
            earlier["prefix_query_tokens"] += s.prefix_query_tokens
            earlier["prefix_hit_tokens"] += s.prefix_hit_tokens
            q = earlier["prefix_query_tokens"]
            earlier["prefix_hit_rate"] = earlier["prefix_hit_tokens"] / q if q else None
            earlier["cpu_hit_tokens"] += s.cpu_hit_tokens
            earlier["preemptions"] += s.total_preemptions
            earlier["gpu_block_evictions"] += core.kv_pool.num_evictions
            continue
        mine = replica_of == core.replica - replica_offset
        row = {
            "replica": core.replica - replica_offset,
            "requests": int(mine.sum()),
            "finished": int((mine & finished).sum()),
            "steps": core.step_idx - core.first_step,
            "busy_ms": core.busy_ms,
            "busy_fraction": core.busy_ms / span_ms if span_ms > 0 else 0.0,
            "prefix_query_tokens": s.prefix_query_tokens,
            "prefix_hit_tokens": s.prefix_hit_tokens,
            "prefix_hit_rate": s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else None,
            "cpu_hit_tokens": s.cpu_hit_tokens,
            "preemptions": s.total_preemptions,
            "gpu_block_evictions": core.kv_pool.num_evictions,
        }
        per_replica.append(row)
        by_id[core.replica] = row
    busy = np.array([r["busy_ms"] for r in per_replica], dtype=np.float64)
    return {
        "replicas": len(per_replica),
        "per_replica": per_replica,
        # Load imbalance: max / mean busy time (1.0 = perfectly even).
        "busy_imbalance": float(busy.max() / busy.mean()) if len(busy) and busy.mean() > 0 else None,
    }
