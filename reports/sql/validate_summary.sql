-- Error statistics per metric (and label group when grouped): MAPE over requests with a positive
-- measurement, bias = mean signed error (predicted - measured; > 0: the replay is pessimistic),
-- exact p50/p90 absolute error (quantile_cont = numpy.percentile, linear), and both distributions
-- (mean, p50, p90, p99 of the measured and of the predicted values over the same requests).
-- fsum: order-independent sums.
SELECT metric, grp,
       count(*)                                        AS requests,
       fsum(measured) / count(*)                       AS measured_mean,
       fsum(predicted) / count(*)                      AS predicted_mean,
       quantile_cont(measured, [0.5, 0.9, 0.99])       AS measured_q,
       quantile_cont(predicted, [0.5, 0.9, 0.99])      AS predicted_q,
       100 * fsum(ape) / nullif(count(ape), 0)         AS mape_pct,
       fsum(error) / count(*)                          AS bias,
       quantile_cont(abs_error, 0.5)                   AS abs_error_p50,
       quantile_cont(abs_error, 0.9)                   AS abs_error_p90,
       max(abs_error)                                  AS abs_error_max
FROM validate_pairs
GROUP BY metric, grp
ORDER BY CASE metric WHEN 'ttft' THEN 0 WHEN 'tpot' THEN 1 WHEN 'itl' THEN 2 WHEN 'e2e' THEN 3
                     WHEN 'queue' THEN 4 WHEN 'prefill' THEN 5 WHEN 'decode' THEN 6 ELSE 7 END, grp
