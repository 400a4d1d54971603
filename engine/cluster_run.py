"""Replay a fleet of clusters: each cluster on its own (here, or on a Ray worker), then one output.

engine/clusters.py says which requests each cluster gets; this module replays one cluster into a
folder of its own (``replay_cluster``), with the same code as any fleet (engine/run.py's
``run_fleet``), and hands back what run.json needs of it (``ClusterResult``: plain numbers, so it
travels from a Ray worker). engine/cluster_merge.py then merges the folders. Local and Ray runs
call the same function on the same inputs and merge in cluster order, so their outputs are
byte-identical.
"""

from __future__ import annotations

import math
import multiprocessing
import shutil
import signal
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from replay.base.errors import ReplayError
from replay.base.heap import release_heap
from replay.engine.cluster_merge import cluster_files
from replay.engine.clusters import ClusterPlan
from replay.engine.config import EngineConfig
from replay.engine.core import EngineCore
from replay.engine.fleet import FleetLoop, ProgressFn
from replay.engine.kv_tier_report import tier_figures, tier_names
from replay.engine.lockstep import ExchangeSeat, LockstepRouter, PeerStopped
from replay.engine.part_results import ClusterResult, OffloadTotals, PoolTotals, ReplicaTotals, SchedTotals
from replay.engine.recorder import Recorder
from replay.engine.replay_gc import without_collector
from replay.engine.routers import Router, RouterContext, build_router
from replay.engine.run_setup import EngineSetup, resolve_setup
from replay.engine.scheduler_factory import build_scheduler, tier_pools_for
from replay.engine.shared_outputs import SharedOutputs
from replay.engine.spec_decode import AcceptanceSampler, resolve_rates
from replay.engine.trace_input import TraceArrays, trace_arrays


@without_collector  # a Ray task too replays under the engine's collector policy
def replay_cluster(trace: TraceArrays, config: EngineConfig, setup: EngineSetup, cp: ClusterPlan,
                   outdir: Path, *, check_invariants: bool = False, fast_forward: bool = True,
                   progress: ProgressFn | None = None, shared: SharedOutputs | None = None,
                   request_rows: np.ndarray | None = None) -> ClusterResult:
    """Replay one cluster's requests on its replicas, behind its own router, into ``outdir`` (its
    chunk runs and steps into ``shared`` instead when given: engine/shared_outputs.py, with
    ``request_rows`` the rows of the merged requests file)."""
    seat = cp.lockstep_seat
    try:
        return _replay_part(trace, config, setup, cp, outdir, check_invariants=check_invariants,
                            fast_forward=fast_forward, progress=progress, shared=shared, request_rows=request_rows)
    except BaseException:
        if isinstance(seat, ExchangeSeat):  # the other parts of a fleet in step wait for this one: they stop
            seat.abandon()
        raise


