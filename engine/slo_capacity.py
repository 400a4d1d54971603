"""What one replica sustains at the SLO: the SLO autoscaling policy's per-replica throughput.

Dynamo's SLA Planner reads this from a pre-deployment profile (prefill throughput per GPU at the TTFT
target, decode throughput per GPU at the ITL target, interpolated at the predicted lengths). Here the
profile is the engine's own step-time model (the StepTimer every replica uses), solved for the steady
state of a replica receiving ``rate`` requests per second of ``isl`` input and ``osl`` output tokens:

- each request decodes for ``osl`` steps, so ``B = rate * osl * t`` requests decode in every step of
  duration ``t``, at a mean context of ``isl + osl / 2`` tokens (Dynamo's ``context_length``);
- the prompts arriving during a step are prefilled in the next: ``P = rate * isl * t`` tokens;
- ``t`` is the step time of that mixed batch (a fixed point, found by iteration).

The rate is feasible when the batch fits vLLM's limits (``B <= max_num_seqs``, ``B + P <=
max_num_batched_tokens``, the decoding requests' KV within the cache), the step (each decode's
inter-token latency) is within the TPOT objective, and a prompt's prefill (chunks of the token budget
left over by the decodes, one per step) is within the TTFT objective. The largest feasible rate is
found by bisection (to 0.01%).

A disaggregated fleet's pools are sized apart, as Dynamo's planner sizes them (prefill_planner:
predicted prompt tokens/s over a prefill engine's throughput at the TTFT target; decode_planner:
predicted output tokens/s over a decode engine's throughput at the ITL target and a context of
``isl + osl / 2``): ``role="prefill"`` solves the same steady state with no decodes (the proxy's
request ends at its first token) against TTFT alone, ``role="decode"`` with no prefill (prompts
arrive as KV; the one-token step that samples the first token is left out) against TPOT alone. Queueing is not modeled here (it is what ``target`` < 1 leaves headroom for, and
what the simulated replay then measures); a departure from Dynamo, whose planner also corrects its
profile by the observed/expected latency ratio each interval.
"""

from __future__ import annotations

import math
from functools import lru_cache

from replay.engine.timing.base import StepTimer


class ReplicaCapacity:
    """Requests per second one replica sustains within the objectives, per (isl, osl)."""

    def __init__(self, timer: StepTimer, *, max_num_batched_tokens: int, max_num_seqs: int, kv_tokens: int,
                 ttft_ms: float | None, tpot_ms: float | None, role: str = "aggregated") -> None:
        if role not in ("aggregated", "prefill", "decode"):
            raise ValueError(f"role {role!r}: aggregated, prefill or decode")
        self.role = role
        self.timer = timer
        self.budget = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.kv_tokens = kv_tokens
        self.ttft_ms = ttft_ms
        self.tpot_ms = tpot_ms
        self.requests_per_s = lru_cache(maxsize=4096)(self._requests_per_s)

    def step_ms(self, rate_per_ms: float, isl: int, osl: int) -> float | None:
        """The steady-state step time at this rate, or None when the batch exceeds vLLM's limits."""
        timer = self.timer
        if self.role == "prefill":  # the fixed point's seed: one step of one whole prompt, or one decode
            t = timer.step_ms(1, isl, 0, isl * (isl + 1) // 2, 0, 0, 0, 0)
        else:
            t = timer.step_ms(0, 0, 0, 0, 1, 1, isl, 0)
        decoding = self.role != "prefill"
        prefilling = self.role != "decode"
        for _ in range(50):
            decodes = rate_per_ms * osl * t if decoding else 0.0
            prefill = rate_per_ms * isl * t if prefilling else 0.0
            if decodes > self.max_seqs or decodes + prefill > self.budget:
                return None
            if decodes * (isl + osl / 2.0) > self.kv_tokens:
                return None
            n_dec = max(1, math.ceil(decodes)) if decoding else 0
            p = int(math.ceil(prefill))
            n_pre = max(1, math.ceil(prefill / isl)) if p else 0
            before = max(0, (isl - p) // 2) if p else 0  # a chunk's mean prefix within its prompt
            work = p * before + p * (p + 1) // 2
            nxt = timer.step_ms(n_pre, p, before * n_pre, work, n_dec, n_dec, int(n_dec * (isl + osl / 2.0)), 0)
            if abs(nxt - t) <= 1e-9 * t:
                return nxt
            t = nxt
        return t

    def _meets(self, rate_per_ms: float, isl: int, osl: int) -> bool:
        t = self.step_ms(rate_per_ms, isl, osl)
        if t is None:
            return False
        if self.tpot_ms is not None and t > self.tpot_ms:
            return False
        if self.ttft_ms is not None:
            room = self.budget - (rate_per_ms * osl * t if self.role == "aggregated" else 0.0)  # left for prefill
            if room <= 0 or math.ceil(isl / room) * t > self.ttft_ms:
                return False
        return True

    def _requests_per_s(self, isl: int, osl: int) -> float:
        lo, hi = 0.0, 1.0  # requests per ms
        while self._meets(hi, isl, osl) and hi < 1e6:
            lo, hi = hi, hi * 2.0
        while hi - lo > 1e-4 * hi:  # to 0.01%: far inside what the step-time model can tell apart
            mid = (lo + hi) / 2.0
            if self._meets(mid, isl, osl):
                lo = mid
            else:
                hi = mid
        # Never zero: a replica that cannot meet the objective even alone still serves requests.
        return max(lo * 1000.0, 1e-3)
