"""``load.window``: replay a slice of a long trace without editing it."""

from __future__ import annotations

import pandas as pd
import pytest

from replay.base.errors import ConfigError, TraceError
from replay.engine.config import EngineConfig, validate_config
from replay.engine.load_window import parse_window
from replay.engine.run import replay_trace
from tests.engine_helpers import FixedTimer, make_trace, setup_for

HOUR = 3_600_000


def test_parse_window():
    w = parse_window("09:00-12:30")
    assert (w.start_ms, w.end_ms) == (9 * HOUR, 12.5 * HOUR)
    assert parse_window("00:00:30-26:00").end_ms == 26 * HOUR  # past midnight of a two-day trace


@pytest.mark.parametrize("text, why", [("09:00", "expected START-END"), ("12:00-09:00", "end must come after"),
                                       ("9h-10h", "not a time"), ("09:61-10:00", "not a time")])
def test_bad_windows_are_one_clear_error(text, why):
    with pytest.raises(ConfigError, match=why):
        validate_config({"load": {"window": text}}, "c.yaml")


def test_a_window_replays_its_slice_from_the_window_start(tmp_path):
    rows = [{"arrival_ms": h * HOUR + k * 1000, "input_tokens": 16, "output_tokens": 4}
            for h in range(24) for k in range(3)]
    table, meta = make_trace(rows, hash_block_size=None)
    cfg = EngineConfig.model_validate({"load": {"window": "09:00-12:00"}})
    info = replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(100, FixedTimer(10.0))).run_info
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert list(reqs.request_id) == [f"r{3 * h + k}" for h in (9, 10, 11) for k in range(3)]
    assert list(reqs.arrival_ms) == [(h - 9) * HOUR + k * 1000 for h in (9, 10, 11) for k in range(3)]
    assert info["trace"]["replayed_rows"] == 9
    assert "09:00-12:00" in info["session_delay_rule"]
    cfg = EngineConfig.model_validate({"load": {"window": "09:00-12:00", "max_requests": 4}})
    replay_trace(table, meta, cfg, tmp_path / "p", setup=setup_for(100, FixedTimer(10.0)))
    assert len(pd.read_parquet(tmp_path / "p" / "requests.parquet")) == 4


def test_an_empty_window_names_the_trace_span(tmp_path):
    table, meta = make_trace([{"arrival_ms": 1000, "input_tokens": 16, "output_tokens": 4}], hash_block_size=None)
    cfg = EngineConfig.model_validate({"load": {"window": "09:00-12:00"}})
    with pytest.raises(TraceError, match="holds no request"):
        replay_trace(table, meta, cfg, tmp_path / "o", setup=setup_for(100, FixedTimer(10.0)))
