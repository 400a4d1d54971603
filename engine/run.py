"""Replay one canonical trace with one config into an output directory (atomically)."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.atomic import atomic_dir, write_json_atomic
from replay.base.errors import ConfigError
from replay.base.parquet_io import CHECKSUMS
from replay.engine.admission import Admission
from replay.engine.arrivals import ArrivalPlan, plan_arrivals
from replay.engine.autoscale import Autoscaler, build_policy
from replay.engine.cluster_merge import merge_outputs
from replay.engine.cluster_run import ClusterResult, MergedRecorder, replay_clusters
from replay.engine.clusters import assign_clusters, split_plan
from replay.engine.config import EngineConfig
from replay.engine.core import EngineCore
from replay.engine.fleet import FleetLoop, ProgressFn
from replay.engine.fleet_partition import replica_targets, why_not_apart, why_replicas_share
from replay.engine.fleet_scaling import FleetScaler
from replay.engine.kv_tier_report import TierFigures, tier_names
from replay.engine.kv_tiers import TierPools
from replay.engine.output_schema import RUN_FILE
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
from replay.engine.recorder import Recorder
from replay.engine.replay_gc import without_collector
from replay.engine.request_selection import ReplayedRequests, select_requests
from replay.engine.routers import Router, RouterContext, build_router
from replay.engine.run_info import ReplayFacts, build_run_info
from replay.engine.run_setup import EngineSetup, resolve_setup
from replay.engine.scaling_output import cost_summary, pd_cost_summary, scaling_summary, write_scaling
from replay.engine.scheduler import Scheduler
from replay.engine.scheduler_factory import build_scheduler, tier_pools_for
from replay.engine.slo_capacity import ReplicaCapacity
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates
from replay.engine.trace_ids import shared_lead_within
from replay.engine.trace_input import TraceArrays, TraceArraysBuilder, trace_arrays
from replay.ingest.fingerprint import TraceFingerprint, trace_fingerprint
from replay.ingest.schema import TraceMetadata, TraceReader, read_trace


@dataclass
class RunSummary:
    """What replay_trace gives back: where the outputs are, and run.json's content."""

    outdir: Path
    run_info: dict


def config_input_files(config: EngineConfig, config_path: str | Path | None = None) -> list[Path]:
    """Every file a run with ``config`` reads besides the trace: the config file itself, a calibrated
    timing profile, a hardware profile YAML, a model's local ``config.json``. They are the run's inputs, so an output folder
    that is or holds one of them is refused instead of replaced (replacing it would delete them)."""
    files = [Path(config_path)] if config_path is not None else []
    if config.timing.profile is not None:
        files.append(Path(config.timing.profile).expanduser())
    hardware = Path(config.hardware).expanduser()
    if hardware.is_file():  # a profile YAML (docs/timing.md, "Hardware profiles")
        files.append(hardware)
    model = Path(config.model).expanduser()
    if model.is_dir():
        files.append(model / "config.json")
    elif model.is_file():
        files.append(model)
    return files


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


def store_trace(prepared: PreparedTrace, outdir: str | Path, tmp: Path) -> Path:
    """Where run.json points for the replayed trace: a canonical Parquet input stays where it is;
    any other input is written (canonical, with its metadata) into the output directory."""
    if prepared.in_place:
        assert prepared.trace_path is not None
        return Path(prepared.trace_path).resolve()
    table, meta = prepared.table, prepared.meta
    assert table is not None
    metadata = {**(table.schema.metadata or {}), **meta.to_parquet_metadata()}
    pq.write_table(table.replace_schema_metadata(metadata), tmp / "trace.parquet", compression="zstd", **CHECKSUMS)
    return Path(outdir).resolve() / "trace.parquet"


@dataclass
class PreparedTrace:
    """A trace made ready for the engine, so that a caller can let its Arrow table go before the
    replay (at 10 M requests the table is 1.7 GB beside the engine's 1.5 GB of columns): the
    fingerprint run.json records, the engine's columns, the rows to replay. ``table`` is kept only
    where the replay still reads it: an input that is not a canonical Parquet file (stored with the
    outputs) and a fleet of clusters (handed to its workers)."""

    meta: TraceMetadata
    fingerprint: str
    arrays: TraceArrays
    requests: ReplayedRequests
    table: pa.Table | None
    trace_path: str | Path | None
    in_place: bool  # the input is a canonical Parquet file, which run.json names (else stored with the outputs)
    prepare_s: float  # the replay's wall time counts its preparation


@without_collector
def prepare_trace(table: pa.Table, meta: TraceMetadata, config: EngineConfig, setup: EngineSetup, *,
                  trace_path: str | Path | None = None, on_error: str = "fail") -> PreparedTrace:
    """Fingerprint ``table``, build the engine's columns and choose the rows to replay (an
    unreplayable row is an error unless ``on_error`` is ``skip``)."""
    start = time.perf_counter()
    fingerprint = trace_fingerprint(table)
    arrays = trace_arrays(table, meta.hash_block_size)
    requests = select_requests(arrays, config, setup, on_error=on_error, trace_path=trace_path)
    in_place = trace_path is not None and Path(trace_path).suffix == ".parquet" and meta is not None
    clustered = config.fleet is not None and config.fleet.clusters > 1
    return PreparedTrace(meta=meta, fingerprint=fingerprint, arrays=arrays, requests=requests,
                         table=table if clustered or not in_place else None, trace_path=trace_path,
                         in_place=in_place, prepare_s=time.perf_counter() - start)


