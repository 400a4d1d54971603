-- Histogram of ITL samples in log-spaced bins ($bins_per_decade per decade of ms; values below
-- $floor_ms share the lowest bin): the CDF charts are drawn from its cumulative counts, which are
-- exact at every bin edge. One grouping pass over the distinct values of itl_values.
SELECT 'itl' AS metric,
       floor(log10(greatest(itl_ms, $floor_ms)) * $bins_per_decade)::INTEGER AS bin,
       sum(n)::BIGINT AS n
FROM itl_values
GROUP BY ALL
ORDER BY bin
