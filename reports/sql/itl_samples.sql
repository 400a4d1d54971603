-- Materialize the ITL samples once (itl_gaps groups every chunk by request, the costliest step of
-- a report), so the summary (itl.sql) and the CDF histogram (itl_cdf.sql) are cheap scans.
CREATE OR REPLACE TEMP TABLE itl_samples AS
SELECT itl_ms FROM itl_gaps WHERE itl_ms IS NOT NULL
