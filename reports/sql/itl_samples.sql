-- Materialize the ITL samples once (itl_gaps groups every chunk by request, the costliest step of
-- a report), so the summary (itl.sql), the quantiles (itl_values.sql) and the CDF histogram
-- (itl_cdf.sql) are cheap scans. {parts} > 1 on large runs: this is part 0, itl_samples_add.sql adds
-- the others (reports/metrics.py, itl_row). The part numbers are formatted in as integer literals,
-- not bound as parameters: with parameters DuckDB does not fold `parts = 1 OR ...` nor push the
-- hash filter into the scan (4x slower, measured).
CREATE OR REPLACE TEMP TABLE itl_samples AS
SELECT itl_ms FROM itl_gaps_part({parts}, 0) WHERE itl_ms IS NOT NULL
