"""A sweep end to end: prepare the trace and the store once, run grid points, write sweep.parquet.

``SweepSession`` is shared by `replay sweep` (all points at once) and `replay plan` (a few points per
bisection round): both go through ``run_points``, which skips every point whose result is already
in the store, so an interrupted sweep or plan resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from replay.api import load_any_trace
from replay.base.atomic import atomic_path, refuse_inputs, write_json_atomic
from replay.base.errors import ConfigError, ReplayError
from replay.base.parquet_io import CHECKSUMS
from replay.base.version import __version__
from replay.engine.config import load_config
from replay.engine.request_selection import check_on_error
from replay.engine.run import config_input_files
from replay.sweep.executors import Executor, make_executor
from replay.sweep.grid import Axis, Point, describe, point_config
from replay.sweep.job import Job
from replay.sweep.slo import SweepSlo
from replay.sweep.store import (
    RESULTS_DIR,
    RUNS_DIR,
    SWEEP_FILE,
    TABLE_FILE,
    TRACE_FILE,
    ResultStore,
    config_hash,
    result_key,
)
from replay.sweep.summary import gpus_used, summarize
from replay.sweep.table import build_table, write_table


class Progress(Protocol):
    def add_total(self, n: int) -> None: ...
    def advance(self, record: dict[str, Any], reused: bool) -> None: ...
    def running(self, n: int) -> None: ...


class NoProgress:
    def add_total(self, n: int) -> None:
        pass

    def advance(self, record: dict[str, Any], reused: bool) -> None:
        pass

    def running(self, n: int) -> None:
        pass


@dataclass
class PointResult:
    point: Point
    key: str | None           # None: the point's config did not validate
    config: dict | None       # the validated config, dumped whole (what its key hashes)
    record: dict[str, Any]    # {"metrics": {...} | None, "error": str | None, ...}
    run_config: dict | None = None  # its set fields only: what a worker validates again

    @property
    def metrics(self) -> dict[str, Any] | None:
        return self.record.get("metrics")

    @property
    def error(self) -> str | None:
        return self.record.get("error")


@dataclass
class SweepOptions:
    ray: str | None = None
    workers: int | None = None
    summary_only: bool = False
    retry_failed: bool = False
    on_error: str = "fail"

    def __post_init__(self) -> None:
        check_on_error(self.on_error)  # before any config runs (a worker would find it too late)


def _fingerprint(table) -> str:
    from replay.ingest.fingerprint import trace_fingerprint  # the fingerprint run.json records

    return trace_fingerprint(table)


@dataclass
class SweepSession:
    """One SWEEPDIR, its trace, its base config and SLO, and an executor kept across batches."""

    sweepdir: Path
    trace_path: str
    fingerprint: str
    base: dict[str, Any]
    base_source: str
    slo: SweepSlo
    options: SweepOptions
    store: ResultStore
    executor: Executor | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"ran": 0, "reused": 0, "failed": 0, "lost": 0})

    @classmethod
    def open(cls, trace: str | Path, config: str | Path | None, sweepdir: str | Path, slo: SweepSlo,
             options: SweepOptions, *, overrides: list[str] | None = None,
             ingest_options: dict | None = None) -> SweepSession:
        base_cfg = load_config(config, overrides)  # the base alone must be valid: errors name the file and key
        # Run folders are replaced when a config is rerun: never one holding a file the sweep reads.
        refuse_inputs(Path(sweepdir) / RUNS_DIR, [trace, *config_input_files(base_cfg, config)])
        store = ResultStore.create(sweepdir)
        table, meta = load_any_trace(trace, **(ingest_options or {}))
        fingerprint = _fingerprint(table)
        trace_path = _place_trace(Path(trace), table, meta, store.root, fingerprint)
        return cls(sweepdir=store.root, trace_path=trace_path, fingerprint=fingerprint,
                   # Only what the config sets: defaults written out would read as set (an autoscaled
                   # fleet's replicas: 1 is then a start size outside min..max, refused).
                   base=base_cfg.model_dump(mode="json", exclude_unset=True),
                   base_source=(str(config) if config else "defaults") + "".join(f" --set {o}" for o in overrides or []),
                   slo=slo, options=options, store=store)

    def write_definition(self, extra: dict[str, Any]) -> None:
        write_json_atomic(self.sweepdir / SWEEP_FILE, {
            "tool_version": __version__, "trace": {"path": self.trace_path, "fingerprint": self.fingerprint},
            "base_config": self.base, "base_config_source": self.base_source, "slo": self.slo.text(),
            "slo_constraints": self.slo.constraints, "summary_only": self.options.summary_only, **extra})

    def _executor(self) -> Executor:
        if self.executor is None:
            self.executor = make_executor(self.options.ray, self.trace_path, self.slo, self.options.workers)
        return self.executor

    def parallelism(self) -> int:
        """How many configs can run at once (pool processes or the Ray cluster's CPUs)."""
        return self._executor().workers

    def where(self, result: PointResult) -> str | None:
        """Where a result lives, relative to SWEEPDIR: its run outdir, or its record (--summary-only)."""
        if result.key is None:
            return None
        if self.options.summary_only or result.error is not None:
            return f"{RESULTS_DIR}/{result.key}.json"
        return f"{RUNS_DIR}/{result.key}"

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None

    def resolve(self, point: Point) -> PointResult:
        """The point's config and key, or a failed result when the combination does not validate."""
        try:
            cfg = point_config(self.base, point, self.base_source)
        except ConfigError as exc:
            return PointResult(point, None, None, {"metrics": None, "error": str(exc)})
        dumped = cfg.model_dump(mode="json")
        digest = config_hash(dumped)
        if self.options.on_error == "skip":  # another result (requests rejected, not a failure): its own key
            digest = config_hash({"config": dumped, "on_error": "skip"})
        return PointResult(point, result_key(self.fingerprint, digest), dumped, {},
                           run_config=cfg.model_dump(mode="json", exclude_unset=True))

    def refuse_all_invalid(self, points: list[Point]) -> None:
        """Exit 2, before anything is written, when no point of the grid is a valid config."""
        _refuse_all_invalid([self.resolve(p) for p in points])

    def point_gpus(self, point: Point) -> int | None:
        """The GPUs a point's config uses (None: the config does not validate), known before it runs."""
        res = self.resolve(point)
        return None if res.config is None else gpus_used(res.config)

    def run_points(self, points: list[Point], progress: Progress | None = None, *,
                   all_invalid_is_an_error: bool = True) -> list[PointResult]:
        """Results for ``points`` (in order): stored ones reused, missing ones run on the executor. A
        plan's round may probe only invalid candidates (``all_invalid_is_an_error`` False): they fail."""
        progress = progress or NoProgress()
        results = [self.resolve(p) for p in points]
        if all_invalid_is_an_error:
            _refuse_all_invalid(results)
        progress.add_total(len(results))
        todo: dict[str, Job] = {}
        for res in results:
            if res.key is None:
                self.counts["failed"] += 1
                progress.advance(res.record, reused=True)
            elif res.key in todo:  # two points with one config (e.g. a value equal to the default)
                progress.advance({}, reused=True)
            elif self.store.is_done(res.key, need_run_dir=not self.options.summary_only,
                                    # a failure stored without --on-error skip may not fail with it
                                    retry_failed=self.options.retry_failed or self.options.on_error == "skip") \
                    and self._summary_under_this_slo(res):
                self.counts["reused"] += 1
                progress.advance(self.store.load(res.key) or {}, reused=True)
            else:
                run_dir = None if self.options.summary_only else str(self.store.run_dir(res.key))
                source = f"{self.base_source} at {describe(res.point)}"
                todo[res.key] = Job(res.key, res.run_config or res.config, source, run_dir, self.options.on_error)
        if todo:
            def on_record(job: Job, record: dict[str, Any]) -> None:
                self.store.save(job.key, record)
                self.counts["ran"] += 1
                self.counts["failed"] += record.get("error") is not None
                progress.advance(record, reused=False)

            lost = self._executor().run(list(todo.values()), on_record, progress.running)
            if lost:
                self.counts["lost"] += len(lost)
                raise ReplayError(f"{len(lost)} config(s) lost their worker (killed process or lost node) and "
                                  f"have no result; rerun the same command to redo only those")
        for res in results:
            if res.key is not None:
                res.record = self.store.load(res.key) or {"metrics": None, "error": "result missing"}
        return results

    def _summary_under_this_slo(self, res: PointResult) -> bool:
        """A stored summary made under another --slo has its SLO columns made again: slo_met from the
        summary itself, goodput from the run's outdir when its thresholds changed. False when that
        cannot be done (--summary-only kept no outdir): the config runs again."""
        record = self.store.load(res.key) or {}
        metrics = record.get("metrics")
        stamp = self.slo.stamp()
        if metrics is None or record.get("slo") == stamp:
            return True
        if (record.get("slo") or {}).get("goodput", "unknown") != stamp["goodput"]:
            run_dir = self.store.run_dir(res.key)
            if not (run_dir / "run.json").is_file():
                return False
            metrics = summarize(run_dir, res.config or {}, self.slo)
        else:
            metrics["slo_met"] = self.slo.met(metrics)
        self.store.save(res.key, {**record, "metrics": metrics, "slo": stamp})
        return True

    def table_rows(self, results: list[PointResult]) -> list[dict[str, Any]]:
        rows = []
        for res in results:
            rows.append({"labels": {k: v.label for k, v in res.point}, "metrics": res.metrics,
                         "config_hash": config_hash(res.config) if res.config else None, "error": res.error,
                         "outdir": None if res.error is not None or self.options.summary_only
                         else f"{RUNS_DIR}/{res.key}"})
        return rows

    def write_table(self, axes: list[Axis], results: list[PointResult]) -> Path:
        path = self.sweepdir / TABLE_FILE
        write_table(build_table(axes, self.table_rows(results)), path)
        return path


def _place_trace(trace: Path, table, meta, root: Path, fingerprint: str) -> str:
    """The Parquet trace the workers read: the input itself when it is canonical, else SWEEPDIR/trace.parquet
    (written once; a SWEEPDIR holding another trace is refused)."""
    from replay.ingest.fingerprint import file_fingerprint
    from replay.ingest.schema import is_canonical_trace

    if is_canonical_trace(trace):
        _refuse_another_trace(root, fingerprint, trace)
        return str(trace.resolve())
    target = root / TRACE_FILE
    if target.is_file():
        if file_fingerprint(target) != fingerprint:
            raise ReplayError(f"{root}: holds a sweep of another trace ({TRACE_FILE} differs from {trace}); "
                              "choose a new -o")
        return str(target.resolve())
    import pyarrow.parquet as pq

    with atomic_path(target) as tmp:
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                      **meta.to_parquet_metadata()}), tmp, compression="zstd",
                       **CHECKSUMS)
    if file_fingerprint(target) != fingerprint:  # the workers must replay exactly what was given
        raise ReplayError(f"{target}: the stored trace does not read back identical to {trace}")
    return str(target.resolve())


def _refuse_all_invalid(results: list[PointResult]) -> None:
    if results and all(res.key is None for res in results):  # nothing would run: say why, exit 2
        raise ConfigError(f"no combination of the grid is a valid config ({len(results)} tried); the first: "
                          f"{results[0].error}")


def _refuse_another_trace(root: Path, fingerprint: str, trace: Path) -> None:
    """A canonical trace is read where it is, so SWEEPDIR holds no copy to compare: its sweep.json
    names the trace an earlier sweep there replayed (by content), and another one is refused."""
    import json

    try:
        earlier = ((json.loads((root / SWEEP_FILE).read_text(encoding="utf-8")) or {}).get("trace") or {})
    except (OSError, ValueError, AttributeError):
        return  # no sweep here yet (or sweep.json unreadable: the report names that)
    recorded = earlier.get("fingerprint") if isinstance(earlier, dict) else None
    if recorded and recorded != fingerprint:
        raise ReplayError(f"{root}: holds a sweep of another trace ({earlier.get('path')}, not {trace}); "
                          "choose a new -o")
