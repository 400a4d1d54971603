-- The sweep table, best first: goodput per GPU (when the sweep has an SLO), then output throughput
-- per GPU; failed configs last. Ties broken by fewer GPUs, then the config hash (a stable order).
SELECT *
FROM sweep
ORDER BY error IS NOT NULL, goodput_per_gpu DESC NULLS LAST, output_throughput_per_gpu DESC NULLS LAST,
         gpus, config_hash
