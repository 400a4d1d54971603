"""Dynamo's KV-aware router (ai-dynamo/dynamo: lib/llm/src/kv_router/scheduler.rs
DefaultWorkerSelector and sequence.rs ActiveSequences; lib/kv-router/src/scheduling/selector/
default.rs in later releases, equal with default settings).

Per worker w, with the request's prompt of ``isl`` tokens in blocks of the KV block size:

    overlap_w        leading request blocks worker w has cached
    prefill_tokens_w = (isl - overlap_w * block_size) + tokens still to prefill of w's requests
    decode_blocks_w  = distinct prompt blocks of w's active requests, this request's included
    cost_w           = overlap_score_weight * prefill_tokens_w / block_size + decode_blocks_w

The lowest cost wins (ties: seeded uniform draw, as Dynamo draws among equal minima); with
``router_temperature`` > 0 the costs are scaled to [0, 1] by (max - min), negated, divided by the
temperature and sampled through a softmax. A request counts as prefilling until its first token
and as active until it finishes (Dynamo: mark_prefill_completed, free): the fleet tells the router of
each first token (Router.request_first_token), so the prefill load is settled once per request, not
looked for at every arrival.

``kv_events: true``: the overlap is read from the replica's real prefix cache at the arrival
instant (what KV events give Dynamo), ReplicaView.prefix_hit_blocks. ``kv_events: false``
(Dynamo's approximate mode, approx.rs): the router remembers the blocks it routed to each worker
for ``ttl_s`` (120 s; routing a block again renews it), pruned to 80% of ``max_tree_blocks``
(2^20) by earliest expiry.

Block identities are the engine's block keys: chained like Dynamo's sequence hashes, so the blocks
a request shares with a worker's active requests are a leading run. The active requests' blocks are
kept per key run (ActiveBlocks), not per block: a handful of runs per request rather than hundreds
of blocks, with the same answers.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import takewhile

from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.active_blocks import ActiveBlocks, kv_aware_costs
from replay.engine.routers.base import Router, RouterContext

__all__ = ["ActiveBlocks", "ApproxIndex", "KvAwareQuote", "KvAwareRouter", "PrefillLoad"]


class ApproxIndex:
    """Blocks the router sent to one worker, each forgotten ``ttl_ms`` after it was last sent."""

    def __init__(self, ttl_ms: float, max_blocks: int) -> None:
        self.ttl_ms = ttl_ms
        self.max_blocks = max_blocks
        self.expiry: dict[int, float] = {}
        self._order: deque[tuple[float, int]] = deque()  # (expiry, key), expiry non-decreasing

    def prune(self, now_ms: float) -> None:
        order, expiry = self._order, self.expiry
        while order and order[0][0] <= now_ms:
            t, key = order.popleft()
            if expiry.get(key) == t:  # not renewed since
                del expiry[key]

    def insert(self, keys: list[int], now_ms: float) -> None:
        t = now_ms + self.ttl_ms
        expiry = self.expiry
        for key in keys:
            expiry[key] = t
        self._order.extend((t, key) for key in keys)
        if len(expiry) > self.max_blocks:  # prune to 80% by earliest expiry (Dynamo's PruneConfig)
            order = self._order
            while len(expiry) > 0.8 * self.max_blocks and order:
                t0, key = order.popleft()
                if expiry.get(key) == t0:
                    del expiry[key]


class PrefillLoad:
    """A routed request's uncached prompt tokens, counted on its worker until its first token."""

    __slots__ = ("replica", "tokens")

    def __init__(self, replica: int, tokens: int) -> None:
        self.replica = replica
        self.tokens = tokens


class KvAwareQuote:
    """One arrival's costs over the replicas asked, and what routing it to one of them records."""

    __slots__ = ("costs", "keys", "new_tokens", "prompt_runs")

    def __init__(self, costs: list[float], new_tokens: list[int], prompt_runs: list[range],
                 keys: list[int] | None) -> None:
        self.costs = costs
        self.new_tokens = new_tokens  # per replica asked: the prompt tokens it would compute
        self.prompt_runs = prompt_runs
        self.keys = keys  # the prompt's block keys (approximate mode only)


