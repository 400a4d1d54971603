"""The report's "KV tiers" section, from run.json's ``kv_tiers`` (docs/kv-tiers.md)."""

from __future__ import annotations

from typing import Any

from replay.reports.fmt import md_table, num


def kv_tiers_section(info: dict[str, Any]) -> list[str]:
    """Per tier below G2: capacity, hits, bytes, evictions, link use; then the size curves."""
    tiers = info.get("kv_tiers")
    if not tiers:
        return []
    rows = []
    for t in tiers:
        util = ", ".join(f"{k} {v:.1%}" for k, v in t["link_utilization"].items())
        rows.append([t["name"], f"{t['medium']}, {t['scope']}, {t['store']}", num(t["num_blocks"], "count"),
                     num(t["hit_tokens"], "count"), num(t["hit_rate"], "ratio"),
                     num(t["bytes_read"] / 1e9, "count"), num(t["bytes_written"] / 1e9, "count"),
                     num(t["evictions"], "count"), num(t["writes_dropped"], "count"), util])
    out = ["## KV tiers", "",
           "Tiers after GPU memory and G2, in lookup order. Hit rate = tokens loaded from the tier / all "
           "prompt tokens. A cluster tier is one pool for the fleet; link use is the share of the span a "
           "link was busy (mean over the tier's links).", "",
           md_table(["tier", "kind", "blocks", "hit tokens", "hit rate", "GB read", "GB written", "evictions",
                     "writes dropped", "link use"], rows, "llrrrrrrrl"), ""]
    curves = [t for t in tiers if t.get("size_curve")]
    if curves:
        out += ["Hit rate against each tier's size, from this one run (LRU stack distances of the tier's own "
                "accesses; the tiers above it as they were):", ""]
        for t in curves:
            cells = [f"{num(p['num_blocks'], 'count')}: {num(p['hit_rate'], 'ratio')}" for p in t["size_curve"]]
            out.append(f"- {t['name']}: " + "; ".join(cells))
        out.append("")
    return out
