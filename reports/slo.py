"""Service-level objectives for goodput, parsed from ``--slo ttft=500,tpot=50`` (milliseconds)."""

from __future__ import annotations

from dataclasses import dataclass

from replay.base.errors import ReplayError

# Accepted keys; e2el is the spelling of `vllm bench serve --goodput`.
_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e"}


@dataclass(frozen=True)
class Slo:
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft is None and self.tpot is None and self.e2e is None

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)) if v is not None}

    def describe(self) -> str:
        return ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in self.as_dict().items())


def parse_slo(text: str | None) -> Slo | None:
    """``"ttft=500,tpot=50"`` -> Slo; None for no text. Errors name the bad item."""
    if text is None or not text.strip():
        return None
    values: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, raw = item.partition("=")
        if not sep:
            key, sep, raw = item.partition(":")  # vllm's ttft:500 form
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise ReplayError(f"--slo {item!r}: expected key=milliseconds with key one of ttft, tpot, e2e "
                              "(e.g. --slo ttft=500,tpot=50)")
        try:
            value = float(raw)
        except ValueError:
            raise ReplayError(f"--slo {item!r}: {raw.strip()!r} is not a number of milliseconds") from None
        if not value > 0:
            raise ReplayError(f"--slo {item!r}: the SLO must be a positive number of milliseconds")
        values[_KEYS[key]] = value
    return Slo(**values)
