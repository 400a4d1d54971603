-- KV reads of a disaggregated run: how many requests were prefilled where, bytes moved, read times.
SELECT
    count(*) FILTER (WHERE prefill_replica IS NOT NULL)                     AS remote_prefills,
    count(*) FILTER (WHERE prefill_replica IS NULL AND status <> 'rejected') AS local_prefills,
    coalesce(sum(kv_transfer_bytes), 0)                                     AS bytes,
    avg(kv_transfer_bytes) FILTER (WHERE kv_transfer_start_ms IS NOT NULL)  AS mean_bytes,
    favg(kv_transfer_end_ms - kv_transfer_start_ms)                         AS mean_transfer_ms,
    quantile_cont(kv_transfer_end_ms - kv_transfer_start_ms, 0.99)          AS p99_transfer_ms,
    favg(kv_wait_ms)                                                        AS mean_kv_wait_ms,
    sum(decode_cached_tokens) FILTER (WHERE kv_transfer_start_ms IS NOT NULL) AS decode_cached_tokens
FROM requests
