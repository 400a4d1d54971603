"""What a replay writes into OUTDIR: the contract between the engine and the reports.

Times are float64 milliseconds of simulated time from the trace start. Token counts are int32.
Reports read only these files (plus the trace named in run.json); the engine never reads reports.
"""

from __future__ import annotations

import pyarrow as pa

from replay.base.parquet_io import CHECKSUMS

REQUESTS_FILE = "requests.parquet"
# Rows per row group of requests.parquet (the recorder and a clustered run's merge write the same
# groups). Each group is built as one Arrow table, about 250 MB a million rows: a quarter of that
# bounds what writing a group adds to a replay's memory, which at 10 M requests runs close to 2 GB.
REQUESTS_ROW_GROUP = 1 << 18
CHUNKS_FILE = "chunks.parquet"
STEPS_FILE = "steps.parquet"
RUN_FILE = "run.json"


def parquet_write_options(schema: pa.Schema) -> dict:
    """Writer settings of every replay output, fixed so that identical runs give identical bytes.

    zstd at level 1: as fast to write as snappy here and 20-44% smaller files. Times, durations and
    usages (float columns) almost never repeat, so a dictionary page would be tried, overflow and
    fall back on every row group; they are written BYTE_STREAM_SPLIT (the bytes of each position
    side by side), which zstd compresses where plain doubles barely compress. Integers keep their
    dictionaries. Measured on a 200,000-request, 8-replica replay (bench/README.md, "Output
    encoding"): steps 29.4 -> 23.2 bytes a row, requests 73.8 -> 48.5, chunks 10.5 -> 8.5 a request."""
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    return dict(compression="zstd", compression_level=1, write_statistics=True,
                use_dictionary=[f.name for f in schema if f.name not in floats],
                column_encoding={name: "BYTE_STREAM_SPLIT" for name in floats}, **CHECKSUMS)


# Request status values.
STATUS_FINISHED = "finished"
STATUS_REJECTED = "rejected"  # could never be replayed (too long, cannot fit); see reject_reason
STATUS_UNFINISHED = "unfinished"  # still in flight when the run stopped (e.g. a time limit)

REQUESTS_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("session_id", pa.string()),
        ("turn", pa.int32()),
        ("arrival_ms", pa.float64()),          # when the request reached the server (closed-loop turns: ready time)
        ("first_scheduled_ms", pa.float64()),  # start of the step that first scheduled it
        ("first_token_ms", pa.float64()),      # end of the step that emitted its first token
        ("finish_ms", pa.float64()),           # end of the step that emitted its last token
        ("ttft_ms", pa.float64()),
        ("e2e_ms", pa.float64()),
        ("queue_ms", pa.float64()),            # first_scheduled_ms - arrival_ms
        ("tpot_ms", pa.float64()),             # (finish - first token) / (output_tokens - 1); null if 1 token
        ("input_tokens", pa.int32()),
        ("output_tokens", pa.int32()),         # generated; for a rejected request, the requested length
        ("cached_tokens", pa.int32()),         # GPU prefix-cache hit tokens at first admission
        ("cpu_hit_tokens", pa.int32()),        # G2 host-cache hit tokens at first admission
        ("load_wait_ms", pa.float64()),        # total time waiting for H2D loads
        ("num_preemptions", pa.int32()),
        ("num_drafts", pa.int32()),            # MTP: decode steps that carried drafts
        ("num_draft_tokens", pa.int32()),
        ("num_accepted_tokens", pa.int32()),
        ("mean_acceptance_length", pa.float64()),  # 1 + accepted / drafts; null without drafts
        ("status", pa.string()),
        ("reject_reason", pa.string()),
    ]
)

# chunks.parquet: every output chunk, exactly, stored as runs. A run is one request's chunks at the
# ends of ``num_steps`` consecutive steps of one replica, each ``tokens`` tokens; the chunk of step s
# is at that step's end, ``start_ms + duration_ms`` of its row in steps.parquet (the very double the
# engine emitted it at). A request that decodes without interruption is one run; preemption, a
# change of replica or an MTP step emitting another token count starts a new one. The reports'
# ``chunks`` view expands the runs into CHUNK_ROWS_SCHEMA (reports/views.py).
CHUNKS_SCHEMA = pa.schema(
    [
        ("request", pa.int32()),      # the request's row in requests.parquet
        ("replica", pa.int32()),      # 0 in a single-replica run; within the decode pool when disaggregated
        ("first_step", pa.int64()),   # steps.parquet `step` of the run's first chunk
        ("num_steps", pa.int32()),
        ("tokens", pa.int32()),       # output tokens in each chunk (>1 only with MTP)
    ]
)

# One row per output chunk: the `chunks` view; also the layout of chunks.parquet before runs (still read).
CHUNK_ROWS_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("time_ms", pa.float64()),  # end of the step that emitted the chunk
        ("tokens", pa.int32()),     # output tokens in this chunk (>1 only with MTP)
    ]
)

STEPS_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("start_ms", pa.float64()),
        ("duration_ms", pa.float64()),
        ("scheduled_tokens", pa.int32()),
        ("prefill_tokens", pa.int32()),
        ("prefill_requests", pa.int32()),
        ("decode_requests", pa.int32()),
        ("running", pa.int32()),
        ("waiting", pa.int32()),
        ("preemptions", pa.int32()),
        ("kv_usage", pa.float32()),          # 1 - free / (num_gpu_blocks - 1), evictable cached blocks free
        ("kv_blocks_used", pa.int32()),
        ("draft_tokens", pa.int32()),
        ("accepted_tokens", pa.int32()),
        ("bytes_stored", pa.int64()),         # G2: D2H bytes started this step
        ("bytes_loaded", pa.int64()),         # G2: H2D bytes started this step
        ("cpu_blocks_used", pa.int64()),
        ("cpu_usage", pa.float32()),
    ]
)
