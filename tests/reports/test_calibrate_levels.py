"""``replay calibrate-requests`` by load level: fit on the rows ``--fit-where`` selects, report every other
level before and after, fit the mixed-step term when server-side prefill times exist, and say when a
parameter ends at a bound. The log has known constants (bench/calibration_levels.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from bench.calibration_levels import build
from replay.api import run
from replay.base.errors import ConfigError
from replay.calibrate_requests import BOUNDS, calibrate_from_requests
from replay.cli import app
from replay.ingest.schema import read_trace
from replay.ingest.writer import write_trace_table

LEVELS = [4.0, 0.3]


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> tuple[Path, pa.Table]:
    return build(tmp_path_factory.mktemp("levels"), 40, LEVELS)


def test_fit_on_the_light_level_reports_the_heavy_one(levels) -> None:
    base, measured = levels
    fit = calibrate_from_requests(base, measured_table=measured, fit_where=["source_run=4x"], max_evaluations=30)
    assert fit.level_column == "source_run" and fit.fit_where == {"source_run": ["4x"]}
    roles = {(e.level, e.role): e for e in fit.levels}
    assert set(roles) == {("4x", "fit"), ("0.3x", "other")}  # no hash holdout with --fit-where
    assert fit.fit_after.requests == roles["4x", "fit"].after.requests == 40
    assert fit.holdout_after.requests == 0
    heavy = roles["0.3x", "other"]
    assert heavy.before.ttft_mape > 0.2 and heavy.after.ttft_mape < 0.5 * heavy.before.ttft_mape
    assert abs(heavy.after.e2e_mean_error) < 0.5 * abs(heavy.before.e2e_mean_error)
    # the log has server-side prefill times: the mixed-step term is fitted, inside its bounds
    names = [p.name for p in fit.fitted]
    assert names == ["eta_compute", "eta_memory", "host_overhead_ms", "mixed_layer_us"]
    for p in fit.fitted:
        assert (p.lower, p.upper) == BOUNDS[p.name] and p.lower <= p.value <= p.upper
    assert fit.params.mixed_layer_us > 0.0
    assert roles["4x", "fit"].after.prefill_mape is not None


def test_without_server_phases_the_mixed_term_is_left_alone(levels) -> None:
    base, measured = levels
    client_only = measured.drop(["measured_prefill_ms", "measured_decode_ms"])
    fit = calibrate_from_requests(base, measured_table=client_only, fit_where=["source_run=4x"], max_evaluations=8)
    assert [p.name for p in fit.fitted] == ["eta_compute", "eta_memory", "host_overhead_ms"]
    assert fit.params.mixed_layer_us == 0.0
    assert fit.levels[0].before.prefill_mape is None


def test_a_fit_stuck_at_a_bound_says_so(levels) -> None:
    """Latencies five times faster than the defaults need efficiencies above 1: the search ends on the
    upper bound and says the data did not pin the value."""
    base, measured = levels
    fast = measured
    for name in ("measured_ttft_ms", "measured_tpot_ms", "measured_e2e_ms", "measured_prefill_ms", "measured_decode_ms"):
        i = fast.column_names.index(name)
        fast = fast.set_column(i, name, pa.array(np.asarray(fast.column(name)) * 0.05))
    fit = calibrate_from_requests(base, measured_table=fast, fit_where=["source_run=4x"], max_evaluations=30)
    stuck = {p.name: p.at_bound for p in fit.stuck}
    assert stuck.get("eta_memory") == "upper"


def test_bad_fit_where(levels) -> None:
    base, measured = levels
    with pytest.raises(ConfigError, match="no column 'load'"):
        calibrate_from_requests(base, measured_table=measured, fit_where=["load=4x"])
    with pytest.raises(ConfigError, match="values present: '4x', '0.3x'"):
        calibrate_from_requests(base, measured_table=measured, fit_where=["source_run=9x"])
    with pytest.raises(ConfigError, match="COLUMN=VALUE"):
        calibrate_from_requests(base, measured_table=measured, fit_where=["source_run"])


def test_cli_fits_on_a_label_of_the_trace(levels, tmp_path: Path) -> None:
    """The measurements and the level label live in the trace itself (as an ingested log has them)."""
    base, measured = levels
    table, meta = read_trace(base / "trace.parquet")
    ids = table.column("request_id").to_pylist()
    pos = {r: i for i, r in enumerate(measured.column("request_id").to_pylist())}
    take = pa.array([pos[r] for r in ids])
    for name in ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms"):  # canonical order
        table = table.append_column(name, measured.column(name).take(take))
    table = table.append_column("tenant", measured.column("source_run").take(take))
    write_trace_table(tmp_path / "log.parquet", table, meta)
    run(tmp_path / "log.parquet", overrides=["scheduler.max_num_batched_tokens=128"], outdir=tmp_path / "out")
    res = CliRunner().invoke(app, ["calibrate-requests", str(tmp_path / "out"), "-o", str(tmp_path / "p.yaml"),
                                   "--fit-where", "tenant=4x", "--max-evaluations", "6", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["level_column"] == "tenant" and out["fit_where"] == {"tenant": ["4x"]}
    assert [(lv["level"], lv["role"]) for lv in out["levels"]] == [("4x", "fit"), ("0.3x", "other")]
    assert {p["name"] for p in out["parameters"]} == {"eta_compute", "eta_memory", "host_overhead_ms"}
    assert all("lower" in p and "upper" in p and "at_bound" in p for p in out["parameters"])
    assert (tmp_path / "p.yaml").is_file()
    text = CliRunner().invoke(app, ["calibrate-requests", str(tmp_path / "out"), "-o", str(tmp_path / "q.yaml"),
                                    "--fit-where", "tenant=4x", "--max-evaluations", "6"]).output
    assert "error per level" in text and "0.3x" in text and "bounds" in text
    bad = CliRunner().invoke(app, ["calibrate-requests", str(tmp_path / "out"), "-o", str(tmp_path / "r.yaml"),
                                   "--fit-where", "tenant=nope"])
    assert bad.exit_code == 2 and "values present" in bad.output


def test_pinned_parameters_keep_the_run_value(levels) -> None:
    base, measured = levels
    fit = calibrate_from_requests(base, measured_table=measured, fit_where=["source_run=4x"], max_evaluations=8,
                                  pin=["host_overhead_ms", "mixed_layer_us"])
    assert [p.name for p in fit.fitted] == ["eta_compute", "eta_memory"]
    assert fit.params.host_overhead_ms == fit.start.host_overhead_ms
    assert fit.params.mixed_layer_us == fit.start.mixed_layer_us == 0.0
    with pytest.raises(ConfigError, match="not a fitted parameter"):
        calibrate_from_requests(base, measured_table=measured, pin=["eta_attention"])
