"""Where the configs run: a local process pool (default) or Ray.

Both take the same ``Job``s and return the same records from the same ``run_job``, so the sweep table
does not depend on the executor. Each worker gets the trace once: pool processes read the sweep's
Parquet trace in their initializer; Ray tasks share one copy put in the object store.

A config's own error comes back as a record. A lost worker (killed process, lost Ray node) gives no
record: the driver reports how many configs are missing and a rerun redoes exactly those.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Protocol

from replay.base.errors import ReplayError
from replay.ingest.schema import read_trace
from replay.sweep.job import Job, WorkerTrace, run_job
from replay.sweep.slo import SweepSlo

OnRecord = Callable[[Job, dict[str, Any]], None]
OnRunning = Callable[[int], None]


class Executor(Protocol):
    workers: int

    def run(self, jobs: list[Job], on_record: OnRecord, on_running: OnRunning) -> list[Job]:
        """Run ``jobs``; call ``on_record`` in the driver as each finishes; return the jobs lost."""

    def close(self) -> None: ...


def load_worker_trace(trace_path: str, slo: SweepSlo) -> WorkerTrace:
    table, meta = read_trace(trace_path, replayable=True)
    return WorkerTrace(table=table, meta=meta, path=trace_path, slo=slo)


_WORKER_TRACE: WorkerTrace | None = None


def _exit_with_parent(parent: int, interval_s: float = 1.0) -> None:
    """A pool worker whose driver died (killed, not interrupted) would finish its current config for
    nobody: it exits instead. Its temp files are removed by the next sweep in that SWEEPDIR."""
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent:
            os._exit(1)


def _init_pool_worker(trace_path: str, slo: SweepSlo, parent: int) -> None:
    global _WORKER_TRACE
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    _WORKER_TRACE = load_worker_trace(trace_path, slo)


def _pool_job(job: Job) -> dict[str, Any]:
    assert _WORKER_TRACE is not None, "pool worker used before its initializer ran"
    return run_job(job, _WORKER_TRACE)


class LocalExecutor:
    """A process pool over the local cores; one worker (or one job) runs in this process, no pool."""

    def __init__(self, trace_path: str, slo: SweepSlo, workers: int | None = None) -> None:
        self.trace_path, self.slo = trace_path, slo
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self._inline: WorkerTrace | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the driver may hold Arrow/DuckDB thread pools, which fork does not copy safely.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"),
                                             initializer=_init_pool_worker,
                                             initargs=(self.trace_path, self.slo, os.getpid()))
        return self._pool

    def run(self, jobs: list[Job], on_record: OnRecord, on_running: OnRunning) -> list[Job]:
        if self.workers == 1 or (len(jobs) <= 1 and self._pool is None):
            return self._run_inline(jobs, on_record, on_running)
        pool = self._get_pool()
        pending: dict[Future, Job] = {pool.submit(_pool_job, job): job for job in jobs}
        lost: list[Job] = []
        try:
            while pending:
                on_running(min(self.workers, len(pending)))
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    job = pending.pop(fut)
                    try:
                        record = fut.result()
                    except BrokenProcessPool:
                        lost.append(job)
                        continue
                    on_record(job, record)
        except BaseException:
            # Interrupted: the queued configs must not run. Cancel them here: shutdown's own
            # cancel_futures runs on the pool's manager thread, which may find the pool already
            # dropped, and exiting would then wait for every queued config and save none of them.
            for fut in pending:
                fut.cancel()
            self.close(cancel=True)
            raise
        if lost:
            self.close(cancel=True)  # a broken pool cannot take more work; the next run makes a new one
        on_running(0)
        return lost

    def _run_inline(self, jobs: list[Job], on_record: OnRecord, on_running: OnRunning) -> list[Job]:
        if self._inline is None:
            self._inline = load_worker_trace(self.trace_path, self.slo)
        for job in jobs:
            on_running(1)
            on_record(job, run_job(job, self._inline))
        on_running(0)
        return []

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=True)
            self._pool = None


class RayExecutor:
    """Each config is one Ray task; the trace is put once in Ray's object store and shared by all tasks.

    ``address='auto'`` starts a local Ray instance (or reuses one this process already started);
    any other address joins that cluster. Run directories are written by the tasks, so on a
    multi-node cluster SWEEPDIR must be on a filesystem every node sees (or use --summary-only:
    records travel back to the driver).
    """

    def __init__(self, address: str, trace_path: str, slo: SweepSlo, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ReplayError("--ray needs Ray: pip install 'replay-analyzer[ray]' (or -e '.[ray]')") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if address == "auto":
                if workers:
                    kwargs["num_cpus"] = workers
                ray.init(**kwargs)
            else:
                ray.init(address=address, **kwargs)
            self._started = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._trace_ref = ray.put(load_worker_trace(trace_path, slo))
        # max_retries: a task whose worker process or node dies is retried by Ray before it is lost.
        self._task = ray.remote(num_cpus=1, max_retries=2)(run_job)

    def run(self, jobs: list[Job], on_record: OnRecord, on_running: OnRunning) -> list[Job]:
        ray = self._ray
        pending = {self._task.remote(job, self._trace_ref): job for job in jobs}
        lost: list[Job] = []
        try:
            while pending:
                on_running(min(self.workers, len(pending)))
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        record = ray.get(ref)
                    except ray.exceptions.RayError:  # worker or node lost even after retries
                        lost.append(job)
                        continue
                    on_record(job, record)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        on_running(0)
        return lost

    def close(self, cancel: bool = False) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_executor(ray_address: str | None, trace_path: str, slo: SweepSlo, workers: int | None) -> Executor:
    if ray_address:
        return RayExecutor(ray_address, trace_path, slo, workers)
    return LocalExecutor(trace_path, slo, workers)

