"""A plan's files: ``plan.parquet`` (one answer row per combination) and ``sweep.parquet`` (every run
the bisection made), so `replay report` and `replay sql` read a plan directory like a sweep's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from replay.sweep.grid import Axis
from replay.sweep.plan import PlanOutcome
from replay.sweep.runner import SweepSession
from replay.sweep.table import write_table

PLAN_FILE = "plan.parquet"


def write_plan(session: SweepSession, axes: list[Axis], outcome: PlanOutcome,
               rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    plan_path = session.sweepdir / PLAN_FILE
    write_table(pa.Table.from_pylist(rows), plan_path)
    return plan_path, session.write_table(axes, outcome.results)
