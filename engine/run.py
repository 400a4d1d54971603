"""Replay one canonical trace with one config into an output directory (atomically)."""

from __future__ import annotations

import functools
import gc
import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.base.atomic import atomic_dir, write_json_atomic
from replay.base.errors import TraceError
from replay.base.version import __version__
from replay.engine.arrivals import plan_arrivals
from replay.engine.config import EngineConfig
from replay.engine.core import EngineCore
from replay.engine.fleet import FleetLoop, ProgressFn
from replay.engine.fleet_summary import fleet_summary
from replay.engine.native import core_kind
from replay.engine.output_schema import RUN_FILE
from replay.engine.recorder import Recorder
from replay.engine.routers import RouterContext, build_router
from replay.engine.scheduler import Scheduler, kv_cache_manager_for, scheduler_limits_for
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates
from replay.engine.timing.base import StepTimer
from replay.engine.trace_input import TraceArrays, trace_arrays
from replay.ingest.schema import TraceMetadata

_MAX_LISTED = 10


@dataclass
class EngineSetup:
    """Everything derived from the config before the run: capacity, limits, timer."""

    num_gpu_blocks: int
    capacity_source: str
    max_model_len: int
    timer: StepTimer
    kv_bytes_per_token: int
    uncalibrated: list[str] = field(default_factory=list)
    capacity_detail: dict = field(default_factory=dict)


def resolve_setup(config: EngineConfig) -> EngineSetup:
    """Model, KV capacity and step timer for a config (errors name the config key)."""
    from replay.engine.kv_capacity import resolve_num_gpu_blocks
    from replay.engine.models import get_model
    from replay.engine.timing import build_timer

    model = get_model(config.model)
    cap = resolve_num_gpu_blocks(config)
    timer = build_timer(config)
    max_model_len = config.max_model_len or int(model.max_position_embeddings)
    # The per-step host overhead is a guess (docs/timing.md) unless the user set it or fitted it.
    user_set = config.timing.host_overhead_ms is not None or config.timing.profile is not None
    uncal = [] if user_set else ["host_overhead_ms"]
    detail = {k: v for k, v in asdict(cap).items() if k not in ("num_gpu_blocks", "source") and v is not None}
    return EngineSetup(num_gpu_blocks=int(cap.num_gpu_blocks), capacity_source=str(cap.source),
                       max_model_len=max_model_len, timer=timer,
                       kv_bytes_per_token=int(config.kv_bytes_per_token()), uncalibrated=uncal,
                       capacity_detail=detail)


@dataclass
class RunSummary:
    outdir: Path
    run_info: dict


def _build_scheduler(config: EngineConfig, setup: EngineSetup, sampler: AcceptanceSampler | None) -> Scheduler:
    """One replica's scheduler with its own KV cache and G2 tier (replicas share nothing else)."""
    kv = kv_cache_manager_for(config, setup.num_gpu_blocks)
    offload = None
    if config.host_offload is not None:
        from replay.engine.offload import OffloadManager

        offload = OffloadManager(config.host_offload, kv, setup.kv_bytes_per_token)
    limits = scheduler_limits_for(config, setup.num_gpu_blocks, setup.max_model_len)
    return Scheduler(limits, kv, sampler, offload)


