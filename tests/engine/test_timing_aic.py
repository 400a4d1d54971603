"""aiconfigurator-core backend (direct calls, the fast decode path) and the roofline-vs-aic grid."""

import sys
from dataclasses import astuple

import pytest

from replay.base.errors import ConfigError
from replay.engine.config import load_config
from replay.engine.hardware import get_hardware
from replay.engine.models import get_model
from replay.engine.timing import build_timer, shape_from_requests
from replay.engine.timing.aic import aic_available
from replay.engine.timing.grid import compare, grid
from replay.engine.timing.roofline import RooflineTimer
from tests.engine_helpers import assert_decode_run_is_step_ms

H200 = get_hardware("h200_sxm")
needs_aic = pytest.mark.skipif(not aic_available(), reason="aiconfigurator-core not installed "
                               "(pip install -e '.[aic]'; CI installs it)")


@pytest.fixture(scope="module")
def aic_timers():
    from replay.engine.timing.aic import AicTimer
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


# --- the fast decode path (docs/timing.md, "How the aic backend stays fast") ----------------------------
# Tolerances, relative to aiconfigurator's own kernel time (host overhead 0):
TABLE_RTOL = 1e-12   # segment lines: exact up to float rounding (measured <= 6e-16)
CELL_RTOL = 5e-4     # interpolation cells where aiconfigurator extrapolates its table (measured <= 1e-4)