class KvAwareRouter(Router):
    name = "kv_aware"
    reads_replica_state = True
    hears_first_tokens = True
    picks_by_cost = True

    def __init__(self, ctx: RouterContext, options) -> None:
        super().__init__(ctx, options)
        self.weight = options.overlap_score_weight
        self.temperature = options.router_temperature
        self.kv_events = options.kv_events
        self.reads_prefix_caches = self.kv_events
        self.active = [ActiveBlocks() for _ in range(self.n)]  # prompt blocks of the active requests
        self.prefill_tokens = [0] * self.n  # per worker: the sum of its requests' PrefillLoad tokens
        self.prefilling: dict[int, PrefillLoad] = {}  # trace row -> load, until its first token
        self.active_runs: dict[int, list[range]] = {}  # trace row -> its prompt runs, until it finishes
        self.tier_weights = options.tier_weights
        self.approx = (None if self.kv_events else
                       [ApproxIndex(options.ttl_s * 1000.0, options.max_tree_blocks) for _ in range(self.n)])

    def _prompt_keys(self, req: Request) -> list[int]:
        n_full = req.num_prompt_tokens // self.ctx.block_size
        return req.keys.keys_upto(n_full)[:n_full]

    def _prompt_runs(self, req: Request) -> list[range]:
        """The prompt's full blocks as key runs: the same keys as ``_prompt_keys``, in order."""
        keys = req.keys
        runs = keys.key_runs(0, req.num_prompt_tokens // self.ctx.block_size, keys.block_size)
        return runs if all(runs) else [run for run in runs if len(run)]

    def _approx_overlap(self, view: ReplicaView, keys: list[int], now_ms: float) -> int:
        """Leading request blocks the approximate index remembers sending to ``view``'s replica."""
        index = self.approx[view.replica]
        index.prune(now_ms)
        return sum(1 for _ in takewhile(index.expiry.__contains__, keys))

    def _settle_prefill(self, req: Request) -> None:
        """``req`` no longer counts as prefill load (it produced its first token, or left)."""
        load = self.prefilling.pop(req.idx, None)
        if load is not None:
            self.prefill_tokens[load.replica] -= load.tokens

    def request_first_token(self, req: Request) -> None:
        self._settle_prefill(req)

    def costs(self, req: Request, replicas: list[ReplicaView], now_ms: float, new_tokens: list[int],
              prompt_runs: list[range] | None = None, keys: list[int] | None = None) -> list[float]:
        """Each replica's cost for ``req`` (in the order of ``replicas``); appends to ``new_tokens``
        the prompt tokens each would have to compute. ``prompt_runs`` and (approximate mode)
        ``keys``: ``_prompt_runs(req)`` and ``_prompt_keys(req)``, when the caller has them. Every
        replica is asked at every arrival: its prefix cache in one compiled pass (or the approximate
        index), then the costs in one compiled loop (active_blocks.kv_aware_costs)."""
        bs = self.ctx.block_size
        if prompt_runs is None:
            prompt_runs = self._prompt_runs(req)
        asked = self.views_asked(replicas)
        if self.kv_events:
            same_size = req.keys.block_size == bs
            runs = prompt_runs if same_size else req.keys.key_runs(0, req.num_prompt_tokens // bs, bs)
            overlaps = asked.prefix_hit_blocks(runs)
        else:
            if keys is None:
                keys = self._prompt_keys(req)
            overlaps = [self._approx_overlap(view, keys, now_ms) for view in replicas]
        credits = None
        if self.tier_weights:  # Dynamo's overlap credit for hits in host and disk tiers
            credits = []
            for pos, view in enumerate(replicas):
                tiers = view.tier_hit_tokens(req, overlaps[pos] * bs, now_ms)
                credits.append(int(sum([self.tier_weights.get(name, 0.0) * t for name, t in tiers.items()])))
        return kv_aware_costs(asked.ids, overlaps, credits, self.active,
                              self.prefill_tokens, prompt_runs, req.num_prompt_tokens, bs, self.weight, new_tokens)

    def quote(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> KvAwareQuote:
        """Each of ``replicas``' cost for ``req``, with what ``commit`` needs of the one chosen."""
        new_tokens: list[int] = []
        prompt_runs = self._prompt_runs(req)
        keys = self._prompt_keys(req) if self.approx is not None else None
        costs = self.costs(req, replicas, now_ms, new_tokens, prompt_runs, keys)
        return KvAwareQuote(costs, new_tokens, prompt_runs, keys)

    def choose(self, costs: list[float]) -> int:
        """The position of the winning cost (ties and temperature draw from the seeded stream)."""
        return self._pick_min(costs) if self.temperature <= 0 else self._sample(costs)

    def picks_a_minimum(self) -> bool:
        return self.temperature <= 0  # softmax sampling may pick any replica

    def commit(self, req: Request, replica: int, quote: KvAwareQuote, pos: int, now_ms: float) -> None:
        """``req`` goes to ``replica``, priced at ``pos`` of ``quote``: count it there."""
        self.active[replica].add(quote.prompt_runs)
        self.active_runs[req.idx] = quote.prompt_runs
        self.prefill_tokens[replica] += quote.new_tokens[pos]
        self.prefilling[req.idx] = PrefillLoad(replica, quote.new_tokens[pos])
        if self.approx is not None and quote.keys is not None:
            self.approx[replica].insert(quote.keys, now_ms)

    def _sample(self, costs: list[float]) -> int:
        lo, hi = min(costs), max(costs)
        if hi == lo:
            return self.rng.randrange(len(costs))
        logits = [-(c - lo) / (hi - lo) / self.temperature for c in costs]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        u = self.rng.random() * sum(weights)
        acc = 0.0
        for i, wgt in enumerate(weights):
            acc += wgt
            if u < acc:
                return i
        return len(costs) - 1

    def request_finished(self, req: Request, replica: int) -> None:
        runs = self.active_runs.pop(req.idx, None)
        self.active[replica].remove(runs if runs is not None else self._prompt_runs(req))
        self._settle_prefill(req)

    def replica_started(self, replica: int) -> None:
        self.active[replica] = ActiveBlocks()
        self.prefill_tokens[replica] = 0
        self.prefilling = {idx: load for idx, load in self.prefilling.items() if load.replica != replica}
        if self.approx is not None:
            old = self.approx[replica]
            self.approx[replica] = ApproxIndex(old.ttl_ms, old.max_blocks)
