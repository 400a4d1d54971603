"""PNG charts for the reports, drawn with matplotlib from already-computed metrics (no queries here).

Every chart has a title, axis labels with units and a legend; PNGs are written without a timestamp or
software tag so identical inputs give identical bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.ticker import PercentFormatter

from replay.reports.fleet import fleet_load_chart
from replay.reports.metrics import TURN_CAP, RunMetrics
from replay.reports.over_time import over_time_chart
from replay.reports.plotting import (
    COLORS,
    SIZE,
    cdf_chart,
    ms_formatter,
    plt,
    save_figure,
    time_axis,
    use_log_scale,
)


def latency_over_time(path: Path, m: RunMetrics) -> Path:
    """TTFT percentiles by arrival time above arrivals vs completions: is the system keeping up?"""
    rows = m.latency_over_time
    div, unit = time_axis(max((r["bucket"] + 1) * m.bucket_ms for r in rows) if rows else 0.0)
    t = [(r["bucket"] + 0.5) * m.bucket_ms / div for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8.0, 6.4), sharex=True, height_ratios=(3, 2))
    series = (("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"), ("queue_p50", "queue time p50"))
    vals: list[float] = []
    for i, (key, label) in enumerate(series):
        ys = [r[key] for r in rows]
        vals += [y for y in ys if y is not None]
        ax1.plot(t, [float("nan") if y is None else y for y in ys], marker=".", color=COLORS[i], label=label)
    if use_log_scale(vals):
        ax1.set_yscale("log")
        ax1.yaxis.set_major_formatter(ms_formatter())
    ax1.set_ylabel("ms (by arrival time)")
    ax1.set_title("Latency over time (finished requests, by arrival bucket)")
    ax1.grid(True, alpha=0.3)
    ax1.legend(loc="upper left", fontsize=9)
    per_s = 1000.0 / m.bucket_ms
    ax2.plot(t, [r["arrivals"] * per_s for r in rows], color=COLORS[0], label="arrivals")
    ax2.plot(t, [r["completions"] * per_s for r in rows], color=COLORS[2], ls="--", label="completions")
    ax2.set_ylabel("requests/s")
    ax2.set_xlabel(f"time since trace start ({unit}); bucket {m.bucket_ms / 1000:g} s")
    ax2.grid(True, alpha=0.3)
    ax2.legend(loc="upper left", fontsize=9)
    return save_figure(fig, path)


def _steps_t(m: RunMetrics) -> tuple[list[float], str]:
    rows = m.steps_over_time
    div, unit = time_axis(max((r["bucket"] + 1) * m.bucket_ms for r in rows) if rows else 0.0)
    return [(r["bucket"] + 0.5) * m.bucket_ms / div for r in rows], unit


def queue_depth(path: Path, m: RunMetrics) -> Path:
    rows = m.steps_over_time
    t, unit = _steps_t(m)
    fig, ax = plt.subplots(figsize=SIZE)
    ax.plot(t, [r["running_mean"] for r in rows], color=COLORS[0], label="running (mean)")
    ax.plot(t, [r["waiting_mean"] for r in rows], color=COLORS[1], label="waiting (mean)")
    ax.plot(t, [r["waiting_max"] for r in rows], color=COLORS[1], ls=":", label="waiting (max)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time since trace start ({unit}); bucket {m.bucket_ms / 1000:g} s")
    ax.set_ylabel("requests")
    ax.set_title("Scheduler queue depth over time (time-weighted per bucket)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    return save_figure(fig, path)


def kv_usage(path: Path, m: RunMetrics, with_cpu: bool) -> Path:
    rows = m.steps_over_time
    t, unit = _steps_t(m)
    fig, ax = plt.subplots(figsize=SIZE)
    ax.plot(t, [r["kv_usage_mean"] for r in rows], color=COLORS[0], label="GPU KV usage (mean)")
    ax.plot(t, [r["kv_usage_max"] for r in rows], color=COLORS[0], ls=":", label="GPU KV usage (max)")
    if with_cpu:
        ax.plot(t, [r["cpu_usage_mean"] for r in rows], color=COLORS[2], label="CPU (G2) cache usage (mean)")
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"time since trace start ({unit}); bucket {m.bucket_ms / 1000:g} s")
    ax.set_ylabel("blocks in use")
    ax.set_title("KV cache usage over time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    return save_figure(fig, path)


def turn_label(turn_key: int) -> str:
    if turn_key < 0:
        return "no session"
    return f"{turn_key}+" if turn_key >= TURN_CAP else str(turn_key)


def reuse_by_turn(path: Path, rows: list[dict[str, Any]], with_cpu: bool) -> Path:
    """Stacked GPU + CPU hit ratio per turn, with the infinite-cache ideal as a marker."""
    labels = [turn_label(r["turn_key"]) for r in rows]
    x = list(range(len(rows)))
    gpu = [r["gpu_hit_ratio"] or 0.0 for r in rows]
    cpu = [r["cpu_hit_ratio"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2.5), 4.6))
    ax.bar(x, gpu, color=COLORS[0], label="GPU prefix-cache hits")
    if with_cpu:
        ax.bar(x, cpu, bottom=gpu, color=COLORS[2], label="CPU (G2) hits")
    ideal = [r.get("ideal_hit_ratio") for r in rows]
    if any(v is not None for v in ideal):
        ax.plot(x, [float("nan") if v is None else v for v in ideal], ls="none", marker="_", markersize=18,
                mew=2.5, color=COLORS[3], label="ideal (infinite cache)")
    ax.set_xticks(x, labels, rotation=45 if len(rows) > 12 else 0)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("session turn")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_title("Prefix reuse by session turn")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    return save_figure(fig, path)


def report_charts(outdir: Path, m: RunMetrics, *, with_cpu: bool) -> dict[str, Path]:
    """All charts of the single-run report, written into ``outdir``; returns name -> path."""
    d = m.dists
    charts = {
        "ttft_cdf": cdf_chart(outdir / "ttft_cdf.png", "TTFT distribution (finished requests)",
                              [("TTFT", d["ttft"].cdf), ("queue time", d["queue"].cdf)], "ms"),
        "itl_cdf": cdf_chart(outdir / "itl_cdf.png", "Inter-token latency distribution",
                             [("ITL (pooled over chunks)", d["itl"].cdf), ("TPOT (per request)", d["tpot"].cdf)],
                             "ms"),
        "latency_over_time": latency_over_time(outdir / "latency_over_time.png", m),
        "queue_depth": queue_depth(outdir / "queue_depth.png", m),
        "kv_usage": kv_usage(outdir / "kv_usage.png", m, with_cpu),
    }
    if m.reuse_by_turn:
        charts["reuse_by_turn"] = reuse_by_turn(outdir / "reuse_by_turn.png", m.reuse_by_turn, with_cpu)
    if m.fleet is not None:
        charts["fleet_load"] = fleet_load_chart(outdir / "fleet_load.png", m.fleet, m.bucket_ms)
    if m.over_time is not None:
        charts["fleet_over_time"] = over_time_chart(outdir / "fleet_over_time.png", m.over_time)
    return charts


def diff_charts(outdir: Path, a: RunMetrics, b: RunMetrics, names: tuple[str, str]) -> dict[str, Path]:
    """Overlaid A-vs-B CDFs of TTFT, ITL, TPOT and E2E."""
    out = {}
    for key, title in (("ttft", "TTFT"), ("itl", "ITL (pooled over chunks)"), ("tpot", "TPOT (per request)"),
                       ("e2e", "E2E latency")):
        out[f"{key}_cdf"] = cdf_chart(outdir / f"{key}_cdf.png", f"{title}: A vs B",
                                      [(names[0], a.dists[key].cdf), (names[1], b.dists[key].cdf)], "ms")
    return out
