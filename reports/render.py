"""Markdown for one replay: what a reviewer pastes into a pull request.

Only formats what ``replay.reports.metrics`` computed; charts are referenced by relative path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from replay.engine.config import EngineConfig
from replay.reports.charts import turn_label
from replay.reports.configdiff import differing
from replay.reports.disagg import disagg_section
from replay.reports.fleet import fleet_section
from replay.reports.fmt import DASH, md_table, num
from replay.reports.kv_tiers import kv_tiers_section
from replay.reports.metrics import LATENCIES, SUMMARY_PERCENTILES, TURN_CAP, RunMetrics, falling_behind
from replay.reports.over_time import over_time_section

PERCENTILE_NOTE = ("Percentiles are `numpy.percentile` with linear interpolation (DuckDB `quantile_cont`). "
                   "Latencies cover finished requests only. TTFT = first token - arrival; queue = first "
                   "scheduled - arrival; E2E = last token - arrival; TPOT per request = (last - first token) / "
                   "(output tokens - 1); ITL = gaps between consecutive output chunks, pooled over all "
                   "requests (one gap per engine step, however many MTP tokens it emitted).")


def _bench_line(label: str, value: Any, decimals: int = 2) -> str:
    if value is None:
        return f"{label:<40} {'n/a':<10}"
    if isinstance(value, int):
        return f"{label:<40} {value:<10}"
    return f"{label:<40} {value:<10.{decimals}f}"


def bench_block(m: RunMetrics) -> str:
    """The summary in the layout of `vllm bench serve`, so numbers line up with real benchmarks."""
    t, d = m.throughput, m.dists
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             _bench_line("Successful requests:", t["completed"]),
             _bench_line("Failed requests (rejected + unfinished):", t["rejected"] + t["unfinished"]),
             _bench_line("Benchmark duration (s):", t["duration_s"]),
             _bench_line("Total input tokens:", int(t["input_tokens"])),
             _bench_line("Total generated tokens:", int(t["output_tokens"])),
             _bench_line("Request throughput (req/s):", t["request_throughput"])]
    if m.goodput is not None:
        lines.append(_bench_line("Request goodput (req/s):", m.goodput["goodput"]))
    lines += [_bench_line("Output token throughput (tok/s):", t["output_throughput"]),
              _bench_line("Total Token throughput (tok/s):", t["total_token_throughput"])]
    for key, title, short in (("ttft", "Time to First Token", "TTFT"),
                              ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
                              ("itl", "Inter-token Latency", "ITL"),
                              ("e2e", "End-to-end Latency", "E2EL")):
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines.append(_bench_line(f"Mean {short} (ms):", d[key].mean))
        lines.append(_bench_line(f"Median {short} (ms):", d[key].percentiles[50]))
        lines.append(_bench_line(f"P99 {short} (ms):", d[key].percentiles[99]))
    lines.append("=" * 50)
    return "```\n" + "\n".join(lines) + "\n```"


def percentile_table(m: RunMetrics) -> str:
    header = ["metric (ms)", "count", "mean"] + [f"p{p}" for p in SUMMARY_PERCENTILES] + ["max"]
    rows = []
    for key, label in LATENCIES.items():
        d = m.dists[key]
        rows.append([label, num(d.count, "count"), num(d.mean, "ms")]
                    + [num(d.percentiles[p], "ms") for p in SUMMARY_PERCENTILES] + [num(d.max, "ms")])
    return md_table(header, rows)


def _reuse_section(m: RunMetrics, chart: str | None) -> list[str]:
    r, out = m.reuse, ["## Prefix reuse", ""]

    def ratio(key: str) -> str:
        return f"unknown ({r['unknown']})" if r.get("unknown") else num(r[key], "ratio")

    rows = [["GPU prefix-cache hits", num(r["gpu_hit_tokens"], "count"), ratio("gpu_hit_ratio")],
            ["CPU (G2) hits", num(r["cpu_hit_tokens"], "count"), ratio("cpu_hit_ratio")],
            ["total", num(r["gpu_hit_tokens"] + r["cpu_hit_tokens"], "count"), ratio("total_hit_ratio")]]
    if m.ideal is not None:
        rows.append(["ideal: infinite cache, replayed rows", num(m.ideal["ideal_hit_tokens"], "count"),
                     num(m.ideal["ideal_hit_ratio"], "ratio")])
    out.append(md_table(["", "tokens", "of prompt tokens"], rows))
    out.append("")
    out.append(f"Hits are counted in tokens at first admission over the {num(r['prompt_tokens'], 'count')} prompt "
               "tokens of admitted requests, as vLLM's prefix-cache counters do. The ideal is the trace's "
               "token-level prefix hit with an infinite cache (each row hits the leading run of its hash ids "
               "seen in earlier rows, in arrival order)." + ("" if m.ideal is not None else
                                                              " The ideal is unavailable for this run."))
    if m.reuse_by_turn:
        out += ["", "By session turn (" + f"turns >= {TURN_CAP} pooled):", ""]
        out.append(md_table(["turn", "requests", "GPU hit", "CPU hit", "ideal"],
                            [[turn_label(t["turn_key"]), num(t["requests"], "count"), num(t["gpu_hit_ratio"], "ratio"),
                              num(t["cpu_hit_ratio"], "ratio"), num(t["ideal_hit_ratio"], "ratio")]
                             for t in m.reuse_by_turn]))
    if chart:
        out += ["", f"![Prefix reuse by session turn]({chart})"]
    return out


def _scheduler_section(m: RunMetrics, info: dict[str, Any]) -> list[str]:
    s, p = m.steps, m.preemptions
    rows = [
        ["engine steps", num(s["steps"], "count")],
        ["busy time (s)", num((s["busy_ms"] or 0) / 1000, "s")],
        ["preemptions", num(p["preemptions"], "count")],
        ["preempted requests", num(p["preempted_requests"], "count")],
        ["GPU KV blocks", num(info.get("num_gpu_blocks"), "count")],
        ["KV usage, time-weighted mean", num(s["kv_usage_mean"], "pct")],
        ["KV usage, peak", num(s["kv_usage_max"], "pct")],
        ["busy time with KV usage >= 95%", num(s["kv_saturated_fraction"], "pct")],
        ["running requests, mean / peak", f"{num(s['running_mean'], 'count')} / {num(s['running_max'], 'count')}"],
        ["waiting requests, mean / peak / at the end",
         f"{num(s['waiting_mean'], 'count')} / {num(s['waiting_max'], 'count')} / {num(s['waiting_final'], 'count')}"],
    ]
    if s["bytes_stored"] or s["bytes_loaded"] or s["cpu_usage_max"]:
        rows += [["CPU (G2) cache usage, mean / peak", f"{num(s['cpu_usage_mean'], 'pct')} / {num(s['cpu_usage_max'], 'pct')}"],
                 ["G2 bytes stored / loaded (GiB)",
                  f"{s['bytes_stored'] / 2**30:,.2f} / {s['bytes_loaded'] / 2**30:,.2f}"]]
    mtp = m.mtp
    if mtp["draft_tokens"]:
        rows += [["MTP drafts / draft tokens / accepted",
                  f"{num(mtp['drafts'], 'count')} / {num(mtp['draft_tokens'], 'count')} / {num(mtp['accepted_tokens'], 'count')}"],
                 ["MTP acceptance rate (accepted / draft tokens)", num(mtp["acceptance_rate"], "ratio")],
                 ["MTP mean acceptance length (1 + accepted / drafts)", num(mtp["mean_acceptance_length"], "ratio")]]
    return ["## Scheduler", "", md_table(["", "value"], rows)]


def keeping_up_text(m: RunMetrics) -> str:
    k = m.keeping_up
    first, last = k.get("ttft_p50_first_fifth"), k.get("ttft_p50_last_fifth")
    if first is None or last is None:
        return "Not enough finished requests to tell whether the system kept up."
    verdict = ("**Falling behind**: the queue grows over the run." if falling_behind(k)
               else "**Keeping up**: latency does not grow over the run.")
    share = k.get("queue_share_of_ttft")
    queue = f" Queueing is {num(share, 'pct')} of mean TTFT." if share is not None else ""
    return (f"{verdict} Median TTFT of requests arriving in the first fifth of the trace: {num(first, 'ms')} ms; "
            f"in the last fifth: {num(last, 'ms')} ms.{queue}")


def _provenance(info: dict[str, Any], outdir: Path) -> list[str]:
    trace = info.get("trace") or {}
    meta = trace.get("metadata") or {}
    timing = info.get("timing") or {}
    rows = [
        ["output directory", f"`{outdir}`"],
        ["trace", f"`{trace.get('path', DASH)}`"],
        ["trace source", f"{meta.get('source_format', DASH)}: `{meta.get('source_file', DASH)}`"],
        ["source sha256", f"`{meta.get('source_sha256') or DASH}`"],
        ["trace fingerprint", f"`{trace.get('fingerprint', DASH)}`"],
        ["trace rows", num(trace.get("rows"), "count")],
        ["prefix identity", f"{meta.get('prefix_identity', DASH)} (hash block {meta.get('hash_block_size') or DASH} tokens)"],
        ["session delay rule", str(info.get("session_delay_rule", DASH))],
        ["tool version", str(info.get("tool_version", DASH))],
        ["seed", str(info.get("seed", DASH))],
        ["timing backend", str(timing.get("backend", DASH))],
        ["simulated span (s)", num((info.get("simulated_span_ms") or 0) / 1000, "s")],
        ["replay wall time (s)", num(info.get("wall_time_s"), "s")],
    ]
    return ["## Provenance", "", md_table(["", ""], rows, "ll")]


def _config_section(info: dict[str, Any]) -> list[str]:
    config = info.get("config") or {}
    out = ["## Config", ""]
    try:
        defaults = EngineConfig().model_dump(mode="json")
    except Exception:  # the config model must never stop a report
        defaults = {}
    changed = differing(defaults, config)
    if changed:
        out.append(md_table(["key (differs from the defaults)", "value", "default"],
                            [[f"`{k}`", f"`{json.dumps(v)}`", f"`{json.dumps(d)}`"] for k, d, v in changed], "lll"))
    else:
        out.append("All engine settings at their defaults.")
    out += ["", "<details><summary>Full config</summary>", "", "```yaml",
            yaml.safe_dump(config, sort_keys=True).rstrip(), "```", "", "</details>"]
    return out


def render_report(m: RunMetrics, info: dict[str, Any], outdir: Path, charts: dict[str, str]) -> str:
    """The whole report; ``charts`` maps chart name -> path relative to the markdown file."""
    config = info.get("config") or {}
    trace = info.get("trace") or {}
    t = m.throughput
    source = (trace.get("metadata") or {}).get("source_file") or Path(str(trace.get("path", "?"))).name
    lines = [f"# Replay report: `{outdir.name}`", "",
             f"{num(t['requests'], 'count')} requests from `{Path(str(source)).name}` replayed on "
             f"{config.get('model', '?')} / {config.get('hardware', '?')} (TP {config.get('tensor_parallel_size', '?')}), "
             f"timing backend `{(info.get('timing') or {}).get('backend', '?')}`: "
             f"{num(t['completed'], 'count')} finished, {num(t['rejected'], 'count')} rejected, "
             f"{num(t['unfinished'], 'count')} unfinished.", "", "## Summary", "", bench_block(m), ""]
    if m.goodput is not None:
        g = m.goodput
        slo_text = ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in m.slo.items())
        lines += [f"Goodput ({slo_text}): {num(g['good_requests'], 'count')} of {num(g['completed'], 'count')} "
                  f"finished requests meet every SLO ({num(g['good_fraction'], 'pct')}), "
                  f"{num(g['goodput'], 'req/s')} req/s.", ""]
    if m.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in m.warnings] + [""]
    lines += ["## Latency", "", percentile_table(m), "", PERCENTILE_NOTE, ""]
    for name, alt in (("ttft_cdf", "TTFT CDF"), ("itl_cdf", "ITL and TPOT CDF")):
        if name in charts:
            lines += [f"![{alt}]({charts[name]})", ""]
    lines += _reuse_section(m, charts.get("reuse_by_turn")) + [""]
    lines += kv_tiers_section(info)
    if m.fleet is not None:
        lines += fleet_section(m.fleet, m.reuse, m.ideal, charts.get("fleet_load"))
    if m.disagg is not None:
        lines += disagg_section(m.disagg)
    if m.over_time is not None:
        lines += over_time_section(m.over_time, charts.get("fleet_over_time"))
    lines += _scheduler_section(m, info) + [""]
    lines += ["## Over time", "", keeping_up_text(m), ""]
    for name, alt in (("latency_over_time", "Latency over time"), ("queue_depth", "Queue depth over time"),
                      ("kv_usage", "KV usage over time")):
        if name in charts:
            lines += [f"![{alt}]({charts[name]})", ""]
    lines += _provenance(info, outdir) + [""]
    lines += _config_section(info) + [""]
    return "\n".join(lines)
