"""Pick a reader: ``--format NAME``, or auto-detection from the file name and its first record.

Detection reads column names (CSV header, keys of the first JSON line), never positions. A page
of a tool's API (``{"data": [...], "meta": ...}``: Langfuse's observations, Helicone's query API)
is read by its first record, on one line or pretty-printed alike. When nothing matches, the error
lists what was found and how to map it with the generic readers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from replay.base.errors import TraceError

from .options import IngestOptions
from .readers import READERS
from .readers.base import Reader
from .readers.csv_source import read_header
from .readers.decoding import open_binary, refuse_unreadable_compression
from .readers.jsonl import first_record
from .schema import is_canonical_trace

_CSV_SUFFIXES = (".csv", ".csv.gz")
_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".ndjson")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suf in _CSV_SUFFIXES + _JSON_SUFFIXES + (".parquet",):
        if name.endswith(suf):
            return suf
    return path.suffix.lower()


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file's first non-blank bytes (after a BOM) are ``prefix``."""
    with open_binary(path) as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    return head.startswith(prefix)


def detect_format(path: str | Path, opts: IngestOptions | None = None) -> str:
    """The reader name for ``path`` (raises ``TraceError`` when it cannot tell)."""
    path = Path(path)
    opts = opts or IngestOptions()
    suf = _suffix(path)
    if suf == ".parquet":
        if is_canonical_trace(path):
            raise TraceError("already a canonical trace: use it directly (replay inspect / replay run)",
                             path=str(path))
        raise TraceError("a Parquet file that is not a canonical trace (no replay.* metadata)", path=str(path))
    if suf in _CSV_SUFFIXES:
        cols = set(read_header(path))
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
            return "azure"
        if {"Timestamp", "Request tokens", "Response tokens"} <= cols:
            return "burstgpt"
        if opts.mapping:
            return "csv"
        raise TraceError(f"unrecognised CSV columns {sorted(cols)}; give --format and, for a generic CSV, "
                         "--map arrival=COL --map input_tokens=COL --map output_tokens=COL --time-unit UNIT",
                         path=str(path), line=1)
    record = first_record(path)
    if record is None:
        peeked = _peek_keys(path)
        if peeked is not None:
            return peeked
        if _starts_with(path, b"["):
            raise TraceError("a JSON array, not JSON Lines: for a benchmark tool's export give --format "
                             "(e.g. vllm-bench, guidellm); for records, write one JSON object per line",
                             path=str(path), line=1)
        raise TraceError("cannot detect the format: not CSV (by name) and the first line is not a JSON object; "
                         "give --format", path=str(path), line=1)
    keys = set(record)
    logs = detect_log_format(record)
    page = page_record(record)
    if logs is None and page is not None:
        logs = detect_log_format(page)
    if logs is not None:
        return logs
    if {"chat_id", "parent_chat_id"} <= keys:
        return "bailian"
    if "hash_ids" in keys and keys & {"input_length", "input_tokens"}:
        return "mooncake"
    if keys & {"prompt", "messages", "prompt_token_ids"}:
        return "requests"
    if opts.mapping:
        return "jsonl"
    what = f"{sorted(page)} (of the first record under 'data')" if page is not None else str(sorted(keys))
    raise TraceError(f"unrecognised JSON fields {what}; give --format, or --format jsonl with --map flags",
                     path=str(path), line=1)


