-- Histogram of ITL samples in log-spaced bins ($bins_per_decade per decade of ms; values below
-- $floor_ms share the lowest bin): the CDF charts are drawn from its cumulative counts, which are
-- exact at every bin edge. One grouping pass, much cheaper than hundreds of exact quantiles.
SELECT 'itl' AS metric,
       floor(log10(greatest(itl_ms, $floor_ms)) * $bins_per_decade)::INTEGER AS bin,
       count(*) AS n
FROM itl_samples
GROUP BY ALL
ORDER BY bin
