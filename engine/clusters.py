"""A fleet split into clusters behind a global balancer (``fleet.clusters``, ``fleet.global_router``).

Large deployments are several clusters of replicas, each behind its own router, with a global
balancer in front that picks a cluster per request. The global balancer here decides from the
request alone (never from cluster state), so the clusters share nothing during a replay: each one
is replayed on its own (in this process, or on a Ray worker: ``replay run --ray``) and the outputs
are merged (engine/cluster_merge.py).

Global routers (each a pure function of the trace and the seed):
- ``round_robin``: the i-th open-loop arrival (in arrival order) goes to cluster i mod K;
- ``random``: a uniform draw per open-loop arrival from a generator seeded with the config's seed;
- ``session_hash``: CRC-32 of the session id (of the request id when a row has none) mod K, so a
  session stays in one cluster;
- ``prefix_hash``: a mix of the request's first trace hash id (its first hash block: a shared
  system prompt) mod K, so requests that share a prompt head share a cluster; rows without hash ids
  fall back to ``session_hash``.

A closed-loop turn (a session turn released by its previous turn's finish) goes to the cluster of
the request that releases it, whatever the global router: a global balancer pins a session's
connection, and it keeps the clusters independent. Concurrency mode (one pool of slots for the
whole fleet) is refused with clusters (engine/config.py).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from replay.engine.arrivals import ArrivalPlan
from replay.engine.trace_input import TraceArrays

# A 64-bit odd multiplier (the golden ratio's, as in Fibonacci hashing): trace ids are often
# consecutive integers, which a plain modulo would spread in lockstep with round robin.
_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class ClusterPlan:
    """One cluster's share of a replay: its arrivals (a sub-plan of the whole fleet's, same times)
    and its rows rejected up front."""

    cluster: int
    replica_offset: int  # global id of the cluster's replica 0
    replicas: int  # how many replicas the cluster has
    plan: ArrivalPlan
    rejected: dict[int, str]
    # Per trace row, its leading ids that another row of the same part has too (a fleet replayed
    # replica by replica: engine/trace_ids.shared_lead_within over the parts); None: the loop's own.
    shared_lead: np.ndarray | None = None
    # A fleet replayed in step by several processes (engine/lockstep.py): the part's seat in the
    # cost exchange, which wraps the part's router; None for a cluster or a replica replayed apart.
    lockstep_seat: object | None = None
    # A part in step of a replay that owns its trace: it hands back the hash ids of rows already
    # arrived and writes the rows it took once they have ended, as the single loop does (every part
    # meets every arrival, in its own process).
    release_ids: bool = False


def _session_hash(trace: TraceArrays, rows: np.ndarray, k: int) -> np.ndarray:
    sid = trace.session_id
    rid = trace.request_id
    out = np.empty(len(rows), dtype=np.int64)
    for j, idx in enumerate(rows.tolist()):
        key = sid[idx] if sid[idx] is not None else rid[idx]
        out[j] = zlib.crc32(key.encode("utf-8")) % k
    return out


def _prefix_hash(trace: TraceArrays, rows: np.ndarray, k: int) -> np.ndarray:
    off = trace.hash_offsets
    has_ids = off[rows + 1] > off[rows]
    out = _session_hash(trace, rows, k)
    with_ids = rows[has_ids]
    if len(with_ids):
        values = trace.hash_values
        first = np.array([values[int(off[i])] for i in with_ids.tolist()], dtype=np.uint64)
        with np.errstate(over="ignore"):
            mixed = (first * _MIX) >> np.uint64(32)
        out[has_ids] = (mixed % np.uint64(k)).astype(np.int64)
    return out


def assign_clusters(trace: TraceArrays, plan: ArrivalPlan, clusters: int, global_router: str,
                    seed: int) -> np.ndarray:
    """The cluster of every trace row the plan releases (-1 for rows it does not)."""
    cluster = np.full(len(trace), -1, dtype=np.int64)
    roots = np.asarray(plan.open_order, dtype=np.int64)
    if global_router == "round_robin":
        cluster[roots] = np.arange(len(roots), dtype=np.int64) % clusters
    elif global_router == "random":
        cluster[roots] = np.random.default_rng(seed).integers(0, clusters, len(roots))
    elif global_router == "session_hash":
        cluster[roots] = _session_hash(trace, roots, clusters)
    elif global_router == "prefix_hash":
        cluster[roots] = _prefix_hash(trace, roots, clusters)
    else:  # the config's Literal rejects any other name first
        raise ValueError(f"unknown global router {global_router!r}")
    # Closed-loop turns follow the request that releases them; a parent is always an earlier row,
    # so one pass in row order reaches every chain.
    for parent in sorted(plan.dependents):
        for child, _ in plan.dependents[parent]:
            cluster[child] = cluster[parent]
    return cluster


def split_plan(plan: ArrivalPlan, cluster_of: np.ndarray, rejected: dict[int, str], clusters: int,
               replicas_per_cluster: int) -> list[ClusterPlan]:
    """Each cluster's arrivals: the fleet's, filtered (the same times, in the same order)."""
    order = np.asarray(plan.open_order, dtype=np.int64)
    times = np.asarray(plan.open_times, dtype=np.float64)
    of_open = cluster_of[order]
    deps: list[dict[int, list[tuple[int, float]]]] = [{} for _ in range(clusters)]
    for parent, children in plan.dependents.items():  # one pass, not one per cluster
        c = int(cluster_of[parent])
        assert c >= 0, "a closed-loop turn's parent is a released row"
        deps[c][parent] = children
    refused: list[dict[int, str]] = [{} for _ in range(clusters)]
    for row, why in rejected.items():
        c = int(cluster_of[row])
        if c >= 0:
            refused[c][row] = why
    out = []
    for c in range(clusters):
        mine = of_open == c
        sub = ArrivalPlan(open_order=order[mine], open_times=times[mine], dependents=deps[c],
                          delay_rule=plan.delay_rule)
        out.append(ClusterPlan(cluster=c, replica_offset=c * replicas_per_cluster, replicas=replicas_per_cluster,
                               plan=sub, rejected=refused[c]))
    return out
