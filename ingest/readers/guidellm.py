"""GuideLLM benchmark reports (``guidellm benchmark ... --output-path benchmarks.json``).

One JSON document: ``{"benchmarks": [...]}`` (0.3) or ``{"metadata", "args", "benchmarks"}``
(0.4-0.6; ``config`` instead of ``args`` from 0.7). Each benchmark is one load level of the run
(``args.strategy`` in 0.3, ``config.strategy`` from 0.4: ``{"type_": "synchronous" | "concurrent"
| "throughput" | "constant" | "poisson", "rate", "streams", "max_concurrency"}``) and holds its
requests by status in ``requests.successful`` / ``errored`` / ``incomplete``.

Per request, 0.3 writes flat fields (``start_time``, ``first_token_time``, ``last_token_time``,
``end_time`` in epoch seconds, ``prompt_tokens``, ``output_tokens``, ``prompt`` text); from 0.4
the times are under ``info.timings`` (``request_start``, ``first_token_iteration``,
``last_token_iteration``, ``request_end``), the counts are computed fields written beside them
(``prompt_tokens``, ``output_tokens``, ``cached_tokens`` in recent versions) and the request body is
``request_args``: ``{"body": {"messages" | "prompt": ...}}`` as JSON from 0.6 (``model_dump_json()``
in GuideLLM's backends/openai/request_handlers.py), as a Python ``repr`` (``str(model_dump())``) in
0.4-0.5; it is read as JSON first, then as a Python literal. Arrival =
request start (epoch s, rebased over the whole file, so a sweep replays its benchmarks in the order
they ran). TTFT = first token - start, E2E = end - start, ITL (GuideLLM's, the mean gap) =
(last - first token) / (output tokens - 1); TPOT is vLLM's (E2E - TTFT) / (output - 1). GuideLLM
keeps no per-token times, so there is no list of gaps.

Every benchmark's label ``source_run`` is its strategy and rate (``constant@4.00``,
``concurrent@8``, ``synchronous``); ``replay ingest --where source_run=...`` keeps one. Prompt
text, when the report kept it, is chain-hashed into prefix ids (``--block-size``, default 16) and
the recorded prompt token count wins over the tokenizer's. Errored requests (and incomplete ones
that received no token) have output length 0, so ``--drop-failed`` drops and counts them; an
incomplete request keeps the tokens it received and its TTFT (it loaded the server).

Two things the ingest says rather than hides: request bodies that cannot be read (no prompt text,
so no prefix ids), and a sampled report (``--sample-requests N`` keeps a reservoir sample of each
benchmark's requests while ``request_totals`` counts all that ran): its timestamps replay a
lighter load than the one its latencies were measured under.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from typing import Any

from replay.base.errors import TraceError

from .base import ReaderInfo
from .json_report import load_json_report
from .records import Bad, Item, RecordReader, TextIds, dig, first, number, text_of, tpot_ms

DEFAULT_BLOCK_SIZE = 16
STATUSES = ("successful", "incomplete", "errored")
_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_mean_ms",
           "measured_cached_tokens", "model", "request_type", "source_run")


def strategy_label(strategy: Any) -> str:
    """``constant@4.00``, ``poisson@2.50``, ``concurrent@8``, ``throughput``, ``synchronous``."""
    if not isinstance(strategy, dict):
        return "unknown"
    kind = str(strategy.get("type_") or strategy.get("type") or "unknown")
    rate = strategy.get("rate")
    if isinstance(rate, int | float) and not isinstance(rate, bool) and kind in ("constant", "poisson"):
        return f"{kind}@{float(rate):.2f}"
    if strategy.get("streams") is not None:
        return f"{kind}@{strategy['streams']}"
    return kind


def strategy_of(bench: dict) -> dict:
    found = dig(bench, "config.strategy") or dig(bench, "args.strategy")
    return found if isinstance(found, dict) else {}


def run_settings(strategy: dict) -> dict[str, Any]:
    """The strategy as ``source_run`` keys ``replay validate`` compares (concurrency, rate)."""
    kind = strategy.get("type_") or strategy.get("type")
    out: dict[str, Any] = {"strategy": kind}
    if kind == "synchronous":
        out["max_concurrency"] = 1
    elif kind == "concurrent" and strategy.get("streams") is not None:
        out["max_concurrency"] = strategy["streams"]
    elif strategy.get("max_concurrency") is not None:
        out["max_concurrency"] = strategy["max_concurrency"]
    if kind in ("constant", "poisson") and strategy.get("rate") is not None:
        out["request_rate"] = strategy["rate"]
    return out


def prompt_text(req: dict) -> tuple[str | None, str]:
    """The prompt as text (0.3's ``prompt``, or the body inside 0.4+'s ``request_args``)."""
    if isinstance(req.get("prompt"), str | list):
        return text_of(req["prompt"], "prompt"), "prompt"
    args = req.get("request_args")
    if not isinstance(args, str) or not args.strip() or args.strip() == "None":
        return None, "request_args"
    parsed = request_args(args)
    body = parsed.get("body") if isinstance(parsed, dict) else None
    if not isinstance(body, dict):
        return None, "request_args"
    value, where = first(body, "messages", "prompt", "input")
    if value is None:
        return None, "request_args"
    return text_of(value, f"request_args.body.{where}"), f"request_args.body.{where}"


def request_args(text: str) -> Any:
    """The ``request_args`` object: JSON (0.6+, ``true``/``null``), else a Python literal (0.4-0.5)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise Bad("request_args", "not a readable request body (neither JSON nor a Python literal)") from None