def _rust_samples(a):
    """aiconfigurator 0.12.0's five generation-attention sample lengths, in its own float arithmetic."""
    lo = max(1, int(a * 0.9))
    hi = max(lo, int(a * 1.1))
    return tuple(lo + (hi - lo) * i // 4 for i in range(5))


def test_integer_samples_match_aiconfigurators_float_formula():
    import random

    from replay.engine.timing.aic_decode import BREAKS as _BREAKS
    from replay.engine.timing.aic_decode import samples as _samples
    rng = random.Random(0)
    values = [*range(0, 1 << 17), *(rng.randrange(1 << 17, 1 << 40) for _ in range(20000))]
    assert all(_samples(a) == _rust_samples(a) for a in values)
    # non-decreasing in a (cells rely on it), and every break is where a sample first passes 2^j
    prev = _samples(1)
    for a in range(2, 1 << 17):
        cur = _samples(a)
        assert all(c >= p for c, p in zip(cur, prev, strict=True))
        prev = cur
    for b in _BREAKS[1:40]:
        before, at = _samples(b - 1), _samples(b)
        assert any(((x - 1).bit_length() != (y - 1).bit_length()) for x, y in zip(before, at, strict=True))


@needs_aic
def test_aiconfigurator_reads_decode_kv_as_sum_floordiv_count(aic_timers):
    """The memo key and the tables use a = sum // n: check aiconfigurator does, bit for bit."""
    import json
    import random
    fpm = aic_timers["meta-llama/Llama-3.1-8B"].forward_pass_model()
    rng = random.Random(1)

    def call(req):
        return fpm.estimate_forward_pass_time_ms(json.dumps({"scheduled_requests": req}))
    for _ in range(300):
        n = rng.randint(2, 300)
        a = rng.randint(1, 60000)
        extra = rng.randint(1, n - 1)
        dec = {"num_decode_requests": n}
        assert call({**dec, "sum_decode_kv_tokens": n * a + extra}) == \
            call({**dec, "sum_decode_kv_tokens": n * a})
        pre = {"num_prefill_requests": rng.randint(1, 3), "sum_prefill_tokens": rng.randint(1, 8192),
               "sum_prefill_kv_tokens": rng.randint(0, 20000)}
        assert call({**pre, **dec, "sum_decode_kv_tokens": n * a + extra}) == \
            call({**pre, **dec, "sum_decode_kv_tokens": n * a})


def _decode_points(seed, count):
    """Decode shapes (n, summed KV): batch sizes around aiconfigurator's rows (powers of two) and KV per
    request log-uniform 16..131k, plus every grid point 2^k and its neighbours."""
    import random
    rng = random.Random(seed)
    batches = (1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 33, 48, 62, 64, 100, 128, 200, 256, 384, 512)
    pts = [(n, n * a) for n in (1, 7, 64, 256) for k in range(4, 17)
           for a in ((1 << k) - 1, 1 << k, (1 << k) + 1)]
    for _ in range(count):
        n = rng.choice(batches)
        pts.append((n, n * int(2 ** rng.uniform(4, 17)) + rng.randrange(n)))
    return pts


def _on_table(timer, n, a):
    from replay.engine.timing.aic_decode import LINEAR, MIN_DECODE_KV, samples
    tab = timer._tables[n]
    return a >= MIN_DECODE_KV and all(tab.state[(s - 1).bit_length() - 1] == LINEAR for s in samples(a))


@needs_aic
@pytest.mark.parametrize("model,tp", [("meta-llama/Llama-3.1-8B", 1), ("Qwen/Qwen3-32B", 2)])
def test_fast_decode_path_matches_direct_calls(model, tp):
    from replay.engine.timing.aic import AicTimer
    fast = AicTimer(get_model(model), H200, tp=tp, host_overhead_ms=0.0)
    exact = AicTimer(get_model(model), H200, tp=tp, host_overhead_ms=0.0, exact=True)
    table_err, cell_err = [], []
    for n, kv in _decode_points(seed=2, count=2500):
        want = exact.kernel_ms(0, 0, 0, 0, n, kv)
        got = fast.kernel_ms(0, 0, 0, 0, n, kv)
        (table_err if _on_table(fast, n, kv // n) else cell_err).append(abs(got - want) / want)
    assert len(table_err) > 1000 and len(cell_err) > 500  # both paths exercised
    assert max(table_err) <= TABLE_RTOL, max(table_err)
    assert max(cell_err) <= CELL_RTOL, max(cell_err)


@needs_aic
def test_fast_path_on_a_decode_trajectory_and_mixed_steps():
    """Realistic shapes: a batch whose requests each gain a token per step, joined and left by others;
    decode-only steps go through the fast path, mixed steps are direct calls (identical)."""
    import random

    from replay.engine.timing.aic import AicTimer
    m = get_model("meta-llama/Llama-3.1-8B")
    fast = AicTimer(m, H200, host_overhead_ms=1.0)
    exact = AicTimer(m, H200, host_overhead_ms=1.0, exact=True)
    rng = random.Random(3)
    ctx = [rng.randint(500, 30000) for _ in range(8)]
    worst = 0.0
    for step in range(4000):
        if step % 50 == 0:  # a request finishes, another joins with a prefill
            ctx.pop(rng.randrange(len(ctx)))
            shape = shape_from_requests([(rng.randint(100, 4000), rng.randint(0, 8000))], ctx)
            assert fast.step_ms(*astuple(shape)) == exact.step_ms(*astuple(shape))
            ctx.append(rng.randint(500, 60000))
        shape = shape_from_requests([], ctx)
        want, got = exact.step_ms(*astuple(shape)) - 1.0, fast.step_ms(*astuple(shape)) - 1.0
        worst = max(worst, abs(got - want) / want)
        ctx = [c + 1 for c in ctx]
    assert worst <= CELL_RTOL


@needs_aic
def test_fast_path_does_not_depend_on_call_order():
    import random

    from replay.engine.timing.aic import AicTimer
    m = get_model("meta-llama/Llama-3.1-8B")
    pts = _decode_points(seed=4, count=600)
    shuffled = pts[:]
    random.Random(5).shuffle(shuffled)
    a, b = AicTimer(m, H200, host_overhead_ms=0.0), AicTimer(m, H200, host_overhead_ms=0.0)
    first = {p: a.kernel_ms(0, 0, 0, 0, *p) for p in pts}
    second = {p: b.kernel_ms(0, 0, 0, 0, *p) for p in shuffled}
    again = {p: a.kernel_ms(0, 0, 0, 0, *p) for p in shuffled}  # memory of the last segment used
    assert first == second == again


@needs_aic
def test_aic_exact_config_prices_every_step_directly():
    import json
    t = build_timer(load_config(None, ["timing.backend=aic", "timing.aic_exact=true",
                                       "timing.host_overhead_ms=0"]))
    assert t.exact and not build_timer(load_config(None, ["timing.backend=aic"])).exact
    for n, kv in ((1, 5000), (7, 7 * 12345 + 3), (64, 64 * 40000)):
        direct = t.forward_pass_model().estimate_forward_pass_time_ms(json.dumps(
            {"scheduled_requests": {"num_decode_requests": n, "sum_decode_kv_tokens": kv}}))
        assert t.step_ms(0, 0, 0, 0, n, n, kv, 0) == direct
    assert not t._tables and t.decode_run(7) is None  # decode windows call step_ms, one direct call a step


@needs_aic
def test_decode_windows_time_steps_bit_identically_to_step_ms():
    """Decode windows time runs of steps with decode_run(n).extend (compiled with the engine core);
    one differing bit would change the outputs, so every duration must equal step_ms for that step
    and every end time the running sum. The runs cross segment lines, two-line ranges and
    interpolation cells (short contexts and long ones past the measured table)."""
    from replay.engine.timing.aic import AicTimer
    m = get_model("meta-llama/Llama-3.1-8B")
    for n, ctx0 in ((1, 1), (1, 40_000), (3, 3 * 1021 + 2), (17, 17 * 8190), (64, 64 * 7_000), (256, 256 * 900)):
        windowed = AicTimer(m, H200, host_overhead_ms=1.25)
        stepped = AicTimer(m, H200, host_overhead_ms=1.25)  # its own fits and memories: no sharing
        assert_decode_run_is_step_ms(windowed, stepped, n, ctx0, 700, start=7.5)


@needs_aic
def test_table_load_overlaps_the_caller_and_the_first_call_waits_for_it():
    """aiconfigurator loads its kernel tables on its first estimate (0.2-0.4 s, GIL released): the
    timer starts that on a thread when built, and its first call waits for the thread (the model is
    never used by two threads at once); the values are those of any other timer."""
    from replay.engine.timing.aic import AicTimer
    m = get_model("meta-llama/Llama-3.1-8B")
    t = AicTimer(m, H200, host_overhead_ms=0.0)
    loading = t._loading
    assert loading is not None and loading.daemon
    value = t.kernel_ms(1, 3000, 500, 0, 4, 4 * 2000)
    assert t._loading is None and not loading.is_alive()
    other = AicTimer(m, H200, host_overhead_ms=0.0)
    other.forward_pass_model()
    assert other.kernel_ms(1, 3000, 500, 0, 4, 4 * 2000) == value