def page_record(doc: Any) -> dict | None:
    """The first record of a page of a tool's API (``{"data": [{...}, ...], ...}``), else None."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return None


def detect_log_format(record: dict) -> str | None:
    """Tool logs (benchmark results, gateway exports, conversations) by their distinctive keys."""
    keys = set(record)
    if {"input_lens", "ttfts"} <= keys:
        if keys & {"model_id", "start_times", "latencies", "endpoint_type"}:
            return "vllm-bench"
        if "dataset_name" in keys:
            return "sglang-bench"
        return None
    meta = record.get("metadata")
    if {"metadata", "metrics"} <= keys and isinstance(meta, dict) and "request_start_ns" in meta:
        return "aiperf"
    if "experiments" in keys and isinstance(record.get("experiments"), list):
        return "genai-perf"
    if "benchmarks" in keys and isinstance(record.get("benchmarks"), list):
        return "guidellm"
    if {"custom_id", "body"} <= keys and "url" in keys:
        return "openai-batch-input"
    if {"custom_id", "response"} <= keys:
        return "openai-batch-output"
    if keys & {"resourceSpans", "batches"} or {"traceID", "spans"} <= keys:  # OTLP, Tempo, one Jaeger trace
        return "otel"
    trace, data = record.get("trace"), record.get("data")
    if isinstance(trace, dict) and set(trace) & {"resourceSpans", "batches"}:
        return "otel"
    if isinstance(data, list) and data and isinstance(data[0], dict) and {"traceID", "spans"} <= set(data[0]):
        return "otel"  # Jaeger export
    if {"startTime", "prompt_tokens", "completion_tokens"} <= keys and keys & {"spend", "call_type", "api_key"}:
        return "litellm"
    if {"traceId", "startTime"} <= keys and keys & {"usageDetails", "usage", "promptTokens"}:
        return "langfuse"
    if {"request_created_at", "prompt_tokens"} <= keys:
        return "helicone"
    if "conversations" in keys and isinstance(record.get("conversations"), list):
        return "sharegpt"
    if "conversation" in keys and isinstance(record.get("conversation"), list):
        return "lmsys"
    if {"start_time", "end_time", "request", "info"} <= keys:
        return "inference-perf"
    if "hash_ids" not in keys and ("text_input" in keys or {"output_length", "messages"} <= keys):
        return "mooncake-text"
    return None


_PEEK_BYTES = 1 << 16
_PEEK_MARKERS = (('"conversations"', "sharegpt"), ('"conversation"', "lmsys"), ('"resourceSpans"', "otel"),
                 ('"experiments"', "genai-perf"), ('"benchmarks"', "guidellm"),
                 ('"scopeSpans"', "otel"), ('"instrumentationLibrarySpans"', "otel"), ('"operationName"', "otel"))


def _peek_keys(path: Path) -> str | None:
    """A multi-line JSON document (an array of conversations, pretty-printed OTLP or a benchmark
    result): parse it when small, else look for one format's marker key near the start."""
    from .readers.decoding import open_binary

    with open_binary(path) as fh:
        head = fh.read(_PEEK_BYTES).decode("utf-8", "replace")
    stripped = head.lstrip()
    if not stripped.startswith(("{", "[")):
        return None
    if len(head) < _PEEK_BYTES:
        try:
            doc = json.loads(head)
        except ValueError:
            doc = None
        whole = detect_log_format(doc) if isinstance(doc, dict) else None
        doc = page_record(doc) or doc
        if isinstance(doc, list) and doc and isinstance(doc[0], dict):
            doc = doc[0]
        if isinstance(doc, dict):
            return whole or detect_log_format(doc)
    else:
        page = _first_page_record(head)
        found = detect_log_format(page) if page is not None else None
        if found is not None:
            return found
    if stripped.startswith("[") and all(f'"{k}"' in head for k in ("start_time", "end_time", "request", "info")):
        return "inference-perf"
    found = {fmt for marker, fmt in _PEEK_MARKERS if marker in head}
    return found.pop() if len(found) == 1 else None


_PAGE_START = re.compile(r'\s*\{\s*"data"\s*:\s*\[\s*')


def _first_page_record(head: str) -> dict | None:
    """The first record of an API page too large to parse whole, when it opens the document."""
    opening = _PAGE_START.match(head.lstrip("\ufeff"))
    if opening is None:
        return None
    try:
        record, _ = json.JSONDecoder().raw_decode(head.lstrip("\ufeff"), opening.end())
    except ValueError:  # the first record does not end within the peek
        return None
    return record if isinstance(record, dict) else None


def make_reader(path: Path, opts: IngestOptions) -> Reader:
    refuse_unreadable_compression(Path(path))
    name = opts.format or detect_format(path, opts)
    if name not in READERS:
        raise TraceError(f"unknown format {name!r}; known formats: {', '.join(sorted(READERS))}", path=str(path))
    reader_class = READERS[name]
    given = {"time_unit": ("--time-unit", opts.time_unit is not None), "block_size": ("--block-size", opts.block_size is not None),
             "mapping": ("--map", bool(opts.mapping))}
    ignored = [flag for option, (flag, was_given) in given.items() if was_given and option not in reader_class.options_read]
    if ignored:
        raise TraceError(f"{' and '.join(ignored)} does not apply to {name} files (the format fixes what it would set); "
                         "remove it, or read the file as generic JSONL/CSV (--format jsonl|csv with --map)",
                         path=str(path))
    return reader_class(path, opts)
