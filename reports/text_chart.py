"""A measured-vs-predicted CDF drawn with characters, for the terminal and for markdown code blocks.

``replay validate`` prints one per metric so the shape of both distributions (where the replay is
faster, where its tail is shorter) is visible without opening a file. Pure text, deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEASURED, PREDICTED, BOTH = "*", "o", "#"
LOG_SPREAD = 50.0  # a log x axis when the plotted values span more than this factor


@dataclass(frozen=True)
class ChartSize:
    width: int = 60  # columns of the plot area
    height: int = 11  # rows of the plot area (CDF 0 .. 1)


def _fmt(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 100_000:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:.2e}"


def cdf_chart(title: str, unit: str, measured: list[float], predicted: list[float],
              size: ChartSize = ChartSize(), counts: tuple[int, int] | None = None) -> str:
    """Both empirical CDFs on one grid: ``*`` measured, ``o`` predicted, ``#`` where they meet.
    ``counts`` gives the sample sizes when the values are a curve's quantile points, not the samples.
    The x axis runs from the smallest value to the larger of the two 99% order statistics (the
    largest value below 100 samples; the tails beyond are in the table's p99); log scaled when that range spans more than ``LOG_SPREAD``x."""
    m = np.sort(np.asarray(measured, dtype=float))
    p = np.sort(np.asarray(predicted, dtype=float))
    if not len(m) or not len(p):
        return f"{title}: no values"
    lo = float(min(m[0], p[0]))
    hi = float(max(values[int(np.ceil(0.99 * len(values))) - 1] for values in (m, p)))  # 99% order statistics
    if hi <= lo:
        hi = lo + max(abs(lo), 1.0) * 0.01
    log = lo > 0 and hi / lo > LOG_SPREAD
    cols = np.arange(size.width) / (size.width - 1)
    xs = np.exp(np.log(lo) + cols * (np.log(hi) - np.log(lo))) if log else lo + cols * (hi - lo)
    grid = [[" "] * size.width for _ in range(size.height)]
    for values, mark in ((m, MEASURED), (p, PREDICTED)):
        frac = np.searchsorted(values, xs, side="right") / len(values)
        rows = np.rint(frac * (size.height - 1)).astype(int)
        for col, row in enumerate(rows.tolist()):
            cell = grid[size.height - 1 - row]
            cell[col] = BOTH if cell[col] not in (" ", mark) else mark
    n_m, n_p = counts or (len(m), len(p))
    lines = [f"{title} ({unit}): CDF, {MEASURED} measured ({n_m:,}), {PREDICTED} predicted ({n_p:,}), "
             f"{BOTH} both" + (", log x" if log else "")]
    for i, row in enumerate(grid):
        level = 1.0 - i / (size.height - 1)
        label = f"{level:4.2f}" if i in (0, size.height // 2, size.height - 1) else "    "
        lines.append(f"{label} |" + "".join(row))
    lines.append("     +" + "-" * size.width)
    left, mid = _fmt(lo), _fmt(float(xs[size.width // 2]))
    right = _fmt(hi)
    axis = [" "] * (size.width + 6)
    for pos, text in ((6, left), (6 + size.width // 2 - len(mid) // 2, mid), (6 + size.width - len(right), right)):
        axis[pos:pos + len(text)] = list(text)
    lines.append("".join(axis).rstrip())
    return "\n".join(lines)
