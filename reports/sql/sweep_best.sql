-- The best config meeting one SLO condition ({condition}: a filter on summary columns, built by
-- reports/sweep_report.py from the sweep's constraints), ranked as sweep_table.sql ranks.
SELECT *
FROM sweep
WHERE error IS NULL AND rejected = 0 AND unfinished = 0 AND ({condition})
ORDER BY goodput_per_gpu DESC NULLS LAST, output_throughput_per_gpu DESC NULLS LAST, gpus, config_hash
LIMIT 1
