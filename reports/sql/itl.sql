-- Pooled ITL summary (ms) over itl_values, the materialized itl_counts (one row per distinct sample
-- value with its count). The mean weighs each value by its count (fsum: compensated, so it does not
-- depend on thread scheduling). The quantiles are itl_ranks.sql's.
SELECT
    sum(n)::BIGINT                       AS itl_count,
    fsum(itl_ms * n) / sum(n)            AS itl_mean,
    max(itl_ms)                          AS itl_max
FROM itl_values
