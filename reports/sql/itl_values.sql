-- Every ITL sample, in no particular order: streamed batch by batch into the quantile selection
-- (reports/quantiles.py), never fetched whole.
SELECT itl_ms FROM itl_samples
