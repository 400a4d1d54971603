"""The fleet section of a report: per-replica table, load imbalance, reuse against two ideals,
and per-replica load over time. Present only for runs with a ``fleet`` config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.reports.fmt import num
from replay.reports.plotting import COLORS, SIZE, plt, save_figure, time_axis
from replay.reports.sqlfiles import sql
from replay.reports.views import Run

_LINES_UP_TO = 8  # replicas drawn as lines; more as a heatmap


def fleet_metrics(run: Run, bucket_ms: float, ideal_available: bool) -> dict[str, Any] | None:
    fleet_info = run.info.get("fleet")
    if not fleet_info:
        return None
    con = run.con
    cur = con.execute(sql("fleet_replicas"))
    cols = [d[0] for d in cur.description]
    replicas = [dict(zip(cols, row)) for row in cur.fetchall()]
    busy = [r["busy_ms"] or 0.0 for r in replicas]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    load = con.execute(sql("fleet_load_over_time"), {"bucket_ms": bucket_ms}).fetchall()
    routed_ideal = None
    if ideal_available:
        cur = con.execute(sql("fleet_ideal"))
        routed_ideal = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    config = (run.info.get("config") or {}).get("fleet") or {}
    return {
        "replicas": int(fleet_info.get("replicas", len(replicas))),
        "router": config.get("router"),
        "router_options": config.get("router_options") or {},
        "router_latency_ms": config.get("router_latency_ms", 0.0),
        "per_replica": replicas,
        "busy_imbalance": max(busy) / mean_busy if mean_busy > 0 else None,
        "routed_ideal": routed_ideal,
        "load_over_time": [{"replica": r, "bucket": b, "busy_fraction": f} for r, b, f in load],
    }


def fleet_section(f: dict[str, Any], reuse: dict[str, Any], ideal: dict[str, Any] | None,
                  chart: str | None) -> list[str]:
    opts = ", ".join(f"{k}={v}" for k, v in sorted(f["router_options"].items())) or "defaults"
    lines = ["## Fleet", "",
             f"{f['replicas']} replicas behind the `{f['router']}` router ({opts}); router latency "
             f"{num(f['router_latency_ms'], 'ms')} ms.", "",
             "| replica | requests | finished | steps | busy (s) | busy % | KV usage (mean / max) | GPU prefix hit "
             "| TTFT p50 (ms) | TTFT p99 (ms) | preemptions |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in f["per_replica"]:
        kv = (f"{num(r['kv_usage_mean'], 'pct')} / {num(r['kv_usage_max'], 'pct')}"
              if r["kv_usage_mean"] is not None else "-")
        lines.append(f"| {r['replica']} | {num(r['requests'], 'count')} | {num(r['finished'], 'count')} | "
                     f"{num(r['steps'], 'count')} | {num((r['busy_ms'] or 0) / 1000, 's')} | "
                     f"{num(r['busy_fraction'], 'pct')} | {kv} | {num(r['gpu_hit_ratio'], 'pct')} | "
                     f"{num(r['ttft_p50'], 'ms')} | {num(r['ttft_p99'], 'ms')} | {num(r['preemptions'], 'count')} |")
    imb = f["busy_imbalance"]
    lines += ["", f"Load imbalance (max / mean busy time): {imb:.3f} (1.000 is perfectly even)." if imb is not None
              else "Load imbalance: no steps ran.", ""]
    routed = f["routed_ideal"]
    reuse_line = f"Prefix reuse: the fleet hit {num(reuse.get('gpu_hit_ratio'), 'pct')} of prompt tokens on GPU"
    if routed is not None and ideal is not None:
        reuse_line += (f"; an infinite cache on every replica, with this routing, would hit "
                       f"{num(routed['routed_ideal_hit_ratio'], 'pct')}; one infinite cache for the whole trace "
                       f"(the trace's ideal) {num(ideal.get('ideal_hit_ratio'), 'pct')}. The first gap is "
                       "eviction, the second is what routing splits apart.")
    else:
        reuse_line += "; the ideals are unknown (the trace has no prefix ids or cannot be found)."
    lines += [reuse_line, ""]
    if chart:
        lines += [f"![Per-replica load over time]({chart})", ""]
    return lines


def fleet_load_chart(path: Path, f: dict[str, Any], bucket_ms: float) -> Path:
    rows = f["load_over_time"]
    n = f["replicas"]
    buckets = max((r["bucket"] for r in rows), default=0) + 1
    grid = [[0.0] * buckets for _ in range(n)]
    for r in rows:
        grid[r["replica"]][r["bucket"]] = r["busy_fraction"]
    scale, unit = time_axis(buckets * bucket_ms)
    fig, ax = plt.subplots(figsize=SIZE)
    if n <= _LINES_UP_TO:
        t = [(b + 0.5) * bucket_ms / scale for b in range(buckets)]
        for i in range(n):
            ax.plot(t, grid[i], color=COLORS[i % len(COLORS)], ls="-" if i < len(COLORS) else "--",
                    label=f"replica {i}", lw=1.2)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("busy fraction of the bucket")
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        ax.grid(True, alpha=0.3)
    else:
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", vmin=0, vmax=1, cmap="viridis",
                       extent=(0, buckets * bucket_ms / scale, n - 0.5, -0.5))
        fig.colorbar(im, ax=ax, label="busy fraction of the bucket")
        ax.set_ylabel("replica")
    ax.set_xlabel(f"time since trace start ({unit}); bucket {bucket_ms / 1000:g} s")
    ax.set_title("Per-replica load over time")
    return save_figure(fig, path)


def _shape(info: dict[str, Any], m) -> dict[str, Any]:
    config = info.get("config") or {}
    fleet = config.get("fleet") or {}
    replicas = int(fleet.get("replicas", 1))
    tp = int(config.get("tensor_parallel_size", 1))
    gpus = replicas * tp
    pools = info.get("pools")
    shape = "aggregated"
    if pools:  # a disaggregated fleet: its prefill and decode pools (reports/disagg.py)
        p, d = pools["prefill"], pools["decode"]
        replicas = p["replicas"] + d["replicas"]
        gpus = p["gpus"] + d["gpus"]
        shape = f"disaggregated: {p['replicas']} prefill x TP{p['tensor_parallel_size']} + " \
                f"{d['replicas']} decode x TP{d['tensor_parallel_size']}"
    f = m.fleet
    router = fleet.get("router", "(single engine)") if fleet else "(single engine)"
    if pools:
        router = f"{fleet.get('prefill_router')} (prefill), {router} (decode)"
    auto = fleet.get("autoscale")
    if auto:  # docs/autoscale.md: the bounds, and GPUs on average over the run
        mean = (info.get("cost") or {}).get("mean_replicas")
        return {**_shape({**info, "config": {**config, "fleet": {**fleet, "autoscale": None}}}, m),
                "replicas": f"{auto['min_replicas']}-{auto['max_replicas']} (autoscaled)",
                "gpus": f"{mean * tp:.2f} on average" if mean is not None else "-"}
    return {
        "shape": shape,
        "replicas": replicas,
        "gpus": gpus,
        "router": router,
        "router_options": fleet.get("router_options") or {},
        "router_latency_ms": fleet.get("router_latency_ms", 0.0),
        "busy_imbalance": f["busy_imbalance"] if f else None,
        "routed_ideal": (f["routed_ideal"] or {}).get("routed_ideal_hit_ratio") if f else None,
    }


def fleet_diff_lines(names: tuple[str, str], metrics: tuple, infos: tuple[dict, dict]) -> list[str]:
    """The fleet side by side, first in a diff: replicas, GPUs, router, imbalance, routed reuse."""
    a, b = (_shape(i, m) for i, m in zip(infos, metrics))
    if a["replicas"] == b["replicas"] == 1 and not (infos[0].get("fleet") or infos[1].get("fleet")):
        return []

    def cell(v: Any, unit: str = "") -> str:
        if isinstance(v, dict):
            return ", ".join(f"{k}={x}" for k, x in sorted(v.items())) or "defaults"
        return num(v, unit) if unit else str(v)

    rows = [("serving", "shape", ""), ("replicas", "replicas", ""), ("GPUs (replicas x TP)", "gpus", ""),
            ("router", "router", ""),
            ("router options", "router_options", ""), ("router latency (ms)", "router_latency_ms", "ms"),
            ("load imbalance (max / mean busy)", "busy_imbalance", "ratio"),
            ("reuse with infinite per-replica caches", "routed_ideal", "pct")]
    na, nb = names
    lines = ["## Fleet", "", f"| | {na} | {nb} |", "|---|---|---|"]
    for label, key, unit in rows:
        mark = " **(differs)**" if a[key] != b[key] and key in ("shape", "replicas", "router", "router_options",
                                                                  "router_latency_ms", "gpus") else ""
        lines.append(f"| {label}{mark} | {cell(a[key], unit)} | {cell(b[key], unit)} |")
    return lines + [""]
