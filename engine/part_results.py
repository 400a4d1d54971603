"""What a part of a fleet replayed in parts (a cluster, a replica apart, a part in step) hands back:
plain numbers, so a result travels from a worker process or a Ray task, and what run.json reads of
them over the whole fleet (engine/cluster_run.py replays the parts, engine/parts_run.py merges)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay.engine.kv_tier_report import TierFigures


@dataclass
class SchedTotals:
    """A replica's scheduler counters (Scheduler's names: run.json reads them by these)."""

    prefix_query_tokens: int
    prefix_hit_tokens: int
    cpu_hit_tokens: int
    total_preemptions: int


@dataclass
class PoolTotals:
    num_evictions: int


@dataclass
class OffloadTotals:
    values: dict[str, int]

    def totals(self) -> dict[str, int]:
        return self.values


@dataclass
class ReplicaTotals:
    """One replica at the end of its cluster's replay, as run.json reads an EngineCore."""

    replica: int  # global id
    step_idx: int
    first_step: int
    busy_ms: float
    schedule_calls: int
    sched: SchedTotals
    kv_pool: PoolTotals
    offload: OffloadTotals | None


@dataclass
class ClusterResult:
    """What run.json needs of one cluster: its replicas, and its requests' rows and end state."""

    cluster: int
    replicas: list[ReplicaTotals]
    rows: np.ndarray  # trace rows this cluster replayed, in trace order (its requests file's order)
    status: np.ndarray  # per row of ``rows``: 0 finished, 1 rejected, 2 unfinished
    output_tokens: np.ndarray
    replica: np.ndarray  # global replica id per row of ``rows`` (-1: none)
    num_steps: int
    num_chunks: int
    span_ms: float
    files: dict[str, bytes] = field(default_factory=dict)  # the output files, when sent from a worker
    tiers: list[TierFigures] = field(default_factory=list)  # its KV tiers (its own cluster tiers)


@dataclass
class MergedRecorder:
    """What run.json reads of a recorder, over every cluster (per trace row, as Recorder keeps it)."""

    status: np.ndarray
    output_tokens: np.ndarray
    replica: np.ndarray
    num_steps: int
    num_chunks: int

    @classmethod
    def of(cls, num_rows: int, results: list[ClusterResult]) -> MergedRecorder:
        merged = cls(status=np.full(num_rows, 2, dtype=np.int8), output_tokens=np.zeros(num_rows, dtype=np.int32),
                     replica=np.full(num_rows, -1, dtype=np.int64),
                     num_steps=sum(r.num_steps for r in results), num_chunks=sum(r.num_chunks for r in results))
        for r in results:
            merged.status[r.rows] = r.status
            merged.output_tokens[r.rows] = r.output_tokens
            merged.replica[r.rows] = r.replica
        return merged