def find_unreplayable(trace: TraceArrays, selected: np.ndarray, config: EngineConfig,
                      setup: EngineSetup) -> dict[int, str]:
    """Requests that can never complete: too long for the model, or larger than the whole KV cache."""
    bs = config.kv_cache.block_size
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    usable = setup.num_gpu_blocks - 1
    inp = trace.input_tokens[selected]
    out = trace.output_tokens[selected]
    too_long = inp + out > setup.max_model_len
    # KV needed at the last step: every token but the last sampled one, plus MTP lookahead slots.
    blocks_needed = -(-(inp + out - 1 + k) // bs)
    too_big = blocks_needed > usable
    rejected: dict[int, str] = {}
    for pos in np.flatnonzero(too_long | too_big):
        idx = int(selected[pos])
        if too_long[pos]:
            rejected[idx] = (f"input {int(inp[pos])} + output {int(out[pos])} tokens exceed "
                             f"max_model_len {setup.max_model_len}")
        else:
            rejected[idx] = (f"needs {int(blocks_needed[pos])} KV blocks but the cache has only {usable} "
                             f"usable blocks of {bs} tokens")
    return rejected


def _fingerprint(table: pa.Table) -> str:
    """Content hash of the canonical columns: equal fingerprints mean the same trace."""
    h = hashlib.sha256()

    class _HashSink:  # IPC bytes go straight into the hash: no copy of the trace in memory
        closed = False

        def write(self, data) -> int:
            h.update(data)
            return len(data)

        def flush(self) -> None:
            pass

    with pa.ipc.new_stream(pa.PythonFile(_HashSink(), mode="w"), table.schema.remove_metadata()) as writer:
        writer.write_table(table.combine_chunks())
    return h.hexdigest()


# Young-generation threshold while a replay runs (CPython's default is 700). The engine allocates
# millions of short-lived objects, but few survive and almost none form cycles: with collection
# off for a whole replay, gc.collect() afterwards found 1.2k-3k unreachable objects (reuse-20k-8rps,
# mooncake-0.25x, mooncake-fleet8), so memory does not grow. What the default costs is 90-105
# generation-0/1 collections per replay that each traverse young containers such as the recorder's
# growing columns and the trace's hash-id list: 0.05-0.17 s of an 8-11 s replay. At 100,000 none
# ran on those workloads, and peak RSS stayed within run-to-run noise (about +-15 MB of 270-290 MB,
# /usr/bin/time -v). gc.freeze() after setup gained nothing more: no full (generation 2) collection
# happens during a replay either way. Collection stays enabled, so a run that does build cycles
# still has them collected.
_GEN0_THRESHOLD = 100_000


@contextmanager
def _engine_gc() -> Iterator[None]:
    """A high generation-0 threshold for the replay; the caller's thresholds restored after it."""
    previous = gc.get_threshold()
    if previous[0] == 0 or previous[0] >= _GEN0_THRESHOLD:  # collection off, or already rarer
        yield
        return
    gc.set_threshold(_GEN0_THRESHOLD, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def _with_engine_gc(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _engine_gc():
            return fn(*args, **kwargs)

    return wrapper


@_with_engine_gc
def replay_trace(table: pa.Table, meta: TraceMetadata, config: EngineConfig, outdir: str | Path, *,
                 trace_path: str | Path | None = None, config_source: str | None = None,
                 on_error: str = "fail", overwrite: bool = True, progress: ProgressFn | None = None,
                 check_invariants: bool = False, setup: EngineSetup | None = None,
                 fast_forward: bool = True) -> RunSummary:
    """Replay ``table`` under ``config`` into ``outdir``; nothing is written unless the run completes.

    ``fast_forward=False`` steps through decode-only runs one step at a time (same bytes, slower:
    kept for the equivalence test).
    """
    wall_start = time.perf_counter()
    setup = setup or resolve_setup(config)
    trace = trace_arrays(table, meta.hash_block_size)
    n = len(trace)
    if n == 0:
        raise TraceError("the trace has no rows", path=str(trace_path) if trace_path else None)
    limit = config.load.max_requests
    selected = np.arange(min(n, limit) if limit else n, dtype=np.int64)
    rejected = find_unreplayable(trace, selected, config, setup)
    if rejected and on_error != "skip":
        ids = [f"{trace.request_id[i]} ({why})" for i, why in list(rejected.items())[:_MAX_LISTED]]
        more = f" and {len(rejected) - _MAX_LISTED} more" if len(rejected) > _MAX_LISTED else ""
        raise TraceError(
            f"{len(rejected)} request(s) can never be replayed with this config: " + "; ".join(ids) + more
            + ". Raise max_model_len or the KV capacity, or pass --on-error skip to mark them rejected.",
            path=str(trace_path) if trace_path else None)

    bs = config.kv_cache.block_size
    sampler = None
    if config.speculative is not None:
        sampler = AcceptanceSampler(resolve_rates(config.speculative), config.speculative.seed)
    fleet = config.fleet
    num_replicas = fleet.replicas if fleet is not None else 1
    schedulers = [_build_scheduler(config, setup, sampler) for _ in range(num_replicas)]
    lookahead_hash = schedulers[0].kv.hash_lookahead
    plan = plan_arrivals(trace, config.load, config.seed, selected)
    router = None
    if num_replicas > 1:
        ctx = RouterContext(num_replicas=num_replicas, block_size=bs, num_gpu_blocks=setup.num_gpu_blocks,
                            seed=config.seed, trace=trace)
        router = build_router(fleet.router, fleet.router_options, ctx)

    with atomic_dir(outdir, overwrite=overwrite, inputs=[trace_path]) as tmp:
        recorder = Recorder(trace, tmp, replica_column=num_replicas > 1)
        cores = [EngineCore(i, sched, setup.timer, recorder, fast_forward=fast_forward,
                            check_invariants=check_invariants) for i, sched in enumerate(schedulers)]
        loop = FleetLoop(trace, plan, cores, router, recorder, block_size=bs, hash_lookahead=lookahead_hash,
                         rejected=rejected, router_latency_ms=fleet.router_latency_ms if fleet else 0.0,
                         progress=progress)
        try:
            loop.run()
        except BaseException:
            recorder.abort()
            raise
        recorder.close()
        if trace_path is not None and Path(trace_path).suffix == ".parquet" and meta is not None:
            stored_trace = Path(trace_path).resolve()
            final_trace = stored_trace
        else:
            pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                          **meta.to_parquet_metadata()}),
                           tmp / "trace.parquet", compression="zstd")
            final_trace = Path(outdir).resolve() / "trace.parquet"
        status = recorder.status[selected]
        totals = {
            "requests": int(len(selected)),
            "finished": int((status == 0).sum()),
            "rejected": int((status == 1).sum()),
            "unfinished": int((status == 2).sum()),
            "input_tokens": int(trace.input_tokens[selected].sum()),
            "output_tokens": int(recorder.output_tokens[selected][status != 1].sum()),  # generated only
            "prefix_query_tokens": sum(c.sched.prefix_query_tokens for c in cores),
            "prefix_hit_tokens": sum(c.sched.prefix_hit_tokens for c in cores),
            "cpu_hit_tokens": sum(c.sched.cpu_hit_tokens for c in cores),
            "preemptions": sum(c.sched.total_preemptions for c in cores),
            "steps": recorder.num_steps,
            "chunks": recorder.num_chunks,
            "gpu_block_evictions": sum(c.kv_pool.num_evictions for c in cores),
        }
        if config.host_offload is not None:
            for key in cores[0].offload.totals():
                values = [c.offload.totals()[key] for c in cores]
                totals[key] = values[0] if key == "num_cpu_blocks" else sum(values)
        warnings = []
        if rejected:
            warnings.append(f"{len(rejected)} request(s) rejected before the run (see reject_reason)")
        if totals["unfinished"]:
            warnings.append(f"{totals['unfinished']} request(s) did not finish")
        if trace.rechained:
            warnings.append("the trace's hash ids are not chained (an id follows different prefixes, or repeats "
                            "in a row): the replay chained them, so a block is shared only after the same prefix, "
                            "as with vLLM's block hashes")
        info = {
            "tool_version": __version__,
            "config": config.model_dump(mode="json"),
            "config_source": config_source or "defaults",
            "trace": {
                "path": str(final_trace),
                "fingerprint": _fingerprint(table),
                "rows": n,
                "replayed_rows": int(len(selected)),
                "metadata": meta.model_dump(mode="json"),
            },
            "seed": config.seed,
            "num_gpu_blocks": setup.num_gpu_blocks,
            "kv_capacity": {"source": setup.capacity_source, "num_gpu_blocks": setup.num_gpu_blocks,
                            "tokens": (setup.num_gpu_blocks - 1) * bs, **setup.capacity_detail},
            "kv_bytes_per_token": setup.kv_bytes_per_token,
            "max_model_len": setup.max_model_len,
            "simulated_span_ms": loop.now,
            "wall_time_s": round(time.perf_counter() - wall_start, 3),
            "engine_core": core_kind(),  # compiled (mypyc) or python: same outputs, not the same speed
            # calls of Scheduler.schedule (an idle or preempting call builds no step); the other steps
            # were fast-forwarded in decode windows (engine/decode_window.py). A speed diagnostic,
            # not a result: it differs with fast_forward, the totals do not.
            "schedule_calls": sum(c.schedule_calls for c in cores),
            "totals": totals,
            "warnings": warnings,
            "timing": {"backend": config.timing.backend, "uncalibrated": setup.uncalibrated},
            "session_delay_rule": plan.delay_rule,
            "prefix_hit_rate": (totals["prefix_hit_tokens"] / totals["prefix_query_tokens"]
                                if totals["prefix_query_tokens"] else None),
        }
        if fleet is not None:
            info["fleet"] = fleet_summary(cores, recorder, selected, loop.now)
        write_json_atomic(tmp / RUN_FILE, info)
    return RunSummary(outdir=Path(outdir), run_info=info)
