"""Readers of the reports people bring to check a prediction: GuideLLM benchmark reports (0.3 and
0.5 shapes), vLLM's request spans (OTLP JSON, Tempo, Jaeger) and inference-perf's per-request
report (0.4 and 0.6 shapes); skipped records are counted, bad files get one clear error. Expected
values are read off the fixtures in tests/fixtures/logs by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.base.errors import TraceError
from replay.ingest import convert, load_trace
from replay.ingest.detect import detect_format

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.mark.parametrize("name, fmt", [
    ("guidellm_v03_benchmarks.json", "guidellm"), ("guidellm_v05_benchmarks.json", "guidellm"),
    ("vllm_spans_otlp.jsonl", "otel"), ("vllm_spans_tempo.json", "otel"), ("vllm_spans_jaeger.json", "otel"),
    ("inference_perf_v04_per_request.json", "inference-perf"),
    ("inference_perf_v06_per_request.json", "inference-perf"),
])
def test_detect(name: str, fmt: str) -> None:
    assert detect_format(LOGS / name) == fmt


def _rows(name: str, **kw) -> tuple[list[dict], object]:
    t, meta = load_trace(LOGS / name, drop_failed=True, **kw)
    return t.to_pylist(), meta


def test_guidellm_v03_every_benchmark_labelled_by_strategy() -> None:
    rows, meta = _rows("guidellm_v03_benchmarks.json")
    # 2 synchronous + constant@4: 2 successful, 1 incomplete with tokens (the errored one is dropped)
    assert [r["request_id"] for r in rows] == ["g3-sync-1", "g3-sync-2", "g3-c4-1", "g3-c4-2", "g3-c4-4"]
    assert [r["source_run"] for r in rows] == ["synchronous"] * 2 + ["constant@4.00"] * 3
    assert [r["arrival_ms"] for r in rows] == [0, 100, 10000, 10250, 10750]  # epoch s rebased over the sweep
    r = rows[0]
    assert (r["input_tokens"], r["output_tokens"]) == (120, 4)
    assert r["measured_ttft_ms"] == pytest.approx(40.0, abs=1e-3)
    assert r["measured_e2e_ms"] == pytest.approx(72.0, abs=1e-3)  # last token 40 + 3 * 10 ms, end 2 ms later
    assert r["measured_tpot_ms"] == pytest.approx((72.0 - 40.0) / 3, abs=1e-3)
    assert r["measured_itl_mean_ms"] == pytest.approx(10.0, abs=1e-3)
    incomplete = rows[4]
    assert incomplete["measured_ttft_ms"] == pytest.approx(70.0, abs=1e-3) and incomplete["measured_e2e_ms"] is None
    assert r["model"] == "meta-llama/Llama-3.1-8B-Instruct" and r["request_type"] == "chat_completions"
    runs = meta.source_run["benchmarks"]
    assert runs == [{"source_run": "synchronous", "strategy": "synchronous", "max_concurrency": 1},
                    {"source_run": "constant@4.00", "strategy": "constant", "request_rate": 4.0}]


def test_guidellm_prompt_text_becomes_shared_prefix_ids() -> None:
    rows, meta = _rows("guidellm_v03_benchmarks.json")
    assert meta.prefix_identity == "real" and meta.hash_block_size == 16
    a, b = rows[0], rows[1]  # the same long system prompt, different questions
    assert len(a["hash_ids"]) == -(-120 // 16)  # recorded prompt_tokens win over the tokenizer's count
    assert a["hash_ids"][:3] == b["hash_ids"][:3] and a["hash_ids"][-1] != b["hash_ids"][-1]
    assert rows[3]["hash_ids"][0] != a["hash_ids"][0]  # an unrelated prompt


def test_guidellm_v05_timings_request_args_and_cached_tokens() -> None:
    rows, meta = _rows("guidellm_v05_benchmarks.json")
    assert [r["source_run"] for r in rows] == ["concurrent@2", "concurrent@2", "poisson@8.00", "poisson@8.00"]
    assert [r["arrival_ms"] for r in rows] == [0, 10, 20000, 20100]
    assert rows[1]["measured_ttft_ms"] == pytest.approx(52.0, abs=1e-3)
    assert rows[1]["measured_e2e_ms"] == pytest.approx(52.0 + 5 * 11.0 + 2.0, abs=1e-3)
    assert rows[1]["measured_cached_tokens"] == 112 and rows[0]["model"] == "Qwen/Qwen3-8B"
    assert rows[0]["hash_ids"][:4] == rows[1]["hash_ids"][:4]  # messages parsed out of request_args
    assert meta.source_run["version"] == "0.5.0" and meta.source_run["model_id"] == "Qwen/Qwen3-8B"


def test_guidellm_where_keeps_one_load_level(tmp_path: Path) -> None:
    rows, meta = _rows("guidellm_v05_benchmarks.json", where={"source_run": "concurrent@2"})
    assert [r["request_id"] for r in rows] == ["g5-c2-1", "g5-c2-2"]
    # the one load level's settings are the run's, so validate can compare the client's concurrency
    assert meta.source_run["max_concurrency"] == 2 and meta.source_run["strategy"] == "concurrent"
    result = convert(LOGS / "guidellm_v05_benchmarks.json", tmp_path / "c2.parquet", drop_failed=True,
                     where={"source_run": "concurrent@2"})
    assert result.rows_written == 2 and result.rows_dropped == 1  # poisson's errored request: dropped first
    assert result.skipped == {"not selected by --where source_run=concurrent@2": 2}
    assert any("2 records skipped" in w for w in result.warnings)


def test_guidellm_errored_and_incomplete_without_tokens_are_failures() -> None:
    with pytest.raises(TraceError, match="zero output tokens"):
        load_trace(LOGS / "guidellm_v05_benchmarks.json")


def test_guidellm_only_errored_requests_is_one_clear_error(tmp_path: Path) -> None:
    doc = json.loads((LOGS / "guidellm_v05_benchmarks.json").read_text())
    for bench in doc["benchmarks"]:
        bench["requests"]["errored"] += bench["requests"]["successful"]
        bench["requests"]["successful"] = []
    bad = tmp_path / "errored.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"no successful request in any benchmark \(4 errored, 1 incomplete\)"):
        load_trace(bad, drop_failed=True)


@pytest.mark.parametrize("name", ["guidellm_v03_benchmarks.json", "vllm_spans_jaeger.json", "vllm_bench_detailed.json",
                                  "genai_perf_profile_export.json",
                                  "inference_perf_v06_per_request.json"])
def test_truncated_json_is_one_clear_error(tmp_path: Path, name: str) -> None:
    raw = (LOGS / name).read_bytes()
    bad = tmp_path / name
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="truncated JSON") as err:
        load_trace(bad, format=detect_format(LOGS / name), drop_failed=True)
    assert name in str(err.value)


def test_truncated_span_export_line_is_named(tmp_path: Path) -> None:
    lines = (LOGS / "vllm_spans_otlp.jsonl").read_text().splitlines()
    bad = tmp_path / "spans.jsonl"
    bad.write_text(lines[0] + "\n" + lines[1][:200] + "\n")
    with pytest.raises(TraceError, match=r"line 2.*truncated JSON"):
        load_trace(bad, format="otel")


@pytest.mark.parametrize("name", ["vllm_spans_otlp.jsonl", "vllm_spans_tempo.json", "vllm_spans_jaeger.json"])
def test_vllm_spans_keep_server_side_phases(name: str) -> None:
    rows, meta = _rows(name)
    r = rows[0]
    assert r["request_id"] == "cmpl-a1b2c3-0"  # gen_ai.request.id
    assert (r["input_tokens"], r["output_tokens"]) == (512, 16)  # gen_ai.usage.prompt_tokens / completion_tokens
    assert r["measured_ttft_ms"] == pytest.approx(60.2) and r["measured_e2e_ms"] == pytest.approx(226.1)
    assert r["measured_queue_ms"] == pytest.approx(0.4) and r["measured_prefill_ms"] == pytest.approx(58.1)
    assert r["measured_decode_ms"] == pytest.approx(165.0)
    assert r["measured_tpot_ms"] == pytest.approx((226.1 - 60.2) / 15)
    assert r["model"] == "meta-llama/Llama-3.1-8B-Instruct" and rows[1]["arrival_ms"] == 150


def test_span_export_counts_skipped_spans(tmp_path: Path) -> None:
    result = convert(LOGS / "vllm_spans_otlp.jsonl", tmp_path / "s.parquet")
    assert result.rows_written == 3
    assert sum(result.skipped.values()) == 1  # the HTTP server span
    assert any("1 record skipped (1 spans without an input token count" in w for w in result.warnings)


def test_jaeger_error_span_is_a_failure() -> None:
    with pytest.raises(TraceError, match="zero output tokens"):
        load_trace(LOGS / "vllm_spans_jaeger.json")
    rows, _ = _rows("vllm_spans_jaeger.json")
    assert len(rows) == 3


def test_span_export_without_request_spans_says_what_it_skipped(tmp_path: Path) -> None:
    doc = json.loads((LOGS / "vllm_spans_otlp.jsonl").read_text().splitlines()[0])
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = [s for s in spans if s["name"] != "llm_request"]
    bad = tmp_path / "http_only.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"no request records in the file: 1 record skipped \(1 spans without"):
        load_trace(bad)


def test_file_without_any_span_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "empty.json"
    bad.write_text(json.dumps({"resourceSpans": []}))
    with pytest.raises(TraceError, match="no spans found"):
        load_trace(bad, format="otel")


def test_inference_perf_v04_flat_info() -> None:
    rows, meta = _rows("inference_perf_v04_per_request.json")
    assert len(rows) == 2 and [r["arrival_ms"] for r in rows] == [0, 500]  # the errored request dropped
    r = rows[0]
    assert (r["input_tokens"], r["output_tokens"]) == (110, 4)
    assert r["measured_ttft_ms"] == pytest.approx(50.0, abs=1e-6)
    assert r["measured_itl_ms"] == pytest.approx([10.0, 10.0, 10.0], abs=1e-6)
    assert r["measured_e2e_ms"] == pytest.approx(81.0, abs=1e-6)
    non_streamed = rows[1]
    assert non_streamed["measured_ttft_ms"] is None and non_streamed["measured_e2e_ms"] == pytest.approx(120.0)
    assert meta.prefix_identity == "real"
    later, _ = _rows("inference_perf_v06_per_request.json")  # the same chat prompt in the other file
    assert rows[0]["hash_ids"][:3] == later[0]["hash_ids"][:3] and rows[1]["hash_ids"][0] != rows[0]["hash_ids"][0]
    assert meta.source_run == {"tool": "inference-perf", "model_id": "meta-llama/Llama-3.1-8B-Instruct"}


def test_inference_perf_v06_server_usage_wins() -> None:
    rows, _ = _rows("inference_perf_v06_per_request.json")
    assert len(rows) == 1
    r = rows[0]
    assert (r["input_tokens"], r["output_tokens"]) == (131, 5)  # server usage, not the client's 126
    assert r["measured_cached_tokens"] == 112
    assert r["measured_ttft_ms"] == pytest.approx(62.0, abs=1e-6)
    assert r["measured_itl_mean_ms"] == pytest.approx(12.0, abs=1e-6)


@pytest.mark.parametrize("name, doc", [
    ("g.json", {"benchmarks": [{"config": {"strategy": {"type_": "constant", "rate": "x"}},
                                "requests": {"successful": [{"request_id": 1, "prompt_tokens": "a"}]}}]}),
    ("g2.json", {"benchmarks": [1, 2]}),
    ("o.json", {"resourceSpans": [{"scopeSpans": {"spans": 1}}]}),
    ("j.json", {"data": [{"traceID": "a", "spans": [{"tags": [{"key": "gen_ai.usage.prompt_tokens", "value": 5}],
                                                     "startTime": "zz"}]}]}),
    ("i.json", [{"start_time": 1, "end_time": 2, "request": 5, "error": None,
                 "info": {"response_metrics": {"output_token_times": {"a": 1}, "server_usage": 3}}}]),
])
def test_odd_shapes_are_errors_not_tracebacks(tmp_path: Path, name: str, doc) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=name):
        load_trace(path)


def test_conversation_without_reply_is_counted_as_skipped(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "anyone there?"}]}]))
    result = convert(path, tmp_path / "s.parquet")
    assert result.rows_written == 1
    assert result.skipped == {"conversations without an assistant reply after a prompt (no request to replay)": 1}
