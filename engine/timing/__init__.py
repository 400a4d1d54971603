"""Step-time models for one forward pass on modeled hardware.

``build_timer(config)`` is the one entry point the engine uses: the roofline by default, a
calibrated profile when ``timing.profile`` is set, aiconfigurator-core when ``timing.backend: aic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replay.base.errors import ConfigError
from replay.engine.hardware import get_hardware
from replay.engine.models import ModelSpec, get_model
from replay.engine.timing.base import StepBreakdown, StepShape, StepTimer, shape_from_requests
from replay.engine.timing.roofline import RooflineParams, RooflineTimer

if TYPE_CHECKING:
    from replay.engine.config import EngineConfig

__all__ = ["RooflineParams", "RooflineTimer", "StepBreakdown", "StepShape", "StepTimer", "build_timer",
           "resolve_drafter", "shape_from_requests"]


def resolve_drafter(config: EngineConfig, model: ModelSpec) -> str | None:
    """None without speculation; "model" needs the checkpoint's MTP head."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.drafter == "model" and model.num_mtp_layers == 0:
        raise ConfigError(f"speculative: {model.name} has no MTP head to draft with; set "
                          "speculative.drafter: synthetic to cost the drafter as one extra target layer")
    return spec.drafter


def build_timer(config: EngineConfig) -> StepTimer:
    """The StepTimer for an engine config (see module docstring)."""
    model = get_model(config.model)
    hw = get_hardware(config.hardware)
    drafter = resolve_drafter(config, model)
    kv_dtype = config.kv_cache_dtype()
    timing = config.timing
    if timing.backend == "aic":
        if timing.profile is not None:
            raise ConfigError("timing.profile calibrates the roofline backend; remove it or use backend: roofline")
        from replay.engine.timing.aic import AicTimer
        host = timing.host_overhead_ms if timing.host_overhead_ms is not None else hw.timing.host_overhead_ms.value
        nextn = config.speculative.num_speculative_tokens if config.speculative is not None else 0
        mixed_us = timing.mixed_layer_us if timing.mixed_layer_us is not None else \
            RooflineParams.from_hardware(hw).mixed_layer_us
        return AicTimer(model, hw, tp=config.tensor_parallel_size, dtype=config.dtype, kv_dtype=kv_dtype,
                        host_overhead_ms=host, nextn=nextn, exact=timing.aic_exact,
                        mixed_ms=model.num_layers * mixed_us * 1e-3)
    params = RooflineParams.from_hardware(hw)
    if timing.profile is not None:
        from replay.engine.timing.profile import load_profile
        prof = load_profile(timing.profile)
        if prof.hardware != hw.name:
            raise ConfigError(f"{timing.profile}: profile was calibrated on {prof.hardware!r}, "
                              f"the config asks for hardware {hw.name!r}")
        params = prof.roofline_params()
    if timing.host_overhead_ms is not None:
        params = params.replace(host_overhead_ms=timing.host_overhead_ms)
    if timing.mixed_layer_us is not None:
        params = params.replace(mixed_layer_us=timing.mixed_layer_us)
    try:
        return RooflineTimer(model, hw, params, tp=config.tensor_parallel_size, dtype=config.dtype,
                             kv_dtype=kv_dtype, drafter=drafter)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
