"""Decode windows' step times for the roofline backend (compiled core, engine/native.py).

A decode window times a run of decode-only steps at once (engine/decode_window.py); the roofline's
decode step is a handful of terms fixed for the window (RooflineTimer.decode_step_terms) and one
context-dependent max, so a step costs a few nanoseconds here instead of a Python call to step_ms.
"""

from __future__ import annotations


def decode_step_times(terms: tuple[float, float, float, float, float], nrun: int, ctx: int, count: int,
                      durations: list[float], times: list[float]) -> None:
    """Append ``count`` decode-only steps of ``nrun`` requests whose context starts at ``ctx``: each
    duration as RooflineTimer.step_ms computes it, from its decode_step_terms, in the same order of
    operations (bit-identical, tests/engine/test_timing_roofline.py), and each end time as the previous
    plus the duration. Compiled, this is a few nanoseconds a step with no numpy call per window."""
    t, kv_c, da_c, tail, host = terms
    cur = times[-1]
    for _ in range(count):
        dm = ctx * kv_c
        dc = ctx * nrun / nrun * da_c
        d = t + (dm if dm > dc else dc)
        d += tail
        d = d + host
        durations.append(d)
        cur = cur + d
        times.append(cur)
        ctx += nrun


class RooflineDecodeRun:
    """The DecodeRun (engine/timing/base.py) of one window of ``nrun`` requests."""

    def __init__(self, terms: tuple[float, float, float, float, float], nrun: int) -> None:
        self.terms = terms
        self.nrun = nrun

    def extend(self, ctx: int, count: int, durations: list[float], times: list[float]) -> None:
        decode_step_times(self.terms, self.nrun, ctx, count, durations, times)
