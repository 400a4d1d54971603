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

Speed (docs/timing.md, "How the aic backend stays fast"): decode-only steps are priced from
aiconfigurator's own structure by ``replay.engine.timing.aic_decode.DecodeTable`` (compiled with the engine
core; decode windows time their steps there), exact up to float rounding inside the measured table
and within 1e-4 where it is extrapolated. ``exact=True`` (``timing.aic_exact``) turns that off: one
memoized direct call per distinct shape. Prefill and mixed steps are always direct calls.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from replay.base.errors import ConfigError
from replay.engine.hardware import HardwareProfile
from replay.engine.models import ModelSpec
from replay.engine.timing.aic_decode import AicDecodeRun, DecodeTable
from replay.engine.timing.base import StepBreakdown, StepShape

AIC_VERSION = "0.12.0"
INSTALL_HINT = "pip install 'aiconfigurator-core==0.12.0' (or pip install -e '.[aic]')"
# Our hardware profile name -> aiconfigurator system name.
AIC_SYSTEMS = {"h200_sxm": "h200_sxm", "h100_sxm": "h100_sxm", "b200": "b200_sxm"}
_MEMO_LIMIT = 2_000_000  # entries; a replay sees far fewer distinct step shapes
_TABLE_MEMO_LIMIT = 200_000  # decode-only values kept per decode batch size
# Any step makes aiconfigurator load all of its kernel tables; its value is not used.
_LOAD_TABLES_STEP = json.dumps({"scheduled_requests": {"num_decode_requests": 1, "sum_decode_kv_tokens": 1024}})


def aic_available() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def _supported_models() -> list[str]:
    from replay.engine.models import get_model, list_models
    return [n for n in list_models() if get_model(n).aic_name]


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
                 kv_dtype: str = "bf16", host_overhead_ms: float, nextn: int = 0, mixed_ms: float = 0.0,
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
        self.mixed_ms = mixed_ms  # added to steps with a prefill chunk (docs/timing.md, "Mixed and prefill steps")
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
        self._tables: dict[int, DecodeTable] = {}  # decode batch size -> its decode-only table
        # aiconfigurator loads its kernel tables on the first estimate (0.2-0.4 s, in Rust with the GIL
        # released): start that now, so it overlaps whatever the caller does next (`replay run` loads
        # the trace). The first direct call waits for it; nothing else touches the model meanwhile.
        self._loading: threading.Thread | None = threading.Thread(target=self._load_tables, daemon=True,
                                                                  name="aic-table-load")
        self._loading.start()

    def _load_tables(self) -> None:
        try:
            self._fpm.estimate_forward_pass_time_ms(_LOAD_TABLES_STEP)
        except Exception:  # noqa: BLE001 - the first real call raises it again, with its reason
            pass

    def before_fork(self) -> None:
        """The tables are loaded (a process forked while the loading thread holds a lock of
        aiconfigurator's would wait on it for ever: engine/cluster_run.py forks workers)."""
        self.forward_pass_model()

    def forward_pass_model(self) -> Any:
        """aiconfigurator's model, once its tables are loaded (never used by two threads at once)."""
        if self._loading is not None:
            self._loading.join()
            self._loading = None
        return self._fpm

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
        value = self.forward_pass_model().estimate_forward_pass_time_ms(json.dumps({"scheduled_requests": req}))
        ms = float(value or 0.0)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = ms
        return ms

    def _table(self, n: int) -> DecodeTable:
        table = self._tables.get(n)
        if table is None:
            table = self._tables[n] = DecodeTable(self._direct, n)
        return table

    def _decode_ms(self, n: int, a: int) -> float:
        if self.exact:
            return self._direct(0, 0, 0, n, a)
        return self._table(n).kernel_ms(a)

    def decode_run(self, nrun: int) -> AicDecodeRun | None:
        """What times a decode window's steps of ``nrun`` requests in compiled code
        (``AicDecodeRun.extend``: each step as ``step_ms`` gives it, bit for bit); None with
        ``exact``, where the window calls ``step_ms`` per step."""
        return None if self.exact else AicDecodeRun(self._table(nrun), self.host_overhead_ms)

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
                    ms = memo[a] = table.kernel_ms(a)
                return ms + self.host_overhead_ms
        ms = self.kernel_ms(num_prefill_reqs, prefill_tokens, prefill_ctx_tokens, prefill_attn_work,
                            num_decode_reqs, decode_ctx_tokens) + self.host_overhead_ms
        return ms + self.mixed_ms if prefill_tokens else ms

    def breakdown(self, shape: StepShape) -> StepBreakdown:
        """aiconfigurator's forward-pass model gives one number: it is reported as ``gpu``."""
        s = shape
        if s.prefill_tokens + s.decode_query_tokens <= 0:
            return StepBreakdown(step_ms=0.0, host_overhead_ms=0.0, parts={"gpu": 0.0})
        gpu = self.kernel_ms(s.num_prefill_reqs, s.prefill_tokens, s.prefill_ctx_tokens, s.prefill_attn_work,
                             s.num_decode_reqs, s.decode_ctx_tokens)
        parts = {"gpu": gpu}
        if self.mixed_ms:
            parts["mixed_overhead"] = self.mixed_ms if s.prefill_tokens else 0.0
        return StepBreakdown(step_ms=gpu + sum(v for k, v in parts.items() if k != "gpu") + self.host_overhead_ms,
                             host_overhead_ms=self.host_overhead_ms, parts=parts)
