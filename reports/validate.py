"""``replay validate``: a replay's per-request predictions against what a real server measured.

The measurements are the ``measured_*`` columns of the run's own trace (a log ingested from vllm
bench, aiperf, a gateway...), or of another file given with ``measured=``; requests are matched by
``request_id``. Per request and metric (TTFT, TPOT, E2E, cached prompt tokens) the error is
predicted - measured; the summary gives MAPE, bias and p50/p90 absolute error, optionally per
label (``by="tenant"``). Because a replay is only comparable to the run that produced the log
when it was driven and served the same way, every recorded difference (load mode, concurrency,
rate, model, speculative decoding, speedup, request limit) is stated, never silently ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replay.base.errors import ReplayError
from replay.ingest.schema import LABEL_COLUMNS, MEASURED_COLUMNS, TraceMetadata
from replay.reports.sqlfiles import sql
from replay.reports.views import Run, open_run

METRICS = {"ttft": ("TTFT", "ms"), "tpot": ("TPOT", "ms"), "itl": ("ITL", "ms"),
           "itl_gaps": ("ITL, every gap", "ms"), "e2e": ("E2E latency", "ms"),
           "queue": ("queue time", "ms"), "prefill": ("prefill time", "ms"), "decode": ("decode time", "ms"),
           "cached_tokens": ("cached prompt tokens", "tokens")}
COMPARED = ("measured_ttft_ms", "measured_tpot_ms", "measured_itl_mean_ms", "measured_e2e_ms", "measured_queue_ms",
            "measured_prefill_ms", "measured_decode_ms", "measured_cached_tokens")
POOLED = ("itl_gaps",)  # distributions of pooled samples: no per-request pairs, errors or scatter
CDF_QUANTILES = [i / 200 for i in range(201)]  # the pooled CDFs' points for the charts
NO_GROUP = "all"
WORST_LIMIT = 10


@dataclass
class Validation:
    """Everything ``replay validate`` reports (JSON-safe via ``to_json``)."""

    outdir: str
    measured_source: str
    by: str | None
    coverage: dict[str, int]
    summary: list[dict[str, Any]]
    worst: list[dict[str, Any]]
    differences: list[str]
    unrecorded: list[str]
    # charts only: per metric the paired values (pooled metrics: quantile points and sample counts)
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("samples")
        return out


def _measured_table(source: pa.Table, by: str | None, where: str, need_measurements: bool = True) -> pa.Table:
    """``request_id``, ``grp`` and the compared measured columns (null where the log has none)."""
    n = source.num_rows
    present = [c for c in MEASURED_COLUMNS if c in source.column_names
               and source.column(c).null_count < n]
    if need_measurements and not any(c in present for c in COMPARED):
        raise ReplayError(f"{where}: no measured latencies or cached tokens (measured_* columns) to validate "
                          "against; ingest a log that has them (vllm-bench, aiperf, litellm, ... see docs/validate.md)")
    if by is not None:
        if by not in LABEL_COLUMNS:
            raise ReplayError(f"--by {by}: not a label; use one of {', '.join(LABEL_COLUMNS)}")
        if by not in source.column_names or source.column(by).null_count == n:
            labels = [c for c in LABEL_COLUMNS if c in source.column_names and source.column(c).null_count < n]
            raise ReplayError(f"--by {by}: {where} has no '{by}' values (labels present: {', '.join(labels) or 'none'})")
        grp = pc.fill_null(source.column(by).cast(pa.string()), "(none)")
    else:
        grp = pa.array([NO_GROUP] * n, pa.string())
    cols = {"request_id": source.column("request_id").cast(pa.string()), "grp": grp}
    if "measured_itl_ms" in source.column_names:  # a request's mean gap, when only the gaps were kept
        mean = _mean_gap(source.column("measured_itl_ms").combine_chunks())
        if "measured_itl_mean_ms" in source.column_names:
            mean = pc.coalesce(source.column("measured_itl_mean_ms").cast(pa.float64()).combine_chunks(), mean)
        source = source.drop_columns([c for c in ("measured_itl_mean_ms",) if c in source.column_names])
        source = source.append_column("measured_itl_mean_ms", mean)
    for name in COMPARED:
        cols[name] = (source.column(name).cast(pa.float64()) if name in source.column_names
                      else pa.nulls(n, pa.float64()))
    return pa.table(cols)


def _mean_gap(gaps: pa.Array) -> pa.Array:
    """Each list's mean (null for a null or empty list), vectorised: millions of requests."""
    flat = pc.list_flatten(gaps).cast(pa.float64()).fill_null(0.0).to_numpy()
    parents = pc.list_parent_indices(gaps).to_numpy()
    counts = pc.list_value_length(gaps).fill_null(0).to_numpy()
    sums = np.bincount(parents, weights=flat, minlength=len(gaps)) if len(flat) else np.zeros(len(gaps))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / counts
    return pa.array(means, pa.float64(), mask=counts == 0)


