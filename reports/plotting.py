"""Matplotlib set up once for every report chart, and the primitives they share: the house style
(size, colours, resolution), byte-identical PNG output, time and millisecond axes, CDF overlays.

It knows nothing of runs or metrics, so charts of every kind (run, fleet, sweep, validation) build on
it without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

DPI = 110
SIZE = (8.0, 4.6)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
PNG_METADATA = {"Software": None}  # no matplotlib version string: byte-identical reruns


def save_figure(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata=PNG_METADATA)
    plt.close(fig)
    return path


def time_axis(span_ms: float) -> tuple[float, str]:
    """Divisor and unit so the time axis reads in s, min or h."""
    if span_ms <= 15 * 60_000:
        return 1000.0, "s"
    if span_ms <= 15 * 3_600_000:
        return 60_000.0, "min"
    return 3_600_000.0, "h"


def ms_formatter() -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")


def use_log_scale(values: Sequence[float]) -> bool:
    pos = [v for v in values if v is not None and v > 0]
    return bool(pos) and max(pos) / min(pos) > 50


def cdf_chart(path: Path, title: str, series: Sequence[tuple[str, list[tuple[float, float]]]],
              xlabel: str, marks: Sequence[float] = (0.5, 0.99)) -> Path:
    """Overlaid CDFs; each series is (label, [(value, fraction)]). Dotted guides at p50 and p99."""
    fig, ax = plt.subplots(figsize=SIZE)
    all_x: list[float] = []
    for i, (label, cdf) in enumerate(series):
        if not cdf:
            continue
        xs = [x for x, _ in cdf]
        ys = [y for _, y in cdf]
        all_x += xs
        ax.plot(xs, ys, color=COLORS[i % len(COLORS)], lw=2, label=label, drawstyle="default")
    if use_log_scale(all_x):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ms_formatter())
    for q in marks:
        ax.axhline(q, color="grey", lw=0.8, ls=":")
        ax.annotate(f"p{q * 100:g}", xy=(0.005, q), xycoords=("axes fraction", "data"),
                    va="top" if q > 0.9 else "bottom", fontsize=8, color="grey")
    ax.set_ylim(0, 1.01)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples below")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if any(c for _, c in series):
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
    return save_figure(fig, path)
