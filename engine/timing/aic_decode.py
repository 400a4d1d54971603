"""Decode-only step times of the aic backend, from aiconfigurator's own structure (compiled core).

A direct aiconfigurator call costs 6-20 us and decode shapes almost never repeat (every decode adds a
token), so decode-only steps are priced from what aiconfigurator 0.12.0 computes (docs/timing.md,
"How the aic backend stays fast"):
- it divides the summed decode KV tokens by the request count (integer division), so a decode step
  is a function of (n, a = sum // n) only;
- the only a-dependent term is generation attention, the mean of five table lookups at sequence
  lengths spread over [0.9 a, 1.1 a] (``_samples``), each interpolated linearly in the sequence
  length between the database's grid points (powers of two).
So within the measured part of the table the step time is (1/5) sum_i L_j(s_i), with L_j one line
per segment (2^j, 2^(j+1)] of sequence length. ``DecodeTable`` fits each line from direct calls at
eight points where all five samples lie inside the segment and keeps it only if all eight agree to
1e-11 (exact up to float rounding; tests compare with direct calls). Where the table is extrapolated
(past a batch row's longest measured sequence aiconfigurator holds a utilization and scales a
speed-of-light time, which is not linear) a segment fails that check, and the step is interpolated
linearly in the mean sample length between exact values at cell ends: 64 cells per octave of a, also
cut wherever a sample crosses a grid point (where the table can jump). Measured error of those
cells: at most 1e-4 relative (tests allow 5e-4).

This module is compiled with the engine core (engine/native.py) because decode windows time every
one of their steps here (``AicDecodeRun.extend``): 97% of the Mooncake replay's 732,637 steps. It
knows nothing of aiconfigurator itself: the direct call is handed in.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Final

# (prefill requests, prefill tokens, prefill KV tokens, decode requests, a) -> kernel ms
DirectCall = Callable[[int, int, int, int, int], float]

SEGMENTS: Final = 32          # segment j holds sequence lengths (2^j, 2^(j+1)]; longer steps use cells
MIN_DECODE_KV: Final = 32     # below this per-request KV the five samples sit in segments too short to fit
_VERIFY_POINTS: Final = 8     # direct calls per fitted segment line; all must agree
_LINEAR_RTOL: Final = 1e-11   # agreement needed to call a segment linear (float noise is ~1e-15)
_CELLS_PER_OCTAVE: Final = 64  # interpolation cells where a segment is not linear
UNKNOWN: Final = 0
LINEAR: Final = 1
NONLINEAR: Final = 2


def samples(a: int) -> tuple[int, int, int, int, int]:
    """The five sequence lengths aiconfigurator 0.12.0 averages generation attention over for a
    decode request with ``a`` KV tokens (Rust ``AttentionTable::query_generation``:
    ``s_min = max(1, int(a * 0.9))``, ``s_max = max(s_min, int(a * 1.1))``,
    ``s_i = s_min + (s_max - s_min) * i // 4``). Each is non-decreasing in ``a``. ``a * 9 // 10`` is
    ``int(a * 0.9)`` exactly (the doubles 0.9 and 1.1 lie above the decimals; tests check it)."""
    lo = a * 9 // 10 or 1
    hi = a * 11 // 10
    if hi < lo:
        hi = lo
    d = hi - lo
    return lo, lo + d // 4, lo + d // 2, lo + 3 * d // 4, hi


def _first_above(i: int, k: int) -> int:
    """Smallest a whose i-th sample exceeds k."""
    a = max(1, int(k / (0.9 + 0.05 * i)) - 4)
    while samples(a)[i] <= k:
        a += 1
    while a > 1 and samples(a - 1)[i] > k:
        a -= 1
    return a


# Every a at which some sample passes a power of two (a database grid point, where aiconfigurator's
# interpolation can change slope or, at the edge of the measured table, jump): cells never straddle one.
BREAKS: Final = sorted({_first_above(i, 1 << j) for j in range(SEGMENTS + 1) for i in range(5)})
# For each segment j, the a's whose five samples all lie in it (first, last).
_PURE: Final = [(_first_above(0, 1 << j), _first_above(4, 2 << j) - 1) for j in range(SEGMENTS)]


class DecodeTable:
    """Decode-only kernel time for one decode batch size n, as a function of a = KV tokens // n.

    Every value is a function of a alone: the memories below only skip the segment search (the
    values are the same either way, to the bit; tests/engine/test_timing_aic.py shuffles the call order)."""

    def __init__(self, direct: DirectCall, n: int) -> None:
        self.direct = direct
        self.n = n
        self.c = [0.0] * SEGMENTS     # segment line L_j(s) = c[j] + b[j] * s (host overhead excluded)
        self.b = [0.0] * SEGMENTS
        self.state = [UNKNOWN] * SEGMENTS
        # Memory of the last a-ranges used: z* one segment holding all five samples, y* one range
        # between two BREAKS with the samples on two segment lines (yk: each sample's c then b),
        # x* one cell (xk: value and sample sum at its start, then at its end).
        self.zlo, self.zhi, self.zc, self.zb = 1, 0, 0.0, 0.0
        self.ylo, self.yhi = 1, 0
        self.yk: tuple[float, float, float, float, float, float, float, float, float, float] = (0.0,) * 10
        self.xlo, self.xhi = 1, 0
        self.xk: tuple[float, int, float, int] = (0.0, 0, 0.0, 1)
        self.memo: dict[int, float] = {}  # a -> value, filled by AicTimer.step_ms (replays revisit shapes)

    def kernel_ms(self, a: int) -> float:
        """Kernel time (no host overhead) of a decode-only step at a KV tokens per request."""
        if self.zlo <= a <= self.zhi:
            lo = a * 9 // 10
            d = a * 11 // 10 - lo
            return self.zc + self.zb * ((5 * lo + d // 4 + d // 2 + 3 * d // 4 + d) / 5)
        if self.ylo <= a <= self.yhi:
            lo = a * 9 // 10
            d = a * 11 // 10 - lo
            c0, c1, c2, c3, c4, b0, b1, b2, b3, b4 = self.yk
            return ((c0 + b0 * lo) + (c1 + b1 * (lo + d // 4)) + (c2 + b2 * (lo + d // 2))
                    + (c3 + b3 * (lo + 3 * d // 4)) + (c4 + b4 * (lo + d))) / 5
        if self.xlo <= a < self.xhi:
            lo = a * 9 // 10
            d = a * 11 // 10 - lo
            y0, m0, y1, m1 = self.xk
            return y0 + (y1 - y0) * ((5 * lo + d // 4 + d // 2 + 3 * d // 4 + d - m0) / (m1 - m0))
        return self.value(a)

    def value(self, a: int) -> float:
        if a < MIN_DECODE_KV:
            return self._cell(a)
        ss = samples(a)
        j = (ss[0] - 1).bit_length() - 1
        if j == (ss[4] - 1).bit_length() - 1:  # all five samples in segment j
            if j >= SEGMENTS:
                return self._cell(a)
            st = self.state[j] or self._fit(j)
            if st != LINEAR:
                return self._cell(a)
            c, b = self.c[j], self.b[j]
            self.zlo, self.zhi = _PURE[j]
            self.zc, self.zb = c, b
            return c + b * (sum(ss) / 5)
        cs: list[float] = []
        bs: list[float] = []
        for s in ss:  # samples on two segment lines
            j = (s - 1).bit_length() - 1
            if j >= SEGMENTS:
                return self._cell(a)
            st = self.state[j] or self._fit(j)
            if st != LINEAR:
                return self._cell(a)
            cs.append(self.c[j])
            bs.append(self.b[j])
        k = bisect_right(BREAKS, a)  # a >= MIN_DECODE_KV, so 0 < k < len(BREAKS)
        self.ylo, self.yhi = BREAKS[k - 1], BREAKS[k] - 1
        self.yk = (cs[0], cs[1], cs[2], cs[3], cs[4], bs[0], bs[1], bs[2], bs[3], bs[4])
        return ((cs[0] + bs[0] * ss[0]) + (cs[1] + bs[1] * ss[1]) + (cs[2] + bs[2] * ss[2])
                + (cs[3] + bs[3] * ss[3]) + (cs[4] + bs[4] * ss[4])) / 5

    def _fit(self, j: int) -> int:
        """Fit segment j's line from direct calls at a's whose five samples all lie in it."""
        a0, a1 = _PURE[j]
        state = NONLINEAR
        if a1 - a0 >= 2 * _VERIFY_POINTS:
            pts = [a0 + (a1 - a0) * k // (_VERIFY_POINTS - 1) for k in range(_VERIFY_POINTS)]
            try:
                ys = [self.direct(0, 0, 0, self.n, a) for a in pts]
            except Exception:  # noqa: BLE001 - a database miss: leave it to the direct call that needs it
                ys = []
            if ys:
                ms = [sum(samples(a)) / 5 for a in pts]
                b = (ys[-1] - ys[0]) / (ms[-1] - ms[0])
                c = ys[0] - b * ms[0]
                if all(abs(c + b * m - y) <= _LINEAR_RTOL * abs(y) for m, y in zip(ms, ys, strict=True)):
                    self.c[j], self.b[j], state = c, b, LINEAR
        self.state[j] = state
        return state

    def _cell(self, a: int) -> float:
        """Linear interpolation in the mean sample length between exact values at the ends of a's cell."""
        direct = self.direct
        n = self.n
        step = (1 << (a.bit_length() - 1)) // _CELLS_PER_OCTAVE or 1
        start = a - a % step
        end = start + step - 1
        k = bisect_right(BREAKS, a)
        if k:
            start = max(start, BREAKS[k - 1])
        if k < len(BREAKS):
            end = min(end, BREAKS[k] - 1)
        if start == end:
            return direct(0, 0, 0, n, a)
        m0, m1 = sum(samples(start)), sum(samples(end))  # m1 > m0: the largest sample grows with a
        y0, y1 = direct(0, 0, 0, n, start), direct(0, 0, 0, n, end)
        self.xlo, self.xhi, self.xk = start, end, (y0, m0, y1, m1)
        if a == end:
            return y1
        return y0 + (y1 - y0) * ((sum(samples(a)) - m0) / (m1 - m0))  # exactly y0 at a == start


class AicDecodeRun:
    """The DecodeRun (engine/timing/base.py) of one decode window: the batch size's table and the
    timer's host overhead, read when the window starts (as RooflineTimer.decode_run reads its terms)."""

    def __init__(self, table: DecodeTable, host_ms: float) -> None:
        self.table = table
        self.host_ms = host_ms

    def extend(self, ctx: int, count: int, durations: list[float], times: list[float]) -> None:
        """Append ``count`` decode-only steps of n requests whose summed context starts at ``ctx``:
        each duration as AicTimer.step_ms gives it (kernel time plus host overhead), each end time
        the previous plus the duration (engine/decode_window.py). Step s is at a = ctx // n + s."""
        table = self.table
        host = self.host_ms
        a = ctx // table.n
        cur = times[-1]
        for _ in range(count):
            d = table.kernel_ms(a) + host
            durations.append(d)
            cur = cur + d
            times.append(cur)
            a += 1
