"""Render a comparison result: a rich table for the terminal, JSON and markdown for the record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from replay.base.atomic import write_json_atomic, write_text_atomic

# (key, label, format) in the order they are shown.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("completed_requests", "completed requests", "{:,.0f}"),
    ("ttft_mean_ms", "TTFT mean (ms)", "{:,.1f}"),
    ("ttft_p50_ms", "TTFT p50 (ms)", "{:,.1f}"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "{:,.1f}"),
    ("itl_pooled_token_ms", "ITL mean, pooled token gaps (ms)", "{:,.2f}"),
    ("itl_pooled_chunk_ms", "ITL mean, pooled chunk gaps (ms)", "{:,.2f}"),
    ("itl_request_mean_ms", "ITL, mean of per-request means (ms)", "{:,.2f}"),
    ("tpot_mean_ms", "TPOT mean (ms)", "{:,.2f}"),
    ("e2e_mean_ms", "E2E mean (ms)", "{:,.1f}"),
    ("reuse_ratio", "prefix reuse (first admission)", "{:.4f}"),
    ("reuse_ratio_gpu", "prefix reuse, GPU only", "{:.4f}"),
    ("reuse_ratio_all_admissions", "prefix reuse, all admissions", "{:.4f}"),
    ("preemptions", "preemptions", "{:,.0f}"),
)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _side_metrics(result: dict[str, Any], side: str) -> dict[str, Any]:
    s = result.get(side, {})
    return s.get("metrics") or {} if s.get("status") == "ok" else {}


def _diff(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return "-"
    if b == 0:
        return f"{a - b:+.4g}"
    return f"{(a - b) / abs(b) * 100:+.1f}%"


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(label, ours, peer, diff) rows: process figures first, then the metrics."""
    rows: list[tuple[str, str, str, str]] = []
    o, p = result.get("ours", {}), result.get("peer", {})
    for key, label, fmt in (("wall_s", "wall time, whole process (s)", "{:,.2f}"),
                            ("peak_rss_tree_mib", "peak RSS, process tree (MiB)", "{:,.0f}")):
        a = (o.get("process") or {}).get(key) if o.get("status") == "ok" else None
        b = (p.get("process") or {}).get(key) if p.get("status") == "ok" else None
        rows.append((label, _fmt(a, fmt), _fmt(b, fmt), _diff(a, b)))
    core = _side_metrics(result, "peer").get("peer_reported", {}).get("wall_time_ms")
    rows.append(("AISimulate core wall_time_ms (s)", "-", _fmt(core / 1000 if core else None, "{:,.2f}"), "-"))
    om, pm = _side_metrics(result, "ours"), _side_metrics(result, "peer")
    for key, label, fmt in ROWS:
        rows.append((label, _fmt(om.get(key), fmt), _fmt(pm.get(key), fmt), _diff(om.get(key), pm.get(key))))
    return rows


def _status_line(result: dict[str, Any], side: str) -> str:
    s = result.get(side, {})
    status = s.get("status", "not_run")
    extra = f": {s['reason']}" if s.get("reason") else ""
    carried = f" (carried from the run of {s['carried_from']})" if s.get("carried_from") else ""
    return f"{status}{extra}{carried}"


def print_table(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"{result['name']}: replay vs AISimulate", show_lines=False)
    table.add_column("metric")
    table.add_column("replay (ours)", justify="right")
    table.add_column("AISimulate", justify="right")
    table.add_column("ours vs peer", justify="right")
    for row in table_rows(result):
        table.add_row(*row)
    console.print(table)
    for side, label in (("ours", "replay"), ("peer", "AISimulate")):
        if result.get(side, {}).get("status") != "ok":
            console.print(f"[yellow]{label}: {_status_line(result, side)}[/]", highlight=False)
    for check in result.get("agreement", []):
        if check["ok"] is not None:
            mark = "[green]ok[/]" if check["ok"] else "[red]outside target[/]"
            console.print(f"agreement {check['metric']}: {_fmt(check['diff'], '{:+.4f}')} "
                          f"({check['kind']}, limit {check['limit']}) {mark}", highlight=False)
    speed = result.get("speed") or {}
    if speed:
        reps = f", median of {speed['reps']} alternating runs" if speed.get("reps") else ""
        console.print(f"speed: ours/peer wall = {speed['ours_over_peer_wall']:.3f}{reps} "
                      f"({'ours not slower' if speed['ours_not_slower'] else 'ours slower'})", highlight=False)


