"""``replay diff``: two replays of one trace side by side, with paired per-request statistics.

Both runs' metrics come from ``replay.reports.metrics`` (the same SQL as the single-run report); this module
adds what only a pair has: config differences, per-request deltas joined on request_id with
bootstrap intervals, the requests and sessions that moved most, and overlaid CDFs.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from replay.base.atomic import atomic_dir, write_json_atomic, write_text_atomic
from replay.base.duckdb_conn import MEMORY_LIMIT_MB, connect, sql_literal
from replay.base.errors import ReplayError
from replay.ingest.fingerprint import PREFIX as FINGERPRINT_PREFIX
from replay.reports.bootstrap import CI_LEVEL, QUANTILE, PairedChange, paired_bootstrap
from replay.reports.charts import diff_charts, turn_label
from replay.reports.configdiff import differing
from replay.reports.fleet import fleet_diff_lines
from replay.reports.fmt import DASH, change, md_table, num
from replay.reports.metrics import Row, RunMetrics, compute, headline, share_ideal
from replay.reports.over_time import over_time_diff_lines
from replay.reports.report_files import charts_dir_for, check_report_outputs, run_files
from replay.reports.slo import Slo
from replay.reports.sqlfiles import sql
from replay.reports.views import VIEW_SQL, Run, open_run

# The three databases the diff queries at once share one report's DuckDB budget (replay/base/duckdb_conn.py):
# each run's metrics half of it, the paired statistics (requests only) a quarter.
RUN_MEMORY_MB = MEMORY_LIMIT_MB // 2
PAIRED_MEMORY_MB = MEMORY_LIMIT_MB // 4

TOP_N = 10
SAME_TOLERANCE = 1e-3  # |relative change| below 0.1% counts as a tie when naming winners
PAIRED_METRICS = {"ttft": "TTFT", "e2e": "E2E latency"}


@dataclass
class Comparison:
    row_a: Row
    value_b: Any
    winner: str  # "A", "B", "tie" or "" (no direction / not comparable)

    @property
    def key(self) -> str:
        return self.row_a.key


@dataclass
class DiffResult:
    names: tuple[str, str]
    dirs: tuple[Path, Path]
    metrics: tuple[RunMetrics, RunMetrics]
    comparisons: list[Comparison]
    config_changes: list[tuple[str, Any, Any]]
    pair_counts: dict[str, int]
    paired: dict[str, PairedChange]
    top_requests: list[dict[str, Any]]
    top_sessions: list[dict[str, Any]]
    infos: tuple[dict[str, Any], dict[str, Any]]
    markdown: Path | None = None
    charts: dict[str, Path] = field(default_factory=dict)

    def wins(self, side: str) -> list[Comparison]:
        return [c for c in self.comparisons if c.winner == side]


def check_same_trace(a: Run, b: Run) -> None:
    """Refuse to compare replays of different traces: per-request pairing would be meaningless."""
    fa = (a.info.get("trace") or {}).get("fingerprint")
    fb = (b.info.get("trace") or {}).get("fingerprint")
    if not fa or not fb:
        missing = a.outdir if not fa else b.outdir
        raise ReplayError(f"{missing}/run.json has no trace.fingerprint: cannot tell whether both runs replayed "
                          "the same trace, so they cannot be diffed")
    if fa.startswith(FINGERPRINT_PREFIX) != fb.startswith(FINGERPRINT_PREFIX):
        older = a.outdir if not fa.startswith(FINGERPRINT_PREFIX) else b.outdir
        raise ReplayError(f"{older} was replayed by an older replay, whose trace fingerprints are taken another way: "
                          "replay it again to diff it against this one")
    if fa != fb:
        pa_ = (a.info.get("trace") or {}).get("path", "?")
        pb_ = (b.info.get("trace") or {}).get("path", "?")
        raise ReplayError(f"refusing to diff: the runs replayed different traces (A: {pa_}, fingerprint "
                          f"{fa[:12]}...; B: {pb_}, fingerprint {fb[:12]}...). A diff needs two replays of one trace.")


def _winner(row: Row, b: Any) -> str:
    a = row.value
    if row.better == "none" or a is None or b is None:
        return ""
    if a == b or (a != 0 and abs(b - a) / abs(a) < SAME_TOLERANCE):
        return "tie"
    better_b = b < a if row.better == "lower" else b > a
    return "B" if better_b else "A"


def compare(ma: RunMetrics, mb: RunMetrics) -> list[Comparison]:
    rows_b = {r.key: r.value for r in headline(mb)}
    return [Comparison(r, rows_b.get(r.key), _winner(r, rows_b.get(r.key))) for r in headline(ma)]


def _rows(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    cur = con.execute(sql(name), params or None)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _paired(a: Run, b: Run, seed: int, resamples: int | None, threads: int) -> tuple[dict, dict, list, list]:
    con = connect(PAIRED_MEMORY_MB, threads=threads)
    try:
        for name, run in (("a_requests", a), ("b_requests", b)):
            path = (run.outdir / "requests.parquet").resolve()
            con.execute(VIEW_SQL.format(name=name, columns="*", path=sql_literal(path), options=""))
        counts = _rows(con, "diff_pair_counts")[0]
        con.execute(sql("diff_paired"))
        cols = con.execute("SELECT ttft_a, ttft_b, e2e_a, e2e_b FROM paired").fetchnumpy()
        arrays = {k: (np.asarray(cols[f"{k}_a"], dtype=np.float64), np.asarray(cols[f"{k}_b"], dtype=np.float64))
                  for k in PAIRED_METRICS}
        paired = paired_bootstrap(arrays, resamples=resamples, seed=seed)
        top_req = _rows(con, "diff_top_requests", limit=TOP_N)
        top_sess = _rows(con, "diff_top_sessions", limit=TOP_N)
    finally:
        con.close()
    return counts, paired, top_req, top_sess


def _replayed_rows(info: dict) -> tuple[int, int | None]:
    """(first replayed trace row, rows replayed) as run.json records them."""
    t = info.get("trace") or {}
    return int(t.get("first_replayed_row") or 0), t.get("replayed_rows")


def _threads_each(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB threads for each of the two databases the diff queries at once: half the default."""
    return max(1, int(con.execute("SELECT current_setting('threads')").fetchone()[0]) // 2)


def diff_runs(dir_a: str | Path, dir_b: str | Path, *, slo: Slo | None = None, names: tuple[str, str] = ("A", "B"),
              seed: int = 0, resamples: int | None = None) -> DiffResult:
    """Compare two OUTDIRs of one trace; raises ReplayError when the traces differ.

    A's metrics, B's metrics and the paired statistics are independent (one DuckDB database each,
    and DuckDB releases the GIL while a query runs), so they run side by side, each database with
    half the cores: two queries on one core each cost less than one query split over two. The
    infinite-cache ideal depends on the trace only, so A computes it and B borrows it
    (``share_ideal``). Every result is the one computing them one after the other gives (tested)."""
    a = open_run(dir_a, connect(RUN_MEMORY_MB))
    b = open_run(dir_b, connect(RUN_MEMORY_MB))
    try:
        check_same_trace(a, b)
        # The ideal covers the rows a run replayed: the same trace, cut alike (load.max_requests,
        # load.window), has one ideal; cut otherwise, each run has its own.
        same_rows = _replayed_rows(a.info) == _replayed_rows(b.info)
        threads = _threads_each(a.con)
        for run in (a, b):
            run.con.execute(f"SET threads = {threads}")
        with ThreadPoolExecutor(max_workers=2) as pool:
            fb = pool.submit(compute, b, slo, with_ideal=not same_rows)
            fp = pool.submit(_paired, a, b, seed, resamples, threads)
            ma = compute(a, slo)
            mb = fb.result()
            counts, paired, top_req, top_sess = fp.result()
    finally:
        a.con.close()
        b.con.close()
    if same_rows:
        share_ideal(mb, ma)
    return DiffResult(
        names=names, dirs=(Path(dir_a), Path(dir_b)), metrics=(ma, mb), comparisons=compare(ma, mb),
        config_changes=sorted(differing(a.info.get("config") or {}, b.info.get("config") or {}),
                              key=lambda row: not row[0].startswith("fleet")),  # fleet keys first
        pair_counts=counts, paired=paired, top_requests=top_req, top_sessions=top_sess, infos=(a.info, b.info),
    )


def _ci(iv) -> str:
    if iv.estimate is None:
        return DASH
    est = f"{iv.estimate:+,.2f}"
    if iv.low is None:
        return est
    mark = " *" if iv.excludes_zero else ""
    return f"{est} [{iv.low:+,.2f}, {iv.high:+,.2f}]{mark}"


def _fmt_value(v: Any) -> str:
    return f"`{json.dumps(v)}`"


def render_diff(d: DiffResult, charts: dict[str, str]) -> str:
    na, nb = d.names
    ma, mb = d.metrics
    trace = d.infos[0].get("trace") or {}
    lines = [f"# Replay diff: {na} vs {nb}", "",
             md_table(["", "output directory", "config"],
                      [[na, f"`{d.dirs[0]}`", (d.infos[0].get("config") or {}).get("model", "?")],
                       [nb, f"`{d.dirs[1]}`", (d.infos[1].get("config") or {}).get("model", "?")]], "lll"),
             "", f"Both replayed `{trace.get('path', '?')}` ({num(trace.get('rows'), 'count')} rows, fingerprint "
             f"`{str(trace.get('fingerprint', '?'))[:16]}...`). Changes are {nb} - {na}; relative changes are "
             f"against {na}.", ""]
    lines += fleet_diff_lines(d.names, d.metrics, d.infos)
    lines += over_time_diff_lines(d.names, d.metrics[0].over_time, d.metrics[1].over_time, d.infos)
    lines += ["## Verdict", ""]
    lines += verdict_lines(d) + [""]
    lines += ["## Config differences", ""]
    if d.config_changes:
        lines.append(md_table(["key", na, nb], [[f"`{k}`", _fmt_value(va), _fmt_value(vb)]
                                                for k, va, vb in d.config_changes], "lll"))
    else:
        lines.append("The configs are identical.")
    lines += ["", "## Metrics", "",
              md_table(["metric", na, nb, "change", "relative", "better"],
                       [[f"{c.row_a.label} ({c.row_a.unit})", num(c.row_a.value, c.row_a.unit),
                         num(c.value_b, c.row_a.unit), *change(c.row_a.value, c.value_b, c.row_a.unit),
                         c.winner or DASH] for c in d.comparisons]),
              "", "Percentiles are `numpy.percentile` (linear). Latencies cover requests finished in each run; "
              f"'better' names the config that wins (a change under {SAME_TOLERANCE:.1%} is a tie).", ""]
    pc = d.pair_counts
    any_pair = next(iter(d.paired.values()))
    lines += ["## Paired per-request deltas", "",
              f"{num(pc['finished_both'], 'count')} requests finished in both runs and are paired on request_id "
              f"({num(pc['finished_a_only'], 'count')} finished only in {na}, {num(pc['finished_b_only'], 'count')} only "
              f"in {nb}, {num(pc['unmatched'], 'count')} present in one run only).", "",
              md_table([f"delta {nb} - {na} (ms)", f"change in mean [{CI_LEVEL:.0%} CI]",
                        f"change in p{QUANTILE * 100:g} [{CI_LEVEL:.0%} CI]"],
                       [[label, _ci(d.paired[k].mean_delta), _ci(d.paired[k].p99_delta)]
                        for k, label in PAIRED_METRICS.items()]),
              "", f"Paired bootstrap: {any_pair.resamples} resamples of the paired requests (seeded), percentile "
              "intervals; * marks an interval that excludes zero.", ""]
    lines += _top_sections(d)
    lines += _reuse_section(d)
    if charts:
        lines += ["## Distributions", ""]
        for key, alt in (("ttft_cdf", "TTFT CDF"), ("itl_cdf", "ITL CDF"), ("tpot_cdf", "TPOT CDF"),
                         ("e2e_cdf", "E2E CDF")):
            if key in charts:
                lines += [f"![{alt}: {na} vs {nb}]({charts[key]})", ""]
    for name, m in ((na, ma), (nb, mb)):
        if m.warnings:
            lines += [f"## Warnings for {name}", ""] + [f"- {w}" for w in m.warnings] + [""]
    return "\n".join(lines)


KEY_METRICS = ("ttft_mean", "ttft_p99", "itl_mean", "tpot_mean", "e2e_mean", "e2e_p99", "request_throughput",
               "output_throughput", "goodput", "gpu_hit_ratio", "total_hit_ratio", "preemptions")


def verdict_lines(d: DiffResult) -> list[str]:
    na, nb = d.names
    wins_a, wins_b = d.wins("A"), d.wins("B")
    ties = d.wins("tie")
    out = [f"- {nb} is better on {len(wins_b)} metrics, {na} on {len(wins_a)}, {len(ties)} unchanged."]
    by_key = {c.key: c for c in d.comparisons}
    for key in KEY_METRICS:
        c = by_key.get(key)
        if c is None or not c.winner:
            continue
        absolute, rel = change(c.row_a.value, c.value_b, c.row_a.unit)
        who = "no change" if c.winner == "tie" else f"{d.names[0] if c.winner == 'A' else nb} wins"
        out.append(f"- {c.row_a.label}: {num(c.row_a.value, c.row_a.unit)} -> {num(c.value_b, c.row_a.unit)} "
                   f"{c.row_a.unit} ({rel}): {who}")
    return out


def _top_sections(d: DiffResult) -> list[str]:
    na, nb = d.names
    out: list[str] = []
    for direction in ("regressed", "improved"):
        rows = [r for r in d.top_requests if r["direction"] == direction]
        out += [f"## Requests that {direction} most (E2E, {nb} vs {na})", ""]
        if rows:
            out.append(md_table(["request", "session", "turn", f"TTFT {na}", f"TTFT {nb}", "TTFT delta",
                                 f"E2E {na}", f"E2E {nb}", "E2E delta"],
                                [[f"`{r['request_id']}`", f"`{r['session_id']}`" if r["session_id"] else DASH,
                                  num(r["turn"], "count"), num(r["ttft_a"], "ms"), num(r["ttft_b"], "ms"),
                                  f"{r['ttft_delta']:+,.1f}", num(r["e2e_a"], "ms"), num(r["e2e_b"], "ms"),
                                  f"{r['e2e_delta']:+,.1f}"] for r in rows], "lllrrrrrr"))
        else:
            out.append(f"No paired request {direction}.")
        out.append("")
    for direction in ("regressed", "improved"):
        rows = [r for r in d.top_sessions if r["direction"] == direction]
        out += [f"## Sessions that {direction} most (total E2E delta over their requests)", ""]
        if rows:
            out.append(md_table(["session", "paired requests", "total E2E delta (ms)", "mean E2E delta (ms)",
                                 "mean TTFT delta (ms)"],
                                [[f"`{r['session_id']}`", num(r["requests"], "count"), f"{r['e2e_delta_total']:+,.1f}",
                                  f"{r['e2e_delta_mean']:+,.1f}", f"{r['ttft_delta_mean']:+,.1f}"] for r in rows]))
        else:
            out.append(f"No session {direction}.")
        out.append("")
    return out


def _reuse_section(d: DiffResult) -> list[str]:
    na, nb = d.names
    ma, mb = d.metrics
    ra, rb = ma.reuse, mb.reuse
    pa_, pb = ma.preemptions, mb.preemptions
    rows = []
    for label, va, vb, unit in (
        ("GPU hit tokens", ra["gpu_hit_tokens"], rb["gpu_hit_tokens"], "count"),
        ("CPU (G2) hit tokens", ra["cpu_hit_tokens"], rb["cpu_hit_tokens"], "count"),
        ("GPU hit ratio", ra["gpu_hit_ratio"], rb["gpu_hit_ratio"], "ratio"),
        ("CPU (G2) hit ratio", ra["cpu_hit_ratio"], rb["cpu_hit_ratio"], "ratio"),
        ("total hit ratio", ra["total_hit_ratio"], rb["total_hit_ratio"], "ratio"),
        ("preemptions", pa_["preemptions"], pb["preemptions"], "count"),
        ("preempted requests", pa_["preempted_requests"], pb["preempted_requests"], "count"),
    ):
        rows.append([label, num(va, unit), num(vb, unit), *change(va, vb, unit)])
    out = ["## Reuse and preemptions", "", md_table(["", na, nb, "change", "relative"], rows), ""]
    if ma.ideal is not None and (mb.ideal is None or mb.ideal == ma.ideal):
        out += [f"Ideal with an infinite cache (same trace for both): {num(ma.ideal['ideal_hit_ratio'], 'ratio')}.", ""]
    elif ma.ideal is not None:
        out += [f"Ideal with an infinite cache, over the rows each run replayed: {na} "
                f"{num(ma.ideal['ideal_hit_ratio'], 'ratio')}, {nb} {num(mb.ideal['ideal_hit_ratio'], 'ratio')}.", ""]
    turns_b = {t["turn_key"]: t for t in mb.reuse_by_turn}
    if ma.reuse_by_turn:
        out += ["By session turn (total hit ratio, GPU + CPU):", "",
                md_table(["turn", na, nb, "change", "ideal"],
                         [[turn_label(t["turn_key"]), num(_total(t), "ratio"), num(_total(turns_b.get(t["turn_key"])), "ratio"),
                           change(_total(t), _total(turns_b.get(t["turn_key"])), "ratio")[0],
                           num(t["ideal_hit_ratio"], "ratio")] for t in ma.reuse_by_turn]), ""]
    return out


def _total(t: dict[str, Any] | None) -> float | None:
    if t is None or t["gpu_hit_ratio"] is None:
        return None
    return t["gpu_hit_ratio"] + (t["cpu_hit_ratio"] or 0.0)


def write_diff(d: DiffResult, markdown: str | Path, *, charts: bool = True, json_path: str | Path | None = None) -> DiffResult:
    markdown = Path(markdown)
    traces = [(info.get("trace") or {}).get("path") for info in d.infos]
    inputs = run_files(d.dirs[0]) + run_files(d.dirs[1]) + traces
    check_report_outputs(markdown, json_path, charts, inputs, [*d.dirs, *traces])
    rel: dict[str, str] = {}
    if charts:
        final_dir = charts_dir_for(markdown)
        with atomic_dir(final_dir, inputs=[*d.dirs, *traces], kind="diff charts") as tmp:
            made = diff_charts(tmp, d.metrics[0], d.metrics[1], d.names)
        d.charts = {k: final_dir / p.name for k, p in made.items()}
        rel = {k: f"{final_dir.name}/{p.name}" for k, p in made.items()}
    write_text_atomic(markdown, render_diff(d, rel), inputs)
    d.markdown = markdown
    if json_path is not None:
        write_json_atomic(json_path, inputs=inputs, obj={
            "names": list(d.names), "dirs": [str(p) for p in d.dirs],
            "a": d.metrics[0].to_json(), "b": d.metrics[1].to_json(),
            "config_changes": [{"key": k, "a": va, "b": vb} for k, va, vb in d.config_changes],
            "pair_counts": d.pair_counts,
            "paired": {k: {"n": v.n, "resamples": v.resamples, "mean_delta": vars(v.mean_delta),
                           "p99_delta": vars(v.p99_delta)} for k, v in d.paired.items()},
            "comparisons": [{"key": c.key, "a": c.row_a.value, "b": c.value_b, "winner": c.winner}
                            for c in d.comparisons],
        })
    return d
