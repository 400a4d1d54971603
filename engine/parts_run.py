"""Replay a fleet in parts: its clusters, or its replicas when they share nothing.

engine/clusters.py (which cluster each request goes to) or engine/fleet_partition.py (which replica)
splits the arrival plan; engine/cluster_run.py replays the parts, in this process or in forked
workers or on Ray; engine/cluster_merge.py merges what other processes wrote; this module ties them
into one output folder and one run.json over the whole fleet.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import time
from pathlib import Path

import numpy as np

from replay.base.atomic import atomic_dir, write_json_atomic
from replay.base.errors import ConfigError
from replay.engine.arrivals import ArrivalPlan, plan_arrivals
from replay.engine.cluster_merge import merge_outputs
from replay.engine.cluster_run import replay_clusters
from replay.engine.clusters import assign_clusters, split_plan
from replay.engine.config import EngineConfig
from replay.engine.fleet import ProgressFn
from replay.engine.kv_tier_report import TierFigures
from replay.engine.lockstep import MAX_LOCKSTEP_PARTS, CostExchange, lockstep_plans, part_bounds
from replay.engine.output_schema import RUN_FILE
from replay.engine.part_results import ClusterResult, MergedRecorder
from replay.engine.prepared_trace import PreparedTrace, RunSummary, config_input_files, store_trace
from replay.engine.run_info import ReplayFacts, build_run_info
from replay.engine.run_setup import EngineSetup
from replay.engine.scaling_output import cost_summary
from replay.engine.trace_ids import shared_lead_within

# Below this many requests, parallel processes gain less than forking them costs (a default of
# ``workers=None`` only; the outputs are the same either way).
_PROCESSES_FROM_REQUESTS = 4000


def parts_in_step(requests: int, replicas: int, workers: int | None) -> int:
    """Processes (parts) for a fleet replayed in step (engine/lockstep.py): ``workers`` when named
    (at most one per replica, and ``MAX_LOCKSTEP_PARTS``); when not, 2 once the replay is large
    enough to gain and this process may use two cores, however many more it has, so that the same
    command writes the same bytes on every such machine (the parts' step and chunk rows come part
    after part). Parts wait for each other at every arrival, the more often the more parts; only
    two have been measured (bench/README.md, "Replicas in step")."""
    if workers is None:
        workers = 2 if requests >= _PROCESSES_FROM_REQUESTS and _usable_cores() >= 2 else 1
    return max(1, min(workers, replicas, MAX_LOCKSTEP_PARTS))


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def auto_workers(requests: int, parts: int) -> int:
    """Processes for ``parts`` independent parts of a replay of ``requests`` requests when the user
    named none: the cores this process may use, if the replay is large enough to gain."""
    if requests < _PROCESSES_FROM_REQUESTS or parts < 2:
        return 1
    return max(1, min(_usable_cores(), parts))


def replay_in_parts(prepared: PreparedTrace, config: EngineConfig, outdir: str | Path, setup: EngineSetup,
                    wall_start: float, *, config_source: str | None,
                    config_path: str | Path | None, overwrite: bool, check_invariants: bool, fast_forward: bool,
                    progress: ProgressFn | None, ray_address: str | None, workers: int | None,
                    apart: tuple[ArrivalPlan, np.ndarray] | None = None,
                    in_step: ArrivalPlan | None = None, once: bool = False) -> RunSummary:
    """A fleet of clusters (engine/clusters.py), or a fleet whose replicas share nothing (``apart``:
    its arrival plan and every row's replica, engine/fleet_partition.py), each part replayed on its
    own (here, in local processes or on Ray), or a fleet behind a cost-picking router split into
    parts replayed in step, one per process (``in_step``: its arrival plan; ``workers`` parts,
    engine/lockstep.py); the outputs merged (engine/cluster_merge.py), one run.json over the
    whole fleet. ``once`` (replay_prepared's): the parts in step hand back the hash ids of rows
    already arrived and write the rows they took once ended, each in its own process."""
    fleet = config.fleet
    assert fleet is not None
    trace, requests, meta, trace_path = prepared.arrays, prepared.requests, prepared.meta, prepared.trace_path
    fingerprint, table = prepared.fingerprint, prepared.table
    if ray_address is not None and table is None:
        raise ConfigError("this trace was prepared for a fleet without clusters, which lets its table go: "
                          "prepare it (prepare_trace) with the clustered config it is replayed with")
    if in_step is not None:
        assert workers is not None, "a fleet in step has as many parts as processes"
        plan, num_parts = in_step, workers
        bounds = part_bounds(fleet.replicas, num_parts)
        exchange = CostExchange(bounds)  # shared with the processes forked below
        plans = [dataclasses.replace(cp, lockstep_seat=exchange.seat(cp.cluster), release_ids=once)
                 for cp in lockstep_plans(plan, requests.rejected, bounds)]
        noun = "part"  # every part at once, one per process: they wait for each other
    else:
        if apart is None:
            plan = plan_arrivals(trace, config.load, config.seed, requests.selected)
            cluster_of = assign_clusters(trace, plan, fleet.clusters, fleet.global_router, config.seed)
            num_parts, noun = fleet.clusters, "cluster"
        else:
            (plan, cluster_of), num_parts, noun = apart, fleet.replicas, "replica"
        plans = split_plan(plan, cluster_of, requests.rejected, num_parts, fleet.replicas // num_parts)
        if apart is not None:  # a replica's requests can hit only what its own requests computed
            lead = shared_lead_within(trace.hash_values, trace.hash_offsets, cluster_of)
            plans = [dataclasses.replace(cp, shared_lead=lead) for cp in plans]
    if workers is None:
        workers = auto_workers(len(requests.selected), num_parts)
    inputs = [trace_path, *config_input_files(config, config_path)]
    with atomic_dir(outdir, overwrite=overwrite, inputs=inputs) as tmp:
        work = tmp / ".clusters"
        work.mkdir()
        results = replay_clusters(trace, table, meta.hash_block_size, config, setup, plans, work,
                                  ray_address=ray_address, workers=workers, check_invariants=check_invariants,
                                  fast_forward=fast_forward, progress=progress, noun=noun)
        merge_outputs([work / f"cluster-{cp.cluster}" for cp in plans], [r.rows for r in results],
                      [cp.replica_offset for cp in plans], tmp)
        shutil.rmtree(work)
        trace_file = store_trace(prepared, outdir, tmp)
        replicas = [rep for r in results for rep in r.replicas]
        facts = ReplayFacts(config=config, config_source=config_source, setup=setup,
                            fingerprint=fingerprint, meta=meta, trace=trace, trace_file=trace_file,
                            selected=requests.selected, rejected=requests.rejected, cores=replicas,  # type: ignore[arg-type]
                            recorder=MergedRecorder.of(len(trace), results),  # type: ignore[arg-type]
                            simulated_span_ms=max(r.span_ms for r in results),
                            wall_time_s=round(time.perf_counter() - wall_start, 3),
                            session_delay_rule=plan.delay_rule, tiers=_cluster_tiers(results))
        info = build_run_info(facts)
        if in_step is not None:
            info["fleet"]["replicas_in_step"] = num_parts
        elif apart is None:
            info["fleet"]["clusters"] = fleet.clusters
            info["fleet"]["global_router"] = fleet.global_router
        else:
            info["fleet"]["replicas_apart"] = True
        info["fleet"]["ran_on"] = ("ray" if ray_address is not None
                                   else f"{min(workers, num_parts)} processes" if workers > 1 else "local")
        span_ms = facts.simulated_span_ms
        info["cost"] = cost_summary(config, fleet.replicas * span_ms, fleet.replicas * span_ms
                                    * config.tensor_parallel_size, span_ms)
        write_json_atomic(tmp / RUN_FILE, info)
    return RunSummary(outdir=Path(outdir), run_info=info)


def _cluster_tiers(results: list[ClusterResult]) -> list[TierFigures] | None:
    """The clusters' KV tier figures added up, tier by tier (None without tiers)."""
    if not results or not results[0].tiers:
        return None
    total = [copy.deepcopy(f) for f in results[0].tiers]
    for r in results[1:]:
        for mine, theirs in zip(total, r.tiers):
            mine.add(theirs)
    return total
