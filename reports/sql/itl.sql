-- Pooled ITL distribution (ms) over the samples of itl_gaps.sql (materialized by itl_samples.sql).
-- The quantiles are not taken here: quantile_cont would gather every sample into one buffer DuckDB
-- cannot spill (512 MB at 50 M samples); reports/quantiles.py selects them from itl_values.sql in
-- streamed passes, with quantile_cont's result.
SELECT
    count(itl_ms)                    AS itl_count,
    fsum(itl_ms) / count(itl_ms)     AS itl_mean,
    max(itl_ms)                      AS itl_max
FROM itl_samples
