-- Per replica of a fleet: requests, latency, reuse (as reuse.sql counts it), busy time and KV usage.
-- busy_ms sums step durations; kv_usage_mean is time-weighted by step duration (steps_over_time.sql).
WITH req AS (
    SELECT
        replica,
        count(*)                                                        AS requests,
        count(*) FILTER (WHERE status = 'finished')                     AS finished,
        quantile_cont(ttft_ms, 0.5) FILTER (WHERE status = 'finished')  AS ttft_p50,
        quantile_cont(ttft_ms, 0.99) FILTER (WHERE status = 'finished') AS ttft_p99,
        sum(cached_tokens) FILTER (WHERE status <> 'rejected')
            / nullif(sum(input_tokens) FILTER (WHERE status <> 'rejected'), 0) AS gpu_hit_ratio,
        coalesce(sum(num_preemptions), 0)                               AS preemptions
    FROM requests
    WHERE replica IS NOT NULL
    GROUP BY ALL
),
st AS (
    SELECT
        replica,
        count(*)                                                        AS steps,
        fsum(duration_ms)                                               AS busy_ms,
        fsum(kv_usage * duration_ms) / nullif(fsum(duration_ms), 0)     AS kv_usage_mean,
        max(kv_usage)                                                   AS kv_usage_max
    FROM fleet_steps
    GROUP BY ALL
)
SELECT
    replica,
    coalesce(req.requests, 0)      AS requests,
    coalesce(req.finished, 0)      AS finished,
    req.ttft_p50,
    req.ttft_p99,
    req.gpu_hit_ratio,
    coalesce(req.preemptions, 0)   AS preemptions,
    coalesce(st.steps, 0)          AS steps,
    coalesce(st.busy_ms, 0.0)      AS busy_ms,
    st.busy_ms / nullif((SELECT last_event_ms FROM run_window), 0) AS busy_fraction,
    st.kv_usage_mean,
    st.kv_usage_max
FROM req FULL OUTER JOIN st USING (replica)
ORDER BY replica