def _load_measured(run: Run, measured: Path | None, ingest_options: dict[str, Any]) -> tuple[pa.Table, TraceMetadata | None, str]:
    if measured is not None:
        from replay.ingest import load_trace

        table, meta = load_trace(measured, drop_failed=True, **ingest_options)
        return table, meta, str(measured)
    if run.trace_path is None:
        raise ReplayError(f"{run.outdir}: the run's trace is not found, so its measured columns are unknown; "
                          "give the log with --measured FILE")
    return pq.read_table(run.trace_path), run.trace_meta, str(run.trace_path)


def _names(model: str | None) -> str:
    return (model or "").rstrip("/").split("/")[-1].lower()


def modeled_model_names(model: str | None) -> set[str]:
    """The names a log may give the modeled model: its config string, the catalog's canonical name,
    and for a Hugging Face ``config.json`` path the folder it sits in and its ``_name_or_path`` (a
    server started from that folder logs one of those, never "config.json")."""
    names = {_names(model)}
    if not model:
        return names
    path = Path(model).expanduser()
    if path.name.lower() == "config.json":
        names.add(_names(path.parent.name))
    elif path.is_dir():
        names.add(_names(path.name))
    try:
        from replay.engine.models import get_model

        names.add(_names(get_model(model).name))
    except ReplayError:
        pass  # a config.json that has moved since the run: the path's names above still count
    names.discard("")
    return names


