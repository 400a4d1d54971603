-- KV and CPU-cache usage and queue depth over time, in buckets of $bucket_ms of step start time.
-- Means are time-weighted by step duration; gaps with no step (idle engine) have no row.
SELECT
    floor(start_ms / $bucket_ms)::BIGINT                               AS bucket,
    fsum(kv_usage * duration_ms) / nullif(fsum(duration_ms), 0)      AS kv_usage_mean,
    max(kv_usage)                                                     AS kv_usage_max,
    fsum(cpu_usage * duration_ms) / nullif(fsum(duration_ms), 0)     AS cpu_usage_mean,
    fsum(running * duration_ms) / nullif(fsum(duration_ms), 0)       AS running_mean,
    fsum(waiting * duration_ms) / nullif(fsum(duration_ms), 0)       AS waiting_mean,
    max(waiting)                                                      AS waiting_max,
    coalesce(sum(preemptions), 0)                                     AS preemptions
FROM steps
GROUP BY ALL
ORDER BY bucket
