"""What a disaggregated fleet adds to the outputs: per-request P/D columns, and pool columns on steps.

requests.parquet gains, for every request (docs/disagg.md, "Outputs"):
  prefill_replica      prefill replica (index in the prefill pool); null when prefilled on the decode replica
  decode_replica       decode replica (index in the decode pool; also the ``replica`` column)
  prefill_end_ms       end of the prefill replica's step that computed the prompt (its response to the proxy)
  decode_cached_tokens the decode replica's own prefix hit when the read started (shrinks the transfer)
  kv_transfer_bytes    bytes read from the prefill replica (0 when prefilled locally)
  kv_transfer_start_ms when the decode replica had allocated the blocks and the read began
  kv_transfer_end_ms   when the read completed (its last byte plus the transfer latency)
  kv_wait_ms           time in WAITING_FOR_REMOTE_KVS on the decode replica: read start to being scheduled
with KV tiers (``kv_cache.tiers``), also:
  decode_tier_tokens   prompt tokens the decode replica loaded from a cluster tier instead of the P->D link
  decode_tier_bytes    the bytes of that load (``fleet.kv_transfer.decode_source: cluster_tier``)
steps.parquet gains ``pool`` ('prefill' | 'decode'), and ``replica`` counts within the pool.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PD_REQUEST_FIELDS = [
    pa.field("prefill_replica", pa.int32()),
    pa.field("decode_replica", pa.int32()),
    pa.field("prefill_end_ms", pa.float64()),
    pa.field("decode_cached_tokens", pa.int32()),
    pa.field("kv_transfer_bytes", pa.int64()),
    pa.field("kv_transfer_start_ms", pa.float64()),
    pa.field("kv_transfer_end_ms", pa.float64()),
    pa.field("kv_wait_ms", pa.float64()),
]
TIER_READ_FIELDS = [
    pa.field("decode_tier_tokens", pa.int32()),
    pa.field("decode_tier_bytes", pa.int64()),
]
POOL_FIELD = pa.field("pool", pa.string())
PREFILL_POOL, DECODE_POOL = "prefill", "decode"


class PDRequestColumns:
    """Per trace row P/D facts, filled by the fleet as they happen (engine/pd_fleet.py)."""

    def __init__(self, num_rows: int, tiers: bool = False) -> None:
        """``tiers``: the fleet has KV tiers (adds the decode replicas' tier-read columns)."""
        nan = np.full(num_rows, np.nan)
        self.fields = PD_REQUEST_FIELDS + (TIER_READ_FIELDS if tiers else [])
        self.tier_tokens = np.zeros(num_rows, dtype=np.int32)
        self.tier_bytes = np.zeros(num_rows, dtype=np.int64)
        self.prefill_replica = np.full(num_rows, -1, dtype=np.int32)
        self.prefill_end = nan.copy()
        self.decode_cached = np.zeros(num_rows, dtype=np.int32)
        self.transfer_bytes = np.zeros(num_rows, dtype=np.int64)
        self.transfer_start = nan.copy()
        self.transfer_end = nan.copy()

    def columns(self, sel: np.ndarray, decode_replica: np.ndarray, load_wait: np.ndarray) -> list[pa.Array]:
        """The ``fields`` columns for rows ``sel`` (with the recorder's replica and load-wait)."""
        remote = self.prefill_replica[sel] >= 0
        read = remote & ~np.isnan(self.transfer_start[sel])

        def f64(x: np.ndarray) -> pa.Array:
            return pa.array(x, pa.float64(), from_pandas=True)

        dec = decode_replica[sel]
        return [
            pa.array(self.prefill_replica[sel], mask=~remote),
            pa.array(dec, pa.int32(), mask=dec < 0),
            f64(self.prefill_end[sel]),
            pa.array(self.decode_cached[sel]),
            pa.array(self.transfer_bytes[sel]),
            f64(self.transfer_start[sel]),
            f64(self.transfer_end[sel]),
            f64(np.where(read, load_wait[sel], np.nan)),
        ] + ([pa.array(self.tier_tokens[sel]), pa.array(self.tier_bytes[sel])]
             if len(self.fields) > len(PD_REQUEST_FIELDS) else [])


def pool_step_columns(global_replica: np.ndarray, num_prefill: int) -> tuple[pa.Array, pa.Array]:
    """(pool, replica within its pool) from the fleet-wide replica numbers (prefill replicas first)."""
    is_prefill = global_replica < num_prefill
    pool = pc.if_else(pa.array(is_prefill), PREFILL_POOL, DECODE_POOL)
    local = np.where(is_prefill, global_replica, global_replica - num_prefill).astype(np.int32)
    return pool, pa.array(local, pa.int32())
