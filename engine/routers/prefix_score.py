"""llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, EPP scheduling profile): a
weighted sum of scorers, highest total wins (max-score picker: ties broken uniformly at random).

Scorers, each in [0, 1] (pkg/epp/scheduling/.../scorer):
- queue (queuedepth/queue.go): (max_q - q) / (max_q - min_q) over the replicas, 1 when all equal;
  q = the replica's waiting requests.
- kv_cache_utilization (kvcacheutilization): 1 - KV cache usage.
- prefix_cache (prefix/plugin.go): matched blocks / request blocks. The walk goes over the
  request's blocks in order and stops at the first block no replica holds; each replica holding a
  block scores one match. Request blocks: at most ``max_prefix_blocks`` (256), the partial tail
  block included. By default (llm-d's approximate prefix producer) a replica "holds" the blocks
  the router sent it, in a per-replica LRU of ``lru_capacity_blocks`` (default: the engine's
  number of KV blocks, llm-d's auto-tune); ``precise: true`` reads the replica's real prefix cache
  instead (llm-d's precise prefix-cache scorer, fed by KV events): each replica's leading run of
  cached request blocks, ReplicaView.prefix_hit_blocks. That is the walk's count: a replica's
  cache never holds a block of a request's chain without the blocks before it (a hit takes a
  leading run and vLLM frees a request's blocks tail first, so a chain is evicted from its end),
  so the replicas' matches stop where the walk stops.

Default weights are llm-d's defaults (pkg/epp/config/loader/defaults.go): queue 2,
kv_cache_utilization 2, prefix_cache 3.

Departures: llm-d hashes prompt characters (4 per token); the replay names blocks by the trace's
token-block identities at the engine's block size. Metrics are read at the arrival instant (llm-d
scrapes them periodically).
"""

from __future__ import annotations

from collections import OrderedDict

from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router, RouterContext


class PrefixScoreRouter(Router):
    name = "prefix_score"
    reads_replica_state = True
    reads_prefix_caches = True

    def __init__(self, ctx: RouterContext, options) -> None:
        super().__init__(ctx, options)
        self.w_queue = options.queue_weight
        self.w_kv = options.kv_cache_utilization_weight
        self.w_prefix = options.prefix_cache_weight
        self.max_blocks = options.max_prefix_blocks
        self.precise = options.precise
        self.capacity = options.lru_capacity_blocks or ctx.num_gpu_blocks
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.n)]
        self.tier_weights = options.tier_weights

    def _request_blocks(self, req: Request) -> tuple[int, int | None]:
        """(full blocks counted, key of the partial tail block or None)."""
        bs = self.ctx.block_size
        isl = req.num_prompt_tokens
        n_full = min(isl // bs, self.max_blocks)
        if n_full < self.max_blocks and isl % bs:
            return n_full, req.keys.prefix_key(isl)  # the partial tail block counts too (llm-d)
        return n_full, None

    def _approx_matches(self, keys: list[int], replicas: list[ReplicaView]) -> list[int]:
        """llm-d's walk over the router's own LRUs of the live replicas: stops at the first block
        none of them holds. One count per position of ``replicas``."""
        lrus = [self.lru[v.replica] for v in replicas]
        matches = [0] * len(lrus)
        for key in keys:
            holders = [w for w, lru in enumerate(lrus) if key in lru]
            if not holders:
                break
            for w in holders:
                matches[w] += 1
        return matches

    def route(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> int:
        n = len(replicas)
        n_full, tail = self._request_blocks(req)
        n_keys = n_full + (tail is not None)
        keys: list[int] = []
        if self.precise:
            runs = req.keys.key_runs(0, n_full, self.ctx.block_size)
            if tail is not None:
                runs.append(range(tail, tail + 1))
            matches = self.views_asked(replicas).prefix_hit_blocks(runs)
        else:
            keys = req.keys.keys_upto(n_full)[:n_full]
            if tail is not None:
                keys.append(tail)
            matches = self._approx_matches(keys, replicas)
        queues = [c.num_waiting for c in replicas]
        qmin, qmax = min(queues), max(queues)
        totals = []
        for w in range(n):
            queue = 1.0 if qmax == qmin else (qmax - queues[w]) / (qmax - qmin)
            kv = 1.0 - replicas[w].kv_usage()
            matched = float(matches[w])
            if self.tier_weights and n_keys:  # blocks found in KV tiers after the GPU, discounted
                tiers = replicas[w].tier_hit_tokens(req, matches[w] * self.ctx.block_size, now_ms)
                matched += sum([self.tier_weights.get(name, 0.0) * t for name, t in tiers.items()]) / self.ctx.block_size
                matched = min(matched, float(n_keys))
            prefix = matched / n_keys if n_keys else 0.0
            totals.append(self.w_queue * queue + self.w_kv * min(max(kv, 0.0), 1.0) + self.w_prefix * prefix)
        w = self._pick_min([-t for t in totals])
        if not self.precise:
            lru = self.lru[replicas[w].replica]
            for key in keys:
                lru[key] = None
                lru.move_to_end(key)
            while len(lru) > self.capacity:
                lru.popitem(last=False)
        return w

    def replica_started(self, replica: int) -> None:
        self.lru[replica] = OrderedDict()
