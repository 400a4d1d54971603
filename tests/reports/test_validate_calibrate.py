"""``replay calibrate-requests``: fit the roofline to per-request TTFT/TPOT of a log whose constants are
known (a replay with a slower profile, exported as aiperf), then check the held-out error falls and the
written profile reproduces the fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.api import run
from replay.base.errors import ConfigError, ReplayError
from replay.calibrate_requests import calibrate_from_requests, holdout_mask, save_request_profile
from replay.engine.hardware import get_hardware
from replay.engine.timing import RooflineParams
from replay.engine.timing.profile import FitStats, ProfileParams, TimingProfile, load_profile, save_profile
from replay.reports.export import export
from replay.reports.validate import compute_validation

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"
LIMIT = "load.max_requests=150"


@pytest.fixture(scope="module")
def truth_and_base(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cal")
    base = RooflineParams.from_hardware(get_hardware("h200_sxm"))
    truth = base.replace(eta_compute=base.eta_compute * 0.6, eta_memory=base.eta_memory * 0.8, host_overhead_ms=3.0)
    save_profile(TimingProfile(hardware="h200_sxm", model="meta-llama/Llama-3.1-8B", tensor_parallel_size=1,
                               dtype="bf16", params=ProfileParams(**truth.as_dict()),
                               fit=FitStats(steps_csv="known constants", num_steps=1, mape=0.0, max_ape=0.0,
                                            mape_before=0.0, host_overhead_fixed=False)), d / "truth.yaml")
    run(SAMPLE, overrides=[LIMIT, f"timing.profile={d / 'truth.yaml'}"], outdir=d / "truth")
    export(d / "truth", "aiperf", d / "measured.jsonl")
    run(SAMPLE, overrides=[LIMIT], outdir=d / "base")
    return d / "measured.jsonl", d / "base"


def test_fit_lowers_held_out_error_and_profile_reproduces_it(truth_and_base, tmp_path: Path) -> None:
    measured, base = truth_and_base
    fit = calibrate_from_requests(base, measured=measured, max_evaluations=30)
    assert fit.evaluations <= 31 and fit.holdout_after.requests > 20
    assert fit.holdout_before.ttft_mape > 0.2 and fit.holdout_before.tpot_mape > 0.2
    assert fit.holdout_after.ttft_mape < 0.6 * fit.holdout_before.ttft_mape
    assert fit.holdout_after.tpot_mape < 0.3 * fit.holdout_before.tpot_mape
    assert fit.fit_after.objective <= fit.fit_before.objective
    save_request_profile(fit, {"hardware": "h200_sxm", "model": "meta-llama/Llama-3.1-8B"}, str(measured),
                         tmp_path / "p.yaml")
    prof = load_profile(tmp_path / "p.yaml")
    assert prof.params.eta_attention == pytest.approx(fit.start.eta_attention)  # not fitted
    # replaying with the written profile gives exactly the fit's errors
    run(SAMPLE, overrides=[LIMIT, f"timing.profile={tmp_path / 'p.yaml'}"], outdir=tmp_path / "again")
    v = compute_validation(tmp_path / "again", measured=measured)
    ttft = next(s for s in v.summary if s["metric"] == "ttft")
    n_fit, n_held = fit.fit_after.requests, fit.holdout_after.requests
    assert ttft["requests"] == n_fit + n_held
    expected = (fit.fit_after.ttft_mape * n_fit + fit.holdout_after.ttft_mape * n_held) / (n_fit + n_held)
    assert ttft["mape_pct"] == pytest.approx(100 * expected, rel=1e-9)


def test_split_is_stable_and_bounded() -> None:
    ids = [f"r{i}" for i in range(1000)]
    mask = holdout_mask(ids, 0.3, seed=0)
    assert 250 < mask.sum() < 350
    assert (holdout_mask(list(reversed(ids)), 0.3, seed=0)[::-1] == mask).all()  # independent of order
    with pytest.raises(ConfigError, match="--holdout"):
        holdout_mask(ids, 1.0, seed=0)


def test_needs_measurements(truth_and_base) -> None:
    _, base = truth_and_base
    with pytest.raises(ReplayError, match="no measured_ttft_ms"):
        calibrate_from_requests(base)
