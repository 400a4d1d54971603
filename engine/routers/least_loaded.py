"""vLLM 0.33's data-parallel load balancer (DPLBAsyncMPClient.get_core_engine_for_request in
vllm/v1/engine/core_client.py, read from the vllm==0.33.0 wheel).

Per engine e, from the coordinator's last snapshot (waiting, running, kv_cache_usage) and the
client's own count of its unfinished requests on e (``inflight``):

    score = max(client_count * inflight, waiting + running)
            + waiting * 6.0 * max(0, kv_cache_usage - 0.5)      (the penalty only when waiting > 0)

Engines are scanned from a start index that advances by one after every pick, and the first strict
minimum wins (ties rotate). After a pick the client adds ``client_count`` to that engine's waiting
count in its local copy of the snapshot, until the next snapshot replaces it. The DP coordinator
publishes snapshots every ``stats_update_interval_ms`` (100 ms) while they change.

Departure (documented in docs/fleet.md): a snapshot is the replicas' state at the first routing at
or after each interval boundary, not at the boundary itself (the engines publish after every step,
so the two differ by at most the steps run since the boundary). ``stats_update_ms: 0`` reads the
replicas' exact state at every arrival.
"""

from __future__ import annotations

from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.routers.base import Router, RouterContext


class LoadQuote:
    """One arrival's scores over the replicas asked."""

    __slots__ = ("costs",)

    def __init__(self, costs: list[float]) -> None:
        self.costs = costs


class LeastLoadedRouter(Router):
    name = "least_loaded"
    reads_replica_state = True
    picks_by_cost = True

    def __init__(self, ctx: RouterContext, options) -> None:
        super().__init__(ctx, options)
        self.client_count = options.client_count
        self.interval = options.stats_update_ms
        self.inflight = [0] * self.n
        self.snapshot: list[list[float]] = [[0, 0, 0.0] for _ in range(self.n)]
        self.next_refresh = 0.0
        self.start = 0

    def _refresh(self, replicas: list[ReplicaView], now_ms: float) -> None:
        snapshot = self.snapshot
        for c in replicas:
            snapshot[c.replica] = [c.num_waiting, c.num_running, c.kv_usage()]
        if self.interval > 0:
            self.next_refresh = (now_ms // self.interval + 1) * self.interval

    def quote(self, req: Request, replicas: list[ReplicaView], now_ms: float) -> LoadQuote:
        """Each of ``replicas``' score from the last snapshot (taken now when it is due)."""
        if self.interval <= 0 or now_ms >= self.next_refresh:
            self._refresh(replicas, now_ms)
        cc = self.client_count
        scores = []
        for view in replicas:
            e = view.replica
            waiting, running, usage = self.snapshot[e]
            score = max(cc * self.inflight[e], waiting + running)
            if waiting > 0 and usage > 0.5:
                score += waiting * 6.0 * (usage - 0.5)
            scores.append(score)
        return LoadQuote(scores)

    def choose(self, costs: list[float]) -> int:
        """The first strict minimum scanning from the rotating start, which then moves on by one."""
        n = len(costs)
        best = -1
        best_score = float("inf")
        for k in range(n):
            pos = (self.start + k) % n
            if costs[pos] < best_score:
                best_score = costs[pos]
                best = pos
        self.start = (self.start + 1) % n
        return best

    def picks_a_minimum(self) -> bool:
        return True

    def commit(self, req: Request, replica: int, quote: LoadQuote, pos: int, now_ms: float) -> None:
        self.snapshot[replica][0] += self.client_count
        self.inflight[replica] += 1

    def request_finished(self, req: Request, replica: int) -> None:
        self.inflight[replica] -= 1

    def replica_started(self, replica: int) -> None:
        self.snapshot[replica] = [0, 0, 0.0]  # an empty engine, until the next snapshot
        self.inflight[replica] = 0