def _replay_part(trace: TraceArrays, config: EngineConfig, setup: EngineSetup, cp: ClusterPlan, outdir: Path, *,
                 check_invariants: bool, fast_forward: bool, progress: ProgressFn | None,
                 shared: SharedOutputs | None, request_rows: np.ndarray | None) -> ClusterResult:
    fleet = config.fleet
    assert fleet is not None
    per = cp.replicas
    sampler = None
    if config.speculative is not None:
        sampler = AcceptanceSampler(resolve_rates(config.speculative), config.speculative.seed)
    # KV tiers per cluster: a cluster-scope tier is one store for this cluster's replicas (clusters
    # replay apart, on their own workers; docs/kv-tiers.md, "Fleets").
    tier_pools = tier_pools_for(config, setup.kv_bytes_per_token)
    schedulers = [build_scheduler(config, setup.num_gpu_blocks, setup.max_model_len, sampler=sampler,
                                  kv_bytes_per_token=setup.kv_bytes_per_token, tier_pools=tier_pools, replica=i)
                  for i in range(per)]
    router: Router | None = None
    seat = cp.lockstep_seat
    if seat is not None:
        # A part of a fleet in step: its router prices the part's replicas and chooses as the whole
        # fleet's would, from the same seeded stream (engine/lockstep.py).
        assert isinstance(seat, ExchangeSeat)
        ctx = RouterContext(num_replicas=per, block_size=config.kv_cache.block_size,
                            num_gpu_blocks=setup.num_gpu_blocks, seed=config.seed, trace=trace)
        router = LockstepRouter(build_router(fleet.router, fleet.router_options, ctx), seat)
        seat.start()
    elif per > 1:
        # Each cluster's router has its own seed (random routing must not repeat across clusters).
        ctx = RouterContext(num_replicas=per, block_size=config.kv_cache.block_size,
                            num_gpu_blocks=setup.num_gpu_blocks, seed=config.seed + cp.cluster, trace=trace)
        router = build_router(fleet.router, fleet.router_options, ctx)
    recorder = Recorder(trace, outdir, replica_column=True, cluster_part=True, tier_names=tier_names(config),
                        shared=shared, replica_offset=cp.replica_offset if shared is not None else 0,
                        request_rows=request_rows if shared is not None else None)
    cores = [EngineCore(i, sched, setup.timer, recorder, fast_forward=fast_forward,
                        check_invariants=check_invariants)
             for i, sched in enumerate(schedulers)]
    for core in cores:
        core.global_replica = core.replica + cp.replica_offset
    loop = FleetLoop(trace, cp.plan, cores, router, recorder, block_size=config.kv_cache.block_size,
                     hash_lookahead=schedulers[0].kv.hash_lookahead, rejected=cp.rejected,
                     router_latency_ms=fleet.router_latency_ms, progress=progress, shared_lead=cp.shared_lead)
    loop.release_consumed_ids = cp.release_ids
    if tier_pools is not None:
        tier_pools.set_clock(lambda: loop.now)
    if isinstance(router, LockstepRouter):
        router.run_ahead = loop.run_ahead  # what a part does while it waits for the others' costs
        loop.records_refused = cp.cluster == 0  # part 0 records the rows refused up front
    loop.run_recorded()
    if seat is not None:
        seat.finish()
    rows = np.flatnonzero(recorder.replayed)
    replica = recorder.replica[rows].astype(np.int64)
    replica[replica >= 0] += cp.replica_offset
    totals = [ReplicaTotals(
        replica=core.replica + cp.replica_offset, step_idx=core.step_idx, first_step=core.first_step,
        busy_ms=core.busy_ms,
        schedule_calls=core.schedule_calls,
        sched=SchedTotals(core.sched.prefix_query_tokens, core.sched.prefix_hit_tokens, core.sched.cpu_hit_tokens,
                          core.sched.total_preemptions),
        kv_pool=PoolTotals(core.kv_pool.num_evictions),
        offload=OffloadTotals(core.offload.totals()) if core.offload is not None else None,
    ) for core in loop.cores]
    result = ClusterResult(cluster=cp.cluster, replicas=totals, rows=rows, status=recorder.status[rows].copy(),
                           output_tokens=recorder.output_tokens[rows].copy(), replica=replica,
                           num_steps=recorder.num_steps, num_chunks=recorder.num_chunks, span_ms=loop.now,
                           tiers=tier_figures(loop.cores))
    for core in loop.cores:
        core.release()
    return result


def replay_cluster_remote(table: pa.Table, hash_block_size: int | None, config: EngineConfig,
                          setup: EngineSetup | None, cp: ClusterPlan) -> ClusterResult:
    """A Ray task: replay one cluster in a scratch folder of the worker's node and send the output
    files back with the result (the driver's folder may not be visible from the worker).
    ``setup``: the driver's, or None when its timer could not travel (the worker resolves it)."""
    trace = trace_arrays(table, hash_block_size)
    if setup is None:
        setup = resolve_setup(config)
    tmp = Path(tempfile.mkdtemp(prefix=f"replay-cluster{cp.cluster}-"))
    try:
        result = replay_cluster(trace, config, setup, cp, tmp)
        result.files = {name: (tmp / name).read_bytes() for name in cluster_files(tmp)}
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replay_clusters(trace: TraceArrays, table: pa.Table | None, hash_block_size: int | None, config: EngineConfig,
                    setup: EngineSetup, plans: list[ClusterPlan], workdir: Path, *, ray_address: str | None,
                    workers: int = 1, check_invariants: bool = False, fast_forward: bool = True,
                    progress: ProgressFn | None = None, noun: str = "cluster") -> list[ClusterResult]:
    """Every cluster into ``workdir/cluster-<c>``: one after another here, in up to ``workers``
    local processes, or on Ray. With processes or Ray this process replays clusters itself while
    the others run elsewhere (it would otherwise sit idle waiting, and one worker fewer starts).
    ``noun`` names a part in errors (``replica`` when a fleet's replicas are replayed apart).
    ``progress`` hears the requests done over every part (not from Ray tasks)."""
    dirs = [workdir / f"cluster-{cp.cluster}" for cp in plans]
    for d in dirs:
        d.mkdir()
    options = _PartOptions(check_invariants, fast_forward, noun)
    if ray_address is None:
        processes = min(workers, len(plans))
        if processes > 1 and "fork" not in multiprocessing.get_all_start_methods():
            raise ReplayError("--workers needs processes started by fork (Linux, macOS); use --ray here")
        work = _PartQueue(trace, config, setup, plans, dirs, options, processes)
        if processes > 1:
            return _run_in_processes(work, progress)
        # One process: the parts write the output's chunk and step files themselves (no merge).
        work.shared = SharedOutputs(workdir.parent)
        work.request_rows = np.unique(np.concatenate([cp.plan.released_rows() for cp in plans]))
        try:
            results = work.run_slot(0, progress)
        except BaseException:
            work.shared.abort()
            raise
        work.shared.close()
        if not np.array_equal(np.sort(np.concatenate([r.rows for r in results])), work.request_rows):
            raise RuntimeError("the parts replayed other rows than their plans: chunk runs would name wrong requests")
        return results

    def first() -> ClusterResult:
        return replay_cluster(trace, config, setup, plans[0], dirs[0], check_invariants=check_invariants,
                              fast_forward=fast_forward)

    assert table is not None, "Ray tasks rebuild the trace from its table"
    local, remote = _run_on_ray(ray_address, table, hash_block_size, config, setup, plans[1:], first)
    for result, d in zip(remote, dirs[1:]):
        for name, data in result.files.items():
            (d / name).write_bytes(data)
        result.files = {}
    return [local, *remote]


