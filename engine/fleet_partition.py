"""Replicas that share nothing: when a fleet can be replayed one replica at a time.

Behind a router that decides from the request alone (round robin, random, session affinity), with
nothing else shared between replicas (no cluster or node KV tier, no admission control, no
autoscaler, no concurrency slots) and every closed-loop turn going to the replica of the turn that
releases it, each replica's run depends only on the requests it gets, and which requests it gets is
known before the replay. Such a fleet is replayed replica by replica, each replica as a fleet of one
(engine/cluster_run.py, the code that replays clusters), one after another or in parallel
processes, and the outputs merged in replica order (engine/cluster_merge.py). Every request's
result is the one the fleet's single event loop gives (tests/engine/test_fleet_partition.py);
steps and chunk runs come in replica order, whatever the number of processes.

``replica_targets`` says whether a config and an arrival plan allow it, and where each row goes.
"""

from __future__ import annotations

import numpy as np

from replay.engine.arrivals import ArrivalPlan
from replay.engine.config import EngineConfig
from replay.engine.routers import RouterContext, build_router
from replay.engine.trace_input import TraceArrays

# Routers whose choice depends on the request alone (Router.reads_replica_state is False).
_REQUEST_ONLY = ("round_robin", "random", "session_affinity")
# Beyond this many requests the fleet runs in one loop unless the user names the processes
# (``--workers`` above 1): its memory stays bounded by handing back the rows already served
# (engine/page_release.py). Replicas apart cannot (each part touches every page of its recorder's
# columns, its rows being spread over the whole trace, and the parts' requests files are merged at
# the end); parts in step hand back ids and written rows, but each keeps its own whole-trace columns
# (status, arrival, finish, replica) and request ids. At 1 M reuse-heavy requests on 8 replicas
# behind round robin, apart in one process: 92 s and a 1.27 GB peak; the single loop: 150 s and
# 644 MB. bench/README.md, "The whole 10 M day", has the parts in step at 10 M.
MAX_APART_REQUESTS = 1_000_000
# Beyond this many replicas too: each part's recorder spans the whole trace, so replaying apart
# costs replicas x trace rows, and the merge reads the parts' files side by side (open files).
MAX_APART_REPLICAS = 64


def why_replicas_share(config: EngineConfig) -> str | None:
    """Why this config's replicas cannot be replayed apart, or None when its config allows it
    (the arrival plan may still forbid it: ``replica_targets``)."""
    why = why_not_one_pool(config)
    if why is not None:
        return why
    assert config.fleet is not None
    if config.fleet.router not in _REQUEST_ONLY:
        return f"fleet.router {config.fleet.router} reads the replicas' state at every arrival"
    return why_replicas_meet(config)


def why_not_one_pool(config: EngineConfig) -> str | None:
    """Why this config is not one pool of several replicas behind one router (None: it is)."""
    fleet = config.fleet
    if fleet is None or fleet.replicas < 2:
        return "a single replica"
    if fleet.mode != "aggregated":
        return "a disaggregated fleet's pools exchange KV"
    if fleet.clusters > 1:
        return "a fleet of clusters is replayed cluster by cluster"
    return None


def why_replicas_meet(config: EngineConfig) -> str | None:
    """What besides the router ties the replicas of one pool together (None: nothing), for
    replicas replayed apart or in step (engine/lockstep.py)."""
    fleet = config.fleet
    assert fleet is not None
    if fleet.autoscale is not None:
        return "fleet.autoscale decides from the whole fleet's load"
    if fleet.admission is not None:
        return "fleet.admission decides from the whole fleet's load"
    if config.load.mode == "concurrency":
        return "load.mode concurrency shares its slots over the whole fleet"
    if config.kv_cache.tiers:
        return "kv_cache.tiers can share a node's link or a cluster's pool between replicas"
    return None


def why_too_many_for_parts(plan: ArrivalPlan, workers: int | None = None) -> str | None:
    """Why a fleet with this many requests stays in one loop rather than in parts (replicas apart,
    or in step: engine/lockstep.py), whose columns each span the trace. ``workers`` above 1 (the
    processes the user named) runs the parts whatever their number: more memory, less time."""
    if workers is not None and workers > 1:
        return None
    requests = len(plan.released_rows())
    if requests > MAX_APART_REQUESTS:
        return (f"{requests:,} requests: beyond {MAX_APART_REQUESTS:,} the fleet runs in one loop, which hands "
                "back the memory of the requests served")
    return None


def why_not_apart(config: EngineConfig, plan: ArrivalPlan, workers: int | None = None) -> str | None:
    """Why this config and arrival plan keep the fleet in one loop (None: they do not, though a
    closed-loop turn routed to another replica than its parent's still may: ``replica_targets``);
    ``workers``: the processes the user named (``why_too_many_for_parts``)."""
    why = why_replicas_share(config)
    if why is not None:
        return why
    assert config.fleet is not None
    if config.fleet.replicas > MAX_APART_REPLICAS:
        return f"beyond {MAX_APART_REPLICAS} replicas the fleet runs in one loop (each replica apart would span the trace)"
    if plan.concurrency:
        return "load.mode concurrency shares its slots over the whole fleet"
    why = why_too_many_for_parts(plan, workers)
    if why is not None:
        return why
    if config.fleet.router == "round_robin" and plan.dependents:
        return "behind round_robin a closed-loop turn takes the next turn when it is released"
    return None


def replica_targets(config: EngineConfig, trace: TraceArrays, plan: ArrivalPlan,
                    rejected: dict[int, str], num_gpu_blocks: int, workers: int | None = None) -> np.ndarray | None:
    """The replica every row of ``plan`` goes to (-1 for rows it does not release), or None when
    the fleet's replicas cannot be replayed apart. A row refused at arrival goes to no replica; it
    is recorded by the replica the router names (round robin: replica 0, as it takes no turn)."""
    if why_not_apart(config, plan, workers) is not None:
        return None
    fleet = config.fleet
    assert fleet is not None
    n = fleet.replicas
    target = np.full(len(trace), -1, dtype=np.int64)
    order = np.asarray(plan.open_order, dtype=np.int64)
    if fleet.router == "round_robin":
        target[order] = 0
        routed = order[_not_in(order, rejected)] if rejected else order
        target[routed] = np.arange(len(routed), dtype=np.int64) % n
        return target
    ctx = RouterContext(num_replicas=n, block_size=config.kv_cache.block_size, num_gpu_blocks=num_gpu_blocks,
                        seed=config.seed, trace=trace)
    router = build_router(fleet.router, fleet.router_options, ctx)
    rows = plan.released_rows()
    static = router.static_targets(rows)
    if static is None:
        return None
    target[rows] = static
    # A closed-loop turn is released when its parent finishes: on another replica, that would tie
    # the two replicas' runs together.
    for parent, deps in plan.dependents.items():
        for child, _ in deps:
            if target[child] != target[parent]:
                return None
    return target


def _not_in(rows: np.ndarray, rejected: dict[int, str]) -> np.ndarray:
    """Mask of the rows that are not in ``rejected``."""
    return np.fromiter((i not in rejected for i in rows.tolist()), dtype=bool, count=len(rows))
