-- Evenly spaced quantiles of the pooled gaps on each side, over every group: the CDF chart's points.
SELECT side, count(*) AS n, quantile_cont(gap_ms, $points) AS points
FROM validate_gaps
GROUP BY side
ORDER BY side