def markdown(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    v = result.get("versions", {})
    lines = [
        f"# {result['name']}: replay vs AISimulate",
        "",
        result.get("description", ""),
        "",
        f"- date (UTC): {result.get('date_utc')}",
        f"- machine: {m.get('cpu')}, {m.get('usable_cpus')} usable of {m.get('logical_cpus')} logical CPUs, "
        f"{m.get('memory_gib')} GiB, {m.get('platform')}, Python {m.get('python')}",
        f"- versions: replay {v.get('replay')} ({v.get('replay_commit')}), AISimulate {v.get('aisimulate')}",
        f"- trace: `{result['trace']['input']}` ({result['trace']['rows']:,} rows)",
        f"- our config: `{result['config']['path']}` (timing: {result.get('timing_backend')})",
        f"- replay: {_status_line(result, 'ours')}",
        f"- AISimulate: {_status_line(result, 'peer')}",
        "",
        "| metric | replay (ours) | AISimulate | ours vs peer |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in table_rows(result)]
    checks = [c for c in result.get("agreement", []) if c["ok"] is not None]
    if checks:
        lines += ["", "Agreement targets:", ""]
        for c in checks:
            lines.append(f"- `{c['metric']}`: {_fmt(c['diff'], '{:+.4f}')} ({c['kind']}, limit {c['limit']}): "
                         f"{'within target' if c['ok'] else 'OUTSIDE target'}")
    speed = result.get("speed") or {}
    if speed:
        lines += ["", f"Speed: ours / AISimulate whole-process wall = {speed['ours_over_peer_wall']:.3f} "
                      f"(AISimulate / ours = {speed['peer_over_ours_wall']:.2f}x)."]
        if speed.get("reps"):
            runs = {side: result[side]["process"].get("wall_s_runs", []) for side in ("ours", "peer")}
            lines += ["", f"Over {speed['reps']} alternating runs of each side (the walls above are the medians): "
                          f"ours {', '.join(f'{w:.2f}' for w in runs['ours'])} s; AISimulate "
                          f"{', '.join(f'{w:.2f}' for w in runs['peer'])} s; pair ratios "
                          f"{', '.join(f'{r:.3f}' for r in speed['pair_ratios'])}."]
    lines += ["", "Commands:", ""]
    for side in ("ours", "peer"):
        cmd = result.get(side, {}).get("command")
        if cmd:
            lines.append(f"    {cmd}")
    notes = result["trace"].get("notes", []) + result.get("translation_notes", [])
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def save(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{result['name']}.json", out_dir / f"{result['name']}.md"
    write_json_atomic(json_path, result)
    write_text_atomic(md_path, markdown(result))
    return json_path, md_path


def summary_markdown(results: list[dict[str, Any]]) -> str:
    """One table over all workloads: the figures bench/README.md publishes."""
    lines = [
        "# replay vs AISimulate: all workloads",
        "",
        "| workload | rows | wall ours (s) | wall AISimulate (s) | ours/peer | RSS ours (MiB) | RSS AISimulate (MiB) "
        "| TTFT mean ours / peer (ms) | ITL pooled ours / peer (ms) | reuse ours / peer | completed ours / peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.get("skipped"):
            continue
        o, p = r.get("ours", {}), r.get("peer", {})
        op = o.get("process") if o.get("status") == "ok" else {}
        pp = p.get("process") if p.get("status") == "ok" else {}
        om, pm = _side_metrics(r, "ours"), _side_metrics(r, "peer")
        ratio = (r.get("speed") or {}).get("ours_over_peer_wall")

        def pair(key: str, fmt: str, om=om, pm=pm) -> str:
            return f"{_fmt(om.get(key), fmt)} / {_fmt(pm.get(key), fmt)}"

        lines.append(
            f"| {r['name']} | {r['trace']['rows']:,} | {_fmt((op or {}).get('wall_s'), '{:.2f}')} "
            f"| {_fmt((pp or {}).get('wall_s'), '{:.2f}')} | {_fmt(ratio, '{:.3f}')} "
            f"| {_fmt((op or {}).get('peak_rss_tree_mib'), '{:.0f}')} | {_fmt((pp or {}).get('peak_rss_tree_mib'), '{:.0f}')} "
            f"| {pair('ttft_mean_ms', '{:,.1f}')} | {pair('itl_pooled_token_ms', '{:.2f}')} "
            f"| {pair('reuse_ratio', '{:.4f}')} | {pair('completed_requests', '{:,.0f}')} |"
        )
    skipped = [r for r in results if r.get("skipped")]
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {r['name']}: {r['skipped']}" for r in skipped]
    return "\n".join(lines) + "\n"
