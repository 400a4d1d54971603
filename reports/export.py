"""``replay export``: a replay's per-request results in benchmark tools' own result shapes, so a
prediction can sit beside a real benchmark in the tools users already have.

* ``vllm-bench``: the JSON object of ``vllm bench serve --save-result --save-detailed``
  (per-request ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``
  in seconds, ``errors``; run totals and mean/median/p99 in ms), plus ``request_ids`` (not in
  vLLM's file; our reader uses it to match requests back).
* ``aiperf``: ``profile_export.jsonl`` records (``metadata`` with ns times, ``metrics`` as
  ``{"value", "unit"}``, ``error``).
* ``guidellm``: a GuideLLM report (``reports/export_guidellm.py``).

Requests that did not finish are written as the tools write failures (vLLM: empty output and an
error text; aiperf: an ``error`` object and ``error_isl``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.base.atomic import atomic_path, check_output_file
from replay.base.duckdb_conn import connect
from replay.base.errors import ReplayError
from replay.reports.report_files import run_files
from replay.reports.sample_stats import SampleSpill
from replay.reports.sqlfiles import sql
from replay.reports.views import open_run

FORMATS = ("vllm-bench", "aiperf", "guidellm")


# Requests per batch streamed from the export query: JSON text, Python objects and the per-request
# lists exist for one batch at a time (the whole run as Python dicts and lists does not fit the memory budget).
EXPORT_BATCH_ROWS = 65_536
# Chunk rows per batch at most (unless one request has more): the ITL gaps of a batch become Python
# floats and JSON text, about 100 bytes each, so a batch of 65,536 requests with 200 chunks each
# took a 1 M-request export past 2 GB (bench/README.md, memory at scale).
EXPORT_BATCH_CHUNKS = 1 << 21


@contextlib.contextmanager
def _batches(outdir: Path) -> Iterator[tuple[Iterator[pa.RecordBatch], dict[str, Any], Any]]:
    """The export query's rows (trace order) in batches, with run.json and the trace metadata; each
    batch carries ``itl_ms``, its requests' gaps between consecutive chunks (ms, in time order)."""
    run = open_run(outdir, connect(EXPORT_DUCKDB_MB))
    try:
        requests = run.con.sql(sql("export_requests")).to_arrow_table()  # a few columns per request, no lists
        chunks = run.con.sql(sql("export_chunk_times")).to_arrow_reader(CHUNK_BATCH_ROWS)
        yield _with_itl(requests, chunks), run.info, run.trace_meta
    finally:
        run.con.close()


# Chunk rows per batch of the sorted chunk stream.
CHUNK_BATCH_ROWS = 1 << 20
# DuckDB's budget here (it spills the chunk sort past it): the report default of 1 GB took a dense
# 1 M-request export past 2 GB when the ITL samples were held in numpy beside it (bench/README.md;
# bench/README.md); they now go to a spill file (reports/sample_stats.py).
EXPORT_DUCKDB_MB = 384


