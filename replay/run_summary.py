"""The table `replay run` prints at the end: the headline metrics, computed by the reports layer."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_SHOWN_LATENCY = ("ttft", "itl", "tpot", "e2e")
_SHOWN_PCTS = ("mean", "p50", "p90", "p99")
_SHOWN_OTHER = ("completed", "rejected", "unfinished", "request_throughput", "output_throughput",
                "gpu_hit_ratio", "cpu_hit_ratio", "preemptions")


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value:.4f}"
    if unit == "count":
        return f"{int(value):,}"
    return f"{value:,.2f}"


def print_run_summary(outdir: Path, info: dict, wall_s: float, console: Console) -> None:
    from replay.reports.metrics import compute, headline
    from replay.reports.views import open_run

    run = open_run(outdir)
    try:
        metrics = compute(run)
        rows = {row.key: row for row in headline(metrics)}
    finally:
        run.con.close()
    unknown = metrics.reuse.get("unknown")
    replayed = info["trace"].get("replayed_rows", info["trace"]["rows"])
    lat = Table(title=escape(f"Replay of {replayed:,} requests ({info['config']['model']}, "
                             f"{info['config']['hardware']}) -> {outdir}"), title_justify="left")
    lat.add_column("latency (ms)")
    for p in _SHOWN_PCTS:
        lat.add_column(p, justify="right")
    for key in _SHOWN_LATENCY:
        cells = [_fmt(rows[f"{key}_{p}"].value, "ms") if f"{key}_{p}" in rows else "-" for p in _SHOWN_PCTS]
        lat.add_row(key.upper(), *cells)
    console.print(lat)
    other = Table(show_header=False, box=None)
    for key in _SHOWN_OTHER:
        if key in rows:
            row = rows[key]
            if unknown and key.endswith("hit_ratio"):
                other.add_row(row.label, f"unknown ({unknown})", "")
                continue
            other.add_row(row.label, _fmt(row.value, row.unit), row.unit if row.unit not in ("count", "ratio") else "")
    fleet = metrics.fleet
    pools = metrics.disagg["pools"] if metrics.disagg is not None else None
    if pools is not None:
        config = (info.get("config") or {}).get("fleet") or {}
        other.add_row("Prefill pool", f"{pools['prefill']['replicas']} x {escape(str(config.get('prefill_router')))}",
                      f"replicas x router, {pools['prefill']['utilization']:.1%} busy")
        other.add_row("Decode pool", f"{pools['decode']['replicas']} x {escape(str(config.get('router')))}",
                      f"replicas x router, {pools['decode']['utilization']:.1%} busy")
        other.add_row("KV read", f"{pools['kv_transfer']['bytes'] / 1e9:,.2f}", "GB")
    elif fleet is not None:
        other.add_row("Fleet", f"{fleet['replicas']} x {escape(str(fleet['router']))}", "replicas x router")
        if fleet["busy_imbalance"] is not None:
            other.add_row("Load imbalance", f"{fleet['busy_imbalance']:.3f}", "max / mean busy")
    other.add_row("Simulated span", f"{info['simulated_span_ms'] / 1000:,.1f}", "s")
    other.add_row("Wall time", f"{wall_s:,.2f}", "s")
    core = info.get("engine_core", "python")
    other.add_row("Engine core", core, "mypyc-compiled hot loop" if core == "compiled" else "pure Python")
    console.print(other)
    if core == "python":
        from replay.engine.native import stale_build

        if stale_build():
            console.print("[yellow]note:[/] the compiled engine core is older than the sources, so the "
                          "slower pure-Python core ran; reinstall to rebuild it: pip install -e .",
                          highlight=False)
    for w in info.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(str(w))}", highlight=False)
