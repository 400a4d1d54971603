-- Pareto front of p99 TTFT (lower is better) against output throughput per GPU (higher is better):
-- a config is on the front when no config with a lower-or-equal p99 TTFT has a higher throughput.
WITH ok AS (
    SELECT config_hash, ttft_p99, output_throughput_per_gpu AS tput
    FROM sweep
    WHERE error IS NULL AND ttft_p99 IS NOT NULL AND output_throughput_per_gpu IS NOT NULL
), ranked AS (
    SELECT *, max(tput) OVER (ORDER BY ttft_p99, tput DESC, config_hash
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS best_before
    FROM ok
)
SELECT config_hash, ttft_p99, tput AS output_throughput_per_gpu,
       best_before IS NULL OR tput > best_before AS on_front
FROM ranked
ORDER BY ttft_p99, tput DESC, config_hash
