"""aiconfigurator-core backend, and the roofline-vs-aic accuracy grid of docs/timing.md."""

import sys
from dataclasses import astuple

import pytest

from engine.config import load_config
from engine.hardware import get_hardware
from engine.models import get_model
from engine.timing import build_timer, shape_from_requests
from engine.timing.aic import aic_available
from engine.timing.grid import compare, grid
from engine.timing.roofline import RooflineTimer
from replay.errors import ConfigError

H200 = get_hardware("h200_sxm")
needs_aic = pytest.mark.skipif(not aic_available(), reason="aiconfigurator-core not installed "
                               "(pip install -e '.[aic]'; CI installs it)")


@pytest.fixture(scope="module")
def aic_timers():
    from engine.timing.aic import AicTimer
    return {m: AicTimer(get_model(m), H200, host_overhead_ms=0.0)
            for m in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B")}


@needs_aic
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B"])
def test_roofline_tracks_aiconfigurator_on_the_grid(aic_timers, model):
    roof = RooflineTimer(get_model(model), H200)
    rows = compare(roof, aic_timers[model], grid(roof.kv_bytes_per_token))
    errs = [abs(e) for *_, e in rows]
    assert len(rows) >= 30
    worst = max(rows, key=lambda r: abs(r[3]))
    assert sum(errs) / len(errs) < 0.06
    assert abs(worst[3]) < 0.15, (worst[0].label, worst[1], worst[2])


@needs_aic
def test_aic_reproduces_the_spec_reference_points(aic_timers):
    t = aic_timers["meta-llama/Llama-3.1-8B"]
    cases = [([], [1024], 4.86), ([], [2048] * 64, 9.47), ([(2048, 0)], [], 43.40),
             ([(2048, 6144)], [], 53.74), ([(1024, 0)], [2048] * 63, 27.76)]
    for prefills, decodes, ref in cases:
        got = t.step_ms(*astuple(shape_from_requests(prefills, decodes)))
        assert got == pytest.approx(ref, rel=0.01)


@needs_aic
def test_aic_memoizes_and_adds_host_overhead():
    t = build_timer(load_config(None, ["timing.backend=aic", "timing.host_overhead_ms=0.5"]))
    shape = astuple(shape_from_requests([(512, 0)], [1024] * 8))
    first = t.step_ms(*shape)
    assert len(t._memo) == 1 and t.step_ms(*shape) == first
    assert first - 0.5 == pytest.approx(t.kernel_ms(1, 512, 0, shape[3], 8, 8 * 1024))
    bd = t.breakdown(shape_from_requests([(512, 0)], [1024] * 8))
    assert bd.step_ms == pytest.approx(first) and bd.host_overhead_ms == 0.5


@needs_aic
def test_aic_keeps_unequal_chunks_quadratic(aic_timers):
    t = aic_timers["meta-llama/Llama-3.1-8B"]
    uneven = t.step_ms(*astuple(shape_from_requests([(7936, 0), (256, 0)])))
    even = t.step_ms(*astuple(shape_from_requests([(4096, 0), (4096, 0)])))
    assert uneven > even * 1.05


@needs_aic
def test_aic_rejects_profile_and_unknown_model(tmp_path):
    with pytest.raises(ConfigError, match="roofline"):
        build_timer(load_config(None, ["timing.backend=aic", "timing.profile=x.yaml"]))
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchArch"], "num_hidden_layers": 2, '
                                          '"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,'
                                          ' "vocab_size": 100, "max_position_embeddings": 512}')
    with pytest.raises(ConfigError, match="Models it ships"):
        build_timer(load_config(None, ["timing.backend=aic", f"model={tmp_path}"]))


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiconfigurator_core.sdk.rust_engine_step", None)
    with pytest.raises(ConfigError, match="pip install"):
        build_timer(load_config(None, ["timing.backend=aic"]))
