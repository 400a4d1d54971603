"""Service-level objectives for goodput, parsed from ``--slo ttft=500,tpot=50`` (milliseconds).

Two optional keys say how attainment over time is judged (reports/over_time.py): ``window`` (seconds,
default 300: five-minute windows) and ``goal`` (the fraction of a window's requests that must meet
every SLO for the window to count as met, default 0.95)."""

from __future__ import annotations

from dataclasses import dataclass

from replay.base.errors import ReplayError

# Accepted keys; e2el is the spelling of `vllm bench serve --goodput`.
_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e"}
_WINDOW_KEYS = {"window": "window_s", "goal": "goal"}
DEFAULT_WINDOW_S = 300.0  # five minutes: the window an SLO dashboard commonly shows
DEFAULT_GOAL = 0.95


@dataclass(frozen=True)
class Slo:
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    window_s: float = DEFAULT_WINDOW_S  # attainment is judged per window of arrivals
    goal: float = DEFAULT_GOAL  # a window meets the SLO when this fraction of its requests do

    @property
    def empty(self) -> bool:
        return self.ttft is None and self.tpot is None and self.e2e is None

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)) if v is not None}

    def describe(self) -> str:
        return ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in self.as_dict().items())


def parse_slo(text: str | list[str] | None) -> Slo | None:
    """``"ttft=500,tpot=50"`` -> Slo; None for no text. A list (``--slo`` repeated) reads as its items
    joined by commas. Errors name the bad item, and a key given twice."""
    if isinstance(text, list):
        text = ",".join(text)
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
        if not sep or (key not in _KEYS and key not in _WINDOW_KEYS):
            raise ReplayError(f"--slo {item!r}: expected key=milliseconds with key one of ttft, tpot, e2e "
                              "(e.g. --slo ttft=500,tpot=50), or window=seconds, goal=fraction")
        try:
            value = float(raw)
        except ValueError:
            raise ReplayError(f"--slo {item!r}: {raw.strip()!r} is not a number of milliseconds") from None
        if not value > 0 or value != value or value == float("inf"):
            raise ReplayError(f"--slo {item!r}: the SLO must be a positive number of milliseconds")
        if key == "goal" and value > 1:
            raise ReplayError(f"--slo {item!r}: goal is a fraction of requests in (0, 1]")
        name = _WINDOW_KEYS.get(key) or _KEYS[key]
        if name in values:
            raise ReplayError(f"--slo {item!r}: {key} is given twice; give each SLO once")
        values[name] = value
    return Slo(**values)
