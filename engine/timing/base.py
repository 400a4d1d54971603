"""The one interface the scheduler calls per step: how long does this batch take on the GPU?

The scheduler summarises a step as a handful of integer sums (no per-request lists), so a call is
cheap and every backend (roofline, aiconfigurator) sees the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StepShape:
    """One scheduled step, as sums over its requests.

    prefill_* cover requests still consuming prompt tokens this step (a chunk of n_i new tokens over
    p_i tokens already in KV, cached prefix and earlier chunks alike). decode_* cover requests that
    generate this step; each contributes 1 + its draft tokens of query.
    """

    num_prefill_reqs: int = 0
    prefill_tokens: int = 0        # sum n_i
    prefill_ctx_tokens: int = 0    # sum p_i
    prefill_attn_work: int = 0     # sum n_i * p_i + n_i * (n_i + 1) // 2 (causal pairs, per request)
    num_decode_reqs: int = 0
    decode_query_tokens: int = 0   # sum (1 + drafts_j)
    decode_ctx_tokens: int = 0     # sum c_j (KV tokens each decode attends to)
    num_spec_passes: int = 0       # MTP drafter passes after sampling (k), 0 without speculation


@dataclass(slots=True)
class StepBreakdown:
    step_ms: float
    host_overhead_ms: float
    parts: dict[str, float] = field(default_factory=dict)  # linear, prefill_attn, decode_attn, comm, layer_overhead, drafter...


class DecodeRun(Protocol):
    """Times a decode window's steps (engine/decode_window.py) in compiled code: a timer's
    ``decode_run(nrun)`` gives one for a window of ``nrun`` decode-only requests (one token each,
    no drafts). Each appended duration must equal ``step_ms`` for that step bit for bit (a single
    differing bit changes the outputs); a timer without ``decode_run`` is called per step."""

    def extend(self, ctx: int, count: int, durations: list[float], times: list[float]) -> None:
        """Append ``count`` steps whose summed decode context starts at ``ctx`` and grows by nrun a
        step: each duration, and each end time as the previous one plus the duration."""
        ...


class StepTimer(Protocol):
    """Backends implement this. ``step_ms`` must be fast (< 5 us): it is called once per step."""

    host_overhead_ms: float

    def step_ms(
        self,
        num_prefill_reqs: int,
        prefill_tokens: int,
        prefill_ctx_tokens: int,
        prefill_attn_work: int,
        num_decode_reqs: int,
        decode_query_tokens: int,
        decode_ctx_tokens: int,
        num_spec_passes: int,
    ) -> float:
        """Whole step time in ms, host overhead included."""
        ...

    def breakdown(self, shape: StepShape) -> StepBreakdown:
        ...


def shape_from_requests(prefills: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
                        decodes: list[int] | tuple[int, ...] = (), *, drafts: int = 0,
                        spec_passes: int | None = None) -> StepShape:
    """Build a StepShape from per-request facts, the way the scheduler sums them.

    ``prefills``: (n_i new tokens, p_i tokens already in KV) per prefilling request; ``decodes``: the
    KV context c_j each decode attends to; ``drafts``: draft tokens per decode (k). Prefill attention
    work is summed per request (causal pairs), never from averaged chunk lengths.
    """
    work = 0
    for n, p in prefills:
        if n <= 0 or p < 0:
            raise ValueError(f"a prefill chunk needs n > 0 new tokens over p >= 0 cached, got {n}@{p}")
        work += n * p + n * (n + 1) // 2
    if any(c <= 0 for c in decodes):
        raise ValueError("decode contexts must be > 0")
    return StepShape(
        num_prefill_reqs=len(prefills),
        prefill_tokens=sum(n for n, _ in prefills),
        prefill_ctx_tokens=sum(p for _, p in prefills),
        prefill_attn_work=work,
        num_decode_reqs=len(decodes),
        decode_query_tokens=len(decodes) * (1 + drafts),
        decode_ctx_tokens=sum(decodes),
        num_spec_passes=drafts if spec_passes is None else spec_passes,
    )
