"""Hardware profiles are data with sources; the H200 figures are the spec's."""

from importlib.resources import files

import pytest

from replay.base.errors import ConfigError
from replay.engine.hardware import Figure, get_hardware, list_hardware


def test_h200_figures_match_the_spec():
    hw = get_hardware("h200_sxm")
    assert hw.gpu.bf16_dense_flops.value == pytest.approx(989.4e12)
    assert hw.gpu.fp8_dense_flops.value == pytest.approx(1979e12)
    assert hw.gpu.hbm_bw.value == pytest.approx(4.8e12)
    assert hw.gpu.usable_memory_bytes.value / 2**30 == pytest.approx(140.4, abs=0.05)
    assert hw.gpu.nvlink_bw_per_dir.value == pytest.approx(450e9)
    assert 50e9 <= hw.gpu.pcie_bw_per_dir.value <= 55e9
    # ridge point about 206 FLOP/byte (BF16)
    assert hw.gpu.bf16_dense_flops.value / hw.gpu.hbm_bw.value == pytest.approx(206, abs=1)
    assert hw.timing.host_overhead_ms.value == 1.0
    assert "UNCALIBRATED" in hw.timing.host_overhead_ms.source


SHIPPED = {"h200_sxm", "h100_sxm", "b200", "a100_40gb", "a100_80gb", "l40s", "rtx_4090", "rtx_pro_6000", "h20",
           "mi300x"}


def test_every_profile_figure_has_a_source():
    assert SHIPPED <= set(list_hardware())
    for name in list_hardware():
        hw = get_hardware(name)
        for section in (hw.gpu, hw.timing):
            for field in type(section).model_fields:
                figure = getattr(section, field)
                if isinstance(figure, Figure):
                    assert len(figure.source) > 10, (name, field)


def test_datasheet_profiles_are_marked_uncalibrated():
    for name in SHIPPED - {"h200_sxm"}:
        timing = get_hardware(name).timing
        for field in ("eta_compute", "eta_memory", "host_overhead_ms"):
            source = getattr(timing, field).source.lower()
            assert "uncalibrated" in source or "guess" in source, (name, field)


def test_what_differs_on_pcie_and_geforce_parts():
    """No NVLink: all-reduces go over PCIe (host-staged on GeForce, which has no P2P); GeForce tensor
    peaks are the FP32-accumulate rates (half the FP16-accumulate ones); GDDR bandwidth."""
    l40s, rtx, pro, a100 = (get_hardware(n) for n in ("l40s", "rtx_4090", "rtx_pro_6000", "a100_80gb"))
    for hw in (l40s, rtx, pro):
        assert hw.gpu.tp_link == "pcie" and hw.gpu.nvlink_bw_per_dir is None
        assert hw.tp_link_bw(2) < 0.2 * get_hardware("h100_sxm").tp_link_bw(2)
    assert rtx.tp_link_bw(2) < l40s.tp_link_bw(2)  # host-staged
    assert rtx.gpu.bf16_dense_flops.value == pytest.approx(165.2e12)
    assert "FP32 accumulate" in rtx.gpu.bf16_dense_flops.source
    assert l40s.gpu.hbm_bw.value == pytest.approx(864e9) and pro.gpu.hbm_bw.value == pytest.approx(1792e9)
    assert pro.gpu.hbm_bytes.value == pytest.approx(96e9)
    assert a100.gpu.fp8_dense_flops.value == a100.gpu.bf16_dense_flops.value  # no FP8 tensor cores on Ampere
    mi = get_hardware("mi300x")
    assert mi.gpu.tp_link == "xgmi" and mi.tp_link_bw(8) == pytest.approx(7 * mi.tp_link_bw(2))


def test_tp_comm_follows_the_link():
    """The same TP2 prefill pays far more all-reduce time on a PCIe-only part than over NVLink."""
    from replay.engine.models import get_model
    from replay.engine.timing import RooflineTimer, shape_from_requests

    model = get_model("meta-llama/Llama-3.1-8B")
    shape = shape_from_requests([(2048, 0)])
    comm = {n: RooflineTimer(model, get_hardware(n), tp=2).breakdown(shape).parts["comm"]
            for n in ("h100_sxm", "l40s", "rtx_4090")}
    assert comm["l40s"] > 10 * comm["h100_sxm"] and comm["rtx_4090"] > comm["l40s"]


def _profile_text(**gpu_changes: str) -> str:
    text = (files("replay.engine.hardware") / "profiles" / "l40s.yaml").read_text()
    text = text.replace("name: l40s", "name: my_l40s")
    for key, line in gpu_changes.items():
        lines = [ln for ln in text.splitlines() if not ln.strip().startswith(f"{key}:")]
        if line:
            lines.insert(lines.index("gpu:") + 1, f"  {key}: {line}")
        text = "\n".join(lines) + "\n"
    return text


def test_hardware_takes_a_profile_path(tmp_path):
    path = tmp_path / "my_l40s.yaml"
    path.write_text(_profile_text(hbm_bw='{value: 1.0e12, source: "my own measurement"}'))
    hw = get_hardware(str(path))
    assert hw.name == "my_l40s" and hw.gpu.hbm_bw.value == 1.0e12
    from replay.engine.config import EngineConfig
    from replay.engine.timing import build_timer

    timer = build_timer(EngineConfig.model_validate({"hardware": str(path)}))
    assert timer.hw.name == "my_l40s"


@pytest.mark.parametrize("change,needle", [
    ({"hbm_bw": ""}, "gpu.hbm_bw: missing"),
    ({"hbm_bw": "{value: -1, source: \"x y z\"}"}, "gpu.hbm_bw.value"),
    ({"hbm_bww": "{value: 1, source: \"typo key\"}"}, "gpu.hbm_bww: unknown key"),
    ({"tp_link_bw_per_dir": ""}, "tp_link pcie needs gpu.tp_link_bw_per_dir"),
    ({"tp_link": "infiniband"}, "gpu.tp_link"),
])
def test_bad_profile_names_the_key(tmp_path, change, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(_profile_text(**change))
    with pytest.raises(ConfigError) as exc:
        get_hardware(str(path))
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_unreadable_profiles(tmp_path):
    with pytest.raises(ConfigError, match="no such profile file"):
        get_hardware(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\ngpu: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML .line"):
        get_hardware(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        get_hardware(str(listy))


def test_unknown_hardware_lists_profiles():
    with pytest.raises(ConfigError, match="h200_sxm"):
        get_hardware("tpu_v5")


def test_fp8_peak_used_for_fp8():
    hw = get_hardware("h200_sxm")
    assert hw.peak_flops("fp8") == hw.gpu.fp8_dense_flops.value
    assert hw.peak_flops("bf16") == hw.gpu.bf16_dense_flops.value
