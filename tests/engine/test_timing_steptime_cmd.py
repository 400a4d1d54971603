"""`replay steptime`: parsing, JSON output, table, errors."""

import json

import pytest
from typer.testing import CliRunner

from replay.base.errors import ConfigError
from replay.cli import app
from replay.commands.steptime_cmd import parse_decode, parse_prefill

runner = CliRunner()


def test_parsers():
    assert parse_prefill("2048") == (2048, 0)
    assert parse_prefill("2048@6144") == (2048, 6144)
    assert parse_decode("64x2048") == [2048] * 64
    assert parse_decode("512") == [512]
    for bad in ("x", "0", "12@-1"):
        with pytest.raises(ConfigError):
            parse_prefill(bad)
    with pytest.raises(ConfigError):
        parse_decode("64*2048")


def test_json_has_step_host_and_parts():
    res = runner.invoke(app, ["steptime", "--model", "meta-llama/Llama-3.1-8B", "--prefill", "2048",
                              "--prefill", "2048@6144", "--decode", "64x2048", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    parts = ("linear", "prefill_attn", "decode_attn", "comm", "layer_overhead", "drafter")
    assert out["step_ms"] == pytest.approx(out["host_overhead_ms"] + sum(out[p] for p in parts))
    assert out["gpu_ms"] == pytest.approx(out["step_ms"] - out["host_overhead_ms"])
    assert out["shape"]["prefill_ctx_tokens"] == 6144 and out["shape"]["num_decode_reqs"] == 64
    assert out["comm"] == 0.0
    tp2 = json.loads(runner.invoke(app, ["steptime", "--prefill", "2048", "--tp", "2", "--json"]).output)
    assert tp2["comm"] > 0


def test_table_output():
    res = runner.invoke(app, ["steptime", "--decode", "64x2048", "--host-overhead-ms", "0.5"])
    assert res.exit_code == 0
    assert "decode attention" in res.output and "host overhead" in res.output and "0.500" in res.output


def test_drafts_need_an_mtp_head_or_synthetic():
    res = runner.invoke(app, ["steptime", "--decode", "8x1024", "--drafts", "2"])
    assert res.exit_code == 2
    ok = runner.invoke(app, ["steptime", "--decode", "8x1024", "--drafts", "2", "--drafter", "synthetic", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["drafter"] > 0
    mimo = runner.invoke(app, ["steptime", "-m", "XiaomiMiMo/MiMo-7B-Base", "-d", "8x1024", "-k", "1", "--json"])
    assert mimo.exit_code == 0 and json.loads(mimo.output)["shape"]["decode_query_tokens"] == 16


@pytest.mark.parametrize("args", [[], ["--prefill", "abc"], ["--model", "nope", "--decode", "1"],
                                  ["--decode", "1", "--dtype", "fp4"]])
def test_user_errors_exit_2(args):
    assert runner.invoke(app, ["steptime", *args]).exit_code == 2


def test_list_models_and_hardware_show_the_catalog():
    from replay.engine.hardware import list_hardware
    from replay.engine.models import list_models

    res = runner.invoke(app, ["steptime", "--list-models"])
    assert res.exit_code == 0, res.output
    for name in list_models():
        assert name in res.output
    res = runner.invoke(app, ["steptime", "--list-hardware"])
    assert res.exit_code == 0, res.output
    for name in list_hardware():
        assert name in res.output
    assert "uncalibrated" in res.output and "pcie" in res.output
    helptext = runner.invoke(app, ["steptime", "--help"]).output
    assert "--list-models" in helptext and "--list-hardware" in helptext


def test_steptime_on_a_profile_file_and_a_bad_one(tmp_path):
    from importlib.resources import files

    good = tmp_path / "gpu.yaml"
    good.write_text((files("replay.engine.hardware") / "profiles" / "l40s.yaml").read_text())
    res = runner.invoke(app, ["steptime", "--hardware", str(good), "--decode", "8x1024", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["step_ms"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("  hbm_bw:", "  hbm_bandwidth:"))
    res = runner.invoke(app, ["steptime", "--hardware", str(bad), "--decode", "8x1024"])
    assert res.exit_code == 2
    assert "gpu.hbm_bandwidth: unknown key" in res.output and "gpu.hbm_bw: missing" in res.output
