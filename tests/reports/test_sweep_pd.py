"""The P x D grid of a sweep over a disaggregated fleet's pool sizes."""

from __future__ import annotations

from replay.reports.sweep_pd import pd_grid, pd_grid_lines


def _row(p, d, value, router="kv_aware", error=None):
    return {"fleet.prefill.replicas": p, "fleet.decode.replicas": d, "fleet.router": router,
            "goodput_per_gpu": value, "gpus": p + d, "error": error}


def test_each_cell_is_the_best_config_over_the_other_keys():
    rows = [_row(1, 2, 0.5), _row(1, 2, 0.7, "round_robin"), _row(2, 2, None), _row(2, 4, 0.2),
            _row(1, 4, 9.0, error="boom")]
    axes = ["fleet.prefill.replicas", "fleet.decode.replicas", "fleet.router"]
    grid = pd_grid(rows, axes, "goodput_per_gpu")
    assert grid.prefill == [1, 2] and grid.decode == [2, 4]
    assert grid.cells == {(1, 2): 0.7, (2, 2): None, (2, 4): 0.2}  # the failed run is no cell
    lines = pd_grid_lines(grid, "req/s", True)
    table = "\n".join(lines)
    assert "| **P=1** | **0.7** | — |" in table and "| **P=2** | — | 0.2 |" in table
    assert "best config over the other varied keys" in table


def test_no_grid_unless_both_pools_vary():
    rows = [_row(1, 2, 0.5), _row(1, 3, 0.4)]
    assert pd_grid(rows, ["fleet.decode.replicas"], "goodput_per_gpu") is None
