"""Serving-benchmark result files: ``vllm bench serve --save-result --save-detailed`` and SGLang
``bench_serving --output-details``.

Both write one object per benchmark run holding per-request arrays (index i is request i):
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (list of s per request), ``errors``;
vLLM adds ``latencies`` (E2E, s) and ``start_times`` (client send times, ``time.perf_counter``
seconds). Times become ms; arrivals are ``start_times`` rebased to the first request, or absent
(SGLang, older vLLM), in which case every arrival is 0 and the trace must be replayed with a load
mode. The run's settings (backend, model, request rate, max concurrency, spec-decode counters,
which vLLM reads from the server's Prometheus counters for the whole run) are kept as
``source_run``. Failed requests have output length 0: ``--drop-failed`` drops and counts them.
``request_ids`` (written by ``replay export``, not by vLLM) names the requests when present.
Several runs appended to one file are read run by run, each labelled ``source_run``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from replay.base.errors import TraceError

from .base import ReaderInfo
from .records import Bad, Item, RecordReader, load_json_document, number, tpot_ms

_RUN_KEYS = ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency", "dataset_name", "duration", "completed",
             "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
             "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates")
_EXTRAS = ("measured_ttft_ms", "measured_e2e_ms", "measured_tpot_ms", "measured_itl_ms", "measured_itl_mean_ms",
           "model")


def _finite(value: Any) -> Any:
    """JSON-safe run settings (``inf`` request rates are written as Infinity by Python's json)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf"
    return value


def run_label(run: dict) -> str:
    """``rate@4.00``, ``rate@inf``, ``rate@inf,concurrency@8``: the run's load, as ``--where`` names it."""
    rate = run.get("request_rate")
    try:
        value = float(rate) if rate is not None else float("inf")
    except (TypeError, ValueError):
        value = None
    label = "rate@?" if value is None else "rate@inf" if value == float("inf") else f"rate@{value:.2f}"
    if run.get("max_concurrency") is not None:
        label += f",concurrency@{run['max_concurrency']}"
    return label


class BenchResultReader(RecordReader):
    """Common parsing of per-request arrays; subclasses name the tool.

    A file may hold several runs, one JSON object per line: ``vllm bench serve --append-result``
    (vLLM's vllm/benchmarks/serve.py opens the result file with mode ``a+``) and SGLang's
    ``bench_serving`` append each run. Each run's requests are then labelled ``source_run``
    (``run_label``; ``--where source_run=...`` keeps one), as a GuideLLM sweep's benchmarks are.
    """

    tool: ClassVar[str] = ""

    def __init__(self, path, opts) -> None:
        super().__init__(path, opts)
        doc = load_json_document(self.path)
        docs = doc if isinstance(doc, list) else [doc]
        if not docs:
            raise TraceError(f"not a {self.tool} result: the file holds no run", path=str(self.path))
        self.runs: list[tuple[str, dict]] = []
        seen: dict[str, int] = {}
        for k, run in enumerate(docs, start=1):
            where = f" (run {k} of {len(docs)})" if len(docs) > 1 else ""
            if not isinstance(run, dict) or not isinstance(run.get("input_lens"), list):
                raise TraceError(f"not a {self.tool} result with per-request details{where} (no 'input_lens' "
                                 "array; run the benchmark with its detailed-output flag)", path=str(self.path))
            n = len(run["input_lens"])
            for key in ("output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "request_ids"):
                if run.get(key) is not None and (not isinstance(run[key], list) or len(run[key]) != n):
                    raise TraceError(f"'{key}' has {len(run[key]) if isinstance(run[key], list) else 'no'} entries "
                                     f"but 'input_lens' has {n}{where}", path=str(self.path), field=key)
            label = run_label(run)
            seen[label] = seen.get(label, 0) + 1
            self.runs.append((label if seen[label] == 1 else f"{label}#{seen[label]}", run))
        self.several = len(self.runs) > 1
        self.timed = all(isinstance(run.get("start_times"), list) for _, run in self.runs)
        if self.several and self.timed:
            self._overlap()

    def _chosen(self) -> list[tuple[str, dict]]:
        wanted = (self.opts.where or {}).get("source_run")
        return [(label, run) for label, run in self.runs if wanted is None or label == wanted]

    def _overlap(self) -> None:
        """Appended runs ran one after the other: start times that overlap come from clocks that
        cannot be compared (each run's ``perf_counter``, on other machines or boots)."""
        spans = []
        for label, run in self._chosen():
            times = [t for t in run["start_times"] if isinstance(t, int | float) and not isinstance(t, bool)]
            if times:
                spans.append((min(times), max(times), label))
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            if start <= end:
                self.warn(f"the runs {a} and {b} overlap in time (each run's start_times are its own process's "
                          "perf_counter): replayed together they are not the load either run had; replay one "
                          f"at a time with --where source_run={a}")
                return

    def info(self) -> ReaderInfo:
        chosen = self._chosen()
        settings = [{k: _finite(run[k]) for k in _RUN_KEYS if k in run} for _, run in chosen]
        run: dict[str, Any] = {"tool": self.tool}
        if len(settings) == 1:  # one run: its settings are the run's (validate compares them)
            run.update(settings[0])
        if self.several:
            run["benchmarks"] = [{"source_run": label, **kv} for (label, _), kv in zip(chosen, settings, strict=True)]
            models = {kv.get("model_id") for kv in settings}
            if len(models) == 1 and None not in models:
                run["model_id"] = models.pop()
        notes = [f"{self.tool} per-request arrays; times converted from s to ms",
                 "TPOT = (E2E - TTFT) / (output - 1), as the tool computes it"]
        if self.several:
            notes.append(f"{len(self.runs)} runs appended in one file: source_run = rate@REQUEST_RATE"
                         "[,concurrency@MAX_CONCURRENCY] of each run")
        if not self.timed:
            notes.append("no per-request start times: arrivals are 0, replay with load.mode concurrency or poisson")
        return ReaderInfo(
            source_format=self.name, time_unit="s", rebase=True, wallclock=False, hash_block_size=None,
            prefix_identity="absent", hash_ids_required=False,
            generated_ids=not any("request_ids" in r for _, r in self.runs),
            field_names={"t_ms": "start_times", "input_tokens": "input_lens", "output_tokens": "output_lens"},
            notes=notes, extra_columns=_EXTRAS + (("source_run",) if self.several else ()), source_run=run,
            no_timestamps=not self.timed, failed_as="its 'errors' entry is set",
        )

    def _row(self, d: dict, i: int) -> dict[str, Any]:
        error = (d.get("errors") or [None] * (i + 1))[i]
        out = number(d["output_lens"][i], f"output_lens[{i}]", integer=True) if d.get("output_lens") else None
        row: dict[str, Any] = {
            "request_id": str(d["request_ids"][i]) if d.get("request_ids") else None,
            "t_ms": 0,
            "input_tokens": number(d["input_lens"][i], f"input_lens[{i}]", integer=True, allow_none=False),
            "output_tokens": 0 if error else out,
            "model": d.get("model_id"),
        }
        if self.timed:
            start = number(d["start_times"][i], f"start_times[{i}]")
            row["t_ms"] = None if start is None else round(start * 1000.0)
        if error:
            return row
        ttft = number(d["ttfts"][i], f"ttfts[{i}]") if d.get("ttfts") else None
        itls = d["itls"][i] if d.get("itls") else None
        if itls is not None and not isinstance(itls, list):
            raise Bad(f"itls[{i}]", "expected a list of inter-token gaps")
        itl_ms = [number(x, f"itls[{i}]", allow_none=False) * 1000.0 for x in itls] if itls is not None else None
        ttft_ms = None if ttft is None else ttft * 1000.0
        lat = number(d["latencies"][i], f"latencies[{i}]") if d.get("latencies") else None
        if lat is not None:
            e2e_ms = lat * 1000.0
        elif ttft_ms is not None and itl_ms is not None:
            e2e_ms = ttft_ms + sum(itl_ms)  # last chunk time - send time, as both tools measure latency
        else:
            e2e_ms = None
        row.update({
            "measured_ttft_ms": ttft_ms, "measured_e2e_ms": e2e_ms,
            "measured_tpot_ms": tpot_ms(e2e_ms, ttft_ms, out),
            "measured_itl_ms": itl_ms,
            "measured_itl_mean_ms": (sum(itl_ms) / len(itl_ms)) if itl_ms else None,
        })
        return row

    def items(self) -> Iterator[Item]:
        k = -1  # record index over the whole file: request k of every run in turn
        for label, run in self.runs:
            for i in range(len(run["input_lens"])):
                k += 1
                try:
                    row = self._row(run, i)
                except Bad as bad:
                    if self.several:
                        bad = Bad(bad.field, f"{bad.reason} (run {label})")
                    yield self.reject(k, None, bad)
                    continue
                if self.several:
                    row["source_run"] = label
                yield Item(k, None, row)


class VllmBenchReader(BenchResultReader):
    name = "vllm-bench"
    tool = "vllm bench serve"


class SglangBenchReader(BenchResultReader):
    name = "sglang-bench"
    tool = "sglang bench_serving"
