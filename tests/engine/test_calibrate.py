"""`replay calibrate`: reading measured steps, recovering known parameters, the profile round trip."""

import json
from dataclasses import astuple

import pytest
import yaml
from typer.testing import CliRunner

from replay.base.errors import ConfigError, TraceError
from replay.cli import app
from replay.engine.config import load_config
from replay.engine.hardware import get_hardware
from replay.engine.models import get_model
from replay.engine.timing import build_timer, shape_from_requests
from replay.engine.timing.calibrate import fit, read_steps_csv
from replay.engine.timing.roofline import RooflineParams, RooflineTimer

H200 = get_hardware("h200_sxm")
TRUE = RooflineParams.from_hardware(H200).replace(eta_compute=0.6, eta_attention=0.55, eta_memory=0.8,
                                                  host_overhead_ms=0.7)
STEPS = [([], "1x1024"), ([], "16x4096"), ([], "64x2048"), ([], "128x8192"), ([], "256x1024"),
         ([(2048, 0)], ""), ([(8192, 0)], ""), ([(512, 0)], ""), ([(2048, 6144)], ""), ([(4096, 12288)], ""),
         ([(1024, 0)], "63x2048"), ([(256, 0)], "31x4096"), ([(3000, 0), (500, 1000)], "8x512")]


def _expand(dec: str) -> list[int]:
    if not dec:
        return []
    b, c = dec.split("x")
    return [int(c)] * int(b)


