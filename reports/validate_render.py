"""Markdown for ``replay validate`` (and its section in ``replay report``): formats only."""

from __future__ import annotations

from replay.reports.fmt import md_table, num
from replay.reports.validate import METRICS, NO_GROUP, POOLED, Validation

DISTRIBUTION_NOTE = ("Both distributions over the same requests (finished in the replay, measured in the log); error = "
                     "predicted - measured of each statistic, error % = error / measured. ITL = each request's mean "
                     "gap between streamed chunks; ITL, every gap = all gaps pooled (vLLM's ITL; requests = the "
                     "measured gaps; no per-request error); queue, prefill and decode are the server-side phases of vLLM's "
                     "request spans (first scheduled - arrival, first token - first scheduled, last - first token).")
ERROR_NOTE = ("Error = predicted - measured, per finished request matched by request_id. MAPE = mean of "
              "|error| / measured over requests with a positive measurement; bias = mean error (positive: the "
              "replay predicts slower / more cache hits than measured); |error| p50/p90 exact (linear "
              "interpolation). Predicted cached tokens = GPU prefix hits + host (G2) hits at first admission.")


def _unit(metric: str) -> str:
    return "count" if metric == "cached_tokens" else "ms"


STATS = (("mean", "measured_mean", "predicted_mean", None), ("p50", "measured_q", "predicted_q", 0),
         ("p90", "measured_q", "predicted_q", 1), ("p99", "measured_q", "predicted_q", 2))


SHORT_NAMES = {"ttft": "TTFT ms", "tpot": "TPOT ms", "itl": "ITL ms", "itl_gaps": "ITL gaps ms", "e2e": "E2E ms", "queue": "queue ms",
               "prefill": "prefill ms", "decode": "decode ms", "cached_tokens": "cached tok"}


def distribution_rows(v: Validation, fmt=None, short: bool = False) -> list[list[str]]:
    """Per metric (and label): mean, p50, p90, p99 measured and predicted, their signed error and
    error %, with the request count and per-request MAPE on each block's first row."""
    fmt = fmt or num
    grouped = v.by is not None
    rows = []
    for s in v.summary:
        label, unit = METRICS[s["metric"]]
        name = SHORT_NAMES[s["metric"]] if short else f"{label} ({unit})"
        u = _unit(s["metric"])
        for k, (stat, m_key, p_key, idx) in enumerate(STATS):
            measured = s[m_key] if idx is None else (s[m_key] or [None] * 3)[idx]
            predicted = s[p_key] if idx is None else (s[p_key] or [None] * 3)[idx]
            error = None if measured is None or predicted is None else predicted - measured
            pct = "—" if error is None or not measured else f"{100 * error / measured:+.1f}%"
            head = [name] + ([str(s["grp"])] if grouped else []) + [
                fmt(s["requests"], "count"), "—" if s["mape_pct"] is None else f"{s['mape_pct']:.1f}%"]
            rows.append((head if k == 0 else [""] * len(head)) +
                        [stat, fmt(measured, u), fmt(predicted, u), fmt(error, u), pct])
    return rows


def distribution_header(v: Validation, short: bool = False) -> list[str]:
    if short:
        return ["metric"] + ([v.by] if v.by is not None else []) + ["n", "MAPE", "", "meas.", "pred.", "err", "err %"]
    return (["metric"] + ([v.by] if v.by is not None else []) +
            ["requests", "MAPE", "stat", "measured", "predicted", "error", "error %"])


def distribution_table(v: Validation) -> str:
    grouped = v.by is not None
    return md_table(distribution_header(v), distribution_rows(v), "l" + ("l" if grouped else "") + "rrl" + "r" * 4)


def cdf_charts_text(v: Validation) -> list[str]:
    """One character CDF chart per latency metric (measured vs predicted, every matched request)."""
    from replay.reports.text_chart import cdf_chart

    out = []
    for metric, (label, unit) in METRICS.items():
        d = v.samples.get(metric)
        if metric == "cached_tokens" or not d or len(d["measured"]) < 2:
            continue
        counts = d.get("counts")
        out.append(cdf_chart(label, unit, d["measured"], d["predicted"],
                             counts=(int(counts[0]), int(counts[1])) if counts else None))
    return out