def condition_differences(info: dict[str, Any], meta: TraceMetadata | None,
                          models: list[str]) -> tuple[list[str], list[str]]:
    """(what differs between this replay and the run that produced the log, what the log does not record)."""
    config = info.get("config") or {}
    load = config.get("load") or {}
    mode = load.get("mode", "trace_timestamps")
    source = (meta.source_run if meta is not None else None) or {}
    diffs: list[str] = []
    unrecorded: list[str] = ["the hardware and engine settings of the measured server (the replay models "
                             f"{config.get('hardware', '?')}, TP {config.get('tensor_parallel_size', '?')}, "
                             f"{(config.get('kv_cache') or {}).get('num_gpu_blocks') or 'derived'} GPU KV blocks)"]
    if meta is not None and meta.timestamps == "absent" and mode == "trace_timestamps":
        diffs.append("the log has no arrival times, yet the replay used trace timestamps: every request "
                     "arrived at 0 (give --set load.mode=concurrency or poisson to match how the log was produced)")
    levels = source.get("benchmarks") if isinstance(source.get("benchmarks"), list) else []
    limited = [b.get("source_run") for b in levels if isinstance(b, dict) and b.get("max_concurrency")]
    if len(levels) > 1 and limited and mode == "trace_timestamps":
        diffs.append(f"the log holds {len(levels)} benchmarks; in {', '.join(map(str, limited))} the client kept a "
                     "concurrency limit, which a replay at the recorded send times does not reproduce (ingest one "
                     "with --where source_run=... and replay it with load.mode=concurrency)")
    conc = source.get("max_concurrency")
    if conc not in (None, "inf"):
        if mode == "trace_timestamps" and meta is not None and meta.timestamps == "recorded":
            diffs.append(f"the log's client kept at most {conc} requests in flight; the replay released them at "
                         "the recorded send times (which include the client's queueing) in open loop, so a "
                         "slower or faster replay is not throttled as the client was "
                         f"(--set load.mode=concurrency --set load.concurrency={conc} replays the limit itself)")
        elif mode != "concurrency":
            diffs.append(f"the log was produced with at most {conc} requests in flight; the replay used load mode "
                         f"{mode} (--set load.mode=concurrency --set load.concurrency={conc})")
        elif int(load.get("concurrency") or 0) != int(conc):
            diffs.append(f"the log was produced at concurrency {conc}; the replay used {load.get('concurrency')}")
    rate = source.get("request_rate")
    if isinstance(rate, int | float) and meta is not None and meta.timestamps == "absent":
        if mode != "poisson" or float(load.get("rate") or 0) != float(rate):
            diffs.append(f"the log was produced at {rate:g} req/s (no per-request times recorded); the replay used "
                         f"load mode {mode}" + (f" at {load.get('rate')} req/s" if mode == "poisson" else ""))
    if mode == "trace_timestamps" and float(load.get("speedup") or 1.0) != 1.0:
        diffs.append(f"the replay ran the log's arrivals at speedup {load.get('speedup')}: not the measured load")
    trace = info.get("trace") or {}
    if trace.get("replayed_rows") is not None and trace.get("rows") is not None \
            and int(trace["replayed_rows"]) < int(trace["rows"]):
        diffs.append(f"the replay stopped after {trace['replayed_rows']} of {trace['rows']} requests "
                     "(load.max_requests): later arrivals did not load the server")
    logged = sorted({m for m in models if m} | ({source["model_id"]} if source.get("model_id") else set()))
    modeled = modeled_model_names(config.get("model"))
    if logged and all(_names(m) not in modeled for m in logged):
        diffs.append(f"the log was served by {', '.join(logged)}; the replay modeled {config.get('model')}")
    elif not logged:
        unrecorded.append("the served model")
    spec_logged = any(str(k).startswith("spec_decode_") for k in source)
    if spec_logged and not config.get("speculative"):
        diffs.append("the log's server used speculative decoding (spec_decode_* counters); the replay did not")
    if not spec_logged and config.get("speculative"):
        unrecorded.append("whether the measured server used speculative decoding (the replay did)")
    uncalibrated = (info.get("timing") or {}).get("uncalibrated")
    if uncalibrated:
        unrecorded.append("how well the step-time model fits the measured server: its "
                          f"{', '.join(map(str, uncalibrated)) if isinstance(uncalibrated, list) else 'constants'} "
                          "are uncalibrated (see run.json timing; `replay calibrate`)")
    return diffs, unrecorded


def _samples(run: Run) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    rows = run.con.execute(sql("validate_samples")).fetchall()
    for metric, predicted, measured, ape in rows:
        d = out.setdefault(metric, {"predicted": [], "measured": [], "ape": []})
        d["predicted"].append(predicted)
        d["measured"].append(measured)
        if ape is not None:
            d["ape"].append(ape)
    return out


def _measured_gaps(source: pa.Table, grp: pa.Array) -> pa.Table | None:
    """One row per recorded gap (request_id, grp, gap_ms), or None when the log has no gap lists."""
    if "measured_itl_ms" not in source.column_names:
        return None
    gaps = source.column("measured_itl_ms").combine_chunks()
    flat = pc.list_flatten(gaps)
    if len(flat) == 0:
        return None
    parents = pc.list_parent_indices(gaps)
    return pa.table({"request_id": source.column("request_id").cast(pa.string()).combine_chunks().take(parents),
                     "grp": grp.take(parents), "gap_ms": flat.cast(pa.float64())})


