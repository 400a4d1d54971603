"""One row of summary metrics per run, from the same SQL as `replay report` (replay.reports.metrics).

The column set is fixed (``METRIC_COLUMNS``) so every row of a sweep has the same schema whatever the
run produced; a metric a run does not have (MTP acceptance without MTP, goodput without an SLO) is null.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.base.duckdb_conn import connect
from replay.reports.metrics import LATENCIES, SUMMARY_PERCENTILES, headline
from replay.reports.sweep_metrics import summary_metrics
from replay.reports.views import open_run
from replay.sweep.slo import SweepSlo

_COUNTS = ["completed", "rejected", "unfinished", "preemptions", "preempted_requests"]
_FLOATS = ["duration_s", "request_throughput", "output_throughput", "total_token_throughput", "goodput",
           "good_fraction", "gpu_hit_ratio", "cpu_hit_ratio", "total_hit_ratio", "kv_usage_mean",
           "kv_usage_max", "waiting_mean", "waiting_max", "acceptance_rate", "mean_acceptance_length"]
_LATENCY = [f"{k}_{s}" for k in LATENCIES for s in ("mean", *(f"p{p}" for p in SUMMARY_PERCENTILES), "max")]
# Derived per sweep row: GPUs = replicas x tensor_parallel_size, and the per-GPU rates plans rank by.
DERIVED = ["gpus", "output_throughput_per_gpu", "goodput_per_gpu", "slo_met"]
METRIC_COLUMNS: dict[str, str] = {**dict.fromkeys(_COUNTS, "int"), **dict.fromkeys(_FLOATS + _LATENCY, "float"),
                                  "gpus": "int", "output_throughput_per_gpu": "float",
                                  "goodput_per_gpu": "float", "slo_met": "bool"}


def gpus_used(config: dict[str, Any]) -> int:
    """GPUs of a dumped config, so it holds before and after the fleet exists: replicas (``fleet.replicas``,
    1 without a fleet section) x tensor_parallel_size; a fleet of pools (e.g. ``fleet.prefill`` and
    ``fleet.decode``, each a mapping with its own ``replicas``) counts every pool's replicas, each at
    its own ``tensor_parallel_size`` when it sets one. An autoscaled fleet or pool counts its
    ``max_replicas``: the GPUs it must be able to hold (its start size undercounted it, so per-GPU
    figures ranked autoscaled configs first)."""
    tp = int(config.get("tensor_parallel_size") or 1)
    fleet = config.get("fleet") or {}
    if not isinstance(fleet, dict):
        return tp
    pools = [p for p in fleet.values() if isinstance(p, dict) and "replicas" in p]
    if pools:
        return sum(_replicas(p, 0) * int(p.get("tensor_parallel_size") or tp) for p in pools)
    return _replicas(fleet, 1) * tp


def _replicas(section: dict[str, Any], default: int) -> int:
    auto = section.get("autoscale")
    if isinstance(auto, dict) and auto.get("max_replicas"):
        return int(auto["max_replicas"])
    return int(section.get("replicas", default) or default)


def summarize(outdir: str | Path, config: dict[str, Any], slo: SweepSlo) -> dict[str, Any]:
    """The summary metrics of one finished run directory."""
    con = connect(threads=1)  # one thread: same float sums every time, no oversubscription
    try:
        run = open_run(outdir, con)
        rows = {r.key: r.value for r in headline(summary_metrics(run, slo.goodput))}
    finally:
        con.close()
    row: dict[str, Any] = {}
    for key, kind in METRIC_COLUMNS.items():
        if key in DERIVED:
            continue
        value = rows.get(key)
        row[key] = None if value is None else int(value) if kind == "int" else float(value)
    gpus = gpus_used(config)
    row["gpus"] = gpus
    row["output_throughput_per_gpu"] = None if row["output_throughput"] is None else row["output_throughput"] / gpus
    row["goodput_per_gpu"] = None if row["goodput"] is None else row["goodput"] / gpus
    row["slo_met"] = slo.met(row)
    return row
