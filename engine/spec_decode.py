"""MTP draft acceptance: per-position conditional rates and batch-order-independent draws.

A replay cannot know which drafts the real model would accept, so it samples: draft i is accepted
with probability a_i given drafts 1..i-1 were accepted (vLLM's rejection sampler stops at the
first rejection). Each draw is a pure function of (seed, request, the request's verification step,
position), so two configs replaying one trace see the same draws for the same request-step,
whatever else shares the batch.
"""

from __future__ import annotations

from replay.base.errors import ConfigError
from replay.engine.config import SpeculativeConfig

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's output function: a well-mixed 64-bit hash of ``x`` (the MTP draws and the random
    router use it; engine/routers/base.py re-exports it for routers)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def expected_accepted(rates: list[float]) -> float:
    """E[accepted drafts per step] = sum_i prod_{j<=i} a_j (the expected accepted length of speculative decoding, Leviathan et al. 2023)."""
    total, prod = 0.0, 1.0
    for a in rates:
        prod *= a
        total += prod
    return total


def rates_from_expected(expected: float, k: int) -> list[float]:
    """Constant conditional rate a with sum_{i=1..k} a^i = expected (bisection).

    A documented modelling choice: one rate for every position (the geometric acceptance of
    a drafter whose quality does not decay with depth). Give `acceptance_rates` for real decay.
    """
    if not 0.0 <= expected <= k:
        raise ConfigError(f"speculative.expected_accepted_tokens={expected} must lie in [0, {k}]"
                          f" for num_speculative_tokens={k}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_accepted([mid] * k) < expected:
            lo = mid
        else:
            hi = mid
    return [round((lo + hi) / 2, 12)] * k


def resolve_rates(cfg: SpeculativeConfig) -> list[float]:
    k = cfg.num_speculative_tokens
    if cfg.acceptance_rates is not None:
        if cfg.expected_accepted_tokens is not None:
            raise ConfigError("speculative: give acceptance_rates or expected_accepted_tokens, not both")
        if len(cfg.acceptance_rates) != k:
            raise ConfigError(f"speculative.acceptance_rates has {len(cfg.acceptance_rates)} entries; "
                              f"num_speculative_tokens is {k}")
        bad = [a for a in cfg.acceptance_rates if not 0.0 <= a <= 1.0]
        if bad:
            raise ConfigError(f"speculative.acceptance_rates must lie in [0, 1]: {bad}")
        return list(cfg.acceptance_rates)
    if cfg.expected_accepted_tokens is None:
        raise ConfigError("speculative needs acceptance_rates: [a1, ..., ak] or expected_accepted_tokens: E")
    return rates_from_expected(cfg.expected_accepted_tokens, k)


class AcceptanceSampler:
    __slots__ = ("rates", "seed_mix")

    def __init__(self, rates: list[float], seed: int) -> None:
        self.rates = rates
        self.seed_mix = splitmix64(seed & _MASK)

    def num_accepted(self, request_idx: int, spec_step: int, num_drafts: int) -> int:
        """Accepted drafts (leading run) among the first ``num_drafts`` positions."""
        base = splitmix64(self.seed_mix ^ ((request_idx * 0x100000001B3) & _MASK))
        base = splitmix64(base ^ spec_step)
        accepted = 0
        for pos in range(num_drafts):
            u = splitmix64(base + pos) / 18446744073709551616.0
            if u >= self.rates[pos]:
                break
            accepted += 1
        return accepted
