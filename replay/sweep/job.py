"""One config of a sweep, run inside a worker (a pool process or a Ray task).

The worker gets the trace once (``WorkerTrace``) and then any number of ``Job``s; each job replays the
trace with its config through the ordinary engine entry point (replay.engine.run.replay_trace, the code
behind `replay run`), summarizes the run and returns a JSON-ready record. A config's own failure (a
bad combination, a request that cannot fit) becomes a record with its error: the sweep goes on.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from replay.base.errors import ReplayError
from replay.engine.config import EngineConfig
from replay.ingest.schema import TraceMetadata
from replay.sweep.slo import SweepSlo
from replay.sweep.summary import summarize


@dataclass(frozen=True)
class Job:
    key: str                  # the result-store key
    config: dict[str, Any]    # the validated config's set fields (model_dump(mode="json", exclude_unset=True)):
    #                           a default written out would read as set (an autoscaled fleet's replicas)
    config_source: str        # for run.json: base config + the point's overrides
    run_dir: str | None       # where the run's outdir goes; None: --summary-only (a temp dir, removed)
    on_error: str = "fail"    # as `replay run --on-error`


@dataclass(frozen=True)
class WorkerTrace:
    table: pa.Table
    meta: TraceMetadata
    path: str                 # the trace path recorded in each run.json
    slo: SweepSlo


def run_job(job: Job, trace: WorkerTrace) -> dict[str, Any]:
    """Replay one config; always returns a record (``error`` set when the config failed)."""
    from replay.engine.run import replay_trace

    started = time.perf_counter()
    record: dict[str, Any] = {"key": job.key, "error": None, "metrics": None}
    tmp_root = None
    try:
        config = EngineConfig.model_validate(job.config)
        if job.run_dir is None:
            tmp_root = Path(tempfile.mkdtemp(prefix="replay-sweep-"))
            outdir = tmp_root / "run"
        else:
            outdir = Path(job.run_dir)
        replay_trace(trace.table, trace.meta, config, outdir, trace_path=trace.path,
                     config_source=job.config_source, on_error=job.on_error, overwrite=True)
        record["metrics"] = summarize(outdir, config.model_dump(mode="json"), trace.slo)
        record["slo"] = trace.slo.stamp()
    except ReplayError as exc:
        # Errors name the trace; it is the sweep's own, and its path would make the table depend on
        # where SWEEPDIR is: say "trace" instead.
        record["error"] = str(exc).replace(f"{trace.path}: ", "trace: ", 1)
    except Exception as exc:  # an engine bug must not stop the other configs; the record says what it was
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    record["wall_time_s"] = round(time.perf_counter() - started, 3)
    return record
