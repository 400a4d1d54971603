"""Building and running a disaggregated fleet for ``replay run`` (engine/run.py calls these).

Each pool is an engine config of its own (``EngineConfig.pool_config``: the shared config with the
pool's overrides), resolved like any run (capacity, length limit, step timer), with the P/D
connector on (vLLM's NixlConnector on both sides: no MTP hash lookahead, as with any KV connector).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.base.errors import ConfigError
from replay.engine.arrivals import ArrivalPlan, plan_arrivals
from replay.engine.config import DTYPE_BYTES, EngineConfig
from replay.engine.core import EngineCore
from replay.engine.fleet import ProgressFn
from replay.engine.fleet_scaling import FleetScaler
from replay.engine.kv_tiers import TierPools
from replay.engine.kv_transfer import TransferNetwork
from replay.engine.models import get_model
from replay.engine.pd_fleet import PDFleetLoop
from replay.engine.pd_outputs import PDRequestColumns
from replay.engine.pd_scaling import PoolControl, attach_pool_controls, pool_scalers
from replay.engine.recorder import Recorder
from replay.engine.routers import Router, RouterContext, build_router
from replay.engine.run_setup import EngineSetup, resolve_setup
from replay.engine.scaling_config import AutoscaleConfig
from replay.engine.scaling_output import PoolBill
from replay.engine.scheduler import Scheduler
from replay.engine.scheduler_factory import build_scheduler, tier_pools_for
from replay.engine.slo_capacity import ReplicaCapacity
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates
from replay.engine.trace_input import TraceArrays

POOLS = ("prefill", "decode")


def is_disaggregated(config: EngineConfig) -> bool:
    return config.fleet is not None and config.fleet.disaggregated


def transfer_bytes_per_token(config: EngineConfig) -> int:
    """``fleet.kv_transfer.bytes_per_token``, or from the model's KV layout (``auto``): every KV
    head of every KV layer once (what must cross, however either side splits it over its ranks)."""
    given = config.fleet.kv_transfer.bytes_per_token
    if given != "auto":
        return int(given)
    decode = config.pool_config("decode")
    model = get_model(decode.model)
    per_layer = model.kv_elems_per_token_per_layer(1) * DTYPE_BYTES[decode.kv_cache_dtype()]
    return per_layer * decode.num_kv_layers(model)


@dataclass(frozen=True)
class Pool:
    """One pool's resolved engine: its config, setup and one scheduler per fleet slot (an
    autoscaled pool has ``2 * max_replicas`` slots, of which the first ``initial`` serve at t = 0)."""

    name: str
    config: EngineConfig
    setup: EngineSetup
    schedulers: list[Scheduler]
    initial: int
    sampler: AcceptanceSampler | None = None


@dataclass(frozen=True)
class PDParts:
    prefill: Pool
    decode: Pool
    plan: ArrivalPlan
    decode_router: Router | None
    prefill_router: Router | None
    tier_pools: TierPools | None = None  # kv_cache.tiers: one set for both pools (cluster tiers shared)


def _pool(config: EngineConfig, name: str, trace: TraceArrays, setup: EngineSetup,
          tier_pools: TierPools | None, first_replica: int) -> Pool:
    pool_cfg = config.pool_config(name)
    sampler = None
    if pool_cfg.speculative is not None:
        sampler = AcceptanceSampler(resolve_rates(pool_cfg.speculative), pool_cfg.speculative.seed)
    spec = getattr(config.fleet, name)
    schedulers = [build_scheduler(pool_cfg, setup.num_gpu_blocks, setup.max_model_len, sampler=sampler,
                                  kv_bytes_per_token=setup.kv_bytes_per_token, kv_connector=True,
                                  tier_pools=tier_pools, replica=first_replica + i)
                  for i in range(spec.id_capacity)]
    return Pool(name=name, config=pool_cfg, setup=setup, schedulers=schedulers, initial=spec.initial_replicas,
                sampler=sampler)


def _fleet_tiers(config: EngineConfig, prefill: EngineSetup, decode: EngineSetup) -> TierPools | None:
    """The fleet's KV tiers, shared by both pools: replica tiers per replica (prefill replicas
    numbered first), each cluster tier one store. Both pools must offload blocks of one size."""
    pools = {name: tier_pools_for(config.pool_config(name), setup.kv_bytes_per_token)
             for name, setup in (("prefill", prefill), ("decode", decode))}
    p, d = pools["prefill"], pools["decode"]
    if p is None or d is None:
        return None
    hosts = {name: config.pool_config(name).host_offload is not None for name in pools}
    if hosts["prefill"] != hosts["decode"]:
        raise ConfigError("fleet.prefill.host_offload: with kv_cache.tiers both pools have G2 or neither "
                          "(G2 is the first tier of the fleet's one chain)")
    if (p.block_size, p.block_bytes) != (d.block_size, d.block_bytes):
        raise ConfigError(f"fleet.prefill.host_offload.block_size: the pools offload blocks of {p.block_size} "
                          f"tokens ({p.block_bytes} bytes) and {d.block_size} tokens ({d.block_bytes} bytes); "
                          f"the fleet's KV tiers keep blocks of one size")
    return d


def _router(name: str, options: dict, pool: Pool, config: EngineConfig, trace: TraceArrays) -> Router | None:
    n = len(pool.schedulers)
    if n == 1:
        return None  # one replica: nobody to choose between (as in any fleet of one)
    ctx = RouterContext(num_replicas=n, block_size=pool.config.kv_cache.block_size,
                        num_gpu_blocks=pool.setup.num_gpu_blocks, seed=config.seed, trace=trace)
    return build_router(name, options, ctx)


def build_pd_parts(trace: TraceArrays, config: EngineConfig, decode_setup: EngineSetup,
                   selected: np.ndarray) -> PDParts:
    fleet = config.fleet
    prefill_setup = resolve_setup(config.pool_config("prefill"))
    tiers = _fleet_tiers(config, prefill_setup, decode_setup)
    prefill = _pool(config, "prefill", trace, prefill_setup, tiers, 0)
    decode = _pool(config, "decode", trace, decode_setup, tiers, fleet.prefill.id_capacity)
    plan = plan_arrivals(trace, config.load, config.seed, selected)
    return PDParts(prefill=prefill, decode=decode, plan=plan,
                   decode_router=_router(fleet.router, fleet.router_options, decode, config, trace),
                   prefill_router=_router(fleet.prefill_router, fleet.prefill_router_options, prefill, config, trace),
                   tier_pools=tiers)


def prefill_pool_rejects(trace: TraceArrays, selected: np.ndarray, config: EngineConfig) -> dict[int, str]:
    """Requests whose prompt cannot fit the prefill pool's KV cache (the decode pool is checked like
    any run's): they are rejected with the reason, never left waiting."""
    pool_cfg = config.pool_config("prefill")
    setup = resolve_setup(pool_cfg)
    bs = pool_cfg.kv_cache.block_size
    usable = setup.num_gpu_blocks - 1
    inp = trace.input_tokens[selected].astype(np.int64)
    needed = -(-inp // bs)
    rejected = {}
    for pos in np.flatnonzero(needed > usable):
        rejected[int(selected[pos])] = (f"prompt needs {int(needed[pos])} KV blocks but a prefill replica's cache "
                                        f"has only {usable} usable blocks of {bs} tokens")
    return rejected


def run_pd_fleet(trace: TraceArrays, config: EngineConfig, parts: PDParts, rejected: dict[int, str],
                 recorder: Recorder, columns: PDRequestColumns, *, progress: ProgressFn | None,
                 fast_forward: bool, check_invariants: bool, total_requests: int = 0) -> PDFleetLoop:
    """Simulate the replay on the two pools into ``recorder`` (closed on success, aborted on error)."""
    fleet = config.fleet
    transfer = fleet.kv_transfer
    num_prefill = len(parts.prefill.schedulers)
    prefill_cores = [EngineCore(i, s, parts.prefill.setup.timer, recorder, fast_forward=fast_forward,
                                check_invariants=check_invariants) for i, s in enumerate(parts.prefill.schedulers)]
    decode_cores = [EngineCore(num_prefill + i, s, parts.decode.setup.timer, recorder, fast_forward=fast_forward,
                               check_invariants=check_invariants) for i, s in enumerate(parts.decode.schedulers)]
    network = TransferNetwork(transfer.bandwidth_gb_per_s, transfer.latency_ms)
    loop = PDFleetLoop(trace, parts.plan, prefill_cores, decode_cores, parts.decode_router, parts.prefill_router,
                       recorder, columns, network, block_size=parts.decode.config.kv_cache.block_size,
                       hash_lookahead=parts.decode.schedulers[0].kv.hash_lookahead, rejected=rejected,
                       transfer_bytes_per_token=transfer_bytes_per_token(config),
                       transfer_full_prompt=transfer.timing_mode == "full_prompt",
                       local_prefill_max_tokens=fleet.local_prefill_max_tokens,
                       prefill_queue_max=fleet.prefill_queue_max,
                       router_latency_ms=fleet.router_latency_ms, progress=progress,
                       live_prefill=parts.prefill.initial, live_decode=parts.decode.initial,
                       reads_cluster_tier=transfer.decode_source == "cluster_tier")
    controls = [pool_control(loop, pool, getattr(fleet, pool.name).autoscale, trace, recorder,
                             total_requests, fast_forward=fast_forward, check_invariants=check_invariants)
                for pool in (parts.prefill, parts.decode) if getattr(fleet, pool.name).autoscale is not None]
    attach_pool_controls(loop, controls)
    if parts.tier_pools is not None:
        parts.tier_pools.set_clock(lambda: loop.now)
    loop.run_recorded()
    return loop


def pool_control(loop: PDFleetLoop, pool: Pool, cfg: AutoscaleConfig, trace: TraceArrays, recorder: Recorder,
                 total_requests: int, *, fast_forward: bool, check_invariants: bool) -> PoolControl:
    """An autoscaled pool's controller: its policy (SLO capacity of this pool's role) and new engines."""
    pc = pool.config
    capacity = None
    if cfg.policy == "slo":
        capacity = ReplicaCapacity(pool.setup.timer, max_num_batched_tokens=pc.scheduler.max_num_batched_tokens,
                                   max_num_seqs=pc.scheduler.max_num_seqs,
                                   kv_tokens=(pool.setup.num_gpu_blocks - 1) * pc.kv_cache.block_size,
                                   ttft_ms=cfg.ttft_ms, tpot_ms=cfg.tpot_ms, role=pool.name)

    def new_core(fleet_number: int) -> EngineCore:
        sched = build_scheduler(pc, pool.setup.num_gpu_blocks, pool.setup.max_model_len, sampler=pool.sampler,
                                kv_bytes_per_token=pool.setup.kv_bytes_per_token, kv_connector=True)
        return EngineCore(fleet_number, sched, pool.setup.timer, recorder, fast_forward=fast_forward,
                          check_invariants=check_invariants)

    return PoolControl(loop, pool.name, cfg, capacity, new_core, trace, total_requests)


def pools_summary(loop: PDFleetLoop, parts: PDParts, span_ms: float) -> dict:
    """run.json ``pools``: per pool replicas, GPUs, busy time, GPU-seconds and utilization; and the
    KV transfers' volume and link time."""
    out = {}
    scalers = pool_scalers(loop)
    for pool, cores in ((parts.prefill, loop.prefill_cores), (parts.decode, loop.decode_cores)):
        tp = pool.config.tensor_parallel_size
        scaler = scalers.get(pool.name)
        replica_ms = len(cores) * span_ms
        if scaler is not None:  # every engine that served, and the replica time the pool held
            cores = scaler.cores()
            replica_ms = scaler.replica_ms(span_ms)
        busy = sum(c.busy_ms for c in cores)
        gpus = len(cores) * tp
        out[pool.name] = {
            "replicas": len(cores) if scaler is None else len({c.replica for c in cores}),
            "tensor_parallel_size": tp,
            "hardware": pool.config.hardware,
            "gpus": gpus,
            "num_gpu_blocks": pool.setup.num_gpu_blocks,
            "steps": sum(c.step_idx - c.first_step for c in cores),
            "busy_ms": busy,
            "gpu_seconds": gpus * span_ms / 1e3 if scaler is None else replica_ms * tp / 1e3,
            "busy_gpu_seconds": busy * tp / 1e3,
            "utilization": busy / replica_ms if replica_ms > 0 else 0.0,
            "prefix_query_tokens": sum(c.sched.prefix_query_tokens for c in cores),
            "prefix_hit_tokens": sum(c.sched.prefix_hit_tokens for c in cores),
            "preemptions": sum(c.sched.total_preemptions for c in cores),
        }
    net = loop.network
    busy = net.link_busy_ms
    out["kv_transfer"] = {
        "transfers": net.total_transfers,
        "bytes": net.total_bytes,
        "bandwidth_gb_per_s": net.bytes_per_ms / 1e6 if net.bytes_per_ms != float("inf") else None,
        "bytes_per_token": loop.bytes_per_token,
        "prefill_egress_busy_ms": [busy.get(("prefill", i), 0.0) for i in range(len(loop.prefill_cores))],
        "decode_ingress_busy_ms": [busy.get(("decode", i), 0.0) for i in range(len(loop.decode_cores))],
    }
    return out


def pool_bills(config: EngineConfig, parts: PDParts, scalers: dict[str, FleetScaler], span_ms: float) -> list[PoolBill]:
    """Each pool's replica time (its fixed replicas for the whole replay, or its autoscaled lives)
    and price (``fleet.<pool>.gpu_cost_per_hour``, else ``fleet.gpu_cost_per_hour``)."""
    fleet = config.fleet
    bills = []
    for pool in (parts.prefill, parts.decode):
        spec = getattr(fleet, pool.name)
        scaler = scalers.get(pool.name)
        replica_ms = scaler.replica_ms(span_ms) if scaler is not None else len(pool.schedulers) * span_ms
        price = spec.gpu_cost_per_hour if spec.gpu_cost_per_hour is not None else fleet.gpu_cost_per_hour
        bills.append(PoolBill(pool.name, replica_ms, pool.config.tensor_parallel_size, price))
    return bills
