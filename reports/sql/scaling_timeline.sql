-- An autoscaled run's decisions (scaling.parquet through the `scaling` view): every column, so a run
-- written before the `pool` column (a disaggregated fleet's pool) still reads; sorted by the caller.
SELECT *
FROM scaling
