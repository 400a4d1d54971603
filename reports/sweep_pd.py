"""The P x D view of a sweep over a disaggregated fleet's pool sizes: goodput per GPU (or output
throughput per GPU without an SLO) for every (prefill replicas, decode replicas) cell, as a
markdown grid and a heatmap. When other keys vary too, each cell shows the best config among them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.reports.fmt import DASH, md_table, num
from replay.reports.plotting import plt, save_figure

PREFILL_KEY = "fleet.prefill.replicas"
DECODE_KEY = "fleet.decode.replicas"


@dataclass
class PDGrid:
    metric: str  # the sweep column shown
    prefill: list[int]  # rows
    decode: list[int]  # columns
    cells: dict[tuple[int, int], float | None]  # (P, D) -> best value among the other keys
    gpus: dict[tuple[int, int], int]


def pd_grid(rows: list[dict[str, Any]], axes: list[str], metric: str) -> PDGrid | None:
    """The grid when both pool sizes vary; None otherwise."""
    if PREFILL_KEY not in axes or DECODE_KEY not in axes:
        return None
    cells: dict[tuple[int, int], float | None] = {}
    gpus: dict[tuple[int, int], int] = {}
    for r in rows:
        if r["error"] is not None:
            continue
        key = (int(r[PREFILL_KEY]), int(r[DECODE_KEY]))
        value = r[metric]
        best = cells.get(key)
        if key not in cells or (value is not None and (best is None or value > best)):
            cells[key] = value
            gpus[key] = r["gpus"]
    return PDGrid(metric=metric, prefill=sorted({k[0] for k in cells}), decode=sorted({k[1] for k in cells}),
                  cells=cells, gpus=gpus)


def pd_grid_lines(grid: PDGrid, unit: str, others_vary: bool) -> list[str]:
    label = grid.metric.replace("_", " ")
    best = max((v for v in grid.cells.values() if v is not None), default=None)
    rows = []
    for p in grid.prefill:
        row = [f"**P={p}**"]
        for d in grid.decode:
            v = grid.cells.get((p, d))
            cell = DASH if v is None else num(v, unit)
            row.append(f"**{cell}**" if v is not None and v == best else cell)
        rows.append(row)
    return [f"## P x D: {label}", "",
            f"Prefill replicas (rows) by decode replicas (columns); the best cell in bold"
            f"{'; each cell the best config over the other varied keys' if others_vary else ''}.", "",
            md_table(["", *(f"D={d}" for d in grid.decode)], rows, "l" + "r" * len(grid.decode)), ""]


def pd_heatmap_chart(path: Path, grid: PDGrid) -> Path:
    import numpy as np

    data = np.full((len(grid.prefill), len(grid.decode)), np.nan)
    for i, p in enumerate(grid.prefill):
        for j, d in enumerate(grid.decode):
            v = grid.cells.get((p, d))
            if v is not None:
                data[i, j] = v
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(grid.decode), 1.2 + 0.7 * len(grid.prefill)))
    im = ax.imshow(data, origin="lower", cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(grid.decode)), [str(d) for d in grid.decode])
    ax.set_yticks(range(len(grid.prefill)), [str(p) for p in grid.prefill])
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.3g}", ha="center", va="center", fontsize=8, color="white")
    ax.set_xlabel("decode replicas")
    ax.set_ylabel("prefill replicas")
    label = grid.metric.replace("_", " ")
    ax.set_title(f"{label} by pool sizes")
    fig.colorbar(im, ax=ax, label=label)
    return save_figure(fig, path)
