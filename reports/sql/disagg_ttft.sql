-- TTFT of disaggregated requests, split where the request was (docs/disagg.md): queued for prefill,
-- prefilling, waiting for blocks on the decode replica, reading the KV, and the decode replica's
-- first step (the last prompt token, which samples the first token). The parts sum to TTFT.
WITH r AS (
    SELECT
        first_scheduled_ms - arrival_ms          AS queue_ms,
        prefill_end_ms - first_scheduled_ms      AS prefill_ms,
        kv_transfer_start_ms - prefill_end_ms    AS decode_admission_ms,
        kv_transfer_end_ms - kv_transfer_start_ms AS transfer_ms,
        first_token_ms - kv_transfer_end_ms      AS first_step_ms,
        ttft_ms
    FROM requests
    WHERE status = 'finished' AND prefill_replica IS NOT NULL
)
SELECT part, favg(v) AS mean, quantile_cont(v, 0.5) AS p50, quantile_cont(v, 0.99) AS p99
FROM (UNPIVOT r ON queue_ms, prefill_ms, decode_admission_ms, transfer_ms, first_step_ms, ttft_ms
      INTO NAME part VALUE v)
GROUP BY part
