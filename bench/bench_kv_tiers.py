"""KV tiers benchmark: the cost of a three-tier chain on a fleet, as a ratio to the same fleet without.

    python bench/bench_kv_tiers.py                        # 8 replicas, first 3,000 Mooncake requests, 3 reps
    python bench/bench_kv_tiers.py --max-requests 12000 --reps 5

Each replay is its own `replay run -q` process. The configs alternate within each repetition
(no tiers, G2 alone, three tiers, no tiers, ...) so all see the same machine load; the figure is the
median over repetitions of cpu(three tiers) / cpu(no tiers), the replay process's user + system CPU
time (wall time is printed too; on a shared machine it measures the neighbours as well). The ratio of
the replays' own walls (run.json ``wall_time_s``: the trace prepared, replayed and written, without the
process's start) is printed beside it: the process's fixed cost (imports, the config, the trace read)
is the same for all three and pulls the CPU ratio towards 1 by as much as it weighs. The three
tiers: G2 host memory (`host_offload`), an on-evict local disk and a write-through cluster pool;
they find hits the plain fleet does not, so the runs also differ in steps (printed beside). G2
alone, the seed's host offload, is printed as a second baseline: what the two tiers below it add.
A fleet without shared tiers behind round robin is replayed replica by replica (docs/fleet.md,
"Replicas that share nothing"), which a fleet with a node disk or a cluster pool cannot be; so the
no-tier fleet is also replayed in the one event loop the tiered fleet uses ("no tiers, one loop"),
and the tiers' own cost is three tiers / that. Results go to bench/results/kv-tiers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.bench_fleet import CONFIGS, MOONCAKE, ONE_LOOP, RESULTS, replay_run  # noqa: E402

TIERS = ("kv_cache.tiers=[{name: ssd, medium: disk, store: on_evict, size_gb: 2000, read_gb_per_s: 6, "
         "write_gb_per_s: 3, latency_ms: 0.1, replicas_per_node: 8}, {name: pool, medium: remote, "
         "scope: cluster, size_gb: 20000, read_gb_per_s: 25, write_gb_per_s: 25, pool_read_gb_per_s: 200, "
         "pool_write_gb_per_s: 200, latency_ms: 1.0}]")
HOST = "host_offload.size_gib=200"


def _ratios(base: list[float], other: list[float]) -> list[float]:
    """other / base, repetition by repetition."""
    return [b / a for a, b in zip(base, other, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    base = [f"fleet.replicas={args.replicas}", f"load.max_requests={args.max_requests}"]
    variants = {"no tiers": base, "no tiers, one loop": base, "G2 alone": base + [HOST],
                "three tiers": base + [HOST, TIERS]}
    walls: dict[str, list[float]] = {k: [] for k in variants}
    replay_walls: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    facts: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kv-tiers-") as tmp:
        for rep in range(args.reps):
            for name, sets in variants.items():
                out = Path(tmp) / f"{name.replace(' ', '-')}-{rep}"
                one_loop = name.endswith("one loop")
                res = replay_run(MOONCAKE, out, CONFIGS / "mooncake-fleet8.yaml", sets,
                                 **({"launcher": ONE_LOOP} if one_loop else {}))
                assert one_loop or name != "no tiers" or res["info"]["fleet"].get("replicas_apart"), name
                walls[name].append(res["wall_s"])
                cpus[name].append(res["cpu_s"])
                replay_walls[name].append(res["info"]["wall_time_s"])
                t = res["info"]["totals"]
                facts[name] = {"steps": t["steps"], "prefix_hit_tokens": t["prefix_hit_tokens"],
                               "cpu_hit_tokens": t["cpu_hit_tokens"], "peak_rss_mib": res["peak_rss_mib"]}
    ratios = _ratios(cpus["no tiers"], cpus["three tiers"])
    one_loop_ratios = _ratios(cpus["no tiers, one loop"], cpus["three tiers"])
    over_g2 = _ratios(cpus["G2 alone"], cpus["three tiers"])
    wall_ratios = _ratios(walls["no tiers"], walls["three tiers"])
    replay_ratios = _ratios(replay_walls["no tiers"], replay_walls["three tiers"])
    result = {"replicas": args.replicas, "max_requests": args.max_requests, "walls_s": walls, "cpu_s": cpus,
              "ratio_median": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
              "wall_ratio_median": round(statistics.median(wall_ratios), 3),
              "replay_walls_s": replay_walls, "replay_wall_ratio_median": round(statistics.median(replay_ratios), 3),
              "ratio_over_g2_median": round(statistics.median(over_g2), 3),
              "ratio_over_one_loop_median": round(statistics.median(one_loop_ratios), 3),
              "ratios_over_one_loop": [round(r, 3) for r in one_loop_ratios],
              "load_average": round(os.getloadavg()[0], 1), "facts": facts}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kv-tiers.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| config | CPU s (median) | wall s (median) | steps | GPU hit tokens | tier hit tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in variants:
        f = facts[name]
        print(f"| {name} | {statistics.median(cpus[name]):.2f} | {statistics.median(walls[name]):.2f} | "
              f"{f['steps']:,} | {f['prefix_hit_tokens']:,} | {f['cpu_hit_tokens']:,} |")
    print(f"\ncpu(three tiers) / cpu(no tiers): median {result['ratio_median']} over {args.reps} reps "
          f"({', '.join(map(str, result['ratios']))}); target <= 1.3; wall ratio {result['wall_ratio_median']}, "
          f"load average {result['load_average']}")
    print(f"cpu(three tiers) / cpu(G2 alone): median {result['ratio_over_g2_median']}")
    print(f"cpu(three tiers) / cpu(no tiers, one loop): median {result['ratio_over_one_loop_median']} "
          f"({', '.join(map(str, result['ratios_over_one_loop']))}); target <= 1.3")
    print(f"replay wall (run.json wall_time_s, without the process's start), three tiers / no tiers: median "
          f"{result['replay_wall_ratio_median']}")


if __name__ == "__main__":
    main()
