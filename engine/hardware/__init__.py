"""Hardware profiles as data: one YAML per GPU under ``profiles/``; adding a GPU is a data change.

Every figure carries its source. The ``timing`` section holds the step-time model's efficiencies and
overheads (named parameters with provenance; ``replay calibrate`` fits new values for them).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from replay.base.errors import ConfigError

__all__ = ["Figure", "HardwareProfile", "TimingParams", "get_hardware", "list_hardware"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figure(_Strict):
    value: float = Field(ge=0.0)
    source: str = Field(min_length=3)


class GpuFigures(_Strict):
    bf16_dense_flops: Figure     # FLOP/s, dense tensor core
    fp8_dense_flops: Figure      # FLOP/s, dense tensor core
    hbm_bytes: Figure            # nominal capacity, bytes
    usable_memory_bytes: Figure  # what the driver reports as total (torch.cuda.mem_get_info), bytes
    hbm_bw: Figure               # bytes/s
    nvlink_bw_per_dir: Figure    # bytes/s per GPU per direction
    pcie_bw_per_dir: Figure      # bytes/s per direction, practical pinned-memory figure
    l2_bytes: Figure
    num_sms: Figure
    tdp_watts: Figure


class TimingParams(_Strict):
    """The roofline's efficiencies and overheads (docs/timing.md has the formulas)."""

    eta_compute: Figure          # fraction of dense peak reached by linear-layer GEMMs
    eta_attention: Figure        # fraction of dense peak reached by prefill attention
    eta_memory: Figure           # fraction of HBM bandwidth reached when streaming weights or KV
    tau_layer_us: Figure         # per-layer fixed cost (norms, rotary, activations, launch gaps), us
    host_overhead_ms: Figure     # per-step host time (scheduling, input prep, sampling sync), ms
    allreduce_latency_us: Figure  # fixed cost of one tensor-parallel all-reduce, us
    eta_nvlink: Figure           # fraction of NVLink per-direction bandwidth an all-reduce reaches


class HardwareProfile(_Strict):
    name: str
    description: str
    gpu: GpuFigures
    timing: TimingParams

    def peak_flops(self, dtype: str) -> float:
        return (self.gpu.fp8_dense_flops if dtype == "fp8" else self.gpu.bf16_dense_flops).value


_PROFILES = "profiles"


@lru_cache(maxsize=1)
def _profiles() -> dict[str, HardwareProfile]:
    out: dict[str, HardwareProfile] = {}
    folder = resources.files(__package__).joinpath(_PROFILES)
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".yaml"):
            continue
        where = f"engine/hardware/{_PROFILES}/{item.name}"
        try:
            profile = HardwareProfile.model_validate(yaml.safe_load(item.read_text(encoding="utf-8")))
        except ValidationError as exc:
            raise ConfigError(f"{where}: invalid hardware profile: {exc}") from None
        if profile.name != item.name.removesuffix(".yaml"):
            raise ConfigError(f"{where}: field 'name' must match the file name")
        out[profile.name] = profile
    return out


def list_hardware() -> list[str]:
    return list(_profiles())


def get_hardware(name: str) -> HardwareProfile:
    """A shipped profile by name (h200_sxm, h100_sxm, b200)."""
    profiles = _profiles()
    try:
        return profiles[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown hardware {name!r}: use one of {', '.join(profiles)}") from None
