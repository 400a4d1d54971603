"""genai-perf ``profile_export.json`` (Perf Analyzer's per-request lifecycle export).

``{"service_kind", "endpoint", "experiments": [{"experiment": {"mode": "concurrency" |
"request_rate", "value"}, "requests": [{"timestamp": ns, "request_inputs": {"payload": JSON
text}, "response_timestamps": [ns...], "response_outputs": [{"response": "data: {...}"}]}]}]}``.

The payload's ``messages``/``prompt`` is hashed into chained block ids from its text; its token
count is the tokenizer's (genai-perf tokenizes too: approximate with the byte fallback). Responses
are OpenAI server-sent events: chunks with no text and ``[DONE]`` are not tokens; the output
length is a recorded ``usage.completion_tokens`` when a chunk carries one, else the tokenizer's
count of the streamed text. TTFT = first text chunk - send time, E2E = last text chunk - send
time, ITL = gaps between text chunks. One experiment per file (a sweep writes several).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from replay.base.errors import TraceError

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, TextIds, first, load_json_document, number, text_of, tpot_ms

DEFAULT_BLOCK_SIZE = 16
_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_ms", "measured_itl_mean_ms",
           "model")


def sse_events(response: str) -> Iterator[Any]:
    """The JSON payloads of ``data: ...`` lines (``[DONE]`` and blank lines skipped)."""
    for line in response.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        body = line[5:].strip()
        if not body or body == "[DONE]":
            continue
        try:
            yield json.loads(body)
        except ValueError:
            continue


def chunk_text(event: Any) -> str:
    out = []
    for choice in (event.get("choices") or []) if isinstance(event, dict) else []:
        if isinstance(choice, dict):
            delta = choice.get("delta") or {}
            out.append(str(delta.get("content") or "") if isinstance(delta, dict) else "")
            out.append(str(choice.get("text") or ""))
    return "".join(out)


class GenaiPerfReader(RecordReader):
    options_read = frozenset({"block_size"})
    name = "genai-perf"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE)
        doc = load_json_document(self.path)
        experiments = doc.get("experiments") if isinstance(doc, dict) else None
        if not isinstance(experiments, list) or not experiments:
            raise TraceError("not a genai-perf profile export (no 'experiments')", path=str(self.path))
        if len(experiments) != 1:
            raise TraceError(f"{len(experiments)} experiments in one export (a sweep); keep the one to compare "
                             "in a file of its own", path=str(self.path), field="experiments")
        self.doc, self.exp = doc, experiments[0]

    def info(self) -> ReaderInfo:
        exp = self.exp.get("experiment") or {}
        run = {"tool": "genai-perf", "service_kind": self.doc.get("service_kind"), "endpoint": self.doc.get("endpoint"),
               "mode": exp.get("mode"), "value": exp.get("value")}
        if exp.get("mode") == "concurrency":
            run["max_concurrency"] = exp.get("value")
        elif exp.get("mode") == "request_rate":
            run["request_rate"] = exp.get("value")
        notes = ["prompt text from request_inputs.payload, chain-hashed; TTFT/E2E/ITL from response_timestamps"]
        notes += self.text.notes()
        return ReaderInfo(
            source_format=self.name, time_unit="ns", rebase=True, wallclock=True,
            hash_block_size=self.text.block_size, prefix_identity="real", hash_ids_required=True,
            tokenizer=self.text.tokenizer.name, generated_ids=True,
            field_names={"t_ms": "timestamp", "input_tokens": "request_inputs.payload",
                         "output_tokens": "response_outputs", "hash_ids": "request_inputs.payload"},
            notes=notes, extra_columns=_EXTRAS, source_run=run,
            failed_as="no streamed text in its response_outputs",
        )

    def _row(self, req: dict) -> dict[str, Any]:
        sent = number(req.get("timestamp"), "timestamp", integer=True, allow_none=False)  # exact ns
        payload = (req.get("request_inputs") or {}).get("payload")
        try:
            body = json.loads(payload) if isinstance(payload, str) else payload
        except ValueError:
            raise Bad("request_inputs.payload", "payload is not JSON") from None
        if not isinstance(body, dict):
            raise Bad("request_inputs.payload", "expected a JSON object payload")
        prompt, where = first(body, "messages", "prompt")
        if prompt is None:
            raise Bad("request_inputs.payload", "no messages or prompt in the payload")
        n_in, ids = self.text(text_of(prompt, f"request_inputs.payload.{where}"))
        times = req.get("response_timestamps") or []
        outputs = req.get("response_outputs") or []
        if len(times) != len(outputs):
            raise Bad("response_timestamps", f"{len(times)} timestamps for {len(outputs)} responses")
        text, chunk_ns, recorded = [], [], None
        for ts, out in zip(times, outputs, strict=True):
            piece = ""
            for event in sse_events(str((out or {}).get("response") or "")):
                piece += chunk_text(event)
                usage = event.get("usage") if isinstance(event, dict) else None
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    recorded = number(usage["completion_tokens"], "usage.completion_tokens", integer=True)
            if piece:
                text.append(piece)
                chunk_ns.append(number(ts, "response_timestamps", integer=True, allow_none=False))
        n_out = recorded if recorded is not None else self.text.count("".join(text))
        ms = [(t - sent) * 1e-6 for t in chunk_ns]
        gaps = [b - a for a, b in zip(ms, ms[1:], strict=False)]
        ttft = ms[0] if ms else None
        e2e = ms[-1] if ms else None
        return {"t_ms": sent // 1_000_000, "input_tokens": n_in, "hash_ids": ids, "output_tokens": n_out,
                "measured_ttft_ms": ttft, "measured_e2e_ms": e2e, "measured_tpot_ms": tpot_ms(e2e, ttft, n_out),
                "measured_itl_ms": gaps if ms else None,
                "measured_itl_mean_ms": (sum(gaps) / len(gaps)) if gaps else None, "model": body.get("model")}

    def items(self) -> Iterator[Item]:
        return self.each((i, None, r) for i, r in enumerate(self.exp.get("requests") or []))
