"""``replay synth``'s day: a cosine rate with a known peak-to-trough ratio and peak hour, bursts."""

from __future__ import annotations

import numpy as np
import pytest

from replay.ingest import synth as sy


def _hourly(cfg: sy.SynthConfig) -> np.ndarray:
    t_h = sy.generate(cfg).column("arrival_ms").to_numpy() / 3.6e6
    return np.histogram(t_h, bins=np.arange(0, 25))[0]


def test_a_flat_day_is_the_trace_it_always_was():
    base = sy.generate(sy.SynthConfig(requests=3000, seed=3))
    flat = sy.generate(sy.SynthConfig(requests=3000, seed=3, peak_to_trough=1.0, peak_hour=9.0))
    assert base.equals(flat)


def test_the_rate_shape_has_the_asked_ratio_mean_and_peak():
    cfg = sy.SynthConfig(peak_to_trough=5.0, peak_hour=15.0)
    t = np.arange(0.0, 86_400.0, 1.0)
    shape = sy.daily_rate_shape(cfg, t)
    assert shape.mean() == pytest.approx(1.0, rel=1e-6)
    assert shape.max() / shape.min() == pytest.approx(5.0, rel=1e-6)
    assert t[shape.argmax()] == 15 * 3600
    assert t[shape.argmin()] == 3 * 3600


def test_a_synthetic_day_peaks_at_the_peak_hour_with_the_asked_ratio():
    cfg = sy.SynthConfig(requests=150_000, rate=2.0, turns_mean=1.0, peak_to_trough=4.0, peak_hour=14.0, seed=1)
    hourly = _hourly(cfg)
    assert hourly.argmax() in (13, 14)
    ratio = hourly[13:15].mean() / hourly[1:3].mean()
    assert 3.3 < ratio < 4.7  # 4, within the Poisson noise of ~5k requests per hour
    assert hourly[:21].sum() / 21 == pytest.approx(2.0 * 3600, rel=0.1)  # the day's mean is the rate


def test_bursts_raise_the_rate_for_their_length_and_are_seeded():
    cfg = sy.SynthConfig(peak_to_trough=1.0, bursts=3, burst_factor=4.0, burst_minutes=20.0, seed=7)
    t = np.arange(0.0, 86_400.0, 1.0)
    shape = sy.daily_rate_shape(cfg, t)
    assert set(np.unique(shape)) == {1.0, 4.0}
    assert (shape == 4.0).sum() <= 3 * 20 * 60 and (shape == 4.0).sum() > 20 * 60
    assert np.array_equal(shape, sy.daily_rate_shape(cfg, t))
    other = sy.daily_rate_shape(cfg.model_copy(update={"seed": 8}), t)
    assert not np.array_equal(shape, other)