@dataclass(frozen=True)
class _PartOptions:
    check_invariants: bool
    fast_forward: bool
    noun: str  # what a part is called in errors


class _PartQueue:
    """The parts (clusters) of one replay, taken in order by whichever process is free (this one
    and its forked workers), so that parts of uneven size keep every process busy; and the
    requests each process has done, for one progress bar. The counters live in shared memory made
    before the fork, which the workers inherit (no copy of the trace is pickled either)."""

    def __init__(self, trace: TraceArrays, config: EngineConfig, setup: EngineSetup, plans: list[ClusterPlan],
                 dirs: list[Path], options: _PartOptions, processes: int) -> None:
        self.trace = trace
        self.config = config
        self.setup = setup
        self.plans = plans
        self.dirs = dirs
        self.options = options
        if processes > 1:
            ctx = multiprocessing.get_context("fork")
            self.next_part = ctx.Value("q", 0)  # with its lock: two processes must not take one part
            self.done = ctx.Array("q", processes, lock=False)  # one writer per slot
        else:
            self.next_part = None
            self.done = [0]
        self._taken = 0  # the next part, without processes
        self.shared: SharedOutputs | None = None  # one process: the output's chunk and step files
        self.request_rows: np.ndarray | None = None

    def take(self) -> int:
        """The next part no process has taken (len(plans) when none is left)."""
        if self.next_part is None:
            i, self._taken = self._taken, self._taken + 1
            return min(i, len(self.plans))
        with self.next_part.get_lock():
            i = self.next_part.value
            if i < len(self.plans):
                self.next_part.value = i + 1
            return min(i, len(self.plans))

    def stop(self) -> None:
        """No process takes another part (one has failed). Without the lock: a worker killed while
        holding it would leave it held for ever, and one store of an int needs none."""
        if self.next_part is not None:
            self.next_part.value = len(self.plans)

    def report(self, forward: ProgressFn | None) -> None:
        # Parts have clocks of their own, so no one simulated time stands for the replay (NaN).
        if forward is not None:
            forward(math.nan, sum(self.done))

    def run_slot(self, slot: int, forward: ProgressFn | None = None,
                 between: Callable[[], None] | None = None) -> list[ClusterResult]:
        """Replay parts until none is left, counting this process's requests in ``slot``;
        ``forward`` (this process only) hears the total over every process; ``between`` runs after
        each part (the parent checks its workers there)."""
        results = []
        while (i := self.take()) < len(self.plans):
            cp = self.plans[i]
            base = self.done[slot]

            def tally(sim_ms: float, done: int, base: int = base) -> None:
                self.done[slot] = base + done
                self.report(forward)

            opts = self.options
            try:
                results.append(replay_cluster(self.trace, self.config, self.setup, cp, self.dirs[i],
                                              check_invariants=opts.check_invariants,
                                              fast_forward=opts.fast_forward, progress=tally, shared=self.shared,
                                              request_rows=self.request_rows))
                release_heap()  # the part's engine and columns, freed: their pages back to the system
                if between is not None:
                    between()
            except ReplayError:
                self.stop()
                raise
            except Exception as exc:  # noqa: BLE001 - a worker names the part that failed
                self.stop()
                if slot == 0:
                    raise
                raise ReplayError(f"{opts.noun} {cp.cluster}'s replay failed in a worker process: {exc!r}") from None
        return results