def request_totals(bench: dict) -> int | None:
    """How many requests the benchmark ran (``metrics.request_totals``; 0.3: ``request_totals``)."""
    totals, _ = first(bench, "metrics.request_totals", "request_totals")
    if not isinstance(totals, dict):
        return None
    counts = {key: value for key, value in totals.items() if isinstance(value, int) and not isinstance(value, bool)}
    if "total" in counts:
        return counts["total"]
    return sum(counts[s] for s in STATUSES) if all(s in counts for s in STATUSES) else None


def _time(req: dict, flat: str, nested: str) -> float | None:
    value, where = first(req, flat, f"info.timings.{nested}")
    return number(value, where)


class GuideLLMReader(RecordReader):
    options_read = frozenset({"block_size"})
    name = "guidellm"

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        doc = load_json_report(self.path, "GuideLLM report")
        benches = doc.get("benchmarks") if isinstance(doc, dict) else None
        if not isinstance(benches, list) or not benches:
            raise TraceError("not a GuideLLM report with benchmarks (no 'benchmarks' list, or an empty one)",
                             path=str(self.path), field="benchmarks")
        self.doc = doc
        self.benches: list[tuple[str, dict]] = []
        seen: dict[str, int] = {}
        for bench in benches:
            if not isinstance(bench, dict):
                raise TraceError("a benchmark must be a JSON object", path=str(self.path), field="benchmarks")
            label = strategy_label(strategy_of(bench))
            seen[label] = seen.get(label, 0) + 1
            self.benches.append((label if seen[label] == 1 else f"{label}#{seen[label]}", bench))
        counts = {s: sum(len(self._requests(b, s)) for _, b in self.benches) for s in STATUSES}
        if not counts["successful"]:
            first_error = next((r.get("error") or dig(r, "info.error") for _, b in self.benches
                                for r in self._requests(b, "errored") if isinstance(r, dict)), None)
            detail = f"; first error: {str(first_error)[:200]}" if first_error else ""
            raise TraceError(f"no successful request in any benchmark ({counts['errored']} errored, "
                             f"{counts['incomplete']} incomplete): the report holds no latencies to compare"
                             + detail, path=str(self.path), field="benchmarks.requests.successful")
        probes = [prompt_state(r) for _, b in self.benches for r in self._requests(b, "successful")[:1]]
        self.has_text = "text" in probes
        self.text = TextIds(opts.tokenizer, opts.block_size or DEFAULT_BLOCK_SIZE) if self.has_text else None
        self.report_notes: list[str] = []
        if not self.has_text and "unreadable" in probes:
            self._unreadable_bodies()
        self._sampling()

    def _chosen(self) -> list[tuple[str, dict]]:
        """The benchmarks ``--where source_run=...`` keeps (all without it)."""
        wanted = (self.opts.where or {}).get("source_run")
        return [(label, b) for label, b in self.benches if wanted is None or label == wanted]

    def _unreadable_bodies(self) -> None:
        """Say that the prompts were there but could not be read (else prefix identity is silently absent)."""
        reqs = [r for _, b in self.benches for s in STATUSES for r in self._requests(b, s)]
        n = sum(prompt_state(r) == "unreadable" for r in reqs)
        text = (f"request_args of {n:,} request{'s' if n != 1 else ''} could not be read (neither JSON nor a "
                "Python literal): no prompt text, so no prefix ids (prefix identity absent)")
        self.report_notes.append(text)
        self.warn(text)

    def _sampling(self) -> None:
        """Say when the report kept a sample of the requests that ran (``--sample-requests``)."""
        kept = ran = 0
        for _, bench in self._chosen():
            total = request_totals(bench)
            here = sum(len(self._requests(bench, s)) for s in STATUSES)
            kept, ran = kept + here, ran + (here if total is None else max(total, here))
        if ran <= kept:
            return
        sample = dig(self.benches[0][1], "config.sample_requests")
        flag = f"--sample-requests {sample}" if isinstance(sample, int) else "--sample-requests"
        text = (f"sampled report (GuideLLM {flag}): it keeps {kept:,} of the {ran:,} requests that ran; "
                "replayed at their recorded times they are a much lighter load than the one their latencies "
                "were measured under (compare with care, or replay with a load mode at the run's rate)")
        self.report_notes.append(text)
        self.warn(text)

    @staticmethod
    def _requests(bench: dict, status: str) -> list:
        found = dig(bench, f"requests.{status}")
        return found if isinstance(found, list) else []

    def _model(self, bench: dict) -> str | None:
        value, _ = first(self.doc, "args.model", "config.model")
        if value is None:
            value, _ = first(bench, "worker.backend_model", "config.backend.model", "config.requests.model")
        return value if isinstance(value, str) else None

    def info(self) -> ReaderInfo:
        chosen = self._chosen()
        runs = [{"source_run": label, **run_settings(strategy_of(b))} for label, b in chosen]
        run: dict[str, Any] = {"tool": "guidellm", "version": dig(self.doc, "metadata.guidellm_version"),
                               "benchmarks": runs}
        if len(runs) == 1:  # one load level: its settings are the run's (validate compares them)
            run.update({k: v for k, v in runs[0].items() if k != "source_run"})
        model = self._model(self.benches[0][1])
        if model:
            run["model_id"] = model
        notes = ["GuideLLM report: every benchmark's successful, incomplete and errored requests; "
                 "source_run = strategy@rate; ITL = GuideLLM's mean gap per request"]
        if self.text is not None:
            notes.append("prompt text chain-hashed into prefix ids; recorded prompt_tokens win")
            notes += self.text.notes()
        notes += self.report_notes
        return ReaderInfo(
            source_format=self.name, time_unit="s", rebase=True, wallclock=True,
            hash_block_size=self.text.block_size if self.text else None,
            prefix_identity="real" if self.text else "absent", hash_ids_required=False,
            tokenizer=self.text.tokenizer.name if self.text else None,
            field_names={"t_ms": "start_time/info.timings.request_start", "input_tokens": "prompt_tokens",
                         "output_tokens": "output_tokens", "request_id": "request_id", "hash_ids": "prompt"},
            notes=notes, extra_columns=_EXTRAS, source_run=run,
            failed_as="in requests.errored, or in requests.incomplete without a first token",
        )

    def _row(self, req: dict, status: str = "successful", label: str = "", model: str | None = None) -> dict:
        start = _time(req, "start_time", "request_start")
        if start is None:
            start = number(dig(req, "info.timings.resolve_start"), "info.timings.resolve_start", allow_none=False)
        first_tok = _time(req, "first_token_time", "first_token_iteration")
        last_tok = _time(req, "last_token_time", "last_token_iteration")
        end = _time(req, "end_time", "request_end")
        n_in = number(first(req, "prompt_tokens", "input_metrics.total_tokens", "input_metrics.text_tokens")[0],
                      "prompt_tokens", integer=True, allow_none=False)
        n_out = number(first(req, "output_tokens", "output_metrics.total_tokens", "output_metrics.text_tokens")[0],
                       "output_tokens", integer=True) or 0
        row: dict[str, Any] = {"request_id": None if req.get("request_id") is None else str(req["request_id"]),
                               "t_ms": round(start * 1000.0), "input_tokens": n_in, "source_run": label,
                               "model": model, "request_type": req.get("request_type")}
        if self.text is not None:
            text, _where = prompt_text(req)
            if text is not None:
                row["input_tokens"], row["hash_ids"] = self.text(text, n_in)
        got_token = first_tok is not None and n_out > 0
        if status == "errored" or not got_token:
            row["output_tokens"] = 0  # failed: --drop-failed drops and counts it
            return row
        row["output_tokens"] = n_out
        ttft = (first_tok - start) * 1000.0
        if ttft < 0:
            raise Bad("first_token_time", f"first token {-ttft:.3f} ms before the request started")
        row["measured_ttft_ms"] = ttft
        row["measured_cached_tokens"] = number(req.get("cached_tokens"), "cached_tokens", integer=True)
        if status == "incomplete" or end is None:
            return row  # cut off by the benchmark's end: no end-to-end latency
        e2e = (end - start) * 1000.0
        if e2e < ttft:
            raise Bad("end_time", "the request ended before its first token")
        row["measured_e2e_ms"] = e2e
        row["measured_tpot_ms"] = tpot_ms(e2e, ttft, n_out)
        # The gap between streamed chunks, as the replay predicts ITL: with speculative decoding an
        # iteration streams several tokens (token_iterations < output tokens).
        chunks = number(dig(req, "info.timings.token_iterations"), "info.timings.token_iterations", integer=True)
        if not chunks or chunks < 1:
            chunks = n_out
        if last_tok is not None and chunks > 1:
            row["measured_itl_mean_ms"] = (last_tok - first_tok) * 1000.0 / (chunks - 1)
        return row

    def items(self) -> Iterator[Item]:
        k = -1
        for label, bench in self.benches:
            model = self._model(bench)
            for status in STATUSES:
                for req in self._requests(bench, status):
                    k += 1
                    try:
                        if not isinstance(req, dict):
                            raise Bad(f"requests.{status}", "a request must be a JSON object")
                        yield Item(k, None, self._row(req, status, label, model))
                    except Bad as bad:
                        yield self.reject(k, None, bad, req)


def prompt_state(req: Any) -> str:
    """``text`` when a request carries prompt text, ``none`` when it has none, ``unreadable`` when its
    body cannot be read (a row's own problem is reported when the row is read)."""
    if not isinstance(req, dict):
        return "none"
    try:
        return "none" if prompt_text(req)[0] is None else "text"
    except Bad:
        return "unreadable"
