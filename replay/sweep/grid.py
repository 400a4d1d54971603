"""The grid: ``--grid key=v1,v2``, ``key=1..64`` (``1..64:8`` for a step) or ``key=a.yaml,b.yaml``.

Every value is applied to the base config through the same path as ``--set`` (replay.engine.config
apply_overrides), so any config key can be swept, including keys added after this module was written.
A value naming a YAML file (``*.yaml``/``*.yml``) is that file's mapping, which becomes the key's
value (``--grid speculative=mtp1.yaml,mtp2.yaml``), as ``--set speculative={...}`` would.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from replay.base.errors import ConfigError, ReplayError
from replay.base.files import require_regular_file
from replay.base.structured import load_yaml, yaml_problem
from replay.engine.config import EngineConfig, apply_overrides, validate_config

_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+))?\s*$")
_YAML_SUFFIXES = (".yaml", ".yml")
MAX_POINTS = 100_000  # a typo like 1..10000000 must fail fast, not fill the disk


@dataclass(frozen=True)
class Value:
    """One value of a grid axis: ``label`` is what the sweep table shows, ``raw`` the --set text or
    the loaded YAML mapping."""

    label: Any
    raw: str | dict


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Value, ...]


def _scalar_label(text: str) -> Any:
    value = load_yaml(text)
    return value if isinstance(value, bool | int | float | str) or value is None else text


def parse_range(text: str, flag: str) -> list[int] | None:
    """``A..B`` (inclusive) or ``A..B:S``; None when ``text`` is not a range."""
    m = _RANGE.match(text)
    if not m:
        return None
    lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if step <= 0 or hi < lo:
        raise ConfigError(f"{flag} {text!r}: a range is LOW..HIGH[:STEP] with LOW <= HIGH and STEP > 0")
    if (hi - lo) // step + 1 > MAX_POINTS:
        raise ConfigError(f"{flag} {text!r}: more than {MAX_POINTS:,} values")
    return list(range(lo, hi + 1, step))


def _load_yaml_value(path: Path, flag: str) -> dict:
    try:
        require_regular_file(path, "grid YAML file")
        loaded = load_yaml(path.read_text(encoding="utf-8"))
    except ReplayError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{flag}: {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{flag}: {path}: not a UTF-8 text file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag}: {path}: invalid YAML: {yaml_problem(exc)}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{flag}: {path}: a grid YAML file must hold a mapping of config keys")
    return loaded


def parse_axis(spec: str, flag: str = "--grid") -> Axis:
    """``key=values`` -> Axis. Errors name the flag and the item."""
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not key or not rest.strip():
        raise ConfigError(f"{flag} {spec!r}: expected key=v1,v2,... or key=LOW..HIGH "
                          "(e.g. scheduler.max_num_seqs=64,128 or fleet.replicas=1..8)")
    rng = parse_range(rest, f"{flag} {key}=")
    if rng is not None:
        values = [Value(v, str(v)) for v in rng]
    else:
        values = []
        for item in (i.strip() for i in _split_top(rest)):
            if not item:
                raise ConfigError(f"{flag} {spec!r}: empty value")
            if item.lower().endswith(_YAML_SUFFIXES):
                values.append(Value(item, _load_yaml_value(Path(item), flag)))
            else:
                values.append(Value(_scalar_label(item), item))
    labels = [repr(v.label) for v in values]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{flag} {spec!r}: a value is listed twice")
    return Axis(key, tuple(values))


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets, so list values like [0.8,0.3] survive."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a config field holds (``X`` or ``X | None``), else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def check_config_key(key: str, flag: str = "--grid") -> None:
    """Refuse a key the engine config does not have (a typo would otherwise make every point of the
    grid fail to validate, and the sweep would run nothing). Keys inside a free-form mapping (e.g.
    ``fleet.router_options.*``) are left to the config's own validation."""
    model: type[BaseModel] = EngineConfig
    parts = key.split(".")
    named = False  # the previous part was a list of named entries: this part names one
    for i, part in enumerate(parts):
        if named:
            named = False
            continue
        field = model.model_fields.get(part)
        where = ".".join(parts[:i + 1])
        if field is None:
            known = ", ".join(model.model_fields)
            raise ConfigError(f"{flag} {key}: unknown config key {where!r} (known here: {known})")
        section = _section_model(field.annotation)
        if section is None:
            if i < len(parts) - 1 and typing.get_origin(field.annotation) is not dict and field.annotation is not dict:
                raise ConfigError(f"{flag} {key}: {where!r} is a value, not a section")
            return
        named = typing.get_origin(field.annotation) is list  # kv_cache.tiers.<name>.<key>
        model = section


def check_axes(axes: list[Axis], flag: str = "--grid") -> list[Axis]:
    """``axes`` when every key is one the engine config has (``check_config_key``)."""
    for axis in axes:
        check_config_key(axis.key, flag)
    return axes


def parse_axes(specs: list[str], flag: str = "--grid") -> list[Axis]:
    axes = [parse_axis(s, flag) for s in specs]
    keys = [a.key for a in axes]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ConfigError(f"{flag}: the key {dup!r} is given twice")
    return axes


Point = tuple[tuple[str, Value], ...]


def product(axes: list[Axis]) -> list[Point]:
    """The cartesian product in a fixed order: the last axis varies fastest."""
    points = [tuple(zip([a.key for a in axes], combo)) for combo in itertools.product(*(a.values for a in axes))]
    if len(points) > MAX_POINTS:
        raise ConfigError(f"--grid: {len(points):,} combinations (more than {MAX_POINTS:,})")
    return points


def point_config(base: dict, point: Point, source: str) -> EngineConfig:
    """The validated config of one grid point (raises ConfigError naming the point on a bad combination)."""
    data = copy.deepcopy(base)
    # A YAML file's mapping goes in as a flow mapping (JSON is YAML), replacing the key's value as
    # `--set key={...}` would.
    apply_overrides(data, [f"{key}={json.dumps(v.raw) if isinstance(v.raw, dict) else v.raw}" for key, v in point])
    return validate_config(data, f"{source} at {describe(point)}")


def describe(point: Point) -> str:
    return ", ".join(f"{k}={v.label}" for k, v in point) or "(base config)"
