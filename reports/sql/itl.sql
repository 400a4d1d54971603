-- Pooled ITL distribution (ms) over the samples of itl_gaps.sql (materialized by itl_samples.sql).
SELECT
    count(itl_ms)                    AS itl_count,
    fsum(itl_ms) / count(itl_ms)     AS itl_mean,
    max(itl_ms)                      AS itl_max,
    quantile_cont(itl_ms, $probs)    AS itl_quantiles
FROM itl_samples
