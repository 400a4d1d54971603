"""Charts for ``replay validate``: predicted-vs-measured scatter and the CDF of relative errors.

Drawn from ``Validation.samples`` (no queries here), with the report charts' style and
deterministic PNG bytes.
"""

from __future__ import annotations

from pathlib import Path

from replay.reports.plotting import COLORS, cdf_chart, plt, save_figure, use_log_scale
from replay.reports.validate import METRICS, POOLED, Validation

PANELS_PER_ROW = 4  # scatter panels per row (up to eight metrics: TTFT ... cached tokens)
CDF_POINTS = 2000  # at most this many evenly spaced order statistics per curve (exact at each point)


def scatter_chart(path: Path, v: Validation) -> Path:
    """One panel per metric: each request's prediction against its measurement, with y = x."""
    metrics = [m for m in METRICS if m in v.samples and m not in POOLED]
    cols = min(PANELS_PER_ROW, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 4.0 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(flat, metrics, strict=False):
        label, unit = METRICS[metric]
        xs, ys = v.samples[metric]["measured"], v.samples[metric]["predicted"]
        ax.scatter(xs, ys, s=8, alpha=0.5, color=COLORS[0], label="request")
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="predicted = measured")
        if use_log_scale(xs + ys) and lo > 0:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"measured {label} ({unit})")
        ax.set_ylabel(f"predicted {label} ({unit})")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    return save_figure(fig, path)


def _empirical_cdf(values: list[float]) -> list[tuple[float, float]]:
    values = sorted(values)
    n = len(values)
    if n == 0:
        return []
    step = max(1, n // CDF_POINTS)
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return [(values[i] * 100.0, (i + 1) / n) for i in idx]


def error_cdf_chart(path: Path, v: Validation) -> Path:
    series = [(METRICS[m][0], _empirical_cdf(v.samples[m]["ape"])) for m in METRICS
              if m in v.samples and m not in POOLED]
    return cdf_chart(path, "Relative error of the replay per request (|predicted - measured| / measured)",
                     series, "absolute error (% of measured)", marks=(0.5, 0.9))


def validation_charts(directory: Path, v: Validation) -> dict[str, Path]:
    if not any(m not in POOLED for m in v.samples):
        return {}
    return {"scatter": scatter_chart(directory / "predicted_vs_measured.png", v),
            "error_cdf": error_cdf_chart(directory / "error_cdf.png", v)}

