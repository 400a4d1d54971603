"""aiconfigurator-core as a step-time backend (optional extra: ``pip install '.[aic]'``).

Uses aiconfigurator-core 0.12.0's compiled forward-pass model (``RustForwardPassPerfModel``, SILICON
database mode, backend vllm) over the same per-step sums the roofline sees and adds the per-step host
overhead (kernel data holds no host time).

Two mappings are ours and documented in docs/timing.md:
- aiconfigurator prices prefill attention from the mean chunk; we pass an effective prefill request
  count that preserves the step's exact causal-pair work (``prefill_attn_work``) so unequal chunks
  are not underestimated.
- MTP: the engine is compiled with ``nextn = k`` (aiconfigurator's own MTP costing: a (1 + k)-wide
  decode batch and an (L + k) / L compute scale); ``num_spec_passes`` is then implied.

Speed (docs/timing.md, "How the aic backend stays fast"). A direct call costs 6-20 us and decode
shapes almost never repeat (every decode adds a token), so decode-only steps are priced from
aiconfigurator's own structure instead of one call each:
- it divides the summed decode KV tokens by the request count (integer division), so a decode step
  is a function of (n, a = sum // n) only;
- the only a-dependent term is generation attention, the mean of five table lookups at sequence
  lengths spread over [0.9 a, 1.1 a] (``_samples``), each interpolated linearly in the sequence
  length between the database's grid points (powers of two).
So within the measured part of the table the step time is (1/5) sum_i L_j(s_i), with L_j one line
per segment (2^j, 2^(j+1)] of sequence length. ``_DecodeTable`` fits each line from direct calls
at eight points where all five samples lie inside the segment and keeps it only if all eight agree
to 1e-11 (exact up to float rounding; tests compare with direct calls). Where the table is
extrapolated (past a batch row's longest measured sequence aiconfigurator holds a utilization and
scales a speed-of-light time, which is not linear) a segment fails that check, and the step is
interpolated linearly in the mean sample length between exact values at cell ends: 64 cells per
octave of a, also cut wherever a sample crosses a grid point (where the table can jump). Measured
error of those cells: at most 1e-4 relative (tests allow 5e-4). ``exact=True``
(``timing.aic_exact``) turns all of this off: one memoized direct call per distinct shape, as before.
Prefill and mixed steps are always direct calls.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from typing import Any

from engine.hardware import HardwareProfile
from engine.models import ModelSpec
from engine.timing.base import StepBreakdown, StepShape
from replay.errors import ConfigError

AIC_VERSION = "0.12.0"
INSTALL_HINT = "pip install 'aiconfigurator-core==0.12.0' (or pip install -e '.[aic]')"
# Our hardware profile name -> aiconfigurator system name.
AIC_SYSTEMS = {"h200_sxm": "h200_sxm", "h100_sxm": "h100_sxm", "b200": "b200_sxm"}
_MEMO_LIMIT = 2_000_000  # entries; a replay sees far fewer distinct step shapes
_TABLE_MEMO_LIMIT = 200_000  # decode-only values kept per decode batch size


def aic_available() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def _supported_models() -> list[str]:
    from engine.models import get_model, list_models
    return [n for n in list_models() if get_model(n).aic_name]


# --- decode-only fast path (see the module docstring) -------------------------------------------------
_SEGMENTS = 32          # segment j holds sequence lengths (2^j, 2^(j+1)]; longer steps use cells
_MIN_DECODE_KV = 32     # below this per-request KV the five samples sit in segments too short to fit
_VERIFY_POINTS = 8      # direct calls per fitted segment line; all must agree
_LINEAR_RTOL = 1e-11    # agreement needed to call a segment linear (float noise is ~1e-15)
_CELLS_PER_OCTAVE = 64  # interpolation cells where a segment is not linear
_UNKNOWN, _LINEAR, _NONLINEAR = 0, 1, 2


def _samples(a: int) -> tuple[int, int, int, int, int]:
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
    while _samples(a)[i] <= k:
        a += 1
    while a > 1 and _samples(a - 1)[i] > k:
        a -= 1
    return a


# Every a at which some sample passes a power of two (a database grid point, where aiconfigurator's
# interpolation can change slope or, at the edge of the measured table, jump): cells never straddle one.
_BREAKS: list[int] = sorted({_first_above(i, 1 << j) for j in range(_SEGMENTS + 1) for i in range(5)})
# For each segment j, the a's whose five samples all lie in it (first, last).
_PURE: list[tuple[int, int]] = [(_first_above(0, 1 << j), _first_above(4, 2 << j) - 1)
                                 for j in range(_SEGMENTS)]


class _DecodeTable:
    """Decode-only kernel time for one decode batch size n, as a function of a = KV tokens // n."""

    __slots__ = ("timer", "n", "c", "b", "state", "zlo", "zhi", "zc", "zb", "ylo", "yhi", "yk", "xlo", "xhi",
                 "xk", "memo")

    def __init__(self, timer: AicTimer, n: int) -> None:
        self.timer, self.n = timer, n
        self.c = [0.0] * _SEGMENTS     # segment line L_j(s) = c[j] + b[j] * s (host overhead excluded)
        self.b = [0.0] * _SEGMENTS
        self.state = [_UNKNOWN] * _SEGMENTS
        # Memory of the last a-ranges used, so most steps skip the segment search (values are the same
        # either way, to the bit): z* one segment holding all five samples, y* one range between two
        # _BREAKS with the samples on two segment lines (yk: each sample's c then b), x* one cell
        # (xk: value and sample sum at its start, then at its end).
        self.zlo, self.zhi, self.zc, self.zb = 1, 0, 0.0, 0.0
        self.ylo, self.yhi, self.yk = 1, 0, (0.0,) * 10
        self.xlo, self.xhi, self.xk = 1, 0, (0.0, 0, 0.0, 1)
        self.memo: dict[int, float] = {}  # a -> value, filled by AicTimer.step_ms (replays revisit shapes)

    def __call__(self, a: int) -> float:
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
        if a < _MIN_DECODE_KV:
            return self._cell(a)
        ss = _samples(a)
        j = (ss[0] - 1).bit_length() - 1
        if j == (ss[4] - 1).bit_length() - 1:  # all five samples in segment j
            if j >= _SEGMENTS:
                return self._cell(a)
            st = self.state[j] or self._fit(j)
            if st != _LINEAR:
                return self._cell(a)
            c, b = self.c[j], self.b[j]
            self.zlo, self.zhi = _PURE[j]
            self.zc, self.zb = c, b
            return c + b * (sum(ss) / 5)
        cs, bs = [], []
        for s in ss:  # samples on two segment lines
            j = (s - 1).bit_length() - 1
            if j >= _SEGMENTS:
                return self._cell(a)
            st = self.state[j] or self._fit(j)
            if st != _LINEAR:
                return self._cell(a)
            cs.append(self.c[j])
            bs.append(self.b[j])
        k = bisect_right(_BREAKS, a)  # a >= _MIN_DECODE_KV, so 0 < k < len(_BREAKS)
        self.ylo, self.yhi, self.yk = _BREAKS[k - 1], _BREAKS[k] - 1, (*cs, *bs)
        return ((cs[0] + bs[0] * ss[0]) + (cs[1] + bs[1] * ss[1]) + (cs[2] + bs[2] * ss[2])
                + (cs[3] + bs[3] * ss[3]) + (cs[4] + bs[4] * ss[4])) / 5

    def _fit(self, j: int) -> int:
        """Fit segment j's line from direct calls at a's whose five samples all lie in it."""
        a0, a1 = _PURE[j]
        state = _NONLINEAR
        if a1 - a0 >= 2 * _VERIFY_POINTS:
            pts = [a0 + (a1 - a0) * k // (_VERIFY_POINTS - 1) for k in range(_VERIFY_POINTS)]
            try:
                ys = [self.timer._direct(0, 0, 0, self.n, a) for a in pts]
            except Exception:  # noqa: BLE001 - a database miss: leave it to the direct call that needs it
                ys = []
            if ys:
                ms = [sum(_samples(a)) / 5 for a in pts]
                b = (ys[-1] - ys[0]) / (ms[-1] - ms[0])
                c = ys[0] - b * ms[0]
                if all(abs(c + b * m - y) <= _LINEAR_RTOL * abs(y) for m, y in zip(ms, ys, strict=True)):
                    self.c[j], self.b[j], state = c, b, _LINEAR
        self.state[j] = state
        return state

    def _cell(self, a: int) -> float:
        """Linear interpolation in the mean sample length between exact values at the ends of a's cell."""
        direct = self.timer._direct
        n = self.n
        step = (1 << (a.bit_length() - 1)) // _CELLS_PER_OCTAVE or 1
        start = a - a % step
        end = start + step - 1
        k = bisect_right(_BREAKS, a)
        if k:
            start = max(start, _BREAKS[k - 1])
        if k < len(_BREAKS):
            end = min(end, _BREAKS[k] - 1)
        if start == end:
            return direct(0, 0, 0, n, a)
        m0, m1 = sum(_samples(start)), sum(_samples(end))  # m1 > m0: the largest sample grows with a
        y0, y1 = direct(0, 0, 0, n, start), direct(0, 0, 0, n, end)
        self.xlo, self.xhi, self.xk = start, end, (y0, m0, y1, m1)
        if a == end:
            return y1
        return y0 + (y1 - y0) * ((sum(_samples(a)) - m0) / (m1 - m0))  # exactly y0 at a == start


class AicTimer:
    """StepTimer backed by aiconfigurator-core's forward-pass model.

    ``exact=False`` (default) prices decode-only steps from per-batch-size segment lines fitted to
    aiconfigurator (exact up to float rounding) and, where its table is extrapolated, from
    interpolation cells (at most 1e-4 relative, measured); ``exact=True`` makes one memoized direct call per
    distinct step. Prefill and mixed steps are always direct calls. Either way a value depends only on
    the step, never on what was priced before it (runs are reproducible).
    """

    backend = "aic"

    def __init__(self, model: ModelSpec, hw: HardwareProfile, *, tp: int = 1, dtype: str = "bf16",
                 kv_dtype: str = "bf16", host_overhead_ms: float, nextn: int = 0,
                 exact: bool = False) -> None:
        try:
            from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel
        except ImportError:
            raise ConfigError(f"timing backend 'aic' needs aiconfigurator-core {AIC_VERSION}: {INSTALL_HINT}") \
                from None
        system = AIC_SYSTEMS.get(hw.name)
        if system is None:
            raise ConfigError(f"timing backend 'aic' has no data for hardware {hw.name!r}: "
                              f"use one of {', '.join(AIC_SYSTEMS)}")
        if not model.aic_name:
            raise ConfigError(f"timing backend 'aic' does not know model {model.name!r}: use one of "
                              f"{', '.join(_supported_models())} or a local folder holding its config.json")
        self.model, self.hw, self.tp, self.dtype, self.kv_dtype = model, hw, tp, dtype, kv_dtype
        self.host_overhead_ms = host_overhead_ms
        self.nextn = nextn
        self.exact = exact
        cfg: dict[str, Any] = {
            "schema_version": 1, "model_name": model.aic_name, "system_name": system, "backend": "vllm",
            "backend_version": None, "tp_size": tp, "pp_size": 1, "database_mode": "SILICON",
            "weight_dtype": "fp8" if dtype == "fp8" else None,
            "kv_cache_dtype": "fp8" if kv_dtype == "fp8" else None,
            "nextn": nextn or None,
        }
        quiet = logging.getLogger("aiconfigurator_core")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it logs a line per low-fidelity table it loads
        try:
            self._fpm = RustForwardPassPerfModel.from_native(cfg)._inner
        except Exception as exc:  # the Rust side raises ValueError/RuntimeError with its reason
            raise ConfigError(f"aiconfigurator-core cannot model {model.name} on {system} (tp={tp}, "
                              f"dtype={dtype}): {exc}. Models it ships: {', '.join(_supported_models())}") \
                from None
        finally:
            quiet.setLevel(level)
        # Direct calls, keyed on what aiconfigurator reads: (prefill requests, prefill tokens, prefill
        # KV tokens, decode requests, decode KV tokens // decode requests).
        self._memo: dict[tuple[int, int, int, int, int], float] = {}
        self._tables: dict[int, _DecodeTable] = {}  # decode batch size -> its decode-only table

    def _direct(self, n_pre: int, prefill_tokens: int, prefill_ctx_tokens: int, n_dec: int, a: int) -> float:
        """One aiconfigurator call (memoized). It reads decode KV only as sum // n_dec, so n_dec * a
        stands for every sum with that quotient (tests check this on random shapes)."""
        key = (n_pre, prefill_tokens, prefill_ctx_tokens, n_dec, a)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        req: dict[str, int] = {}
        if prefill_tokens:
            req.update(num_prefill_requests=n_pre, sum_prefill_tokens=prefill_tokens,
                       sum_prefill_kv_tokens=prefill_ctx_tokens)
        if n_dec:
            req.update(num_decode_requests=n_dec, sum_decode_kv_tokens=n_dec * a)
        value = self._fpm.estimate_forward_pass_time_ms(json.dumps({"scheduled_requests": req}))
        ms = float(value or 0.0)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = ms
        return ms

    def _decode_ms(self, n: int, a: int) -> float:
        if self.exact:
            return self._direct(0, 0, 0, n, a)
        table = self._tables.get(n)
        if table is None:
            table = self._tables[n] = _DecodeTable(self, n)
        return table(a)

    def kernel_ms(self, num_prefill_reqs: int, prefill_tokens: int, prefill_ctx_tokens: int,
                  prefill_attn_work: int, num_decode_reqs: int, decode_ctx_tokens: int) -> float:
        """GPU time of the step as aiconfigurator predicts it (no host overhead)."""
        if not prefill_tokens:
            if not num_decode_reqs:
                return 0.0
            return self._decode_ms(num_decode_reqs, decode_ctx_tokens // num_decode_reqs)
        n_pre = num_prefill_reqs
        if prefill_attn_work and n_pre > 1:
            # Effective request count whose equal chunks give the same causal pairs as the real ones.
            s, p = prefill_tokens, prefill_ctx_tokens
            n_eff = round((s * s / 2 + s * p) / max(1, prefill_attn_work - s / 2))
            n_pre = min(n_pre, max(1, n_eff))
        a = decode_ctx_tokens // num_decode_reqs if num_decode_reqs else 0
        return self._direct(n_pre, prefill_tokens, prefill_ctx_tokens, num_decode_reqs, a)

    def step_ms(self, num_prefill_reqs: int, prefill_tokens: int, prefill_ctx_tokens: int,
                prefill_attn_work: int, num_decode_reqs: int, decode_query_tokens: int,
                decode_ctx_tokens: int, num_spec_passes: int) -> float:
        if not prefill_tokens:  # decode-only: the hot path
            if decode_query_tokens <= 0:
                return 0.0
            table = self._tables.get(num_decode_reqs)
            if table is not None:
                a = decode_ctx_tokens // num_decode_reqs
                memo = table.memo
                ms = memo.get(a)
                if ms is None:
                    if len(memo) >= _TABLE_MEMO_LIMIT:
                        memo.clear()
                    ms = memo[a] = table(a)
                return ms + self.host_overhead_ms
        return self.kernel_ms(num_prefill_reqs, prefill_tokens, prefill_ctx_tokens, prefill_attn_work,
                              num_decode_reqs, decode_ctx_tokens) + self.host_overhead_ms

    def breakdown(self, shape: StepShape) -> StepBreakdown:
        """aiconfigurator's forward-pass model gives one number: it is reported as ``gpu``."""
        s = shape
        if s.prefill_tokens + s.decode_query_tokens <= 0:
            return StepBreakdown(step_ms=0.0, host_overhead_ms=0.0, parts={"gpu": 0.0})
        gpu = self.kernel_ms(s.num_prefill_reqs, s.prefill_tokens, s.prefill_ctx_tokens, s.prefill_attn_work,
                             s.num_decode_reqs, s.decode_ctx_tokens)
        return StepBreakdown(step_ms=gpu + self.host_overhead_ms, host_overhead_ms=self.host_overhead_ms,
                             parts={"gpu": gpu})
