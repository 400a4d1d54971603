"""Hardware profiles are data with sources; the H200 figures are the spec's."""

import pytest

from replay.base.errors import ConfigError
from replay.engine.hardware import get_hardware, list_hardware


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


def test_every_profile_figure_has_a_source():
    assert {"h200_sxm", "h100_sxm", "b200"} <= set(list_hardware())
    for name in list_hardware():
        hw = get_hardware(name)
        for section in (hw.gpu, hw.timing):
            for field in type(section).model_fields:
                assert len(getattr(section, field).source) > 10, (name, field)


def test_unknown_hardware_lists_profiles():
    with pytest.raises(ConfigError, match="h200_sxm"):
        get_hardware("tpu_v5")


def test_fp8_peak_used_for_fp8():
    hw = get_hardware("h200_sxm")
    assert hw.peak_flops("fp8") == hw.gpu.fp8_dense_flops.value
    assert hw.peak_flops("bf16") == hw.gpu.bf16_dense_flops.value
