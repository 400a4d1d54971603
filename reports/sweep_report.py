"""``replay report SWEEPDIR``: the sweep as markdown with charts.

Sections: the configs ranked by goodput per GPU (output throughput per GPU without an SLO), the best
config per SLO constraint and for all of them together, a plan's answers when the directory holds
one, the failed configs, a Pareto chart (p99 TTFT against output throughput per GPU) and a chart per
varied key. Every number comes from sweep.parquet through the ``sweep_*.sql`` queries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.base.atomic import atomic_dir, write_text_atomic
from replay.reports.fmt import DASH, md_table, num
from replay.reports.plotting import COLORS, SIZE, plt, save_figure
from replay.reports.report_files import charts_dir_for
from replay.reports.sqlfiles import sql
from replay.reports.sweep_pd import DECODE_KEY, PREFILL_KEY, pd_grid, pd_grid_lines, pd_heatmap_chart
from replay.reports.sweep_views import Sweep, open_sweep

TABLE_ROWS = 40          # ranked rows shown in the markdown (all are in sweep.parquet)
MAX_LINES = 8            # per-key chart: lines (combinations of the other keys) drawn in colour
_IDENT = re.compile(r"^[a-z0-9_]+$")
_SHOWN = (("gpus", "GPUs", "count"), ("goodput_per_gpu", "goodput/GPU (req/s)", "req/s"),
          ("output_throughput_per_gpu", "output tok/s per GPU", "tok/s"), ("ttft_p99", "p99 TTFT (ms)", "ms"),
          ("tpot_p99", "p99 TPOT (ms)", "ms"), ("good_fraction", "SLO attainment", "pct"),
          ("gpu_hit_ratio", "GPU prefix hit", "ratio"), ("preemptions", "preemptions", "count"),
          ("slo_met", "SLO met", ""))


@dataclass
class SweepReportResult:
    markdown: Path
    charts: dict[str, Path]
    rows: int


def _records(sweep: Sweep, query: str) -> list[dict[str, Any]]:
    cur = sweep.con.execute(query)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _cell(value: Any, unit: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return num(value, unit) if value is not None else DASH


def _label(row: dict[str, Any], axes: list[str]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in axes) or row["config_hash"]


def ranked_rows(sweep: Sweep) -> list[dict[str, Any]]:
    return _records(sweep, sql("sweep_table"))


def best_per_slo(sweep: Sweep) -> list[tuple[str, dict[str, Any] | None]]:
    """(condition label, best row) for each SLO constraint alone and for all together."""
    constraints: dict[str, float] = sweep.info.get("slo_constraints") or {}
    conditions = []
    for key, limit in constraints.items():
        if not _IDENT.match(key):  # column names only; sweep.json is ours, but never paste text into SQL
            continue
        conditions.append((f"{key} <= {limit:g} ms", f"{key} <= {float(limit)!r}"))
    if len(conditions) > 1 or not conditions:
        conditions.append(("every constraint" if conditions else "no SLO (best throughput per GPU)",
                           "slo_met" if conditions else "true"))
    out = []
    for label, cond in conditions:
        rows = _records(sweep, sql("sweep_best").format(condition=cond))
        out.append((label, rows[0] if rows else None))
    return out


def pareto_chart(path: Path, points: list[dict[str, Any]]) -> Path:
    fig, ax = plt.subplots(figsize=SIZE)
    other = [p for p in points if not p["on_front"]]
    front = [p for p in points if p["on_front"]]
    ax.scatter([p["ttft_p99"] for p in other], [p["output_throughput_per_gpu"] for p in other],
               color="grey", alpha=0.6, s=18, label="config")
    ax.plot([p["ttft_p99"] for p in front], [p["output_throughput_per_gpu"] for p in front],
            color=COLORS[3], marker="o", lw=1.5, label="Pareto front")
    xs = [p["ttft_p99"] for p in points if p["ttft_p99"] and p["ttft_p99"] > 0]
    if xs and max(xs) / min(xs) > 50:
        ax.set_xscale("log")
    ax.set_xlabel("p99 TTFT (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("Throughput per GPU against p99 TTFT (each point a config)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    return save_figure(fig, path)


def key_chart(path: Path, rows: list[dict[str, Any]], key: str, axes: list[str], rank: str) -> Path:
    """``rank`` and p99 TTFT against one varied key, one line per combination of the other keys."""
    others = [a for a in axes if a != key]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["error"] is None:
            groups.setdefault(_label(r, others) or "all", []).append(r)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8.0, 6.4), sharex=True)
    numeric = all(isinstance(r[key], int | float) for g in groups.values() for r in g)
    for i, (label, g) in enumerate(sorted(groups.items())):
        g = sorted(g, key=lambda r: r[key] if numeric else str(r[key]))
        xs = [r[key] if numeric else str(r[key]) for r in g]
        style = {"color": COLORS[i % len(COLORS)], "marker": "o", "label": label} if i < MAX_LINES else \
            {"color": "lightgrey", "marker": ".", "label": None}
        ax1.plot(xs, [r[rank] for r in g], **style)
        ax2.plot(xs, [r["ttft_p99"] for r in g], **style)
    ax1.set_ylabel(rank.replace("_", " "))
    ax1.set_title(f"{rank.replace('_', ' ')} and p99 TTFT against {key}")
    ax2.set_ylabel("p99 TTFT (ms)")
    ax2.set_xlabel(key)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    if others and groups:
        ax1.legend(fontsize=8, loc="best")
    return save_figure(fig, path)



def _chart_name(key: str) -> str:
    return "by_" + re.sub(r"[^A-Za-z0-9_]+", "_", key)


def varied_axes(sweep: Sweep, rows: list[dict[str, Any]]) -> list[str]:
    """The grid keys that take more than one value among the rows (a one-value key is a setting)."""
    return [a for a in sweep.axes if len({repr(r[a]) for r in rows}) > 1]


def render(sweep: Sweep, rows: list[dict[str, Any]], best, plan_rows, charts: dict[str, str]) -> str:
    info, axes = sweep.info, varied_axes(sweep, rows)
    fixed = [a for a in sweep.axes if a not in axes]
    rank = "goodput per GPU" if any(r["goodput_per_gpu"] is not None for r in rows) else "output throughput per GPU"
    failed = [r for r in rows if r["error"] is not None]
    out = [f"# Sweep report: {sweep.root}", "",
           f"- Trace: `{info['trace']['path']}` (fingerprint `{info['trace']['fingerprint'][:16]}`)",
           f"- Base config: `{info.get('base_config_source')}`; varied: "
           + (", ".join(f"`{a}`" for a in axes) or "nothing"),
           *(["- Set by the grid to one value: " + ", ".join(f"`{a}={rows[0][a]}`" for a in fixed)]
             if fixed and rows else []),
           f"- SLO: {info.get('slo') or 'none'}",
           f"- {len(rows)} configs, {len(failed)} failed; GPUs = replicas x tensor_parallel_size "
           "(a disaggregated fleet: summed over both pools)", ""]
    header = [*(a for a in axes), *(label for _, label, _ in _SHOWN)]
    table = [[*(str(r[a]) for a in axes), *(_cell(r[k], u) for k, _, u in _SHOWN)]
             for r in rows if r["error"] is None][:TABLE_ROWS]
    out += [f"## Configs ranked by {rank}", "", md_table(header, table, "r" * len(header)), ""]
    if len(rows) - len(failed) > TABLE_ROWS:
        out += [f"{len(rows) - len(failed) - TABLE_ROWS} more in `sweep.parquet`.", ""]
    grid = pd_grid(rows, axes, "goodput_per_gpu" if rank == "goodput per GPU" else "output_throughput_per_gpu")
    if grid is not None:
        others_vary = any(a not in (PREFILL_KEY, DECODE_KEY) for a in axes)
        out += pd_grid_lines(grid, "req/s" if rank == "goodput per GPU" else "tok/s", others_vary)
    out += ["## Best config per SLO", ""]
    best_rows = [[label, DASH if r is None else _label(r, axes), DASH if r is None else _cell(r["gpus"], "count"),
                  DASH if r is None else _cell(r["goodput_per_gpu"], "req/s"),
                  DASH if r is None else _cell(r["output_throughput_per_gpu"], "tok/s"),
                  DASH if r is None else (r["outdir"] or DASH)] for label, r in best]
    out += [md_table(["condition", "best config", "GPUs", "goodput/GPU", "tok/s per GPU", "run"], best_rows), ""]
    if plan_rows:
        cols = [c for c in plan_rows[0] if c != "violations"]
        out += ["## Plan: fewest GPUs meeting the SLO", "",
                md_table(cols, [[_cell(r[c], "") for c in cols] for r in plan_rows], "r" * len(cols)), ""]
        for r in plan_rows:
            if r.get("violations"):
                out.append(f"- not monotone: {r['violations']}")
        out.append("")
    if failed:
        out += ["## Failed configs", ""]
        out += [f"- {_label(r, axes)}: {r['error'].splitlines()[0][:300]}" for r in failed] + [""]
    if charts:
        out += ["## Charts", ""] + [f"![{name}]({rel})" for name, rel in charts.items()] + [""]
    out += [f"_Notes_: {n}" for n in sweep.notes]
    return "\n".join(out).rstrip() + "\n"


def write_sweep_report(root: str | Path, markdown: str | Path, *, charts: bool = True) -> SweepReportResult:
    root, markdown = Path(root), Path(markdown)
    sweep = open_sweep(root)
    try:
        rows = ranked_rows(sweep)
        best = best_per_slo(sweep)
        pareto = _records(sweep, sql("sweep_pareto"))
        plan_rows = _records(sweep, "SELECT * FROM plan") if sweep.has_plan else []
    finally:
        sweep.con.close()
    rank = "goodput_per_gpu" if any(r["goodput_per_gpu"] is not None for r in rows) else "output_throughput_per_gpu"
    made: dict[str, Path] = {}
    rel: dict[str, str] = {}
    if charts:
        final_dir = charts_dir_for(markdown)
        with atomic_dir(final_dir) as tmp:
            if pareto:
                made["pareto"] = pareto_chart(tmp / "pareto.png", pareto)
            axes = varied_axes(sweep, rows)
            for key in axes:
                made[_chart_name(key)] = key_chart(tmp / f"{_chart_name(key)}.png", rows, key, axes, rank)
            grid = pd_grid(rows, axes, rank)
            if grid is not None:
                made["pd_heatmap"] = pd_heatmap_chart(tmp / "pd_heatmap.png", grid)
        rel = {k: f"{final_dir.name}/{p.name}" for k, p in made.items()}
        made = {k: final_dir / p.name for k, p in made.items()}
    write_text_atomic(markdown, render(sweep, rows, best, plan_rows, rel))
    return SweepReportResult(markdown=markdown, charts=made, rows=len(rows))