def _with_itl(requests: pa.Table, chunks: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    """Request batches with the ``itl_ms`` list of each request: the chunk stream is sorted by
    (request position, time), so each batch takes the chunk rows of its positions. A batch has at
    most EXPORT_BATCH_ROWS requests and, unless its first request alone has more, at most
    EXPORT_BATCH_CHUNKS chunk rows. Gaps are the same float subtraction as ``time_ms - lag(time_ms)``;
    a request without chunks gets an empty list."""
    pos = np.zeros(0, dtype=np.int64)
    times = np.zeros(0, dtype=np.float64)
    stream = iter(chunks)
    done = False
    lo = 0
    while lo < requests.num_rows:
        hi = min(lo + EXPORT_BATCH_ROWS, requests.num_rows)
        # Read until every chunk row of [lo, hi) is in, or more than EXPORT_BATCH_CHUNKS rows are,
        # those of request lo among them.
        while not done and (not len(pos) or pos[-1] < hi) and (len(pos) <= EXPORT_BATCH_CHUNKS or pos[-1] <= lo):
            nxt = next(stream, None)
            if nxt is None:
                done = True
                break
            pos = np.concatenate([pos, nxt.column("pos").to_numpy().astype(np.int64)])
            times = np.concatenate([times, nxt.column("time_ms").to_numpy()])
        if len(pos) > EXPORT_BATCH_CHUNKS:  # the requests whose rows are all among the first EXPORT_BATCH_CHUNKS
            hi = min(hi, max(lo + 1, int(pos[EXPORT_BATCH_CHUNKS])))
        part = requests.slice(lo, hi - lo)
        batch = pa.RecordBatch.from_arrays([col.combine_chunks() for col in part.columns], names=part.schema.names)
        cut = int(np.searchsorted(pos, hi))
        p, t = pos[:cut], times[:cut]
        pos, times = pos[cut:], times[cut:]
        same = p[1:] == p[:-1]  # a gap follows every chunk but a request's first
        gaps = (t[1:] - t[:-1])[same]
        counts = np.bincount(p - lo, minlength=hi - lo)
        offsets = np.zeros(hi - lo + 1, dtype=np.int32)
        np.cumsum(np.maximum(counts - 1, 0), out=offsets[1:])
        itl = pa.ListArray.from_arrays(pa.array(offsets), pa.array(gaps, type=pa.float64()))
        yield pa.RecordBatch.from_arrays([*batch.columns, itl], names=[*batch.schema.names, "itl_ms"])
        lo = hi


def _load_settings(info: dict[str, Any]) -> tuple[Any, Any]:
    load = (info.get("config") or {}).get("load") or {}
    mode = load.get("mode")
    rate = float(load["rate"]) if mode == "poisson" else float("inf")
    return rate, (load.get("concurrency") if mode == "concurrency" else None)


class _JsonList:
    """A JSON list written piece by piece to a temp file, as ``json.dumps`` writes a whole list."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile("w+", encoding="utf-8")
        self._empty = True

    def extend(self, items: list) -> None:
        if items:
            self.file.write(("" if self._empty else ", ") + json.dumps(items)[1:-1])
            self._empty = False

    def copy_to(self, out: TextIO) -> None:
        self.file.seek(0)
        out.write("[")
        shutil.copyfileobj(self.file, out, 1 << 20)
        out.write("]")
        self.file.close()


# The vllm bench per-request lists, in the file's key order (between the run totals and the stats).
_VLLM_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts",
               "errors", "request_ids")


def _numpy(batch: pa.RecordBatch, name: str) -> np.ndarray:
    return batch.column(name).to_numpy(zero_copy_only=False)


def vllm_bench(outdir: Path, out: TextIO) -> None:
    """The replay as a ``vllm bench serve --save-detailed`` result (one JSON object), written to ``out``."""
    lists = {key: _JsonList() for key in _VLLM_LISTS}
    # The pooled samples of the statistics go to temp files, read back in passes (220 M ITL
    # gaps of a 1 M-request replay are 1.76 GB as doubles); same numbers as numpy over the whole arrays.
    samples = {key: SampleSpill() for key in ("ttft", "tpot", "itl", "e2el")}
    try:
        _vllm_bench(outdir, out, lists, samples)
    finally:
        for spill in samples.values():
            spill.close()


def _vllm_bench(outdir: Path, out: TextIO, lists: dict[str, _JsonList], samples: dict[str, SampleSpill]) -> None:
    n = completed = total_in = total_out = 0
    start: float | None = None
    end: float | None = None
    with _batches(outdir) as (batches, info, _meta):
        for batch in batches:
            status = batch.column("status").to_pylist()
            ok = np.array([st == "finished" for st in status], dtype=bool)
            arrival, ttft, e2e = _numpy(batch, "arrival_ms"), _numpy(batch, "ttft_ms"), _numpy(batch, "e2e_ms")
            inputs, outputs = _numpy(batch, "input_tokens"), _numpy(batch, "output_tokens")
            n += batch.num_rows
            completed += int(ok.sum())
            total_in += int(inputs[ok].sum())
            total_out += int(outputs[ok].sum())
            if batch.num_rows:
                low = arrival.min().item()
                start = low if start is None else min(start, low)
            if ok.any():
                high = _numpy(batch, "finish_ms")[ok].max().item()
                end = high if end is None else max(end, high)
            itl = batch.column("itl_ms")
            done_itl = pc.list_flatten(itl.filter(pa.array(ok)))
            lists["input_lens"].extend(inputs.tolist())
            lists["output_lens"].extend(np.where(ok, outputs, 0).tolist())
            lists["ttfts"].extend(np.where(ok, ttft / 1000.0, 0.0).tolist())
            gaps = pc.divide(itl.flatten(), 1000.0).to_numpy().tolist()
            bounds = np.cumsum(pc.list_value_length(itl).fill_null(0).to_numpy()).tolist()
            lists["itls"].extend([gaps[lo:hi] if good else []
                                  for lo, hi, good in zip([0, *bounds[:-1]], bounds, ok.tolist(), strict=True)])
            lists["latencies"].extend(np.where(ok, e2e / 1000.0, 0.0).tolist())
            lists["start_times"].extend((arrival / 1000.0).tolist())
            lists["generated_texts"].extend([""] * batch.num_rows)
            reasons = batch.column("reject_reason").to_pylist()
            lists["errors"].extend(["" if st == "finished" else f"{st}: {why or 'did not finish in the replay'}"
                                    for st, why in zip(status, reasons, strict=True)])
            lists["request_ids"].extend(batch.column("request_id").to_pylist())
            tpot = batch.column("tpot_ms").filter(pa.array(ok))
            samples["ttft"].add(ttft[ok])
            samples["tpot"].add(tpot.drop_null().to_numpy())
            samples["itl"].add(done_itl.to_numpy())
            samples["e2el"].add(e2e[ok])
    start = 0.0 if start is None else start
    end = start if end is None else end
    duration = max((end - start) / 1000.0, 1e-9)
    rate, conc = _load_settings(info)
    config = info.get("config") or {}
    head: dict[str, Any] = {
        "date": "replay",  # no wall-clock date: same replay, same bytes
        "endpoint_type": "replay", "backend": "replay", "label": Path(outdir).name,
        "model_id": config.get("model"), "tokenizer_id": config.get("model"), "num_prompts": n,
        "request_rate": rate, "burstiness": 1.0, "max_concurrency": conc,
        "duration": duration, "completed": completed, "failed": n - completed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / duration, "request_goodput": None,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
    }
    tail: dict[str, Any] = {}
    for key, spill in samples.items():
        st = spill.stats()
        tail.update({f"mean_{key}_ms": st["mean"], f"median_{key}_ms": st["median"], f"std_{key}_ms": st["std"],
                     f"p99_{key}_ms": st["p99"]})
    # json.dumps of the whole object, piece by piece: same separators, same key order, same bytes.
    out.write("{" + json.dumps(head)[1:-1])
    for key in _VLLM_LISTS:
        out.write(f", {json.dumps(key)}: ")
        lists[key].copy_to(out)
    out.write(", " + json.dumps(tail)[1:] + "\n")


def _epoch_ms(meta) -> float:
    """Trace start as epoch ms (aiperf times are epoch ns); 0 when the trace has no wall clock."""
    if meta is None or not meta.start_time:
        return 0.0
    return datetime.fromisoformat(meta.start_time.replace("Z", "+00:00")).timestamp() * 1000.0


def aiperf(outdir: Path, out: TextIO) -> None:
    """The replay as aiperf ``profile_export.jsonl`` records (one per request), written to ``out``."""
    with _batches(outdir) as (batches, _info, meta):
        base = _epoch_ms(meta)
        i = 0
        for batch in batches:
            lines = [_aiperf_record(i + k, r, base) for k, r in enumerate(batch.to_pylist())]
            out.write("".join(line + "\n" for line in lines))
            i += len(lines)
    if i == 0:
        out.write("\n")


def _aiperf_record(i: int, r: dict[str, Any], base: float) -> str:
    """One request's aiperf record."""
    start_ns = round((base + r["arrival_ms"]) * 1e6)
    finished = r["status"] == "finished"
    metadata = {"session_num": i, "x_request_id": r["request_id"],
                "x_correlation_id": r["session_id"] or r["request_id"],
                "conversation_id": r["session_id"] or r["request_id"],
                "turn_index": (r["turn"] - 1) if r["turn"] else 0, "request_start_ns": start_ns,
                "request_ack_ns": None,
                "request_end_ns": round((base + r["finish_ms"]) * 1e6) if finished else start_ns,
                "worker_id": "replay", "record_processor_id": "replay", "benchmark_phase": "profiling",
                "was_cancelled": False, "cancellation_time_ns": None}
    if finished:
        ms = lambda v: {"value": v, "unit": "ms"}  # noqa: E731
        metrics = {"input_sequence_length": {"value": r["input_tokens"], "unit": "tokens"},
                   "time_to_first_token": ms(r["ttft_ms"]), "request_latency": ms(r["e2e_ms"]),
                   "output_token_count": {"value": r["output_tokens"], "unit": "tokens"},
                   "inter_chunk_latency": ms(list(r["itl_ms"])),
                   "output_sequence_length": {"value": r["output_tokens"], "unit": "tokens"}}
        if r["tpot_ms"] is not None:
            metrics["inter_token_latency"] = ms(r["tpot_ms"])
            if r["tpot_ms"] > 0:
                metrics["output_token_throughput_per_user"] = {"value": 1000.0 / r["tpot_ms"],
                                                               "unit": "tokens/sec/user"}
        error = None
    else:
        metrics = {"error_isl": {"value": r["input_tokens"], "unit": "tokens"}}
        error = {"code": 503, "type": f"Replay{r['status'].capitalize()}",
                 "message": r["reject_reason"] or "did not finish in the replay"}
    return json.dumps({"metadata": metadata, "metrics": metrics, "error": error})


def guidellm(outdir: Path, out: TextIO) -> None:
    """The replay as a GuideLLM report (``reports/export_guidellm.py``), written to ``out``."""
    from replay.reports.export_guidellm import write_guidellm

    run = open_run(outdir)
    run.con.close()
    with _batches(outdir) as (batches, info, meta):
        write_guidellm(batches, info, meta, _epoch_ms(meta) / 1000.0, run.trace_path, out, _JsonList)


def export(outdir: str | Path, fmt: str, dest: str | Path) -> Path:
    """Write the replay in ``outdir`` as ``fmt`` to ``dest`` (atomically); returns ``dest``."""
    outdir, dest = Path(outdir), Path(dest)
    if fmt not in FORMATS:
        raise ReplayError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    run = open_run(outdir)
    run.con.close()
    inputs = run_files(outdir) + [run.trace_path]
    check_output_file(dest, inputs)  # before any work: never onto the replay's own files
    with atomic_path(dest, inputs) as tmp, open(tmp, "w", encoding="utf-8") as out:
        if fmt == "guidellm":
            guidellm(outdir, out)
        else:
            (vllm_bench if fmt == "vllm-bench" else aiperf)(outdir, out)
    return dest
