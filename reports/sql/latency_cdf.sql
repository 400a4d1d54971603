-- Histograms of the per-request latencies of finished requests in log-spaced bins (see itl_cdf.sql);
-- UNPIVOT drops NULLs, so one-token outputs have no TPOT sample, as in latency.sql.
WITH v AS (
    UNPIVOT (SELECT ttft_ms AS ttft, tpot_ms AS tpot, e2e_ms AS e2e, queue_ms AS queue
             FROM requests WHERE status = 'finished')
    ON ttft, tpot, e2e, queue INTO NAME metric VALUE value
)
SELECT metric,
       floor(log10(greatest(value, $floor_ms)) * $bins_per_decade)::INTEGER AS bin,
       count(*) AS n
FROM v
GROUP BY ALL
ORDER BY metric, bin
