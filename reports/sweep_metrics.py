"""The headline metrics of one run without the chart data: what a sweep row needs, from the same
``.sql`` files as ``replay.reports.metrics.compute``.

A sweep summarizes every run it makes, so it skips the CDF histograms, the over-time series and the
infinite-cache ideal (charts and warnings of one run, not comparable columns); what it keeps is
computed by exactly the queries the report uses, so a sweep row equals ``replay report --json`` of
that run.
"""

from __future__ import annotations

from replay.reports.metrics import LATENCIES, PROBS, RunMetrics, dist_from_row, itl_row, query_one_row
from replay.reports.slo import Slo
from replay.reports.views import Run


def summary_metrics(run: Run, slo: Slo | None = None) -> RunMetrics:
    """A RunMetrics whose headline() rows are complete; cdf, over-time and ideal fields are empty."""
    probs = list(PROBS)
    lat = query_one_row(run, "latency", probs=probs)
    itl, _ = itl_row(run, histograms=False)
    goodput = None
    if slo is not None and not slo.empty:
        goodput = query_one_row(run, "goodput", ttft=slo.ttft, tpot=slo.tpot, e2e=slo.e2e)
    return RunMetrics(
        dists={k: dist_from_row(itl if k == "itl" else lat, k, []) for k in LATENCIES},
        throughput=query_one_row(run, "throughput"),
        goodput=goodput,
        slo=slo.as_dict() if slo is not None else {},
        preemptions=query_one_row(run, "preemptions"),
        reuse=query_one_row(run, "reuse"),
        ideal=None,
        reuse_by_turn=[],
        mtp=query_one_row(run, "mtp"),
        steps=query_one_row(run, "steps_summary"),
        bucket_ms=0.0,
        steps_over_time=[],
        latency_over_time=[],
        keeping_up={},
        status=[],
    )