# The work a forked worker process takes parts from: set just before the pool forks, inherited by
# the children, cleared after.
_FORKED: _PartQueue | None = None


def _replay_forked(slot: int) -> list[ClusterResult]:
    """A worker process: replay parts until none is left (each into its folder, which the parent merges).
    Signals get Python's own handling here, not the command's inherited one: the main process says
    what an interrupt did, once, and stops its workers."""
    assert _FORKED is not None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _FORKED.run_slot(slot)


def _run_in_processes(work: _PartQueue, progress: ProgressFn | None) -> list[ClusterResult]:
    """Every part of ``work``, taken by this process and ``len(work.done) - 1`` forked workers as
    each comes free; the results in part order. Fork shares the trace and the resolved timer with
    the workers as they are; platforms without fork use --ray instead."""
    global _FORKED
    processes = len(work.done)
    # A timer still loading its tables on a thread of its own (aiconfigurator's, in Rust) could hold
    # a lock the fork copies held: the child would wait on it for ever. Let it finish first.
    before_fork = getattr(work.setup.timer, "before_fork", None)
    if before_fork is not None:
        before_fork()
    _FORKED = work
    others = set(multiprocessing.active_children())  # children of someone else's, never ours to stop
    pool = ProcessPoolExecutor(max_workers=processes - 1, mp_context=multiprocessing.get_context("fork"))
    done = False
    try:
        # The workers fork here, before this process's replay starts its writer thread. A progress
        # bar's refresh thread may be running: the children never touch the console, and the
        # engine's state they inherit is plain Python and numpy (no lock of another thread's).
        futures: list[Future[list[ClusterResult]]] = [pool.submit(_replay_forked, slot)
                                                      for slot in range(1, processes)]

        def check_workers() -> None:
            """A worker that failed or died stops the replay now, not after this process's parts."""
            for fut in futures:
                if fut.done() and fut.exception() is not None:
                    fut.result()

        try:
            try:
                results = work.run_slot(0, progress, between=check_workers)
            except PeerStopped as stopped:  # a part in step failed in a worker: report its error, not this one
                wait(futures, timeout=10.0)
                check_workers()
                raise ReplayError(f"a worker process of the replay stopped without reporting an error ({stopped})") \
                    from None
            while wait(futures, timeout=0.5).not_done:
                work.report(progress)
                check_workers()
            for fut in futures:
                results += fut.result()
        except BrokenProcessPool as exc:  # a worker that died (its part is not known here)
            raise ReplayError(f"a worker process of the replay failed: {exc!r}") from None
        work.report(progress)
        results.sort(key=lambda r: r.cluster)
        done = True
        return results
    finally:
        if not done:  # an error or an interrupt: the workers' parts are of no use any more
            for child in set(multiprocessing.active_children()) - others:
                child.terminate()
        work.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        _FORKED = None


def _run_on_ray(address: str, table: pa.Table, hash_block_size: int | None, config: EngineConfig,
                setup: EngineSetup, plans: list[ClusterPlan],
                meanwhile: Callable[[], ClusterResult]) -> tuple[ClusterResult, list[ClusterResult]]:
    """One Ray task per cluster of ``plans``, the trace put once in the object store, while this
    process runs ``meanwhile``; (its result, the tasks' results in cluster order). ``auto`` starts a
    local Ray instance (or reuses this process's); any other address joins it."""
    try:
        import ray
    except ImportError:
        raise ReplayError("--ray needs Ray: pip install 'replay-analyzer[ray]' (or -e '.[ray]')") from None
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if address == "auto":
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(replay_cluster_remote)
        table_ref = ray.put(table)
        try:
            setup_ref = ray.put(setup)
        except Exception:  # noqa: BLE001 - a timer that cannot be pickled: each worker resolves its own
            setup_ref = None
        refs = [task.remote(table_ref, hash_block_size, config, setup_ref, cp) for cp in plans]
        local = meanwhile()
        try:
            return local, ray.get(refs)
        except ray.exceptions.RayError as exc:
            raise ReplayError(f"a cluster's replay failed on Ray: {exc}") from None
    finally:
        if started:
            ray.shutdown()
