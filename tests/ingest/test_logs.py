"""Tool-log readers (tests/fixtures/logs): benchmark results, gateway exports, OTel spans,
conversations, OpenAI Batch files and extended Mooncake text rows. Expected values are read off
the fixtures by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.base.errors import TraceError
from replay.ingest import load_trace
from replay.ingest.detect import detect_format
from replay.ingest.hashing import chain_hash_blocks
from replay.ingest.readers.records import fit_ids

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.mark.parametrize("name, fmt", [
    ("vllm_bench_detailed.json", "vllm-bench"), ("sglang_bench_details.jsonl", "sglang-bench"),
    ("aiperf_profile_export.jsonl", "aiperf"), ("openai_batch_input.jsonl", "openai-batch-input"),
    ("openai_batch_output.jsonl", "openai-batch-output"), ("litellm_spend_logs.jsonl", "litellm"),
    ("langfuse_observations.json", "langfuse"), ("helicone_requests.json", "helicone"),
    ("otel_genai_spans.jsonl", "otel"), ("sharegpt.json", "sharegpt"), ("lmsys_chat.jsonl", "lmsys"),
    ("mooncake_text.jsonl", "mooncake-text"),
])
def test_detect(name: str, fmt: str) -> None:
    assert detect_format(LOGS / name) == fmt


def _rows(name: str, **kw) -> tuple[list[dict], object]:
    t, meta = load_trace(LOGS / name, drop_failed=True, **kw)
    return t.to_pylist(), meta


def test_vllm_bench_per_request_arrays() -> None:
    rows, meta = _rows("vllm_bench_detailed.json")
    assert len(rows) == 3  # the failed 4th request is dropped by --drop-failed
    assert [r["arrival_ms"] for r in rows] == [0, 0, 63]  # start_times rebased, s -> ms
    r = rows[0]
    assert r["input_tokens"] == 512 and r["output_tokens"] == 4
    assert r["measured_ttft_ms"] == pytest.approx(41.2) and r["measured_e2e_ms"] == pytest.approx(62.2)
    assert r["measured_tpot_ms"] == pytest.approx((62.2 - 41.2) / 3)
    assert r["measured_itl_ms"] == pytest.approx([7.1, 6.9, 7.0]) and r["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert meta.source_run["max_concurrency"] == 2 and meta.source_run["request_rate"] == "inf"
    assert meta.source_run["spec_decode_accepted_tokens"] == 5 and meta.timestamps == "recorded"


def test_vllm_bench_failed_request_needs_drop_failed() -> None:
    with pytest.raises(TraceError, match=r"record 4: zero output tokens"):
        load_trace(LOGS / "vllm_bench_detailed.json")


def test_sglang_bench_has_no_start_times() -> None:
    rows, meta = _rows("sglang_bench_details.jsonl")
    assert [r["arrival_ms"] for r in rows] == [0, 0, 0] and meta.timestamps == "absent"
    assert rows[0]["measured_e2e_ms"] == pytest.approx(91 + 48)  # TTFT + sum of the gaps
    assert meta.source_run["request_rate"] == 4.0


def test_sglang_several_runs_in_one_file_are_labelled(tmp_path: Path) -> None:
    line = (LOGS / "sglang_bench_details.jsonl").read_text()
    f = tmp_path / "runs.jsonl"
    f.write_text(line + line)  # bench_serving appends each run to its output file
    table, meta = load_trace(f, format="sglang-bench", drop_failed=True)
    assert table.column("source_run").to_pylist() == ["rate@4.00"] * 3 + ["rate@4.00#2"] * 3
    assert [b["source_run"] for b in meta.source_run["benchmarks"]] == ["rate@4.00", "rate@4.00#2"]


def test_aiperf_nanoseconds_sessions_and_failures() -> None:
    rows, meta = _rows("aiperf_profile_export.jsonl")
    assert [r["request_id"] for r in rows] == ["req-0", "req-1", "req-2"]  # cancelled req-3 dropped
    assert [r["arrival_ms"] for r in rows] == [0, 250, 500]
    assert rows[2]["session_id"] == "sess-a" and rows[2]["turn"] == 2 and rows[2]["parent_id"] == "req-0"
    assert rows[0]["measured_tpot_ms"] == pytest.approx(7.0) and rows[0]["measured_itl_ms"] == [7.0, 7.0, 7.0]
    assert meta.start_time == "2025-10-07T05:00:07.533Z"


def test_openai_batch_input_hashes_text_and_notes_the_cap() -> None:
    rows, meta = _rows("openai_batch_input.jsonl")
    assert [r["output_tokens"] for r in rows] == [256, 256, 256]
    assert "max_tokens cap" in meta.notes and meta.timestamps == "absent" and meta.prefix_identity == "real"
    # the shared system prompt gives the same leading blocks
    assert rows[0]["hash_ids"][:4] == rows[1]["hash_ids"][:4] == rows[2]["hash_ids"][:4]


def test_openai_batch_output_uses_recorded_usage() -> None:
    rows, _ = _rows("openai_batch_output.jsonl")
    assert [(r["input_tokens"], r["output_tokens"], r["measured_cached_tokens"]) for r in rows] == [
        (78, 41, 0), (80, 55, 64), (76, 12, 64)]


def test_litellm_times_labels_and_failure() -> None:
    rows, meta = _rows("litellm_spend_logs.jsonl")
    assert len(rows) == 2 and meta.start_time == "2025-06-02T10:00:00.120Z"
    a, b = rows
    assert a["measured_ttft_ms"] == pytest.approx(190.0) and a["measured_e2e_ms"] == pytest.approx(1900.0)
    assert a["measured_cached_tokens"] == 1024 and a["tenant"] == "team-search" and a["session_id"] == "s-9"
    assert b["arrival_ms"] == 880 and b["session_id"] is None and b["tenant"] == "team-ads"


def test_langfuse_and_helicone() -> None:
    rows, _ = _rows("langfuse_observations.json")
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(900, 51), (200, 11)]
    assert rows[0]["measured_ttft_ms"] == pytest.approx(200.0) and rows[0]["measured_cached_tokens"] == 512
    assert rows[1]["measured_ttft_ms"] == pytest.approx(100.0)  # timeToFirstToken (s) when no completionStartTime
    assert rows[1]["session_id"] == "tr-2" and rows[0]["tenant"] == "tenant-a"
    rows, _ = _rows("helicone_requests.json")
    assert rows[0]["measured_e2e_ms"] == 800.0 and rows[0]["measured_ttft_ms"] == 120.0
    assert rows[0]["measured_cached_tokens"] == 256 and rows[1]["arrival_ms"] == 250


def test_otel_keeps_only_genai_spans() -> None:
    rows, _ = _rows("otel_genai_spans.jsonl")
    assert [r["request_id"] for r in rows] == ["chatcmpl-1", "chatcmpl-2"]  # the /health span is skipped
    assert rows[0]["input_tokens"] == 640 and rows[0]["measured_cached_tokens"] == 512
    assert rows[0]["measured_e2e_ms"] == pytest.approx(750.0) and rows[1]["arrival_ms"] == 1000
    assert rows[0]["model"] == "llama-3.1-8b-instruct" and rows[1]["model"] == "llama-3.1-8b"


def test_sharegpt_turns_share_their_prefix() -> None:
    rows, meta = _rows("sharegpt.json")
    assert [r["request_id"] for r in rows] == ["QWJhYvA_0-1", "QWJhYvA_0-2", "i6IyJda_0-1"]
    assert meta.timestamps == "absent" and rows[1]["delay_ms"] == 0 and rows[1]["parent_id"] == "QWJhYvA_0-1"
    # turn 2's prompt starts with turn 1's prompt + reply: every full block of turn 1's prompt is shared
    t1, t2 = rows[0], rows[1]
    full = t1["input_tokens"] // 16
    assert t2["hash_ids"][:full] == t1["hash_ids"][:full]
    lm, _ = _rows("lmsys_chat.jsonl")
    assert [r["model"] for r in lm] == ["vicuna-13b", "koala-13b", "koala-13b"] and lm[2]["turn"] == 2


def test_mooncake_text_rows_recorded_length_wins() -> None:
    rows, _ = _rows("mooncake_text.jsonl")
    assert rows[1]["priority"] == -1  # extra.nvext.priority
    a1, a2 = rows[0], rows[2]
    assert a2["input_tokens"] == 60 and len(a2["hash_ids"]) == 4 and a2["delay_ms"] == 2000
    assert a2["hash_ids"][:3] == a1["hash_ids"][:3]  # the shared system prompt's full blocks


def test_fit_ids_keeps_prefix_and_is_deterministic() -> None:
    ids = chain_hash_blocks(list(range(40)), 16)
    assert fit_ids(ids, 20, 16) == ids[:2]
    longer = fit_ids(ids, 80, 16)
    assert longer[:3] == ids and len(longer) == 5 and longer == fit_ids(ids, 80, 16)


def test_generic_jsonl_dotted_paths_and_measured_columns(tmp_path: Path) -> None:
    f = tmp_path / "log.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"ts": 1_700_000_000_000_000_000, "usage": {"prompt_tokens": 100, "completion_tokens": 20}, "lat": {"ttft": 12.5}},
        {"ts": 1_700_000_000_500_000_000, "usage": {"prompt_tokens": 50, "completion_tokens": 2}, "lat": {"ttft": 9}},
    ]) + "\n")
    mapping = {"arrival": "ts", "input_tokens": "usage.prompt_tokens", "output_tokens": "usage.completion_tokens",
               "measured_ttft_ms": "lat.ttft"}
    t, _ = load_trace(f, format="jsonl", time_unit="ns", mapping=mapping)
    assert t.column("arrival_ms").to_pylist() == [0, 500]
    assert t.column("measured_ttft_ms").to_pylist() == [12.5, 9.0]
    with pytest.raises(TraceError, match=r"log\.jsonl, line 1, field 'ts': time unit contradicts the values: "
                                         r".*epoch ns \(2023-11-14\), not s; use --time-unit ns"):
        load_trace(f, format="jsonl", time_unit="s", mapping=mapping)


def test_generic_nested_type_error_names_the_path(tmp_path: Path) -> None:
    f = tmp_path / "log.jsonl"
    f.write_text('{"ts": 0, "usage": {"prompt_tokens": 10, "completion_tokens": 2}}\n'
                 '{"ts": 1, "usage": {"prompt_tokens": "many", "completion_tokens": 2}}\n')
    mapping = {"arrival": "ts", "input_tokens": "usage.prompt_tokens", "output_tokens": "usage.completion_tokens"}
    with pytest.raises(TraceError, match=r"line 2, field 'usage': prompt_tokens: not an integer"):
        load_trace(f, format="jsonl", time_unit="s", mapping=mapping)


def test_measured_columns_survive_a_parquet_round_trip(tmp_path: Path) -> None:
    from replay.ingest import convert, read_trace

    out = tmp_path / "t.parquet"
    convert(LOGS / "aiperf_profile_export.jsonl", out, drop_failed=True)
    table, meta = read_trace(out)
    assert table.column("measured_ttft_ms").to_pylist() == [25.5, 20.0, 30.0]
    assert meta.source_run == {"tool": "aiperf"}


def test_inspect_shows_measurements_labels_and_source_run() -> None:
    from typer.testing import CliRunner

    from replay.cli import app

    res = CliRunner().invoke(app, ["inspect", str(LOGS / "litellm_spend_logs.jsonl"), "--json", "--drop-failed",
                                   "--lru-blocks", "10"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["measured"]["measured_ttft_ms"]["requests"] == 2
    assert stats["measured"]["measured_ttft_ms"]["mean"] == pytest.approx(170.0)
    assert stats["measured"]["measured_cached_tokens"]["requests"] == 1
    assert stats["labels"]["tenant"] == {"distinct": 2, "requests": 2, "top": [["team-ads", 1], ["team-search", 1]]}
    assert stats["source_run"] == {"tool": "LiteLLM spend logs"} and stats["timestamps"] == "recorded"
    res = CliRunner().invoke(app, ["inspect", str(LOGS / "sharegpt.json"), "--lru-blocks", "10"])
    assert res.exit_code == 0 and "no arrival times" in res.output and "no measured latencies" in res.output


def test_chat_log_uses_recorded_usage_counts_not_estimates() -> None:
    rows, meta = _rows("chat_usage.jsonl")
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(31, 12), (35, 40)]
    assert [r["measured_cached_tokens"] for r in rows] == [0, 16] and rows[0]["model"] == "llama-3.1-8b-instruct"
    assert [len(r["hash_ids"]) for r in rows] == [2, 3]  # ceil(31/16), ceil(35/16): resized to the recorded counts
    assert rows[0]["hash_ids"][0] == rows[1]["hash_ids"][0]  # the shared system prompt's first block
    assert "recorded prompt counts" in meta.notes


def test_genai_perf_stream_times_and_counts() -> None:
    assert detect_format(LOGS / "genai_perf_profile_export.json") == "genai-perf"
    rows, meta = _rows("genai_perf_profile_export.json")
    a, b = rows
    assert [a["arrival_ms"], b["arrival_ms"]] == [0, 200]
    assert a["measured_ttft_ms"] == pytest.approx(30.0) and a["measured_itl_ms"] == pytest.approx([8.0])
    assert a["measured_e2e_ms"] == pytest.approx(38.0)  # [DONE] is not a token
    assert b["output_tokens"] == 4  # the recorded usage.completion_tokens
    assert b["measured_itl_ms"] == pytest.approx([7.0, 7.5, 8.0]) and b["measured_e2e_ms"] == pytest.approx(47.5)
    assert a["hash_ids"][0] == b["hash_ids"][0] and a["hash_ids"][1] != b["hash_ids"][1]  # system prompt block
    assert meta.source_run["max_concurrency"] == 4