@without_collector
def prepare_trace_file(path: str | Path, config: EngineConfig, setup: EngineSetup, *,
                       on_error: str = "fail") -> PreparedTrace:
    """``prepare_trace`` of a canonical Parquet trace, read a piece at a time into the
    fingerprint and the engine's columns, so the trace's Arrow table is never held whole (at 10 M
    reuse-heavy rows: 1.7 GB, beside the columns' 1.4 GB). A fleet of clusters hands the table to
    its workers, so it reads the table."""
    if config.fleet is not None and config.fleet.clusters > 1:
        table, meta = read_trace(path, replayable=True)
        return prepare_trace(table, meta, config, setup, trace_path=path, on_error=on_error)
    start = time.perf_counter()
    reader = TraceReader(path, replayable=True)
    fingerprint = TraceFingerprint(reader.schema)
    builder = TraceArraysBuilder(reader.num_rows, reader.meta.hash_block_size, reader.hash_id_bound())
    for piece in reader.pieces():
        fingerprint.add(piece)
        builder.add(piece)
        del piece
    arrays = builder.finish()
    del builder
    requests = select_requests(arrays, config, setup, on_error=on_error, trace_path=path)
    return PreparedTrace(meta=reader.meta, fingerprint=fingerprint.hexdigest(), arrays=arrays, requests=requests,
                         table=None, trace_path=path, in_place=True, prepare_s=time.perf_counter() - start)


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
    same outputs as without either); None: as many as the machine's cores when the replay is large
    enough to gain, never an error. ``replicas_apart=False`` replays such a fleet in one event loop
    instead (the same rows; kept for the equivalence test). ``once``: ``prepared`` is replayed this once
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
        return _replay_clustered(prepared, config, outdir, setup, wall_start, ray_address=ray_address,
                                 workers=workers, **common)
    if ray_address is not None:
        raise ConfigError("--ray replays the clusters of a fleet on Ray workers: set fleet.clusters above 1")
    disaggregated = is_disaggregated(config)
    plan = None
    if not disaggregated and replicas_apart:
        plan = plan_arrivals(trace, config.load, config.seed, requests.selected)
        targets = replica_targets(config, trace, plan, requests.rejected, setup.num_gpu_blocks)
        if targets is not None:
            return _replay_clustered(prepared, config, outdir, setup, wall_start, ray_address=None, workers=workers,
                                     apart=(plan, targets), **common)
    if workers is not None and workers > 1:
        why = (why_replicas_share(config) or ("replicas_apart is off" if plan is None else why_not_apart(config, plan))
               or "a closed-loop turn can go to another replica than the turn it follows")
        raise ConfigError("--workers replays the clusters of a fleet (fleet.clusters above 1), or the replicas of a "
                          f"fleet that share nothing, in parallel processes; here they cannot be: {why}")
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


# Below this many requests, parallel processes gain less than forking them costs (a default of
# ``workers=None`` only; the outputs are the same either way).
_PROCESSES_FROM_REQUESTS = 4000


def auto_workers(requests: int, parts: int) -> int:
    """Processes for ``parts`` independent parts of a replay of ``requests`` requests when the user
    named none: the cores this process may use, if the replay is large enough to gain."""
    if requests < _PROCESSES_FROM_REQUESTS or parts < 2:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    return max(1, min(cores, parts))


def _replay_clustered(prepared: PreparedTrace, config: EngineConfig, outdir: str | Path, setup: EngineSetup,
                      wall_start: float, *, config_source: str | None,
                      config_path: str | Path | None, overwrite: bool, check_invariants: bool, fast_forward: bool,
                      progress: ProgressFn | None, ray_address: str | None, workers: int | None,
                      apart: tuple[ArrivalPlan, np.ndarray] | None = None) -> RunSummary:
    """A fleet of clusters (engine/clusters.py), or a fleet whose replicas share nothing (``apart``:
    its arrival plan and every row's replica, engine/fleet_partition.py), each part replayed on its
    own (here, in local processes or on Ray), the outputs merged (engine/cluster_merge.py), one
    run.json over the whole fleet."""
    fleet = config.fleet
    assert fleet is not None
    trace, requests, meta, trace_path = prepared.arrays, prepared.requests, prepared.meta, prepared.trace_path
    fingerprint, table = prepared.fingerprint, prepared.table
    if ray_address is not None and table is None:
        raise ConfigError("this trace was prepared for a fleet without clusters, which lets its table go: "
                          "prepare it (prepare_trace) with the clustered config it is replayed with")
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
        if apart is None:
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
