"""The disaggregation section of a report: the two pools side by side, the KV reads between them,
and where TTFT went. Present only for runs of a disaggregated fleet (run.json has ``pools``)."""

from __future__ import annotations

from typing import Any

from replay.reports.fmt import num
from replay.reports.sqlfiles import sql
from replay.reports.views import Run

_TTFT_PARTS = [("queue_ms", "queued for prefill"), ("prefill_ms", "prefill (prefill replica's steps)"),
               ("decode_admission_ms", "decode replica admission (its step boundary, free blocks)"),
               ("transfer_ms", "KV read"), ("first_step_ms", "decode replica's first step"),
               ("ttft_ms", "TTFT")]


def _rows(run: Run, name: str) -> list[dict[str, Any]]:
    cur = run.con.execute(sql(name))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def disagg_metrics(run: Run) -> dict[str, Any] | None:
    pools = run.info.get("pools")
    if not pools:
        return None
    fleet = (run.info.get("config") or {}).get("fleet") or {}
    return {
        "pools": pools,
        "steps_by_pool": {r["pool"]: r for r in _rows(run, "disagg_pools")},
        "ttft": {r["part"]: r for r in _rows(run, "disagg_ttft")},
        "transfers": _rows(run, "disagg_transfers")[0],
        "kv_transfer_config": fleet.get("kv_transfer") or {},
        "prefill_router": fleet.get("prefill_router"),
        "decode_router": fleet.get("router"),
    }


def disagg_section(d: dict[str, Any]) -> list[str]:
    pools = d["pools"]
    cfg = d["kv_transfer_config"]
    bw = cfg.get("bandwidth_gb_per_s")
    lines = ["## Disaggregation", "",
             f"Prefill pool behind `{d['prefill_router']}`, decode pool behind `{d['decode_router']}`; KV read "
             f"over {num(bw) if bw is not None else '?'} GB/s links ({cfg.get('timing_mode', '?')}, "
             f"{num(cfg.get('latency_ms', 0.0), 'ms')} ms per read).", "",
             "| pool | replicas x TP | GPUs | GPU-s | busy GPU-s | utilization | steps | mean batch (requests / tokens) "
             "| waiting (mean / max) | KV usage (mean / max) | preemptions |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("prefill", "decode"):
        p = pools[name]
        s = d["steps_by_pool"].get(name) or {}
        lines.append(
            f"| {name} | {p['replicas']} x {p['tensor_parallel_size']} | {p['gpus']} | {num(p['gpu_seconds'], 's')} | "
            f"{num(p['busy_gpu_seconds'], 's')} | {num(p['utilization'], 'pct')} | {num(p['steps'], 'count')} | "
            f"{num(s.get('mean_batch_requests'))} / {num(s.get('mean_batch_tokens'))} | "
            f"{num(s.get('mean_waiting'))} / {num(s.get('max_waiting'))} | "
            f"{num(s.get('kv_usage_mean'), 'pct')} / {num(s.get('kv_usage_max'), 'pct')} | "
            f"{num(p['preemptions'], 'count')} |")
    t = d["transfers"]
    net = pools.get("kv_transfer") or {}
    egress = net.get("prefill_egress_busy_ms") or []
    ingress = net.get("decode_ingress_busy_ms") or []
    lines += ["", f"{num(t['remote_prefills'], 'count')} requests prefilled on the prefill pool, "
              f"{num(t['local_prefills'], 'count')} on their decode replica. KV read: "
              f"{num((t['bytes'] or 0) / 1e9)} GB in all, {num((t['mean_bytes'] or 0) / 1e6)} MB per read, "
              f"mean {num(t['mean_transfer_ms'], 'ms')} ms (p99 {num(t['p99_transfer_ms'], 'ms')} ms), "
              f"{num(t['decode_cached_tokens'], 'count')} prompt tokens found on the decode replica instead. "
              f"Link time with traffic: prefill egress {num(sum(egress) / 1e3, 's')} s over {len(egress)} links, "
              f"decode ingress {num(sum(ingress) / 1e3, 's')} s over {len(ingress)} links.", "",
              "TTFT of requests prefilled remotely, by where the time went (ms):", "",
              "| part | mean | p50 | p99 |", "|---|---:|---:|---:|"]
    for key, label in _TTFT_PARTS:
        r = d["ttft"].get(key)
        if r is not None:
            lines.append(f"| {label} | {num(r['mean'], 'ms')} | {num(r['p50'], 'ms')} | {num(r['p99'], 'ms')} |")
    lines += ["", "The parts' means sum to the mean TTFT; percentiles do not add up.", ""]
    return lines
