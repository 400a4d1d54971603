"""A fleet over the day: GPU-hours and cost, refusals, SLO attainment per window, and a chart of
replicas, arrival rate and waiting requests over time (reports/sql/slo_windows.sql, the run's
scaling.parquet written by an autoscaled replay, run.json's ``cost`` and ``scaling``).

Present in a report when the run autoscaled, refused requests at admission, priced its GPUs, or an
SLO was given; in a diff, GPU-hours and attainment stand side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.engine.scaling_output import SCALING_FILE
from replay.reports.fmt import md_table, num
from replay.reports.plotting import COLORS, plt, save_figure, time_axis
from replay.reports.slo import Slo
from replay.reports.sqlfiles import sql
from replay.reports.views import Run


def _rows(run: Run, name: str, **params: Any) -> list[dict[str, Any]]:
    cur = run.con.execute(sql(name), params or None)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def over_time_metrics(run: Run, slo: Slo | None) -> dict[str, Any] | None:
    info = run.info
    scaling = info.get("scaling")
    cost = info.get("cost")
    priced = bool(cost and cost.get("gpu_cost_per_hour") is not None)
    has_slo = slo is not None and not slo.empty
    if not (scaling or priced or has_slo):
        return None
    out: dict[str, Any] = {"cost": cost, "scaling": scaling, "refused": _rows(run, "rejected_reasons")}
    window_s = slo.window_s if slo is not None else 300.0
    out["window_s"] = window_s
    windows = _rows(run, "slo_windows", window_ms=window_s * 1000.0, ttft=slo.ttft if has_slo else None,
                    tpot=slo.tpot if has_slo else None, e2e=slo.e2e if has_slo else None)
    out["windows"] = windows
    if has_slo:
        met = sum(1 for w in windows if w["attainment"] is not None and w["attainment"] >= slo.goal)
        out["goal"] = slo.goal
        out["windows_met"] = met
        out["windows_met_fraction"] = met / len(windows) if windows else None
        total = sum(w["requests"] for w in windows)
        out["attainment"] = sum(w["good"] for w in windows) / total if total else None
    timeline = _rows(run, "scaling_timeline") if (run.outdir / SCALING_FILE).is_file() else []
    out["timeline"] = sorted(timeline, key=lambda r: (r["time_ms"], r.get("pool") != "prefill"))
    return out


def over_time_section(o: dict[str, Any], chart: str | None) -> list[str]:
    lines = ["## Fleet over time", ""]
    cost = o.get("cost") or {}
    if cost:
        price = cost.get("gpu_cost_per_hour")
        priced = f", {num(cost['cost'], 's')} at {price:g} per GPU-hour" if price is not None else ""
        each = cost.get("gpus_per_replica")
        each_text = f", {each} GPU(s) each" if each is not None else ", GPUs per replica by pool"
        lines += [f"GPU-hours: {num(cost['gpu_hours'], 's')} ({num(cost.get('mean_replicas'), 's')} replicas "
                  f"on average{each_text}){priced}. A replica is counted from its start (provisioning "
                  "included) to its retirement (draining included).", ""]
    for name, pool_cost in (cost.get("pools") or {}).items():
        price = pool_cost.get("gpu_cost_per_hour")
        priced = f", {num(pool_cost['cost'], 's')} at {price:g} per GPU-hour" if price is not None else ""
        lines += [f"- {name} pool: {num(pool_cost['gpu_hours'], 's')} GPU-hours "
                  f"({num(pool_cost.get('mean_replicas'), 's')} replicas on average, "
                  f"{pool_cost['gpus_per_replica']} GPU(s) each){priced}"]
    if cost.get("pools"):
        lines.append("")
    scaling = o.get("scaling") or {}
    pools = scaling.get("pools") or ({None: scaling} if scaling.get("replicas") is not None else {})
    for name, pool_scaling in pools.items():
        lives = pool_scaling["replicas"]
        lines += [f"Autoscaling{' of the ' + name + ' pool' if name else ''}: {pool_scaling.get('decisions', 0)} "
                  f"decisions, between {pool_scaling.get('min_live')} and {pool_scaling.get('max_live')} live "
                  f"replicas; {len(lives)} replica lives "
                  f"({sum(1 for lf in lives if lf['state'] == 'cancelled')} cancelled while starting, "
                  f"{sum(1 for lf in lives if lf['drain_ms'] is not None)} drained).", ""]
    if o["refused"]:
        lines += ["Refused requests (status `rejected`; they count against goodput and attainment):", "",
                  md_table(["reason", "requests"], [[r["reason"] or "-", num(r["requests"], "count")]
                                                    for r in o["refused"]]), ""]
    if "goal" in o:
        windows = o["windows"]
        lines += [f"SLO attainment per {o['window_s']:g} s window of arrivals: {o['windows_met']} of {len(windows)} "
                  f"windows ({num(o['windows_met_fraction'], 'pct')}) had at least {o['goal']:.0%} of their requests "
                  f"finish within every SLO; over the whole run {num(o['attainment'], 'pct')} did (rejected and "
                  "unfinished requests count as misses).", ""]
        worst = sorted((w for w in windows if w["attainment"] is not None), key=lambda w: w["attainment"])[:5]
        if worst:
            lines += ["Worst windows:", "", md_table(
                ["window start (s)", "requests", "rejected", "attainment", "TTFT p99 (ms)"],
                [[num(w["window_index"] * o["window_s"], "s"), num(w["requests"], "count"),
                  num(w["rejected"], "count"), num(w["attainment"], "pct"), num(w["ttft_p99"], "ms")]
                 for w in worst]), ""]
    if chart:
        lines += [f"![Replicas, arrival rate and waiting requests over time]({chart})", ""]
    return lines


def over_time_chart(path: Path, o: dict[str, Any]) -> Path:
    """Three panels on one time axis: replicas, arrival rate (and refusals), waiting requests."""
    windows = o["windows"]
    timeline = o["timeline"]
    w_ms = o["window_s"] * 1000.0
    span = max([(w["window_index"] + 1) * w_ms for w in windows] + [r["time_ms"] for r in timeline] + [1.0])
    scale, unit = time_axis(span)
    fig, axes = plt.subplots(3, 1, figsize=(8.0, 7.0), sharex=True)
    ax = axes[0]
    pools = sorted({r.get("pool") or "" for r in timeline}, key=lambda p: p != "prefill")
    for k, pool in enumerate(pools):  # one set of lines per autoscaled pool (one, unnamed, when aggregated)
        rows = [r for r in timeline if (r.get("pool") or "") == pool]
        t = [r["time_ms"] / scale for r in rows]
        tag = f"{pool} " if pool else ""
        ax.step(t, [r["live"] for r in rows], where="post", color=COLORS[3 * k % len(COLORS)], label=f"{tag}live")
        ax.step(t, [r["live"] + r["provisioning"] for r in rows], where="post",
                color=COLORS[(3 * k + 1) % len(COLORS)], ls="--", label=f"{tag}live + starting")
        ax.step(t, [r["desired"] for r in rows], where="post", color=COLORS[(3 * k + 2) % len(COLORS)], ls=":",
                label=f"{tag}desired")
    if timeline:
        ax.legend(loc="upper left", fontsize=8)
    else:
        replicas = (o.get("cost") or {}).get("mean_replicas") or 1
        ax.axhline(replicas, color=COLORS[0], label="replicas (fixed)")
    ax.set_ylabel("replicas")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax = axes[1]
    mid = [(w["window_index"] + 0.5) * w_ms / scale for w in windows]
    ax.plot(mid, [w["requests"] / o["window_s"] for w in windows], color=COLORS[0], label="arrivals")
    if any(w["rejected"] for w in windows):
        ax.plot(mid, [w["rejected"] / o["window_s"] for w in windows], color=COLORS[3], label="refused")
    ax.set_ylabel("requests/s")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax = axes[2]
    if timeline:
        for k, pool in enumerate(pools):
            rows = [r for r in timeline if (r.get("pool") or "") == pool]
            ax.plot([r["time_ms"] / scale for r in rows], [r["waiting"] for r in rows],
                    color=COLORS[(1 + k) % len(COLORS)], label=f"{pool} pool" if pool else None)
        if pools != [""]:
            ax.legend(loc="upper left", fontsize=8)
        ax.set_ylabel("waiting requests")
    elif "goal" in o:
        ax.plot(mid, [w["attainment"] for w in windows], color=COLORS[2])
        ax.set_ylabel("SLO attainment")
    ax.grid(True, alpha=0.3)
    ax.set_xlabel(f"time since trace start ({unit})")
    axes[0].set_title("Fleet over time")
    return save_figure(fig, path)


def over_time_diff_lines(names: tuple[str, str], a: dict[str, Any] | None, b: dict[str, Any] | None,
                         infos: tuple[dict[str, Any], dict[str, Any]]) -> list[str]:
    """GPU-hours, cost and attainment of two runs side by side (a static and an autoscaled fleet);
    present when either run has the fleet-over-time section."""
    if a is None and b is None:
        return []
    a = {**(a or {}), "cost": infos[0].get("cost")}
    b = {**(b or {}), "cost": infos[1].get("cost")}

    def get(o: dict[str, Any], *keys: str) -> Any:
        for k in keys:
            o = (o or {}).get(k) if isinstance(o, dict) else None
        return o

    rows = [("GPU-hours", ("cost", "gpu_hours"), "s"), ("mean replicas", ("cost", "mean_replicas"), "s"),
            ("cost", ("cost", "cost"), "s"), ("SLO attainment (all requests)", ("attainment",), "pct"),
            ("windows meeting the SLO", ("windows_met_fraction",), "pct")]
    lines = ["## GPU-hours and SLO attainment", "", f"| | {names[0]} | {names[1]} |", "|---|---|---|"]
    for label, keys, unit in rows:
        lines.append(f"| {label} | {num(get(a, *keys), unit)} | {num(get(b, *keys), unit)} |")
    refused_a = sum(r["requests"] for r in a.get("refused", []))
    refused_b = sum(r["requests"] for r in b.get("refused", []))
    lines.append(f"| refused requests | {num(refused_a, 'count')} | {num(refused_b, 'count')} |")
    goal = a.get("goal", b.get("goal"))
    if goal is not None:
        lines += ["", f"A window ({a.get('window_s', b.get('window_s')):g} s of arrivals) meets the SLO when at least "
                      f"{goal:.0%} of its requests finish within every SLO."]
    return lines + [""]
