"""Admission control: refuse a request at arrival, before routing (``fleet.admission``).

A refused request gets status ``rejected`` and the bound that refused it in ``reject_reason``; it
never reaches a replica (the client got an HTTP 429/503), and it counts against goodput. Each bound is
one small class behind ``AdmissionBound.refuse``; the bounds are checked in the order below and the
first that refuses names the reason (so a request shed by a queue bound does not take a token).

- ``max_waiting_per_replica``: refuse when every live replica has at least that many requests
  waiting (Dynamo's router rejects when all workers are over its busy threshold: a request is
  refused only when no replica could take it without queueing past the bound).
- ``max_predicted_wait_ms``: refuse when the shortest predicted queue wait over the live replicas
  exceeds the bound. The prediction is the prompt tokens still to prefill ahead of the request
  (ReplicaView.waiting_prompt_tokens) over the replica's prefill throughput with its running
  decodes sharing the token budget (the step timer's time for a full budget of prefill). It ignores
  requests finishing and freeing KV meanwhile: an estimate an operator's gateway could make.
- ``rate`` / ``burst``: a token bucket (Envoy's and NGINX's rate limits): ``burst`` tokens at the
  start, refilled at ``rate`` per second up to ``burst``; a request takes one or is refused.
"""

from __future__ import annotations

from replay.engine.replica_view import ReplicaView
from replay.engine.request import Request
from replay.engine.scaling_config import AdmissionConfig
from replay.engine.timing.base import StepTimer


class AdmissionBound:
    """One admission rule: None to admit, or the reason for refusing."""

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None:
        raise NotImplementedError


class WaitingBound(AdmissionBound):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reason = f"admission: every live replica has >= {limit} waiting"

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None:
        limit = self.limit
        for v in live:
            if v.num_waiting < limit:
                return None
        return self.reason


class PredictedWaitBound(AdmissionBound):
    def __init__(self, limit_ms: float, timer: StepTimer, max_num_batched_tokens: int) -> None:
        self.limit_ms = limit_ms
        self.budget = max_num_batched_tokens
        self.full_prefill_ms = timer.step_ms(1, max_num_batched_tokens, 0,
                                             max_num_batched_tokens * (max_num_batched_tokens + 1) // 2, 0, 0, 0, 0)
        self.reason = f"admission: predicted wait > {limit_ms:g} ms"

    def predicted_wait_ms(self, v: ReplicaView) -> float:
        room = self.budget - v.num_running  # each running decode takes one token of the budget
        if room <= 0:
            return float("inf")
        return v.waiting_prompt_tokens() / room * self.full_prefill_ms

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None:
        for v in live:
            if self.predicted_wait_ms(v) <= self.limit_ms:
                return None
        return self.reason


class TokenBucket(AdmissionBound):
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_ms = rate_per_s / 1000.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.last_ms = 0.0
        self.reason = f"admission: rate limit {rate_per_s:g}/s, burst {burst}"

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None:
        tokens = self.tokens + (now_ms - self.last_ms) * self.rate_per_ms
        self.tokens = tokens if tokens < self.burst else self.burst
        self.last_ms = now_ms
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return self.reason


class Admission:
    """The configured bounds, checked in order (see the module doc)."""

    def __init__(self, cfg: AdmissionConfig, timer: StepTimer, max_num_batched_tokens: int) -> None:
        bounds: list[AdmissionBound] = []
        if cfg.max_waiting_per_replica is not None:
            bounds.append(WaitingBound(cfg.max_waiting_per_replica))
        if cfg.max_predicted_wait_ms is not None:
            bounds.append(PredictedWaitBound(cfg.max_predicted_wait_ms, timer, max_num_batched_tokens))
        if cfg.rate is not None:
            burst = cfg.burst if cfg.burst is not None else max(1, int(cfg.rate))
            bounds.append(TokenBucket(cfg.rate, burst))
        self.bounds = bounds
        self.num_refused: dict[str, int] = {}

    def refuse(self, req: Request, live: list[ReplicaView], now_ms: float) -> str | None:
        for bound in self.bounds:
            reason = bound.refuse(req, live, now_ms)
            if reason is not None:
                self.num_refused[reason] = self.num_refused.get(reason, 0) + 1
                return reason
        return None