def summary_table(v: Validation) -> str:
    grouped = v.by is not None
    header = (["metric"] + ([v.by] if grouped else []) +
              ["requests", "measured mean", "predicted mean", "MAPE", "bias", "abs error p50", "abs error p90"])
    rows = []
    for s in (s for s in v.summary if s["metric"] not in POOLED):
        label, unit = METRICS[s["metric"]]
        u = _unit(s["metric"])
        rows.append([f"{label} ({unit})"] + ([str(s["grp"])] if grouped else []) +
                    [num(s["requests"], "count"), num(s["measured_mean"], u), num(s["predicted_mean"], u),
                     "—" if s["mape_pct"] is None else f"{s['mape_pct']:.1f}%", num(s["bias"], u),
                     num(s["abs_error_p50"], u), num(s["abs_error_p90"], u)])
    return md_table(header, rows, "l" + ("l" if grouped else "") + "r" * 7)


def conditions_lines(v: Validation) -> list[str]:
    out = []
    if v.differences:
        out.append("**The replay was not run like the log.** These differences make the errors below partly "
                   "a comparison of different conditions, not only of the model:")
        out += [""] + [f"- {d}" for d in v.differences]
    else:
        out.append("No difference found between the replay and the recorded settings of the log.")
    if v.unrecorded:
        out += ["", "Not recorded in the log, so not checked: " + "; ".join(v.unrecorded) + "."]
    return out


def worst_table(v: Validation) -> str:
    grouped = v.by is not None
    header = ["metric", "request"] + ([v.by] if grouped else []) + ["measured", "predicted", "error", "error %"]
    rows = [[METRICS[w["metric"]][0], f"`{w['request_id']}`"] + ([str(w["grp"])] if grouped else []) +
            [num(w["measured"], _unit(w["metric"])), num(w["predicted"], _unit(w["metric"])),
             num(w["error"], _unit(w["metric"])), "—" if w["ape"] is None else f"{w['ape']:.1%}"]
            for w in v.worst]
    return md_table(header, rows, "ll" + ("l" if grouped else "") + "rrrr")


def coverage_line(v: Validation) -> str:
    c = v.coverage
    text = (f"{num(c['matched'], 'count')} finished requests of {num(c['replayed'], 'count')} replayed matched a "
            f"measurement ({num(c['measured_rows'], 'count')} measured rows in `{v.measured_source}`")
    if c["unmatched_measured"]:
        text += f"; {num(c['unmatched_measured'], 'count')} match no replayed request"
    return text + ")."


def validation_section(v: Validation, charts: dict[str, str], level: str = "##",
                       text_charts: bool = False) -> list[str]:
    """The validation as markdown lines; ``charts`` maps chart name -> relative path."""
    out = [f"{level} Predicted vs measured", "", coverage_line(v), "", *conditions_lines(v), "",
           distribution_table(v), "", DISTRIBUTION_NOTE, "", f"{level}# Per-request errors", "",
           summary_table(v), "", ERROR_NOTE, ""]
    if text_charts and v.samples:
        out += [f"{level}# Measured and predicted distributions", "", "```text",
                *"\n\n".join(cdf_charts_text(v)).splitlines(), "```", ""]
    for name, alt in (("scatter", "Predicted vs measured per request"), ("error_cdf", "Relative error CDF")):
        if name in charts:
            out += [f"![{alt}]({charts[name]})", ""]
    if v.worst:
        out += [f"{level}# Worst requests", "", worst_table(v), ""]
    return out


def render_validation(v: Validation, charts: dict[str, str]) -> str:
    title = f"# Validation: `{v.outdir}` against `{v.measured_source}`"
    if v.by is not None and v.by != NO_GROUP:
        title += f" (by {v.by})"
    return "\n".join([title, ""] + validation_section(v, charts, text_charts=True))


def labels_section(by: str, groups: list[dict]) -> list[str]:
    """``replay report --by LABEL``: requests, latency percentiles and prefix hits per label value."""
    rows = []
    for g in groups:
        q = {k: (g[k] or [None, None, None]) for k in ("ttft_q", "tpot_q", "e2e_q")}
        rows.append([str(g["grp"]), num(g["requests"], "count"), num(g["finished"], "count"),
                     *(num(v, "ms") for v in q["ttft_q"]), num(q["tpot_q"][0], "ms"), num(q["tpot_q"][2], "ms"),
                     num(q["e2e_q"][0], "ms"), num(q["e2e_q"][2], "ms"), num(g["hit_ratio"], "ratio")])
    header = [by, "requests", "finished", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p99",
              "E2E p50", "E2E p99", "prefix hit"]
    return [f"## By {by}", "", md_table(header, rows, "l" + "r" * 10), "",
            "Latencies in ms over finished requests; prefix hit = (GPU + host hits) / prompt tokens of admitted "
            "requests. Requests without the label are grouped as `(none)`.", ""]
