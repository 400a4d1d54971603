"""Open a sweep directory as DuckDB views: ``sweep`` (sweep.parquet, one row per config), ``plan``
(plan.parquet, when `replay plan` made the directory) and, across every run that kept its outdir,
``requests`` and ``steps`` with a ``config`` column (the run's ``config_hash`` in ``sweep``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from replay.base.duckdb_conn import connect, sql_literal
from replay.base.errors import ReplayError
from replay.base.structured import parse_json
from replay.engine.output_schema import REQUESTS_FILE, STEPS_FILE
from replay.reports.sqlfiles import sql

SWEEP_FILE = "sweep.json"      # the names replay.sweep.store writes (reports does not import replay.sweep)
TABLE_FILE = "sweep.parquet"
PLAN_FILE = "plan.parquet"     # written by `replay plan` only
FIRST_METRIC = "completed"     # sweep.parquet: the grid keys, then the metrics from this column on
TAIL_COLUMNS = ("config_hash", "outdir", "error")  # sweep.parquet's last columns (replay/sweep/table.py)
CROSS_RUN_VIEWS = {"requests": REQUESTS_FILE, "steps": STEPS_FILE}


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


@dataclass
class Sweep:
    root: Path
    info: dict[str, Any]                  # sweep.json
    con: duckdb.DuckDBPyConnection
    axes: list[str]                       # the grid keys, in grid order (plan: the other keys, then --vary)
    has_plan: bool                        # the `plan` view exists
    notes: list[str] = field(default_factory=list)
    trace_path: Path | None = None        # no `trace` view: what `replay sql` may read is the sweep dir only

    @property
    def outdir(self) -> Path:
        """The directory `replay sql`'s read-only lock-down (replay.reports.adhoc) confines queries to."""
        return self.root



def open_sweep(root: str | Path, con: duckdb.DuckDBPyConnection | None = None) -> Sweep:
    root = Path(root)
    try:
        info = parse_json((root / SWEEP_FILE).read_bytes(), f"{root / SWEEP_FILE}: cannot read the sweep definition")
    except OSError as exc:
        raise ReplayError(f"{root / SWEEP_FILE}: cannot read the sweep definition: {exc.strerror}") from None
    if not isinstance(info, dict):
        raise ReplayError(f"{root / SWEEP_FILE}: expected a JSON object (a damaged sweep definition)")
    table = root / TABLE_FILE
    if not table.is_file():
        raise ReplayError(f"{root}: no {TABLE_FILE} yet (the sweep has not finished: rerun `replay sweep` "
                          "with the same arguments to complete it)")
    con = con if con is not None else connect()
    try:
        con.execute(f"CREATE OR REPLACE VIEW sweep AS SELECT * FROM read_parquet({sql_literal(str(table.resolve()))})")
    except duckdb.Error as exc:
        raise ReplayError(f"{table}: damaged Parquet file, cannot read it ({' '.join(str(exc).split())})") from None
    names = [r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE sweep)").fetchall()]
    missing = [c for c in (FIRST_METRIC, *TAIL_COLUMNS) if c not in names]
    if missing:
        raise ReplayError(f"{table}: not a sweep table (column '{missing[0]}' missing); rerun `replay sweep` "
                          "with the same arguments to rebuild it")
    axes = names[:names.index(FIRST_METRIC)] if FIRST_METRIC in names else []  # always the table's own
    has_plan = (root / PLAN_FILE).is_file() and info.get("command") == "plan"  # not a stale plan under a later sweep
    if has_plan:
        con.execute(f"CREATE OR REPLACE VIEW plan AS SELECT * FROM read_parquet({sql_literal(str((root / PLAN_FILE).resolve()))})")
    runs = con.execute("SELECT config_hash, outdir FROM sweep WHERE outdir IS NOT NULL AND error IS NULL "
                       "ORDER BY config_hash").fetchall()
    notes: list[str] = []
    con.execute("CREATE OR REPLACE TEMP TABLE sweep_files (kind VARCHAR, config VARCHAR, path VARCHAR)")
    seen: set[str] = set()
    files: dict[str, list[str]] = {k: [] for k in CROSS_RUN_VIEWS}
    for config, outdir in runs:
        for kind, filename in CROSS_RUN_VIEWS.items():
            path = (root / outdir / filename).resolve()
            if path.is_file() and str(path) not in seen:
                seen.add(str(path))
                files[kind].append(str(path))
                con.execute("INSERT INTO sweep_files VALUES (?, ?, ?)", [kind, config, str(path)])
    for kind, paths in files.items():
        if not paths:
            notes.append(f"no run outdirs (a --summary-only sweep?): the `{kind}` view is unavailable")
            continue
        listed = "[" + ", ".join(sql_literal(p) for p in paths) + "]"
        con.execute(sql("sweep_run_view").format(name=kind, paths=listed))
    return Sweep(root=root, info=info, con=con, axes=axes, has_plan=has_plan, notes=notes)