def _pooled_gaps(run: Run, gaps: pa.Table | None, summary: list[dict[str, Any]],
                 samples: dict[str, dict[str, list[float]]]) -> None:
    """Append the pooled ITL gap distributions to ``summary`` (one row per group) and their
    quantile curves to ``samples``."""
    if gaps is None:
        return
    run.con.register("measured_gaps", gaps)
    run.con.execute(sql("validate_gaps"))
    rows = _records(run.con.execute(sql("validate_gaps_summary")))
    appended = False
    for r in rows:
        if not r["measured_n"] or not r["predicted_n"]:
            continue
        appended = True
        summary.append({"metric": "itl_gaps", "grp": r["grp"], "requests": r["measured_n"],
                        "measured_mean": r["measured_mean"], "predicted_mean": r["predicted_mean"],
                        "measured_q": r["measured_q"], "predicted_q": r["predicted_q"], "mape_pct": None,
                        "bias": r["predicted_mean"] - r["measured_mean"], "abs_error_p50": None,
                        "abs_error_p90": None, "abs_error_max": None, "predicted_gaps": r["predicted_n"]})
    if not appended:
        return
    curves = {side: (n, points) for side, n, points in
              run.con.execute(sql("validate_gaps_cdf"), {"points": CDF_QUANTILES}).fetchall()}
    samples["itl_gaps"] = {"measured": curves["measured"][1], "predicted": curves["predicted"][1], "ape": [],
                           "counts": [curves["measured"][0], curves["predicted"][0]]}
    order = list(METRICS)
    summary.sort(key=lambda s: (order.index(s["metric"]), str(s["grp"])))


def _records(cur) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def compute_validation(outdir: str | Path, *, measured: str | Path | None = None, by: str | None = None,
                       ingest_options: dict[str, Any] | None = None, worst: int = WORST_LIMIT) -> Validation:
    """Compare the run in ``outdir`` with the measurements of its trace (or of ``measured``)."""
    run = open_run(outdir)
    try:
        source, meta, where = _load_measured(run, Path(measured) if measured else None, ingest_options or {})
        table = _measured_table(source, by, where)
        run.con.register("measured", table)
        run.con.execute(sql("validate_pairs"))
        coverage = _records(run.con.execute(sql("validate_coverage")))[0]
        if coverage["matched"] == 0:
            raise ReplayError(f"{where}: no measured request matches a finished request of {run.outdir} by "
                              "request_id (was the replay made from this log?)")
        summary = _records(run.con.execute(sql("validate_summary")))
        worst_rows = _records(run.con.execute(sql("validate_worst"), {"limit": worst}))
        samples = _samples(run)
        _pooled_gaps(run, _measured_gaps(source, table.column("grp")), summary, samples)
        models = (source.column("model").unique().drop_null().to_pylist() if "model" in source.column_names else [])
        differences, unrecorded = condition_differences(run.info, meta, models)
    finally:
        run.con.close()
    return Validation(outdir=str(outdir), measured_source=where, by=by, coverage=coverage, summary=summary,
                      worst=worst_rows, differences=differences, unrecorded=unrecorded, samples=samples)


def has_measurements(trace_path: Path | None) -> bool:
    """Whether the run's trace (``Run.trace_path``: None when not found) carries measured columns
    (``replay report`` then adds a validation section)."""
    if trace_path is None:
        return False
    names = pq.read_schema(trace_path).names
    return any(c in names for c in COMPARED)


def label_groups(outdir: str | Path, by: str) -> list[dict[str, Any]]:
    """The run's headline metrics per value of the trace label ``by`` (``replay report --by``)."""
    run = open_run(outdir)
    try:
        if run.trace_path is None:
            raise ReplayError(f"--by {by}: the run's trace is not found, so its labels are unknown")
        source = pq.read_table(run.trace_path)
        table = _measured_table(source, by, str(run.trace_path), need_measurements=False)
        run.con.register("labels", table.select(["request_id", "grp"]))
        return _records(run.con.execute(sql("validate_labels")))
    finally:
        run.con.close()
