"""Sweep SLOs: ``--slo ttft_p99=2000,tpot_p99=50``.

A key ``<metric>_<stat>`` (metric ttft, tpot, itl, e2e, queue; stat mean, p50, p90, p95, p99, max) is a
constraint on the run's summary metric of that name: the config meets the SLO when every constraint
holds and no request was rejected or left unfinished. The same thresholds, per request, define goodput
(as `vllm bench serve --goodput`): a request is good when its TTFT, TPOT and E2E are within the
smallest threshold given for that metric. Bare keys (``ttft=500``) set a per-request goodput threshold
only, as in ``replay report --slo``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from replay.base.errors import ReplayError
from replay.reports.metrics import LATENCIES, SUMMARY_PERCENTILES
from replay.reports.slo import Slo, parse_slo

_STATS = ("mean", "max", *(f"p{p}" for p in SUMMARY_PERCENTILES))
_CONSTRAINT = re.compile(rf"^({'|'.join(LATENCIES)})_({'|'.join(_STATS)})$")
_GOODPUT_METRICS = ("ttft", "tpot", "e2e")  # the per-request metrics goodput.sql filters on


@dataclass(frozen=True)
class SweepSlo:
    constraints: dict[str, float] = field(default_factory=dict)  # summary column -> max allowed (ms)
    goodput: Slo | None = None                                   # per-request thresholds

    @property
    def empty(self) -> bool:
        return not self.constraints and self.goodput is None

    def text(self) -> str:
        """``ttft_p99<=2000, tpot_p99<=50 (goodput: ttft<=2000, tpot<=50 per request)``."""
        parts = ", ".join(f"{k}<={v:g}" for k, v in self.constraints.items())
        if self.goodput is not None:
            per_request = ", ".join(f"{k}<={v:g}" for k, v in self.goodput.as_dict().items())
            parts = (parts + " " if parts else "") + f"(goodput: {per_request} per request)"
        return parts

    def stamp(self) -> dict[str, Any]:
        """What a stored summary depends on of this SLO: the constraints (slo_met, recomputable from
        the summary) and the per-request goodput thresholds (goodput: needs the run's requests)."""
        return {"constraints": dict(sorted(self.constraints.items())),
                "goodput": self.goodput.as_dict() if self.goodput is not None else None}

    def met(self, row: dict) -> bool | None:
        """True/False from a summary row; None when there are no constraints."""
        if not self.constraints:
            return None
        if row.get("error") is not None:
            return False
        if (row.get("rejected") or 0) or (row.get("unfinished") or 0) or not row.get("completed"):
            return False
        for key, limit in self.constraints.items():
            value = row.get(key)
            if value is None or value > limit:
                return False
        return True


def _milliseconds(item: str, raw: str) -> float:
    """One bound, valid exactly when `replay report --slo` (replay.reports.slo) would take it; its errors
    name the sweep's item."""
    try:
        return parse_slo(f"e2e={raw}").e2e
    except ReplayError as exc:
        raise ReplayError(str(exc).replace(repr(f"e2e={raw}"), repr(item), 1)) from None


def parse_sweep_slo(text: str | list[str] | None) -> SweepSlo:
    """``"ttft_p99=2000,tpot=50"`` -> SweepSlo (a list: ``--slo`` repeated, joined by commas)."""
    if isinstance(text, list):
        text = ",".join(text)
    if text is None or not text.strip():
        return SweepSlo()
    constraints: dict[str, float] = {}
    bare: list[str] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        m = _CONSTRAINT.match(key)
        if not m:
            bare.append(item)
            continue
        if key in constraints:
            raise ReplayError(f"--slo {item!r}: {key} is given twice; give each constraint once")
        constraints[key] = _milliseconds(item, raw)
    try:
        per_request = parse_slo(",".join(bare)) if bare else None
    except ReplayError as exc:
        raise ReplayError(f"{exc} or <metric>_<stat>=ms with metric one of {', '.join(LATENCIES)} and stat "
                          f"one of {', '.join(_STATS)} (e.g. --slo ttft_p99=2000,tpot_p99=50)") from None
    thresholds = per_request.as_dict() if per_request else {}
    for key, value in constraints.items():
        metric = key.split("_")[0]
        if metric in _GOODPUT_METRICS:
            thresholds[metric] = min(value, thresholds.get(metric, value))
    return SweepSlo(constraints, Slo(**thresholds) if thresholds else None)
