"""Hardware profiles as data: one YAML per GPU under ``profiles/``; adding a GPU is a data change.

Every figure carries its source. The ``timing`` section holds the step-time model's efficiencies and
overheads (named parameters with provenance; ``replay calibrate`` fits new values for them).
``hardware:`` takes a shipped profile's name or the path of a YAML file in the same schema
(docs/timing.md, "Hardware profiles").
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from replay.base.errors import ConfigError, ReplayError
from replay.base.files import require_regular_file
from replay.base.structured import load_bundled_yaml, load_yaml

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
    pcie_bw_per_dir: Figure      # bytes/s per direction, practical pinned-memory figure (host link)
    l2_bytes: Figure
    num_sms: Figure              # SMs (NVIDIA) or compute units (AMD)
    tdp_watts: Figure
    # What tensor-parallel all-reduces travel over: nvlink (nvlink_bw_per_dir, per GPU per direction),
    # pcie (tp_link_bw_per_dir: peer-to-peer, or through host memory where the driver disables P2P)
    # or xgmi (a fully connected mesh: tp_link_bw_per_dir per peer link; tp-1 links in use).
    tp_link: Literal["nvlink", "pcie", "xgmi"] = "nvlink"
    nvlink_bw_per_dir: Figure | None = None  # bytes/s per GPU per direction; required with tp_link nvlink
    tp_link_bw_per_dir: Figure | None = None  # bytes/s per direction; required with tp_link pcie or xgmi

    @model_validator(mode="after")
    def _tp_link_figure(self) -> GpuFigures:
        if self.tp_link == "nvlink" and self.nvlink_bw_per_dir is None:
            raise ValueError("tp_link nvlink needs gpu.nvlink_bw_per_dir")
        if self.tp_link != "nvlink" and self.tp_link_bw_per_dir is None:
            raise ValueError(f"tp_link {self.tp_link} needs gpu.tp_link_bw_per_dir")
        return self


class TimingParams(_Strict):
    """The roofline's efficiencies and overheads (docs/timing.md has the formulas)."""

    eta_compute: Figure          # fraction of dense peak reached by linear-layer GEMMs
    eta_attention: Figure        # fraction of dense peak reached by prefill attention
    eta_memory: Figure           # fraction of HBM bandwidth reached when streaming weights or KV
    tau_layer_us: Figure         # per-layer fixed cost (norms, rotary, activations, launch gaps), us
    host_overhead_ms: Figure     # per-step host time (scheduling, input prep, sampling sync), ms
    allreduce_latency_us: Figure  # fixed cost of one tensor-parallel all-reduce, us
    eta_nvlink: Figure           # fraction of the TP link's per-direction bandwidth an all-reduce reaches
    # Extra cost per layer of a step that carries a prefill chunk (attention and launches outside the
    # CUDA graph that decode-only steps replay), us; absent: 0 (docs/timing.md, "Mixed and prefill steps").
    mixed_layer_us: Figure | None = None


class HardwareProfile(_Strict):
    name: str
    description: str
    gpu: GpuFigures
    timing: TimingParams

    def peak_flops(self, dtype: str) -> float:
        return (self.gpu.fp8_dense_flops if dtype == "fp8" else self.gpu.bf16_dense_flops).value

    def tp_link_bw(self, tp: int) -> float:
        """Bytes/s per direction one GPU's all-reduce traffic gets over its tensor-parallel group."""
        g = self.gpu
        if g.tp_link == "nvlink":
            assert g.nvlink_bw_per_dir is not None
            return g.nvlink_bw_per_dir.value
        assert g.tp_link_bw_per_dir is not None
        links = max(1, tp - 1) if g.tp_link == "xgmi" else 1
        return g.tp_link_bw_per_dir.value * links


_PROFILES = "profiles"


@lru_cache(maxsize=1)
def _profiles() -> dict[str, HardwareProfile]:
    out: dict[str, HardwareProfile] = {}
    folder = resources.files(__package__).joinpath(_PROFILES)
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".yaml"):
            continue
        where = f"engine/hardware/{_PROFILES}/{item.name}"
        profile = _validate(load_bundled_yaml(item.read_text(encoding="utf-8")), where)
        if profile.name != item.name.removesuffix(".yaml"):
            raise ConfigError(f"{where}: field 'name' must match the file name")
        out[profile.name] = profile
    return out


def _validate(data: object, where: str) -> HardwareProfile:
    """One error naming the file and every offending key (``gpu.hbm_bw.value: ...``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a hardware profile must be a YAML mapping with name, description, gpu "
                          "and timing (docs/timing.md, \"Hardware profiles\")")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            key = ".".join(str(p) for p in e["loc"]) or "(profile)"
            what = "unknown key" if e["type"] == "extra_forbidden" else \
                "missing (every figure is {value, source})" if e["type"] == "missing" else e["msg"]
            problems.append(f"{key}: {what}")
        raise ConfigError(f"{where}: invalid hardware profile: " + "; ".join(problems)) from None


@lru_cache(maxsize=32)
def _profile_file(path: str) -> HardwareProfile:
    try:
        require_regular_file(path, "hardware profile")
        text = Path(path).read_text(encoding="utf-8")
    except ReplayError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the hardware profile: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; a hardware profile is YAML text") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return _validate(data, path)


def list_hardware() -> list[str]:
    return list(_profiles())


def get_hardware(name: str) -> HardwareProfile:
    """A shipped profile by name (``list_hardware()``), or the path of a profile YAML in the same schema."""
    profiles = _profiles()
    shipped = profiles.get(name.lower())
    if shipped is not None:
        return shipped
    path = Path(name).expanduser()
    if path.suffix.lower() in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"hardware {name!r}: no such profile file")
        return _profile_file(str(path.resolve()))
    raise ConfigError(f"unknown hardware {name!r}: use one of {', '.join(profiles)}, or the path of a profile "
                      "YAML (docs/timing.md, \"Hardware profiles\"; replay steptime --list-hardware)")
