-- The ITL samples at 0-based ranks $ranks of their ascending order: the smallest value whose running
-- count passes the rank. One sort of the distinct values (not of every sample); reports/metrics.py
-- interpolates between the ranks as quantile_cont does.
WITH running AS (
    SELECT itl_ms, sum(n) OVER (ORDER BY itl_ms ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto
    FROM itl_values
)
SELECT r.rank, min(running.itl_ms) AS itl_ms
FROM running, (SELECT unnest($ranks::BIGINT[]) AS rank) AS r
WHERE running.upto > r.rank
GROUP BY r.rank
