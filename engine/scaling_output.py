"""What an autoscaled or admission-controlled replay writes: scaling.parquet and run.json's sections.

``scaling.parquet`` has one row per autoscaler decision (engine/fleet_scaling.py, ``ScalingRow``):
the replicas live, starting and draining, the count the autoscaler asked for, and the interval's
arrivals, refusals, waiting and running requests and KV usage. Written only when ``fleet.autoscale``
is set, so a fixed fleet's output directory is unchanged. ``cost`` (every run) gives GPU-hours: a
replica holds ``tensor_parallel_size`` GPUs from its start to its end (a fixed fleet: the whole
replay), priced at ``fleet.gpu_cost_per_hour`` when given.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.engine.admission import Admission
from replay.engine.config import EngineConfig
from replay.engine.fleet_scaling import FleetScaler, ScalingRow
from replay.engine.output_schema import parquet_write_options

SCALING_FILE = "scaling.parquet"
_MS_PER_HOUR = 3_600_000.0

SCALING_SCHEMA = pa.schema([
    ("time_ms", pa.float64()),
    ("live", pa.int32()),
    ("provisioning", pa.int32()),
    ("draining", pa.int32()),
    ("desired", pa.int32()),
    ("arrivals", pa.int64()),
    ("rejected", pa.int64()),
    ("waiting", pa.int64()),
    ("running", pa.int64()),
    ("kv_usage", pa.float64()),
    ("predicted_rate", pa.float64()),
    ("pool", pa.string()),  # a disaggregated fleet's pool; null for an aggregated fleet
])
assert [f.name for f in fields(ScalingRow)] == SCALING_SCHEMA.names


def write_scaling(rows: list[ScalingRow], outdir: Path) -> None:
    columns = {name: [getattr(r, name) for r in rows] for name in SCALING_SCHEMA.names}
    table = pa.Table.from_pydict(columns, schema=SCALING_SCHEMA)
    pq.write_table(table, outdir / SCALING_FILE, **parquet_write_options(SCALING_SCHEMA))


def cost_summary(config: EngineConfig, replica_ms: float, gpu_ms: float, span_ms: float) -> dict:
    """run.json's ``cost``: GPU-hours held over the replay and their price (``gpu_ms``: replica
    time by the GPUs of each replica, which differ by pool in a disaggregated fleet)."""
    tp = config.tensor_parallel_size
    gpu_hours = gpu_ms / _MS_PER_HOUR
    price = config.fleet.gpu_cost_per_hour if config.fleet is not None else None
    return {
        "gpu_hours": gpu_hours,
        "replica_hours": replica_ms / _MS_PER_HOUR,
        "mean_replicas": replica_ms / span_ms if span_ms > 0 else None,
        "gpus_per_replica": tp if gpu_ms == replica_ms * tp else None,  # None: pools differ
        "gpu_cost_per_hour": price,
        "cost": gpu_hours * price if price is not None else None,
    }


@dataclass(frozen=True)
class PoolBill:
    """What one pool of a disaggregated fleet held: replica time, GPUs per replica, its price."""

    name: str
    replica_ms: float
    gpus_per_replica: int
    gpu_cost_per_hour: float | None  # the pool's, else the fleet's, else None


def pd_cost_summary(bills: list[PoolBill], span_ms: float) -> dict:
    """run.json's ``cost`` for a disaggregated fleet: the totals, and each pool's under ``pools``.
    The total cost is the pools' sum, known when every pool has a price."""
    pools = {}
    for b in bills:
        gpu_hours = b.replica_ms * b.gpus_per_replica / _MS_PER_HOUR
        pools[b.name] = {
            "gpu_hours": gpu_hours,
            "replica_hours": b.replica_ms / _MS_PER_HOUR,
            "mean_replicas": b.replica_ms / span_ms if span_ms > 0 else None,
            "gpus_per_replica": b.gpus_per_replica,
            "gpu_cost_per_hour": b.gpu_cost_per_hour,
            "cost": gpu_hours * b.gpu_cost_per_hour if b.gpu_cost_per_hour is not None else None,
        }
    replica_ms = sum(b.replica_ms for b in bills)
    gpu_ms = sum(b.replica_ms * b.gpus_per_replica for b in bills)
    tps = {b.gpus_per_replica for b in bills}
    prices = {b.gpu_cost_per_hour for b in bills}
    costs = [p["cost"] for p in pools.values()]
    return {
        "gpu_hours": gpu_ms / _MS_PER_HOUR,
        "replica_hours": replica_ms / _MS_PER_HOUR,
        "mean_replicas": replica_ms / span_ms if span_ms > 0 else None,
        "gpus_per_replica": tps.pop() if len(tps) == 1 else None,  # None: pools differ
        "gpu_cost_per_hour": prices.pop() if len(prices) == 1 else None,  # None: pools differ (or none given)
        "cost": sum(costs) if all(c is not None for c in costs) else None,
        "pools": pools,
    }


def scaling_summary(scaler: FleetScaler | None, admission: Admission | None, end_ms: float) -> dict:
    """run.json's ``scaling``: each replica's life, the decisions' extremes, the refusals by reason."""
    out: dict = {}
    if scaler is not None:
        rows = scaler.rows
        out["decisions"] = len(rows)
        out["max_live"] = max((r.live for r in rows), default=None)
        out["min_live"] = min((r.live for r in rows), default=None)
        lives = []
        for life in scaler.lives:
            d = {f.name: getattr(life, f.name) for f in fields(life) if f.name != "core"}
            d["hours"] = ((life.ended_ms if life.ended_ms is not None else end_ms) - life.started_ms) / _MS_PER_HOUR
            lives.append(d)
        out["replicas"] = lives
    if admission is not None:
        out["refused"] = dict(sorted(admission.num_refused.items()))
    return out
