"""Calibrated timing profiles: the YAML ``replay calibrate`` writes and ``timing.profile`` reads."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from replay.base.atomic import write_text_atomic
from replay.base.errors import ConfigError, ReplayError
from replay.base.files import require_regular_file
from replay.base.structured import load_yaml, yaml_problem
from replay.engine.timing.roofline import RooflineParams

PROFILE_KIND = "replay-timing-profile"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileParams(_Strict):
    eta_compute: float = Field(gt=0.0, le=1.0)
    eta_attention: float = Field(gt=0.0, le=1.0)
    eta_memory: float = Field(gt=0.0, le=1.0)
    tau_layer_us: float = Field(ge=0.0)
    host_overhead_ms: float = Field(ge=0.0)
    allreduce_latency_us: float = Field(ge=0.0)
    eta_nvlink: float = Field(gt=0.0, le=1.0)
    mixed_layer_us: float = Field(0.0, ge=0.0)  # written only when fitted or non-zero


class FitStats(_Strict):
    steps_csv: str
    num_steps: int = Field(gt=0)
    mape: float = Field(ge=0.0)
    max_ape: float = Field(ge=0.0)
    mape_before: float = Field(ge=0.0)  # the hardware profile's defaults on the same steps
    host_overhead_fixed: bool


class TimingProfile(_Strict):
    kind: str = PROFILE_KIND
    version: int = 1
    hardware: str
    model: str
    tensor_parallel_size: int = Field(gt=0)
    dtype: str
    params: ProfileParams
    fit: FitStats

    def roofline_params(self) -> RooflineParams:
        return RooflineParams(**self.params.model_dump())


def save_profile(profile: TimingProfile, path: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Write ``profile`` atomically; never onto one of ``inputs`` (the measured steps it was fitted on)."""
    header = ("# Calibrated step-time profile written by `replay calibrate`; use it with\n"
              "# timing: {profile: <this file>} in an engine config.\n")
    data = profile.model_dump()
    if not data["params"]["mixed_layer_us"]:
        del data["params"]["mixed_layer_us"]  # profiles without the term stay as they were
    write_text_atomic(path, header + yaml.safe_dump(data, sort_keys=False), inputs=inputs)


def load_profile(path: str | Path) -> TimingProfile:
    try:
        require_regular_file(path, "timing profile")
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except ReplayError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read timing profile: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; a timing profile is YAML text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ConfigError(f"{path}: not a timing profile (expected kind: {PROFILE_KIND}; "
                          "write one with `replay calibrate`)")
    try:
        return TimingProfile.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{path}: invalid timing profile:\n" + "\n".join(lines)) from None
