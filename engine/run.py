"""Replay one canonical trace with one config into an output directory (atomically)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from replay.base.atomic import atomic_dir, write_json_atomic
from replay.base.errors import ConfigError
from replay.engine.admission import Admission
from replay.engine.arrivals import ArrivalPlan, plan_arrivals
from replay.engine.autoscale import Autoscaler, build_policy
from replay.engine.config import EngineConfig
from replay.engine.core import EngineCore
from replay.engine.fleet import FleetLoop, ProgressFn
from replay.engine.fleet_partition import replica_targets, why_not_apart, why_replicas_share
from replay.engine.fleet_scaling import FleetScaler
from replay.engine.kv_tier_report import tier_names
from replay.engine.kv_tiers import TierPools
from replay.engine.lockstep import router_picks_by_cost, why_not_lockstep
from replay.engine.output_schema import RUN_FILE
from replay.engine.parts_run import parts_in_step, replay_in_parts
from replay.engine.pd_fleet import PDFleetLoop
from replay.engine.pd_outputs import PDRequestColumns
from replay.engine.pd_run import (
    build_pd_parts,
    is_disaggregated,
    pool_bills,
    pools_summary,
    run_pd_fleet,
)
from replay.engine.pd_scaling import pool_scalers
from replay.engine.prepared_trace import (  # the preparation step, also reached through this module
    PreparedTrace,
    RunSummary,
    config_input_files,
    prepare_trace,
    prepare_trace_file,
    store_trace,
)
from replay.engine.recorder import Recorder
from replay.engine.replay_gc import without_collector
from replay.engine.request_selection import ReplayedRequests
from replay.engine.routers import Router, RouterContext, build_router
from replay.engine.run_info import ReplayFacts, build_run_info
from replay.engine.run_setup import EngineSetup, resolve_setup
from replay.engine.scaling_output import cost_summary, pd_cost_summary, scaling_summary, write_scaling
from replay.engine.scheduler import Scheduler
from replay.engine.scheduler_factory import build_scheduler, tier_pools_for
from replay.engine.slo_capacity import ReplicaCapacity
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates
from replay.engine.trace_input import TraceArrays
from replay.ingest.schema import TraceMetadata

__all__ = ["FleetParts", "PreparedTrace", "RunSummary", "build_fleet_parts", "config_input_files",
           "prepare_trace", "prepare_trace_file", "replay_prepared", "replay_trace", "run_fleet", "store_trace"]


@dataclass(frozen=True)
class FleetParts:
    """The replicas' schedulers, the arrival plan and the router: everything a replay's fleet
    needs before its output directory (and so its recorder) exists."""

    schedulers: list[Scheduler]
    plan: ArrivalPlan
    router: Router | None  # None for a single replica
    sampler: AcceptanceSampler | None = None  # MTP draws, shared by every replica (new ones too)
    tier_pools: TierPools | None = None  # kv_cache.tiers: the fleet's tiers (cluster ones shared)


def build_fleet_parts(trace: TraceArrays, config: EngineConfig, setup: EngineSetup,
                      selected: np.ndarray, plan: ArrivalPlan | None = None) -> FleetParts:
    """One scheduler per replica (sharing the MTP acceptance sampler), the arrivals (``plan`` when
    already made), the router."""
    sampler = None
    if config.speculative is not None:
        sampler = AcceptanceSampler(resolve_rates(config.speculative), config.speculative.seed)
    fleet = config.fleet
    num_replicas = initial_replicas(config)
    tier_pools = tier_pools_for(config, setup.kv_bytes_per_token)  # cluster tiers: one pool for all
    schedulers = [build_scheduler(config, setup.num_gpu_blocks, setup.max_model_len, sampler=sampler,
                                  kv_bytes_per_token=setup.kv_bytes_per_token, tier_pools=tier_pools, replica=i)
                  for i in range(num_replicas)]
    if plan is None:
        plan = plan_arrivals(trace, config.load, config.seed, selected)
    router = None
    autoscale = fleet.autoscale if fleet is not None else None
    if fleet is not None and (num_replicas > 1 or autoscale is not None):
        # An autoscaled router keeps state for every id the fleet may use (ReplicaView.replica).
        ids = autoscale.id_capacity if autoscale is not None else num_replicas
        ctx = RouterContext(num_replicas=ids, block_size=config.kv_cache.block_size,
                            num_gpu_blocks=setup.num_gpu_blocks, seed=config.seed, trace=trace)
        router = build_router(fleet.router, fleet.router_options, ctx)
    return FleetParts(schedulers=schedulers, plan=plan, router=router, sampler=sampler,
                      tier_pools=tier_pools)


def initial_replicas(config: EngineConfig) -> int:
    """Replicas at t = 0: ``fleet.replicas``; autoscaled, ``min_replicas`` unless replicas was given."""
    fleet = config.fleet
    if fleet is None:
        return 1
    if fleet.autoscale is not None and "replicas" not in fleet.model_fields_set:
        return fleet.autoscale.min_replicas
    return fleet.replicas


def build_scaling(config: EngineConfig, setup: EngineSetup, trace: TraceArrays, parts: FleetParts,
                  requests: ReplayedRequests, recorder: Recorder, cores: list[EngineCore], *,
                  fast_forward: bool, check_invariants: bool) -> tuple[FleetScaler | None, Admission | None]:
    """The autoscaling controller and the admission gate a config asks for (None: a fixed fleet)."""
    fleet = config.fleet
    if fleet is None:
        return None, None
    budget = config.scheduler.max_num_batched_tokens
    admission = Admission(fleet.admission, setup.timer, budget) if fleet.admission is not None else None
    cfg = fleet.autoscale
    if cfg is None:
        return None, admission
    capacity = None
    if cfg.policy == "slo":
        capacity = ReplicaCapacity(setup.timer, max_num_batched_tokens=budget,
                                   max_num_seqs=config.scheduler.max_num_seqs,
                                   kv_tokens=(setup.num_gpu_blocks - 1) * config.kv_cache.block_size,
                                   ttft_ms=cfg.ttft_ms, tpot_ms=cfg.tpot_ms)

    def new_core(replica: int) -> EngineCore:
        # A joining replica starts cold: its GPU cache and replica tiers are empty, while the
        # fleet's cluster tiers (one store for every replica) are there to read.
        sched = build_scheduler(config, setup.num_gpu_blocks, setup.max_model_len, sampler=parts.sampler,
                                kv_bytes_per_token=setup.kv_bytes_per_token, tier_pools=parts.tier_pools,
                                replica=replica)
        return EngineCore(replica, sched, setup.timer, recorder, fast_forward=fast_forward,
                          check_invariants=check_invariants)

    scaler = FleetScaler(cfg, Autoscaler(cfg, build_policy(cfg, capacity)), new_core, trace,
                         len(requests.selected), cores)
    return scaler, admission


def run_fleet(trace: TraceArrays, config: EngineConfig, setup: EngineSetup, parts: FleetParts,
              requests: ReplayedRequests, recorder: Recorder, *, progress: ProgressFn | None,
              fast_forward: bool, check_invariants: bool, release_consumed_ids: bool = False) -> FleetLoop:
    """Simulate the whole replay into ``recorder`` (closed on success, aborted on any error);
    returns the finished loop, whose replicas hold the end state run.json reports.
    ``release_consumed_ids``: the trace is this replay's alone, so the hash ids of rows already
    arrived may be handed back as it goes (TraceArrays.release_ids_before)."""
    cores = [EngineCore(i, sched, setup.timer, recorder, fast_forward=fast_forward,
                        check_invariants=check_invariants) for i, sched in enumerate(parts.schedulers)]
    fleet = config.fleet
    scaler, admission = build_scaling(config, setup, trace, parts, requests, recorder, cores,
                                      fast_forward=fast_forward, check_invariants=check_invariants)
    loop = FleetLoop(trace, parts.plan, cores, parts.router, recorder, block_size=config.kv_cache.block_size,
                     hash_lookahead=parts.schedulers[0].kv.hash_lookahead, rejected=requests.rejected,
                     router_latency_ms=fleet.router_latency_ms if fleet else 0.0, progress=progress,
                     control=scaler, admission=admission)
    loop.release_consumed_ids = release_consumed_ids
    if parts.tier_pools is not None:
        parts.tier_pools.set_clock(lambda: loop.now)
    loop.run_recorded()
    return loop


def served_cores(loop: FleetLoop, scaler: FleetScaler | None) -> list[EngineCore]:
    """Every engine that served, one per life of an autoscaled fleet or pool (empty fleet slots of
    a pool that never filled them left out)."""
    if scaler is not None:
        return scaler.cores()
    scalers = pool_scalers(loop) if isinstance(loop, PDFleetLoop) else {}
    if not scalers:
        return loop.cores
    return [core for name, fixed in (("prefill", loop.prefill_cores), ("decode", loop.decode_cores))
            for core in (scalers[name].cores() if name in scalers else fixed)]


def replay_end_ms(recorder: Recorder, selected: np.ndarray) -> float:
    """When an autoscaled replay's last request finished or was refused (its controller's last
    decision may come later: the replay's span, and the GPUs' bill, end here)."""
    ends = recorder.finish[selected]
    arrivals = recorder.arrival[selected]
    values = np.concatenate([ends[~np.isnan(ends)], arrivals[~np.isnan(arrivals)]])
    return float(values.max()) if len(values) else 0.0


@without_collector
def replay_trace(table: pa.Table, meta: TraceMetadata, config: EngineConfig, outdir: str | Path, *,
                 trace_path: str | Path | None = None, config_source: str | None = None,
                 config_path: str | Path | None = None, on_error: str = "fail", overwrite: bool = True,
                 progress: ProgressFn | None = None, check_invariants: bool = False,
                 setup: EngineSetup | None = None, fast_forward: bool = True, ray_address: str | None = None,
                 workers: int | None = 1, replicas_apart: bool = True) -> RunSummary:
    """Replay ``table`` under ``config`` into ``outdir``; nothing is written unless the run completes.
    ``prepare_trace`` then ``replay_prepared`` (see both), for a caller that keeps the table anyway; the
    CLI calls the two itself, letting the table go between them."""
    setup = setup or resolve_setup(config)
    prepared = prepare_trace(table, meta, config, setup, trace_path=trace_path, on_error=on_error)
    return replay_prepared(prepared, config, outdir, config_source=config_source, config_path=config_path,
                           overwrite=overwrite, progress=progress, check_invariants=check_invariants,
                           setup=setup, fast_forward=fast_forward, ray_address=ray_address, workers=workers,
                           once=True, replicas_apart=replicas_apart)


@without_collector
def replay_prepared(prepared: PreparedTrace, config: EngineConfig, outdir: str | Path, *,
                    config_source: str | None = None, config_path: str | Path | None = None,
                    overwrite: bool = True, progress: ProgressFn | None = None,
                    check_invariants: bool = False, setup: EngineSetup | None = None,
                    fast_forward: bool = True, ray_address: str | None = None, workers: int | None = 1,
                    once: bool = False, replicas_apart: bool = True) -> RunSummary:
    """Replay a prepared trace under ``config`` (the config it was prepared with) into ``outdir``.

    ``fast_forward=False`` steps through decode-only runs one step at a time (same bytes, slower:
    kept for the equivalence test). ``config_path``: the YAML file the config came from, an input
    like the trace (see ``config_input_files``). ``ray_address`` (``auto`` or a Ray address): a fleet
    of clusters replays each cluster as a Ray task; ``workers`` > 1: the clusters, or the replicas of
    a fleet that share nothing (engine/fleet_partition.py), in up to that many local processes (the
    same outputs as without either), or a kv_aware or least_loaded fleet's replicas in step in that
    many processes (engine/lockstep.py: the same requests, step and chunk rows ordered by process);
    None: as many as the machine's cores when the replay is large enough to gain (two in step),
    never an error. ``replicas_apart=False`` replays either fleet in one event loop instead (the
    same rows; kept for the equivalence tests). ``once``: ``prepared`` is replayed this once
    only, so the hash ids of rows already arrived are handed back as the replay goes (the same
    outputs, less memory: 0.9 GB by the end at 10 M reuse-heavy rows, engine/page_release.py); it
    cannot be replayed again.
    """
    wall_start = time.perf_counter() - prepared.prepare_s
    setup = setup or resolve_setup(config)
    trace, requests, meta, trace_path = prepared.arrays, prepared.requests, prepared.meta, prepared.trace_path
    fingerprint = prepared.fingerprint
    if ray_address is not None and workers is not None and workers > 1:
        raise ConfigError("--ray and --workers are two ways to spread the clusters: give one")
    common = dict(config_source=config_source, config_path=config_path, overwrite=overwrite,
                  check_invariants=check_invariants, fast_forward=fast_forward, progress=progress)
    if config.fleet is not None and config.fleet.clusters > 1:
        return replay_in_parts(prepared, config, outdir, setup, wall_start, ray_address=ray_address,
                                 workers=workers, **common)
    if ray_address is not None:
        raise ConfigError("--ray replays the clusters of a fleet on Ray workers: set fleet.clusters above 1")
    disaggregated = is_disaggregated(config)
    plan = None
    if not disaggregated and replicas_apart:
        plan = plan_arrivals(trace, config.load, config.seed, requests.selected)
        targets = replica_targets(config, trace, plan, requests.rejected, setup.num_gpu_blocks, workers)
        if targets is not None:
            return replay_in_parts(prepared, config, outdir, setup, wall_start, ray_address=None, workers=workers,
                                     apart=(plan, targets), **common)
        if why_not_lockstep(config, plan, workers) is None:
            parts = parts_in_step(len(requests.selected), config.fleet.replicas, workers)  # type: ignore[union-attr]
            if parts > 1:
                return replay_in_parts(prepared, config, outdir, setup, wall_start, ray_address=None,
                                         workers=parts, in_step=plan, once=once, **common)
    if workers is not None and workers > 1:
        if plan is None:
            why = "replicas_apart is off" if not disaggregated else "a disaggregated fleet's pools exchange KV"
        elif router_picks_by_cost(config):
            why = why_not_lockstep(config, plan, workers) or "a fleet in step cannot be replayed in parts here"
        else:
            why = (why_replicas_share(config) or why_not_apart(config, plan, workers)
                   or "a closed-loop turn can go to another replica than the turn it follows")
        raise ConfigError("--workers replays the clusters of a fleet (fleet.clusters above 1), the replicas of a "
                          "fleet that share nothing, or a kv_aware or least_loaded fleet's replicas in step, in parallel processes; "
                          f"here they cannot be: {why}")
    inputs = [trace_path, *config_input_files(config, config_path)]
    if disaggregated:
        pd_parts = build_pd_parts(trace, config, setup, requests.selected)
        delay_rule = pd_parts.plan.delay_rule
        inputs += [f for pool in (pd_parts.prefill, pd_parts.decode) for f in config_input_files(pool.config)]
    else:
        parts = build_fleet_parts(trace, config, setup, requests.selected, plan=plan)
        delay_rule = parts.plan.delay_rule
    pools = None
    with atomic_dir(outdir, overwrite=overwrite, inputs=inputs) as tmp:
        if disaggregated:
            columns = PDRequestColumns(len(trace), tiers=bool(config.kv_cache.tiers))
            recorder = Recorder(trace, tmp, replica_column=True, pd_columns=columns,
                                num_prefill=len(pd_parts.prefill.schedulers), tier_names=tier_names(config),
                                request_rows=requests.selected)
            pd_loop = run_pd_fleet(trace, config, pd_parts, requests.rejected, recorder, columns, progress=progress,
                                   fast_forward=fast_forward, check_invariants=check_invariants,
                                   total_requests=len(requests.selected))
            pool_scaled = pool_scalers(pd_loop)
            pd_span = replay_end_ms(recorder, requests.selected) if pool_scaled else pd_loop.now
            pools = pools_summary(pd_loop, pd_parts, pd_span)
            loop: FleetLoop = pd_loop
        else:
            scaled = config.fleet is not None and config.fleet.autoscale is not None
            recorder = Recorder(trace, tmp, replica_column=len(parts.schedulers) > 1 or scaled,
                                tier_names=tier_names(config), request_rows=requests.selected)
            loop = run_fleet(trace, config, setup, parts, requests, recorder, progress=progress,
                             fast_forward=fast_forward, check_invariants=check_invariants,
                             release_consumed_ids=once)
        scaler = loop.control if isinstance(loop.control, FleetScaler) else None
        span_ms = loop.now if scaler is None else replay_end_ms(recorder, requests.selected)
        if disaggregated:
            span_ms = pd_span
        if scaler is not None:
            write_scaling(scaler.rows, tmp)
        elif disaggregated and pool_scaled:
            write_scaling(sorted((r for sc in pool_scaled.values() for r in sc.rows),
                                 key=lambda r: (r.time_ms, r.pool != "prefill")), tmp)
        trace_file = store_trace(prepared, outdir, tmp)
        wall_time_s = round(time.perf_counter() - wall_start, 3)
        facts = ReplayFacts(config=config, config_source=config_source, setup=setup, fingerprint=fingerprint,
                            meta=meta, trace=trace, trace_file=trace_file, selected=requests.selected,
                            rejected=requests.rejected, cores=served_cores(loop, scaler),
                            recorder=recorder, simulated_span_ms=span_ms, wall_time_s=wall_time_s,
                            session_delay_rule=delay_rule, pools=pools)
        info = build_run_info(facts)
        if disaggregated:  # each pool's replicas hold their own pool's GPUs (the whole replay, unless autoscaled)
            info["cost"] = pd_cost_summary(pool_bills(config, pd_parts, pool_scaled, span_ms), span_ms)
        else:
            replica_ms = scaler.replica_ms(span_ms) if scaler is not None else len(loop.cores) * span_ms
            gpu_ms = replica_ms * config.tensor_parallel_size
            info["cost"] = cost_summary(config, replica_ms, gpu_ms, span_ms)
        if scaler is not None or loop.admission is not None:
            info["scaling"] = scaling_summary(scaler, loop.admission if isinstance(loop.admission, Admission)
                                              else None, span_ms)
        elif disaggregated and pool_scaled:
            info["scaling"] = {"pools": {name: scaling_summary(sc, None, span_ms) for name, sc in pool_scaled.items()}}
        write_json_atomic(tmp / RUN_FILE, info)
    for core in facts.cores:
        core.release()
    return RunSummary(outdir=Path(outdir), run_info=info)