def write_csv(path, params=TRUE):
    truth = RooflineTimer(get_model("meta-llama/Llama-3.1-8B"), H200, params)
    lines = ["prefill_tokens,prefill_cached,decode_ctx,measured_ms"]
    for prefills, dec in STEPS:
        ms = truth.step_ms(*astuple(shape_from_requests(prefills, _expand(dec))))
        lines.append(f"{';'.join(str(n) for n, _ in prefills)},{';'.join(str(p) for _, p in prefills)},{dec},{ms:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fit_recovers_known_parameters(tmp_path):
    samples = read_steps_csv(write_csv(tmp_path / "steps.csv"))
    assert len(samples) == len(STEPS)
    assert samples[-1].shape.prefill_ctx_tokens == 1000 and samples[-1].shape.num_decode_reqs == 8
    res = fit(get_model("meta-llama/Llama-3.1-8B"), H200, samples)
    assert res.start_mape > 0.05 and res.mape < 0.002
    for key in ("eta_compute", "eta_attention", "eta_memory", "host_overhead_ms"):
        assert getattr(res.params, key) == pytest.approx(getattr(TRUE, key), rel=0.02), key
    assert res.params.tau_layer_us == H200.timing.tau_layer_us.value  # not identifiable with the host term


def test_kernel_only_data_fits_tau_layer(tmp_path):
    samples = read_steps_csv(write_csv(tmp_path / "steps.csv", TRUE.replace(host_overhead_ms=0.0, tau_layer_us=40.0)))
    res = fit(get_model("meta-llama/Llama-3.1-8B"), H200, samples, fix_host_overhead_ms=0.0)
    assert res.params.host_overhead_ms == 0.0 and res.mape < 0.002
    assert res.params.tau_layer_us == pytest.approx(40.0, rel=0.02)


def test_fixed_host_overhead_is_kept(tmp_path):
    samples = read_steps_csv(write_csv(tmp_path / "steps.csv"))
    res = fit(get_model("meta-llama/Llama-3.1-8B"), H200, samples, fix_host_overhead_ms=0.7)
    assert res.params.host_overhead_ms == 0.7 and res.mape < 0.002
    assert res.params.tau_layer_us == pytest.approx(TRUE.tau_layer_us, rel=0.02)


@pytest.mark.parametrize("content,field", [
    ("prefill_tokens,measured_ms\n2048,abc\n", "measured_ms"),
    ("prefill_tokens,measured_ms\n20x8,5\n2048,-1\n", "measured_ms"),
    ("prefill_tokens,prefill_cached,measured_ms\n2048;10,0,5\n", "prefill_cached"),
    ("decode_ctx,measured_ms\n64y2048,5\n", "decode_ctx"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, content, field):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError) as exc:
        read_steps_csv(path)
    assert str(path) in str(exc.value) and f"field '{field}'" in str(exc.value) and "line" in str(exc.value)


def test_missing_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("tokens,ms\n1,2\n")
    with pytest.raises(TraceError, match="measured_ms"):
        read_steps_csv(path)


def test_cli_writes_a_profile_the_engine_uses(tmp_path):
    csv = write_csv(tmp_path / "steps.csv")
    out = tmp_path / "prof" / "h200.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", str(csv), "--model", "meta-llama/Llama-3.1-8B", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["mape"] < 0.002 and summary["params"]["eta_memory"] == pytest.approx(0.8, rel=0.02)
    prof = yaml.safe_load(out.read_text())
    assert prof["kind"] == "replay-timing-profile" and prof["fit"]["num_steps"] == len(STEPS)
    t = build_timer(load_config(None, [f"timing.profile={out}"]))
    assert t.params.eta_compute == pytest.approx(0.6, rel=0.02)
    assert build_timer(load_config(None, [f"timing.profile={out}", "timing.host_overhead_ms=0"])).host_overhead_ms == 0
    res = runner.invoke(app, ["steptime", "--decode", "64x2048", "--profile", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["host_overhead_ms"] == pytest.approx(0.7, rel=0.02)
    table = runner.invoke(app, ["calibrate", str(csv), "--model", "meta-llama/Llama-3.1-8B", "-o", str(out)])
    assert table.exit_code == 0 and "MAPE" in table.output


def test_steps_csv_errors_name_the_file_line(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("prefill_tokens,decode_ctx,measured_ms\n512,,10\n\n1024,,12\n256,,abc\n")
    with pytest.raises(TraceError, match=r"line 5, field 'measured_ms': not a number"):
        read_steps_csv(path)


def test_calibrate_never_writes_onto_the_measured_steps(tmp_path):
    csv = write_csv(tmp_path / "steps.csv")
    before = csv.read_bytes()
    res = CliRunner().invoke(app, ["calibrate", str(csv), "--model", "meta-llama/Llama-3.1-8B", "-o", str(csv)])
    assert res.exit_code == 2 and csv.read_bytes() == before, res.output


def test_profile_for_other_hardware_is_rejected(tmp_path):
    csv = write_csv(tmp_path / "steps.csv")
    out = tmp_path / "p.yaml"
    CliRunner().invoke(app, ["calibrate", str(csv), "--model", "meta-llama/Llama-3.1-8B", "-o", str(out)])
    from replay.base.errors import ConfigError
    with pytest.raises(ConfigError, match="h200_sxm"):
        build_timer(load_config(None, [f"timing.profile={out}", "hardware=h100_sxm"]))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: something-else\n")
    with pytest.raises(ConfigError, match="not a timing profile"):
        build_timer(load_config(None, [f"timing.profile={bad}"]))


def test_cli_bad_csv_exits_2(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("prefill_tokens,measured_ms\nx,1\n")
    res = CliRunner().invoke(app, ["calibrate", str(path), "--model", "meta-llama/Llama-3.1-8B",
                                   "-o", str(tmp_path / "o.yaml")])
    assert res.exit_code == 2 and not (tmp_path / "o.yaml").exists()


def test_fit_mixed_recovers_the_mixed_step_term(tmp_path):
    """Steps with a prefill chunk cost L * mixed_layer_us more: --fit-mixed recovers it beside the host
    overhead (decode-only rows pin the host term); without it the term stays 0 and the fit is worse."""
    truth = TRUE.replace(mixed_layer_us=25.0)
    samples = read_steps_csv(write_csv(tmp_path / "steps.csv", truth))
    model = get_model("meta-llama/Llama-3.1-8B")
    res = fit(model, H200, samples, fit_mixed=True)
    assert res.mape < 0.002
    assert res.params.mixed_layer_us == pytest.approx(25.0, rel=0.05)
    assert res.params.host_overhead_ms == pytest.approx(truth.host_overhead_ms, rel=0.05)
    plain = fit(model, H200, samples)
    assert plain.params.mixed_layer_us == 0.0 and plain.mape > res.mape
    decode_only = [s for s in samples if not s.shape.prefill_tokens]
    with pytest.raises(ConfigError, match="decode-only steps and steps with a prefill chunk"):
        fit(model, H200, decode_only, fit_mixed=True)
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["calibrate", str(tmp_path / "steps.csv"), "--model", "meta-llama/Llama-3.1-8B",
                                   "-o", str(out), "--fit-mixed", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["params"]["mixed_layer_us"] == pytest.approx(25.0, rel=0.05)
    assert yaml.safe_load(out.read_text())["params"]["mixed_layer_us"] == pytest.approx(25.0, rel=0.05)
