"""``replay validate``: hand-checked error statistics, stated condition differences, grouping by a
label, the ``replay report`` section, and the export round trip (zero error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replay.api import run
from replay.base.errors import ReplayError
from replay.cli import app
from replay.ingest import convert
from replay.reports.export import export
from replay.reports.validate import compute_validation
from replay.reports.validate_report import write_validation

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_sessions.jsonl"


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory) -> Path:
    """A replay of the first 300 requests of the bundled Mooncake sample (sessions, prefix sharing)."""
    out = tmp_path_factory.mktemp("sample") / "out"
    run(SAMPLE, overrides=["load.max_requests=300"], outdir=out)
    return out


@pytest.fixture(scope="module")
def aiperf_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("aiperf")
    convert(LOGS / "aiperf_profile_export.jsonl", d / "t.parquet", drop_failed=True)
    run(d / "t.parquet", outdir=d / "out")
    return d / "out"


def _by_metric(v) -> dict[str, dict]:
    return {s["metric"]: s for s in v.summary}


@pytest.mark.parametrize("fmt", ["vllm-bench", "aiperf"])
def test_round_trip_export_then_validate_is_zero_error(sample_run: Path, tmp_path: Path, fmt: str) -> None:
    exported = export(sample_run, fmt, tmp_path / f"export.{fmt}")
    v = compute_validation(sample_run, measured=exported)
    info = json.loads((sample_run / "run.json").read_text())
    assert v.coverage["matched"] == info["totals"]["finished"] > 250
    stats = _by_metric(v)
    for metric in ("ttft", "tpot", "e2e"):
        assert stats[metric]["requests"] > 250
        assert stats[metric]["mape_pct"] == pytest.approx(0.0, abs=1e-9)
        assert stats[metric]["abs_error_max"] == pytest.approx(0.0, abs=1e-9)
    assert "cached_tokens" not in stats  # the benchmark formats carry no cached-token counts


def test_hand_checked_statistics(aiperf_run: Path, tmp_path: Path) -> None:
    """Measurements exactly twice the predictions: every error is -prediction, every relative error 50%."""
    exported = export(aiperf_run, "aiperf", tmp_path / "p.jsonl")
    lines = []
    for line in exported.read_text().splitlines():
        rec = json.loads(line)
        for key in ("time_to_first_token", "request_latency", "inter_token_latency"):
            rec["metrics"][key]["value"] *= 2
        lines.append(json.dumps(rec))
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text("\n".join(lines) + "\n")
    v = compute_validation(aiperf_run, measured=doubled)
    ttft = _by_metric(v)["ttft"]
    predicted = sorted(w["predicted"] for w in v.worst if w["metric"] == "ttft")
    assert ttft["requests"] == 3 and ttft["mape_pct"] == pytest.approx(50.0)
    assert ttft["bias"] == pytest.approx(-sum(predicted) / 3)
    assert ttft["abs_error_p50"] == pytest.approx(predicted[1])  # median of |error| = median prediction
    assert ttft["abs_error_p90"] == pytest.approx(predicted[1] + 0.8 * (predicted[2] - predicted[1]))
    worst = [w for w in v.worst if w["metric"] == "ttft"]
    assert worst[0]["predicted"] == max(predicted) and worst[0]["error"] == pytest.approx(-max(predicted))


def test_measured_columns_of_the_run_trace_and_conditions(tmp_path: Path) -> None:
    convert(LOGS / "vllm_bench_detailed.json", tmp_path / "v.parquet", drop_failed=True)
    run(tmp_path / "v.parquet", outdir=tmp_path / "a")
    v = compute_validation(tmp_path / "a")
    assert v.coverage == {"replayed": 3, "finished": 3, "measured_rows": 3, "matched": 3, "unmatched_measured": 0}
    text = " ".join(v.differences)
    assert "at most 2 requests in flight" in text and "load.concurrency=2" in text and "recorded send times" in text
    assert "served by meta-llama/Llama-3.1-8B-Instruct" in text and "speculative decoding" in text
    run(tmp_path / "v.parquet", outdir=tmp_path / "b",
        overrides=["load.mode=concurrency", "load.concurrency=2", "model=meta-llama/Llama-3.1-8B-Instruct"])
    v = compute_validation(tmp_path / "b")
    assert not any("in flight" in d or "served by" in d for d in v.differences)


def test_no_timestamps_with_trace_timestamps_is_stated(tmp_path: Path) -> None:
    convert(LOGS / "sglang_bench_details.jsonl", tmp_path / "s.parquet")
    run(tmp_path / "s.parquet", outdir=tmp_path / "a")
    v = compute_validation(tmp_path / "a")
    assert any("no arrival times" in d for d in v.differences)
    assert any("4 req/s" in d for d in v.differences)


def test_group_by_tenant(tmp_path: Path) -> None:
    convert(LOGS / "litellm_spend_logs.jsonl", tmp_path / "l.parquet", drop_failed=True)
    run(tmp_path / "l.parquet", outdir=tmp_path / "a")
    v = compute_validation(tmp_path / "a", by="tenant")
    groups = {(s["metric"], s["grp"]) for s in v.summary}
    assert {("ttft", "team-search"), ("ttft", "team-ads"), ("cached_tokens", "team-search")} <= groups
    with pytest.raises(ReplayError, match="--by priority: .* has no 'priority' values"):
        compute_validation(tmp_path / "a", by="priority")
    with pytest.raises(ReplayError, match="not a label"):
        compute_validation(tmp_path / "a", by="colour")


def test_trace_without_measurements_is_a_clear_error(sample_run: Path) -> None:
    with pytest.raises(ReplayError, match="no measured latencies"):
        compute_validation(sample_run)


def test_cli_writes_markdown_charts_and_json(aiperf_run: Path, tmp_path: Path) -> None:
    md = tmp_path / "v.md"
    res = CliRunner().invoke(app, ["validate", str(aiperf_run), "-o", str(md), "--json", str(tmp_path / "v.json")])
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "## Predicted vs measured" in text and "### Worst requests" in text
    assert (tmp_path / "v_files" / "predicted_vs_measured.png").is_file()
    assert (tmp_path / "v_files" / "error_cdf.png").is_file()
    assert json.loads((tmp_path / "v.json").read_text())["coverage"]["matched"] == 3
    res = CliRunner().invoke(app, ["validate", str(aiperf_run), "--by", "tenant", "-o", str(md)])
    assert res.exit_code == 2 and "no 'tenant' values" in " ".join(res.output.split())


def test_validation_output_is_deterministic(aiperf_run: Path, tmp_path: Path) -> None:
    a = write_validation(aiperf_run, tmp_path / "a.md")
    b = write_validation(aiperf_run, tmp_path / "b.md")
    assert a.markdown.read_text().replace("a_files", "b_files") == b.markdown.read_text()
    for name in ("predicted_vs_measured.png", "error_cdf.png"):
        assert (tmp_path / "a_files" / name).read_bytes() == (tmp_path / "b_files" / name).read_bytes()


def test_report_gets_a_validation_section(aiperf_run: Path, sample_run: Path, tmp_path: Path) -> None:
    from replay.reports.report import write_report

    write_report(aiperf_run, tmp_path / "r.md", charts=False)
    assert "## Predicted vs measured" in (tmp_path / "r.md").read_text()
    write_report(sample_run, tmp_path / "s.md", charts=False)
    assert "Predicted vs measured" not in (tmp_path / "s.md").read_text()


def test_report_by_label(tmp_path: Path) -> None:
    from replay.reports.report import write_report

    convert(LOGS / "litellm_spend_logs.jsonl", tmp_path / "l.parquet", drop_failed=True)
    run(tmp_path / "l.parquet", outdir=tmp_path / "a")
    write_report(tmp_path / "a", tmp_path / "r.md", charts=False, by="tenant")
    text = (tmp_path / "r.md").read_text()
    assert "## By tenant" in text and "| team-search | 1 | 1 |" in text and "| team-ads | 1 | 1 |" in text
    assert "| TTFT (ms) | team-ads |" in text  # the validation section is grouped too
    with pytest.raises(ReplayError, match="--by priority"):
        write_report(tmp_path / "a", tmp_path / "r2.md", charts=False, by="priority")
    assert not (tmp_path / "r2.md").exists()


def test_outputs_never_land_on_inputs(aiperf_run: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["validate", str(aiperf_run), "-o", str(aiperf_run / "requests.parquet")])
    assert res.exit_code == 2 and "the output is the input" in " ".join(res.output.split())
    measured = tmp_path / "m.jsonl"
    export(aiperf_run, "aiperf", measured)
    before = measured.read_bytes()
    res = CliRunner().invoke(app, ["validate", str(aiperf_run), "-m", str(measured), "--json", str(measured),
                                   "-o", str(tmp_path / "v.md")])
    assert res.exit_code == 2 and measured.read_bytes() == before and not (tmp_path / "v.md").exists()


def test_a_config_json_of_the_served_model_is_not_a_different_model(tmp_path: Path) -> None:
    """A replay modeled from the served checkpoint's own config.json (a path) must not report "served by
    X, modeled .../config.json"; a genuinely different model still is."""
    from replay.reports.validate import condition_differences

    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 131072}
    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    other = tmp_path / "checkpoint"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**cfg, "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}))
    served = ["meta-llama/Llama-3.1-8B-Instruct"]
    for model in (str(folder / "config.json"), str(folder), str(other / "config.json")):
        diffs, _ = condition_differences({"config": {"model": model}}, None, served)
        assert not any("served by" in d for d in diffs), (model, diffs)
    diffs, _ = condition_differences({"config": {"model": str(folder / "config.json")}}, None, ["Qwen/Qwen3-8B"])
    assert any("served by Qwen/Qwen3-8B" in d for d in diffs)
