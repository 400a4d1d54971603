-- Latency over time: finished requests bucketed by arrival ($bucket_ms), plus arrivals and
-- completions per bucket. A system that keeps up completes what arrives and keeps TTFT flat.
WITH arrived AS (
    SELECT floor(arrival_ms / $bucket_ms)::BIGINT AS bucket,
           count(*)                                             AS arrivals,
           quantile_cont(ttft_ms, 0.5) FILTER (WHERE status = 'finished')   AS ttft_p50,
           quantile_cont(ttft_ms, 0.99) FILTER (WHERE status = 'finished')  AS ttft_p99,
           quantile_cont(queue_ms, 0.5) FILTER (WHERE status = 'finished')  AS queue_p50,
           quantile_cont(e2e_ms, 0.5) FILTER (WHERE status = 'finished')    AS e2e_p50
    FROM requests
    GROUP BY ALL
),
done AS (
    SELECT floor(finish_ms / $bucket_ms)::BIGINT AS bucket, count(*) AS completions
    FROM requests
    WHERE status = 'finished'
    GROUP BY ALL
)
SELECT bucket,
       coalesce(a.arrivals, 0)      AS arrivals,
       coalesce(d.completions, 0)   AS completions,
       a.ttft_p50, a.ttft_p99, a.queue_p50, a.e2e_p50
FROM arrived AS a FULL OUTER JOIN done AS d USING (bucket)
ORDER BY bucket
