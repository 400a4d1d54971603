-- Per pool of a disaggregated run: steps, busy time, batch sizes and queue depth (steps.parquet's pool).
SELECT
    pool,
    count(*)                                        AS steps,
    fsum(duration_ms)                               AS busy_ms,
    avg(prefill_requests + decode_requests)         AS mean_batch_requests,
    avg(scheduled_tokens)                           AS mean_batch_tokens,
    avg(prefill_tokens)                             AS mean_prefill_tokens,
    avg(waiting)                                    AS mean_waiting,
    max(waiting)                                    AS max_waiting,
    fsum(kv_usage * duration_ms) / nullif(fsum(duration_ms), 0) AS kv_usage_mean,
    max(kv_usage)                                   AS kv_usage_max
FROM steps
GROUP BY ALL
ORDER BY pool DESC
