"""KV tiers against AISimulate: one Mooncake-format trace, one tier variant, both simulators.

    python -m bench.compare.kv_tiers_peer TRACE.jsonl VARIANT REPLICAS GPU_BLOCKS OUTDIR

VARIANT: ``g2`` (per-replica G2 only), ``g3local`` (G2 + a replica-scope disk tier = the peer's
g3_offload worker_local), ``g3shared`` (G2 + a cluster pool = g3_offload cluster_shared),
``g2shared`` (no G2, one cluster-scope host tier = the peer's host_offload scope cluster_shared).
G2 holds 2 x GPU_BLOCKS, the tier 20 x GPU_BLOCKS; links as the peer's defaults (G2 32 GB/s, G3
10 GB/s and 0.1 ms, pools 80 GB/s); fleet of REPLICAS behind round robin. Prints one JSON line:
our hit ratio (GPU + tiers, at first admission) beside the peer's first-admission and overall
ratios, mean TTFT on both sides, and the peer's G3 counters. docs/kv-tiers.md quotes the results.
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

trace, variant, replicas, gpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
W = Path(sys.argv[5]) / f"{Path(trace).stem}-{variant}"
W.mkdir(parents=True, exist_ok=True)
ours = {"model": "meta-llama/Llama-3.1-8B", "hardware": "h200_sxm",
        "scheduler": {"max_num_batched_tokens": 8192, "max_num_seqs": 256},
        "kv_cache": {"block_size": 16, "enable_prefix_caching": True, "num_gpu_blocks": gpu + 1},
        "load": {"mode": "trace_timestamps"}, "timing": {"backend": "roofline", "host_overhead_ms": 0.0},
        "fleet": {"replicas": replicas, "router": "round_robin"}}
kvp = {"block_size": 16, "prefix_caching": True, "capacity": {"type": "fixed", "blocks": gpu}}
host = {"num_cpu_blocks": 2 * gpu, "d2h_gbps": 32.0, "h2d_gbps": 32.0, "latency_us": 0.0}
g3 = dict(num_blocks=20 * gpu, read_gb_per_s=10.0, write_gb_per_s=10.0, latency_ms=0.1)
if variant == "g3local":
    ours["host_offload"] = host
    ours["kv_cache"]["tiers"] = [dict(name="ssd", medium="disk", scope="replica", **g3)]
    kvp["host_offload"] = {"num_host_blocks": 2 * gpu, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0}
    kvp["g3_offload"] = {"scope": "worker_local", "num_g3_blocks": 20 * gpu, "latency_to_first_byte_ms": 0.1,
                         "read_bandwidth_gbps": 10.0, "write_bandwidth_gbps": 10.0,
                         "shared_read_bandwidth_gbps": 1e6, "shared_write_bandwidth_gbps": 1e6}
elif variant == "g3shared":
    ours["host_offload"] = host
    ours["kv_cache"]["tiers"] = [dict(name="pool", medium="remote", scope="cluster", pool_read_gb_per_s=80.0,
                                      pool_write_gb_per_s=80.0, **g3)]
    kvp["host_offload"] = {"num_host_blocks": 2 * gpu, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0}
    kvp["g3_offload"] = {"scope": "cluster_shared", "num_g3_blocks": 20 * gpu, "latency_to_first_byte_ms": 0.1,
                         "read_bandwidth_gbps": 10.0, "write_bandwidth_gbps": 10.0,
                         "shared_read_bandwidth_gbps": 80.0, "shared_write_bandwidth_gbps": 80.0}
elif variant == "g2shared":
    ours["kv_cache"]["tiers"] = [dict(name="pool", medium="host", scope="cluster", num_blocks=2 * gpu * replicas,
                                      read_gb_per_s=32.0, write_gb_per_s=32.0, pool_read_gb_per_s=80.0,
                                      pool_write_gb_per_s=80.0, latency_ms=0.0)]
    kvp["host_offload"] = {"scope": "cluster_shared", "num_host_blocks": 2 * gpu * replicas, "d2h_bandwidth_gbps": 32.0,
                           "h2d_bandwidth_gbps": 32.0, "shared_d2h_bandwidth_gbps": 80.0,
                           "shared_h2d_bandwidth_gbps": 80.0}
elif variant == "g2":
    ours["host_offload"] = host
    kvp["host_offload"] = {"num_host_blocks": 2 * gpu, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0}
peer = {"traffic": {"source": {"type": "trace", "paths": [str(Path(trace).resolve())], "format": "mooncake", "block_size": 512},
                    "load": {"type": "trace_timestamps", "speedup": 1.0}},
        "engine": {"mode": "aggregated", "model": "meta-llama/Meta-Llama-3.1-8B", "hardware": "h200_sxm", "backend": "vllm",
                   "workers": {"aggregated": {"parallelism": {"tensor": 1, "replicas": replicas},
                                              "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
                                              "kv_cache": kvp}}}}
(W / "ours.yaml").write_text(yaml.safe_dump(ours))
(W / "peer.yaml").write_text(yaml.safe_dump(peer))
r = subprocess.run([sys.executable, "-m", "replay.cli", "run", trace, "-c", str(W / "ours.yaml"), "-o", str(W / "ours"), "-q"],
                   cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
if r.returncode:
    sys.exit(r.stderr[-2000:])
p = subprocess.run([str(Path.home() / "aisim/bin/aisimulate"), "predict", "-c", str(W / "peer.yaml"), "--output-dir", str(W / "peer"),
                    "--overwrite", "--format", "json"], capture_output=True, text=True)
if p.returncode:
    sys.exit(p.stderr[-3000:])
info = json.loads((W / "ours" / "run.json").read_text())
t = info["totals"]
req = pd.read_parquet(W / "ours" / "requests.parquet")
ours_hit = (t["prefix_hit_tokens"] + t["cpu_hit_tokens"]) / t["prefix_query_tokens"]
pred = json.loads(next((W / "peer").glob("prediction*.json")).read_text())


def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key:
                return v
            x = find(v, key)
            if x is not None:
                return x
    return None


peer_ttft = find(pred, "mean_ttft_ms")
peer_hit = find(pred, "prefix_cache_reused_ratio")
peer_first = find(pred, "first_admission_prefix_cache_reused_ratio")
print(json.dumps({"trace": Path(trace).stem, "variant": variant, "ours_hit": round(ours_hit, 4), "peer_hit": round(peer_hit, 4), "peer_first_admission_hit": round(peer_first, 4),
                  "ours_ttft_mean": round(float(req.ttft_ms.mean()), 2), "peer_ttft_mean": round(peer_ttft, 2), "ttft_ratio": round(float(req.ttft_ms.mean()) / peer_ttft, 3),
                  "tiers": [(x["name"], x["hit_rate"]) for x in info.get("kv_tiers", [])], "peer_g3": {k: v for k, v in pred.items() if "g3" in k or "host" in k}}))
