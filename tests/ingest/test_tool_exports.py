"""Tool exports as the tools write them today: GuideLLM's JSON request bodies and sampled reports,
LiteLLM's non-streamed requests, Langfuse and Helicone API pages on one line, Langfuse observations
that are not generations, appended ``vllm bench serve`` runs, and the wording of failures and of
``--format``. Each fixture is written inline, with the fields the tool writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.base.errors import TraceError
from replay.ingest import convert, load_trace
from replay.ingest.detect import detect_format
from replay.ingest.readers import READERS

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
SYSTEM = "You are a helpful assistant. Answer briefly and cite the manual section. " * 4


# GuideLLM ---------------------------------------------------------------------------------------

def _guidellm_request(i: int, request_args: str | None) -> dict:
    start = 1733140100.0 + i
    return {"request_id": f"r{i}", "request_type": "chat_completions", "request_args": request_args,
            "info": {"timings": {"request_start": start, "first_token_iteration": start + 0.05,
                                 "last_token_iteration": start + 0.08, "request_end": start + 0.082,
                                 "token_iterations": 4}},
            "prompt_tokens": 100, "output_tokens": 4}


def _guidellm_report(requests: list[dict], version: str = "0.7.1", totals: dict | None = None) -> dict:
    bench: dict = {"config": {"strategy": {"type_": "concurrent", "streams": 2}},
                   "requests": {"successful": requests, "incomplete": [], "errored": []}}
    if totals is not None:
        bench["metrics"] = {"request_totals": totals}
    return {"metadata": {"guidellm_version": version}, "config": {"model": "Qwen/Qwen3-8B"}, "benchmarks": [bench]}


def _json_args(question: str) -> str:
    """``request_args`` as GuideLLM 0.6+ writes it (``model_dump_json``: ``true``, ``null``)."""
    return json.dumps({"method": "POST", "stream": True, "headers": {}, "params": {}, "files": None,
                       "body": {"model": "Qwen/Qwen3-8B", "stream": True, "max_tokens": 4,
                                "messages": [{"role": "user", "content": SYSTEM + question}]}},
                      separators=(",", ":"))


def _write(tmp_path: Path, name: str, doc, one_line: bool = True) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if one_line else json.dumps(doc, indent=2))
    return path


def test_guidellm_json_request_args_give_prefix_ids(tmp_path: Path) -> None:
    path = _write(tmp_path, "g7.json", _guidellm_report([_guidellm_request(0, _json_args("Ticket 1?")),
                                                         _guidellm_request(1, _json_args("Ticket 2?"))]))
    table, meta = load_trace(path)
    rows = table.to_pylist()
    assert meta.prefix_identity == "real" and meta.hash_block_size == 16
    assert len(rows[0]["hash_ids"]) == -(-100 // 16)  # the recorded prompt_tokens win
    assert rows[0]["hash_ids"][:3] == rows[1]["hash_ids"][:3] and rows[0]["hash_ids"][-1] != rows[1]["hash_ids"][-1]


def test_guidellm_python_repr_request_args_still_read(tmp_path: Path) -> None:
    args = repr({"method": "POST", "stream": True, "files": None,
                 "body": {"messages": [{"role": "user", "content": SYSTEM + "Ticket 1?"}]}})
    path = _write(tmp_path, "g5.json", _guidellm_report([_guidellm_request(0, args)], version="0.5.0"))
    _, meta = load_trace(path)
    assert meta.prefix_identity == "real"


def test_guidellm_unreadable_request_args_are_reported_not_dropped(tmp_path: Path) -> None:
    path = _write(tmp_path, "g.json", _guidellm_report([_guidellm_request(0, "{'body': <Body object at 0x7f>}"),
                                                        _guidellm_request(1, "{'body': <Body object at 0x7f>}")]))
    result = convert(path, tmp_path / "g.parquet")
    assert result.rows_written == 2 and result.metadata.prefix_identity == "absent"
    said = [w for w in result.warnings if "request_args" in w]
    assert said and "2 requests" in said[0] and "prefix" in said[0]
    assert "request_args" in (result.metadata.notes or "")


def test_guidellm_sampled_report_says_how_many_requests_ran(tmp_path: Path) -> None:
    requests = [_guidellm_request(i, None) for i in range(3)]
    path = _write(tmp_path, "sampled.json", _guidellm_report(
        requests, version="0.5.0", totals={"successful": 1000, "incomplete": 12, "errored": 3, "total": 1015}))
    result = convert(path, tmp_path / "s.parquet")
    said = [w for w in result.warnings if "sampled" in w]
    assert said and "3 of the 1,015 requests" in said[0] and "--sample-requests" in said[0]
    assert "3 of the 1,015 requests" in (result.metadata.notes or "")


def test_guidellm_complete_report_has_no_sampling_warning(tmp_path: Path) -> None:
    requests = [_guidellm_request(i, None) for i in range(3)]
    path = _write(tmp_path, "full.json", _guidellm_report(
        requests, totals={"successful": 3, "incomplete": 0, "errored": 0, "total": 3}))
    assert not [w for w in convert(path, tmp_path / "f.parquet").warnings if "sampled" in w]


# LiteLLM ----------------------------------------------------------------------------------------

def _spend_log(rid: str, start: str, first: str | None, end: str, n_out: int) -> dict:
    return {"request_id": rid, "call_type": "acompletion", "spend": 0.0001, "api_key": "88dc",
            "prompt_tokens": 100, "completion_tokens": n_out, "model": "llama-3.1-8b", "status": "success",
            "startTime": start, "completionStartTime": first, "endTime": end, "metadata": {}}


def test_litellm_non_streamed_request_has_no_ttft(tmp_path: Path) -> None:
    path = tmp_path / "spend.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        _spend_log("streamed", "2025-06-02T10:00:00.100000+00:00", "2025-06-02T10:00:00.200000+00:00",
                   "2025-06-02T10:00:01.100000+00:00", 20),
        _spend_log("whole", "2025-06-02T10:00:00.500000+00:00", "2025-06-02T10:00:02.500000+00:00",
                   "2025-06-02T10:00:02.500000+00:00", 40),
        _spend_log("one-token", "2025-06-02T10:00:03.000000+00:00", "2025-06-02T10:00:03.300000+00:00",
                   "2025-06-02T10:00:03.300000+00:00", 1))))
    table, meta = load_trace(path)
    rows = {r["request_id"]: r for r in table.to_pylist()}
    assert rows["streamed"]["measured_ttft_ms"] == pytest.approx(100.0)
    whole = rows["whole"]  # LiteLLM sets completionStartTime = endTime when the response was not streamed
    assert whole["measured_ttft_ms"] is None and whole["measured_tpot_ms"] is None
    assert whole["measured_e2e_ms"] == pytest.approx(2000.0)
    assert rows["one-token"]["measured_ttft_ms"] == pytest.approx(300.0)  # its first token is its last
    assert "completionStartTime" in (meta.notes or "")


# Langfuse and Helicone API pages --------------------------------------------------------------

def _observation(oid: str, kind: str, n_in: int, n_out: int, start: str) -> dict:
    usage = {"input": n_in, "output": n_out, "total": n_in + n_out} if kind == "GENERATION" else {}
    return {"id": oid, "traceId": "tr-1", "type": kind, "name": "chat" if kind == "GENERATION" else "handler",
            "startTime": start, "endTime": "2025-06-02T10:00:01.200Z",
            "completionStartTime": "2025-06-02T10:00:00.250Z" if kind == "GENERATION" else None,
            "model": "llama-3.1-8b" if kind == "GENERATION" else None, "level": "DEFAULT",
            "usage": {"input": n_in, "output": n_out, "total": n_in + n_out, "unit": "TOKENS"},
            "usageDetails": usage, "promptTokens": n_in, "completionTokens": n_out}


def _langfuse_page() -> dict:
    return {"data": [_observation("obs-0", "SPAN", 0, 0, "2025-06-02T10:00:00.050Z"),
                     _observation("obs-1", "GENERATION", 120, 30, "2025-06-02T10:00:00.100Z"),
                     _observation("obs-2", "EVENT", 0, 0, "2025-06-02T10:00:00.900Z")],
            "meta": {"page": 1, "limit": 50, "totalItems": 3, "totalPages": 1}}


def _helicone_page() -> dict:
    rows = [{"request_id": f"q{i}", "request_created_at": f"2025-06-02T10:00:0{i}.100Z",
             "response_created_at": f"2025-06-02T10:00:0{i}.900Z", "response_status": 200,
             "request_path": "/v1/chat/completions", "request_user_id": "u1", "delay_ms": 800,
             "time_to_first_token": 120, "prompt_tokens": 120, "completion_tokens": 30,
             "prompt_cache_read_tokens": 64, "model": "gpt-4o-mini"} for i in range(2)]
    return {"data": rows, "error": None}


@pytest.mark.parametrize("page, fmt", [(_langfuse_page, "langfuse"), (_helicone_page, "helicone")])
def test_api_page_on_one_line_reads_as_pretty_printed(tmp_path: Path, page, fmt: str) -> None:
    one = _write(tmp_path, "one.json", page())
    pretty = _write(tmp_path, "pretty.json", page(), one_line=False)
    assert detect_format(one) == detect_format(pretty) == fmt
    assert load_trace(one)[0].to_pylist() == load_trace(pretty)[0].to_pylist()


def test_large_pretty_printed_api_page_is_detected(tmp_path: Path) -> None:
    doc = _helicone_page()
    doc["data"] = [dict(doc["data"][0], request_id=f"q{i}") for i in range(600)]  # beyond the 64 KiB peek
    path = _write(tmp_path, "big.json", doc, one_line=False)
    assert path.stat().st_size > 1 << 16
    assert detect_format(path) == "helicone"


def test_langfuse_spans_and_events_are_skipped_and_counted(tmp_path: Path) -> None:
    path = _write(tmp_path, "obs.json", _langfuse_page(), one_line=False)
    result = convert(path, tmp_path / "o.parquet")
    assert result.rows_written == 1 and result.rows_rejected == 0
    assert result.skipped == {"observations of type SPAN, not model generations": 1,
                              "observations of type EVENT, not model generations": 1}
    assert any("2 records skipped" in w for w in result.warnings)


def test_langfuse_page_of_spans_only_says_what_it_skipped(tmp_path: Path) -> None:
    doc = _langfuse_page()
    doc["data"] = [doc["data"][0]]
    with pytest.raises(TraceError, match=r"no request records in the file: 1 record skipped \(1 observations of type SPAN"):
        load_trace(_write(tmp_path, "spans.json", doc), format="langfuse")


# vllm bench serve --append-result --------------------------------------------------------------

def _vllm_run(rate, concurrency: int | None, clock: float) -> dict:
    return {"date": "20250610-101112", "backend": "openai-chat", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
            "num_prompts": 2, "request_rate": rate, "burstiness": 1.0, "max_concurrency": concurrency,
            "input_lens": [10, 20], "output_lens": [3, 4], "ttfts": [0.05, 0.07], "itls": [[0.01, 0.01], [0.02] * 3],
            "latencies": [0.072, 0.134], "start_times": [clock, clock + 0.1], "errors": ["", ""]}


def test_vllm_appended_runs_are_read_as_labelled_runs(tmp_path: Path) -> None:
    path = tmp_path / "vllm.json"  # --append-result: a newline and the next run's object
    path.write_text(json.dumps(_vllm_run("inf", 8, 100.0)) + "\n" + json.dumps(_vllm_run(4.0, None, 200.0)))
    assert detect_format(path) == "vllm-bench"
    table, meta = load_trace(path)
    rows = table.to_pylist()
    assert [r["source_run"] for r in rows] == ["rate@inf,concurrency@8"] * 2 + ["rate@4.00"] * 2
    assert [r["arrival_ms"] for r in rows] == [0, 100, 100000, 100100]
    assert len({r["request_id"] for r in rows}) == 4
    runs = meta.source_run["benchmarks"]
    assert [(r["source_run"], r["max_concurrency"], r["request_rate"]) for r in runs] == [
        ("rate@inf,concurrency@8", 8, "inf"), ("rate@4.00", None, 4.0)]
    one, meta = load_trace(path, where={"source_run": "rate@inf,concurrency@8"})
    assert one.num_rows == 2 and meta.source_run["max_concurrency"] == 8  # validate compares the limit


def test_vllm_appended_runs_overlapping_in_time_are_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(_vllm_run("inf", None, 100.0)) + "\n" + json.dumps(_vllm_run(4.0, None, 100.0)) + "\n")
    result = convert(path, tmp_path / "v.parquet")
    assert result.rows_written == 4
    assert any("overlap" in w and "--where source_run=" in w for w in result.warnings)


# Failures and --format --------------------------------------------------------------------------

@pytest.mark.parametrize("name, marker", [
    ("vllm_bench_detailed.json", "'errors'"), ("aiperf_profile_export.jsonl", "'error'"),
    ("vllm_spans_jaeger.json", "error span"), ("litellm_spend_logs.jsonl", "status 'failure'"),
])
def test_zero_output_names_the_formats_failure_marker(name: str, marker: str) -> None:
    with pytest.raises(TraceError, match="zero output tokens") as err:
        load_trace(LOGS / name)
    text = str(err.value)
    assert marker in text and "--drop-failed" in text and "BurstGPT" not in text


def test_otel_error_status_is_named(tmp_path: Path) -> None:
    span = {"traceId": "t", "spanId": "s1", "name": "chat", "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000", "status": {"code": 2},
            "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
                           {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "0"}}]}
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n")
    with pytest.raises(TraceError, match=r"status\.code 2.*--drop-failed"):
        load_trace(path)


def test_burstgpt_failure_still_names_its_marker() -> None:
    with pytest.raises(TraceError, match=r"'Response tokens'.*zero output tokens.*--drop-failed"):
        load_trace(LOGS.parent.parent / "ingest_fixtures" / "burstgpt_v1.csv")


def test_format_help_lists_every_reader() -> None:
    from replay.ingest.formats import FORMAT_NAMES, format_help

    assert all(READERS[name].name == name for name in FORMAT_NAMES)
    text = format_help()
    assert all(name in text for name in ("vllm-bench", "guidellm", "otel", "jsonl", "csv", "burstgpt"))
