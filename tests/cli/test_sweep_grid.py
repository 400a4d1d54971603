"""The --grid syntax, the config of each point (through the --set path) and the result keys."""

from __future__ import annotations

import pytest

from replay.base.errors import ConfigError
from replay.engine.config import load_config
from replay.sweep.grid import parse_axes, parse_axis, point_config, product
from replay.sweep.slo import parse_sweep_slo
from replay.sweep.store import config_hash, result_key
from replay.sweep.summary import gpus_used


def test_lists_ranges_and_steps():
    assert [v.label for v in parse_axis("scheduler.max_num_seqs=64,128").values] == [64, 128]
    assert [v.label for v in parse_axis("fleet.replicas=1..5").values] == [1, 2, 3, 4, 5]
    assert [v.label for v in parse_axis("x=8..32:8").values] == [8, 16, 24, 32]
    assert [v.label for v in parse_axis("load.speedup=0.5,2").values] == [0.5, 2]
    assert [v.label for v in parse_axis("scheduler.policy=fcfs,priority").values] == ["fcfs", "priority"]
    # a list value keeps its brackets together
    axis = parse_axis("speculative.acceptance_rates=[0.8,0.3],[0.9,0.5]")
    assert [v.raw for v in axis.values] == ["[0.8,0.3]", "[0.9,0.5]"]


@pytest.mark.parametrize("spec, needle", [
    ("scheduler.max_num_seqs", "expected key=v1,v2"),
    ("x=5..1", "LOW <= HIGH"),
    ("x=1..4:0", "STEP > 0"),
    ("x=1,1", "listed twice"),
    ("x=1,,2", "empty value"),
    ("x=1..1000000000", "more than"),
])
def test_bad_axes_are_named(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_axis(spec)


def test_duplicate_keys_and_product_order():
    with pytest.raises(ConfigError, match="given twice"):
        parse_axes(["a=1,2", "a=3"])
    points = product(parse_axes(["a=1,2", "b=x,y,z"]))
    assert [(p[0][1].label, p[1][1].label) for p in points] == [
        (1, "x"), (1, "y"), (1, "z"), (2, "x"), (2, "y"), (2, "z")]


def test_point_config_goes_through_set_and_yaml_files(tmp_path):
    spec = tmp_path / "mtp2.yaml"
    spec.write_text("method: mtp\nnum_speculative_tokens: 2\nacceptance_rates: [0.8, 0.4]\n")
    base = load_config(None).model_dump(mode="json")
    axes = parse_axes(["scheduler.max_num_seqs=7", f"speculative={spec}"])
    cfg = point_config(base, product(axes)[0], "defaults")
    direct = load_config(None, ["scheduler.max_num_seqs=7", "speculative.num_speculative_tokens=2",
                                "speculative.acceptance_rates=[0.8, 0.4]"])
    assert cfg == direct
    assert config_hash(cfg.model_dump(mode="json")) == config_hash(direct.model_dump(mode="json"))
    # an unknown key or bad value is a ConfigError naming the point, as with --set
    with pytest.raises(ConfigError, match=r"(?s)at scheduler.max_num_seqs=0: invalid config.*greater than 0"):
        point_config(base, product(parse_axes(["scheduler.max_num_seqs=0"]))[0], "defaults")
    with pytest.raises(ConfigError, match="unknown key"):
        point_config(base, product(parse_axes(["scheduler.nope=1"]))[0], "defaults")


def test_keys_change_with_trace_config_and_version():
    base = load_config(None).model_dump(mode="json")
    h = config_hash(base)
    other = config_hash(load_config(None, ["seed=1"]).model_dump(mode="json"))
    assert h != other
    keys = {result_key("t1", h, "0.1"), result_key("t2", h, "0.1"), result_key("t1", other, "0.1"),
            result_key("t1", h, "0.2")}
    assert len(keys) == 4


def test_gpus_used_reads_fleet_when_present():
    assert gpus_used({"tensor_parallel_size": 2}) == 2
    assert gpus_used({"tensor_parallel_size": 2, "fleet": {"replicas": 8, "router": "kv_aware"}}) == 16
    assert gpus_used({"tensor_parallel_size": 4, "fleet": None}) == 4


def test_sweep_slo_constraints_and_goodput_thresholds():
    slo = parse_sweep_slo("ttft_p99=2000,tpot_p99=50,itl_p50=20")
    assert slo.constraints == {"ttft_p99": 2000.0, "tpot_p99": 50.0, "itl_p50": 20.0}
    assert slo.goodput.as_dict() == {"ttft": 2000.0, "tpot": 50.0}  # ITL has no per-request goodput
    row = {"completed": 10, "rejected": 0, "unfinished": 0, "ttft_p99": 1999.0, "tpot_p99": 50.0, "itl_p50": 3}
    assert slo.met(row) is True
    assert slo.met({**row, "ttft_p99": 2000.5}) is False
    assert slo.met({**row, "rejected": 1}) is False  # a rejected request never meets an SLO
    assert parse_sweep_slo("ttft=500").constraints == {}
    with pytest.raises(Exception, match="ttft_p99=2000"):
        parse_sweep_slo("latency_p99=3")
    with pytest.raises(Exception, match=r"'ttft_p99=abc': 'abc' is not a number"):
        parse_sweep_slo("ttft_p99=abc")
    with pytest.raises(Exception, match=r"'tpot_p99=0': the SLO must be a positive"):
        parse_sweep_slo("tpot_p99=0")


def test_the_table_starts_with_the_grid_keys_then_the_first_metric():
    from replay.reports.sweep_views import FIRST_METRIC
    from replay.sweep.summary import METRIC_COLUMNS
    from replay.sweep.table import sweep_schema

    names = sweep_schema(parse_axes(["b=1,2", "a=x"])).names
    assert names[:3] == ["b", "a", FIRST_METRIC] and next(iter(METRIC_COLUMNS)) == FIRST_METRIC
