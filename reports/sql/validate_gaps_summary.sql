-- The pooled gap distributions per label group: count, mean, p50/p90/p99 on each side (exact,
-- quantile_cont = numpy.percentile).
SELECT grp,
       count(*) FILTER (WHERE side = 'measured')                                    AS measured_n,
       count(*) FILTER (WHERE side = 'predicted')                                   AS predicted_n,
       fsum(gap_ms) FILTER (WHERE side = 'measured') / count(*) FILTER (WHERE side = 'measured')    AS measured_mean,
       fsum(gap_ms) FILTER (WHERE side = 'predicted') / count(*) FILTER (WHERE side = 'predicted') AS predicted_mean,
       quantile_cont(gap_ms, [0.5, 0.9, 0.99]) FILTER (WHERE side = 'measured')      AS measured_q,
       quantile_cont(gap_ms, [0.5, 0.9, 0.99]) FILTER (WHERE side = 'predicted')     AS predicted_q
FROM validate_gaps
GROUP BY grp
ORDER BY grp
