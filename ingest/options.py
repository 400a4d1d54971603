"""Ingest options shared by every reader (the ``replay ingest`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from replay.base.errors import ConfigError

from .columns import TIME_UNITS
from .schema import LABEL_FIELDS, MAX_HASH_BLOCK_SIZE, OPTIONAL_SCHEMA

OnError = Literal["fail", "skip"]

# Canonical names accepted on the left of ``--map CANONICAL=SOURCE`` (generic csv/jsonl).
MAP_TARGETS = ("arrival", "input_tokens", "output_tokens", "request_id", "session_id", "parent_id", "turn",
               "delay_ms", "priority", "hash_ids") + tuple(OPTIONAL_SCHEMA.names)
_MAP_ALIASES = {"arrival_ms": "arrival", "timestamp": "arrival", "time": "arrival"}


@dataclass(frozen=True)
class IngestOptions:
    format: str | None = None
    block_size: int | None = None
    on_error: OnError = "fail"
    time_unit: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)
    tokenizer: str | None = None
    drop_failed: bool = False
    # keep only rows whose label equals the value (``--where source_run=constant@4.00``); others are
    # counted as skipped, not rejected
    where: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.on_error not in ("fail", "skip"):
            raise ConfigError(f"on_error must be 'fail' or 'skip', not {self.on_error!r}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ConfigError(f"block size must be a positive integer, not {self.block_size!r}")
        if self.block_size is not None and self.block_size > MAX_HASH_BLOCK_SIZE:
            raise ConfigError(f"block size {self.block_size} is too large: at most {MAX_HASH_BLOCK_SIZE:,} tokens per hash id")
        if self.time_unit is not None and self.time_unit not in TIME_UNITS:
            raise ConfigError(f"time unit must be one of {', '.join(TIME_UNITS)}, not {self.time_unit!r}")
        normalized: dict[str, str] = {}
        for key, value in (self.mapping or {}).items():
            target = _MAP_ALIASES.get(key, key)
            if target not in MAP_TARGETS:
                raise ConfigError(f"--map: unknown canonical field {key!r}; use one of {', '.join(MAP_TARGETS)}")
            if target in normalized:
                raise ConfigError(f"--map: {key!r} and another name map the same field {target!r}; map it once")
            normalized[target] = value
        object.__setattr__(self, "mapping", normalized)
        labels = tuple(f.name for f in LABEL_FIELDS) + ("session_id", "priority")
        for key in self.where or {}:
            if key not in labels:
                raise ConfigError(f"--where: {key!r} is not a label; use one of {', '.join(labels)}")


def parse_where_flags(flags: list[str]) -> dict[str, str]:
    """``["source_run=constant@4.00"]`` -> ``{"source_run": "constant@4.00"}``."""
    out: dict[str, str] = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--where expects LABEL=VALUE, got {flag!r}")
        if key.strip() in out:
            raise ConfigError(f"--where {flag!r}: {key.strip()} is given twice; a label has one value")
        out[key.strip()] = value.strip()
    return out


def parse_map_flags(flags: list[str]) -> dict[str, str]:
    """``["arrival=ts", "input_tokens=prompt_len"]`` -> ``{"arrival": "ts", ...}``."""
    out: dict[str, str] = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--map expects CANONICAL=SOURCE_COLUMN, got {flag!r}")
        if key.strip() in out:
            raise ConfigError(f"--map {flag!r}: {key.strip()} is mapped twice; map each field once")
        out[key.strip()] = value.strip()
    return out
