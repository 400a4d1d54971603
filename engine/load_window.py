"""``load.window``: replay one slice of a long trace, e.g. ``"09:00-12:00"``, without editing it.

Times are hours and minutes (optionally seconds) on the trace's clock, from its first arrival
(``arrival_ms`` 0; a trace that starts at midnight reads as the time of day). The slice keeps the
requests arriving in [start, end) and shifts the clock so the replay starts at the window's start:
the fleet starts there as the config says (cold caches, the autoscaler's starting size), and a
session whose earlier turns fall before the window starts with its first turn inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CLOCK = re.compile(r"^\s*(\d{1,3}):([0-5]\d)(?::([0-5]\d(?:\.\d+)?))?\s*$")


@dataclass(frozen=True)
class LoadWindow:
    start_ms: float
    end_ms: float


def _clock_ms(text: str, whole: str) -> float:
    m = _CLOCK.match(text)
    if m is None:
        raise ValueError(f"window {whole!r}: {text.strip()!r} is not a time HH:MM or HH:MM:SS "
                         "(hours may exceed 24 for traces longer than a day)")
    hours, minutes, seconds = int(m.group(1)), int(m.group(2)), float(m.group(3) or 0.0)
    return ((hours * 60 + minutes) * 60 + seconds) * 1000.0


def parse_window(text: str) -> LoadWindow:
    """``"09:00-12:00"`` -> LoadWindow(9 h, 12 h) in ms; ValueError says what is wrong."""
    start, sep, end = text.partition("-")
    if not sep:
        raise ValueError(f"window {text!r}: expected START-END, e.g. 09:00-12:00")
    w = LoadWindow(_clock_ms(start, text), _clock_ms(end, text))
    if w.end_ms <= w.start_ms:
        raise ValueError(f"window {text!r}: the end must come after the start")
    return w
