"""Every metric of a replay, computed once by the ``.sql`` files over the run's views.

``compute(run)`` returns a ``RunMetrics`` that the markdown report, the diff and ``--json`` output all
read; none of them computes a metric itself. ``headline(metrics)`` flattens it into the labelled,
direction-aware rows the summary tables and the diff compare.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from replay.reports.disagg import disagg_metrics
from replay.reports.fleet import fleet_metrics
from replay.reports.over_time import over_time_metrics
from replay.reports.quantiles import interpolate
from replay.reports.slo import Slo
from replay.reports.views import Run, build_trace_ideal, query_errors

# Summary percentiles (vllm bench serve reports p50/p90/p95/p99), exact (numpy.percentile, linear).
SUMMARY_PERCENTILES = (50, 90, 95, 99)
PROBS = tuple(p / 100 for p in SUMMARY_PERCENTILES)
# CDF charts come from log-spaced histograms: exact cumulative fractions at every bin edge, 40 edges
# per decade (each step under 6% in value); values below CDF_FLOOR_MS share the lowest bin.
CDF_BINS_PER_DECADE = 40
CDF_FLOOR_MS = 1e-3
LATENCIES = {  # key -> label; sql columns are <key>_count, <key>_mean, <key>_max, <key>_quantiles
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2e": "E2E latency",
    "queue": "Queue time",
}
TURN_CAP = 16  # turns >= 16 pooled into one "16+" row (long sessions are rare and noisy)
TIME_BUCKETS_TARGET = 60  # about this many points on the over-time charts

# Heuristics for warnings (guesses, documented in docs/reports.md; they only add warnings).
FALLING_BEHIND_RATIO = 2.0    # last-fifth median TTFT over first-fifth median TTFT
FALLING_BEHIND_MIN_MS = 1000.0
KV_SATURATED_WARN = 0.05      # fraction of busy time with KV usage >= 95%


@dataclass
class Dist:
    count: int
    mean: float | None
    max: float | None
    percentiles: dict[int, float | None]
    cdf: list[tuple[float, float]]  # (bin edge in ms, fraction of samples below it), rising


@dataclass
class RunMetrics:
    dists: dict[str, Dist]
    throughput: dict[str, Any]
    goodput: dict[str, Any] | None
    slo: dict[str, float]
    preemptions: dict[str, Any]
    reuse: dict[str, Any]
    ideal: dict[str, Any] | None
    reuse_by_turn: list[dict[str, Any]]
    mtp: dict[str, Any]
    steps: dict[str, Any]
    bucket_ms: float
    steps_over_time: list[dict[str, Any]]
    latency_over_time: list[dict[str, Any]]
    keeping_up: dict[str, Any]
    status: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    fleet: dict[str, Any] | None = None  # reports/fleet.py; runs with a fleet config only
    disagg: dict[str, Any] | None = None  # reports/disagg.py; disaggregated fleets only
    over_time: dict[str, Any] | None = None  # reports/over_time.py: cost, refusals, attainment per window

    def to_json(self) -> dict[str, Any]:
        return _clean(asdict(self))


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def query_one_row(run: Run, name: str, **params: Any) -> dict[str, Any]:
    """The first row of a named query as a dict (every column None when it returned no row)."""
    cur = run.query(name, **params)
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()  # not fetchone: DuckDB 2.0 refuses a relation query while a result is unfinished
    return dict(zip(cols, rows[0], strict=True)) if rows else dict.fromkeys(cols)


def _rows(run: Run, name: str, **params: Any) -> list[dict[str, Any]]:
    cur = run.query(name, **params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def dist_from_row(row: dict[str, Any], key: str, hist: list[tuple[int, int]]) -> Dist:
    qs = row[f"{key}_quantiles"]
    by_p = dict(zip(PROBS, qs, strict=True)) if qs is not None else {}
    return Dist(
        count=int(row[f"{key}_count"] or 0),
        mean=row[f"{key}_mean"],
        max=row[f"{key}_max"],
        percentiles={p: by_p.get(p / 100) for p in SUMMARY_PERCENTILES},
        cdf=cdf_from_histogram(hist),
    )


def cdf_from_histogram(hist: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """(bin, count) rows in bin order -> ECDF points at the bin edges, starting from 0."""
    total = sum(n for _, n in hist)
    if not total:
        return []
    points = [(10 ** (hist[0][0] / CDF_BINS_PER_DECADE), 0.0)]
    seen = 0
    for b, n in hist:
        seen += n
        points.append((10 ** ((b + 1) / CDF_BINS_PER_DECADE), seen / total))
    return points


def _histograms(run: Run) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {k: [] for k in LATENCIES}
    params = {"floor_ms": CDF_FLOOR_MS, "bins_per_decade": CDF_BINS_PER_DECADE}
    for name in ("latency_cdf", "itl_cdf"):
        for r in _rows(run, name, **params):
            out[r["metric"]].append((r["bin"], r["n"]))
    return out


def itl_row(run: Run, *, histograms: bool) -> tuple[dict[str, Any], dict[str, list[tuple[int, int]]]]:
    """The pooled ITL row (count, mean, max, quantiles as latency.sql names them) and, if asked, every
    latency histogram. The samples are never expanded: ``itl_counts`` (each distinct gap and how many
    samples have it, computed from the chunk runs) is materialized once, and the quantiles are the
    values at the wanted ranks of its running counts, interpolated as DuckDB's ``quantile_cont``
    interpolates (reports/quantiles.py), so they equal ``quantile_cont`` over every sample."""
    run.con.execute("CREATE OR REPLACE TEMP TABLE itl_values AS SELECT itl_ms, n FROM itl_counts")
    row = query_one_row(run, "itl")
    row["itl_quantiles"] = weighted_quantiles(run, int(row["itl_count"] or 0), PROBS)
    hists = _histograms(run) if histograms else {k: [] for k in LATENCIES}
    run.con.execute("DROP TABLE itl_values")
    return row, hists


def weighted_quantiles(run: Run, n: int, probs: tuple[float, ...]) -> list[float] | None:
    """``quantile_cont(itl_ms, probs)`` over the ``n`` samples that ``itl_values`` counts; None
    without samples (SQL NULL)."""
    if n == 0:
        return None
    spots = []
    for q in probs:
        rn = (n - 1) * float(q)
        spots.append((rn, math.floor(rn), math.ceil(rn)))
    ranks = sorted({i for _, lo, hi in spots for i in (lo, hi)})
    found = {int(rank): float(value) for rank, value in run.query("itl_ranks", ranks=ranks).fetchall()}
    return [found[lo] if lo == hi else interpolate(found[lo], found[hi], rn - lo) for rn, lo, hi in spots]


def nice_bucket_ms(span_ms: float) -> float:
    """A round bucket width giving about TIME_BUCKETS_TARGET buckets over the span."""
    steps_s = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400)
    want = max(span_ms, 1.0) / TIME_BUCKETS_TARGET / 1000.0
    for s in steps_s:
        if s >= want:
            return s * 1000.0
    return math.ceil(want / 86400) * 86400 * 1000.0


def compute(run: Run, slo: Slo | None = None, *, with_ideal: bool = True) -> RunMetrics:
    """All metrics of one run. ``with_ideal=False`` skips the infinite-cache ideal (``ideal`` None, no
    ideal by turn): the diff computes it for one run and gives it to the other with ``share_ideal``.
    A damaged output file is named in a ``ReplayError`` (``query_errors``)."""
    with query_errors(run):
        return _compute(run, slo, with_ideal)


NO_PREFIX_IDS = "the trace has no prefix ids"


def _reuse(run: Run) -> dict[str, Any]:
    """Prefix-cache hits; on a trace without prefix ids the ratios are unknown (None), not zero: the
    replay could not share blocks it cannot identify, which says nothing about the real traffic."""
    reuse = query_one_row(run, "reuse")
    if run.trace_meta is not None and not run.has_prefix_ids:
        for key in ("gpu_hit_ratio", "cpu_hit_ratio", "total_hit_ratio"):
            reuse[key] = None
        reuse["unknown"] = NO_PREFIX_IDS
    return reuse


def _compute(run: Run, slo: Slo | None, with_ideal: bool) -> RunMetrics:
    probs = list(PROBS)
    lat = query_one_row(run, "latency", probs=probs)
    itl, hists = itl_row(run, histograms=True)
    dists = {k: dist_from_row(itl if k == "itl" else lat, k, hists[k]) for k in LATENCIES}
    throughput = query_one_row(run, "throughput")
    goodput = None
    if slo is not None and not slo.empty:
        goodput = query_one_row(run, "goodput", ttft=slo.ttft, tpot=slo.tpot, e2e=slo.e2e)
    if with_ideal:
        ideal = query_one_row(run, "reuse_ideal") if build_trace_ideal(run) else None
    else:
        build_trace_ideal(run, empty=True)
        ideal = None
    span = query_one_row(run, "run_window")["last_event_ms"] or 0.0
    bucket_ms = nice_bucket_ms(float(span))
    metrics = RunMetrics(
        dists=dists,
        throughput=throughput,
        goodput=goodput,
        slo=slo.as_dict() if slo is not None else {},
        preemptions=query_one_row(run, "preemptions"),
        reuse=_reuse(run),
        ideal=ideal,
        reuse_by_turn=_rows(run, "reuse_by_turn", turn_cap=TURN_CAP),
        mtp=query_one_row(run, "mtp"),
        steps=query_one_row(run, "steps_summary"),
        bucket_ms=bucket_ms,
        steps_over_time=_rows(run, "steps_over_time", bucket_ms=bucket_ms),
        latency_over_time=_rows(run, "latency_over_time", bucket_ms=bucket_ms),
        keeping_up=query_one_row(run, "keeping_up"),
        status=_rows(run, "status"),
    )
    metrics.fleet = fleet_metrics(run, bucket_ms, run.trace_path is not None and run.has_prefix_ids)
    metrics.disagg = disagg_metrics(run)
    metrics.over_time = over_time_metrics(run, slo)
    metrics.warnings = _warnings(run, metrics)
    return metrics


def share_ideal(metrics: RunMetrics, source: RunMetrics) -> None:
    """Give ``metrics`` (computed ``with_ideal=False``) the infinite-cache ideal of ``source``, a run of
    the same trace (the diff checks the fingerprints): the ideal depends on the trace only."""
    metrics.ideal = source.ideal
    ideal_by_turn = {r["turn_key"]: r["ideal_hit_ratio"] for r in source.reuse_by_turn}
    for r in metrics.reuse_by_turn:
        r["ideal_hit_ratio"] = ideal_by_turn.get(r["turn_key"])


def falling_behind(keeping_up: dict[str, Any]) -> bool | None:
    first, last = keeping_up.get("ttft_p50_first_fifth"), keeping_up.get("ttft_p50_last_fifth")
    if first is None or last is None:
        return None
    return last > FALLING_BEHIND_MIN_MS and last > FALLING_BEHIND_RATIO * max(first, 1e-9)


def _warnings(run: Run, m: RunMetrics) -> list[str]:
    out: list[str] = []
    for row in m.status:
        if row["status"] == "rejected":
            out.append(f"{row['requests']:,} requests rejected ({row['reason'] or 'no reason given'}); "
                       "they are excluded from latency metrics")
        else:
            out.append(f"{row['requests']:,} requests {row['status']} when the run stopped; "
                       "they are excluded from latency metrics")
    if falling_behind(m.keeping_up):
        k = m.keeping_up
        share = k.get("queue_share_of_ttft")
        backlog = (f"; queueing is {share:.0%} of mean TTFT, so TTFT here magnifies any step-time error several "
                   "times over (docs/timing.md, \"Under overload, TTFT magnifies step time\")") if share else ""
        out.append(f"falling behind: median TTFT grows from {k['ttft_p50_first_fifth']:,.0f} ms (first fifth of "
                   f"arrivals) to {k['ttft_p50_last_fifth']:,.0f} ms (last fifth); the load exceeds capacity"
                   + backlog)
    sat = m.steps.get("kv_saturated_fraction")
    if sat is not None and sat >= KV_SATURATED_WARN:
        out.append(f"KV cache saturated: usage >= 95% for {sat:.1%} of busy time")
    pre = m.preemptions.get("preemptions") or 0
    if pre:
        out.append(f"{pre:,} preemptions ({m.preemptions['preempted_requests']:,} requests recomputed)")
    uncal = (run.info.get("timing") or {}).get("uncalibrated") or []
    if uncal:
        out.append("uncalibrated timing constants (results are estimates): " + ", ".join(map(str, uncal)))
    out.extend(str(w) for w in run.info.get("warnings") or [])
    out.extend(run.notes)
    seen: set[str] = set()
    return [w for w in out if not (w in seen or seen.add(w))]


Better = Literal["lower", "higher", "none"]


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str   # ms, count, ratio, req/s, tok/s, s
    value: float | int | None
    better: Better


def headline(m: RunMetrics) -> list[Row]:
    """The comparable metrics, in report order, each with the direction that counts as better."""
    t, rows = m.throughput, []
    rows += [
        Row("completed", "Completed requests", "count", t["completed"], "higher"),
        Row("rejected", "Rejected requests", "count", t["rejected"], "lower"),
        Row("unfinished", "Unfinished requests", "count", t["unfinished"], "lower"),
        Row("duration_s", "Duration", "s", t["duration_s"], "none"),
        Row("request_throughput", "Request throughput", "req/s", t["request_throughput"], "higher"),
        Row("output_throughput", "Output token throughput", "tok/s", t["output_throughput"], "higher"),
        Row("total_token_throughput", "Total token throughput", "tok/s", t["total_token_throughput"], "higher"),
    ]
    if m.goodput is not None:
        rows += [
            Row("goodput", "Request goodput", "req/s", m.goodput["goodput"], "higher"),
            Row("good_fraction", "Requests meeting the SLO", "ratio", m.goodput["good_fraction"], "higher"),
        ]
    for key, label in LATENCIES.items():
        d = m.dists[key]
        rows.append(Row(f"{key}_mean", f"Mean {label}", "ms", d.mean, "lower"))
        for p in SUMMARY_PERCENTILES:
            rows.append(Row(f"{key}_p{p}", f"P{p} {label}", "ms", d.percentiles[p], "lower"))
        rows.append(Row(f"{key}_max", f"Max {label}", "ms", d.max, "lower"))
    r = m.reuse
    rows += [
        Row("preemptions", "Preemptions", "count", m.preemptions["preemptions"], "lower"),
        Row("preempted_requests", "Preempted requests", "count", m.preemptions["preempted_requests"], "lower"),
        Row("gpu_hit_ratio", "GPU prefix hit ratio", "ratio", r["gpu_hit_ratio"], "higher"),
        Row("cpu_hit_ratio", "CPU (G2) hit ratio", "ratio", r["cpu_hit_ratio"], "higher"),
        Row("total_hit_ratio", "Total prefix hit ratio", "ratio", r["total_hit_ratio"], "higher"),
    ]
    if m.ideal is not None:
        rows.append(Row("ideal_hit_ratio", "Ideal hit ratio (infinite cache)", "ratio", m.ideal["ideal_hit_ratio"], "none"))
    s = m.steps
    rows += [
        Row("kv_usage_mean", "Mean KV usage", "ratio", s["kv_usage_mean"], "none"),
        Row("kv_usage_max", "Peak KV usage", "ratio", s["kv_usage_max"], "none"),
        Row("waiting_mean", "Mean queue depth", "count", s["waiting_mean"], "lower"),
        Row("waiting_max", "Peak queue depth", "count", s["waiting_max"], "lower"),
    ]
    if m.mtp["draft_tokens"]:
        rows += [
            Row("acceptance_rate", "MTP acceptance rate", "ratio", m.mtp["acceptance_rate"], "higher"),
            Row("mean_acceptance_length", "MTP mean acceptance length", "count", m.mtp["mean_acceptance_length"], "higher"),
        ]
    return rows
