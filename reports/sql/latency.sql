-- Per-request latency distributions (ms) over finished requests only; rejected and unfinished
-- requests are counted separately (status.sql). Definitions: spec/vllm-scheduler.md section 6.
-- $probs: quantile levels; quantile_cont is linear interpolation, i.e. numpy.percentile's default.
-- Means use fsum (compensated summation) so the result does not depend on thread scheduling.
SELECT
    count(ttft_ms)                       AS ttft_count,
    fsum(ttft_ms) / count(ttft_ms)       AS ttft_mean,
    max(ttft_ms)                         AS ttft_max,
    quantile_cont(ttft_ms, $probs)       AS ttft_quantiles,
    count(tpot_ms)                       AS tpot_count,
    fsum(tpot_ms) / count(tpot_ms)       AS tpot_mean,
    max(tpot_ms)                         AS tpot_max,
    quantile_cont(tpot_ms, $probs)       AS tpot_quantiles,
    count(e2e_ms)                        AS e2e_count,
    fsum(e2e_ms) / count(e2e_ms)         AS e2e_mean,
    max(e2e_ms)                          AS e2e_max,
    quantile_cont(e2e_ms, $probs)        AS e2e_quantiles,
    count(queue_ms)                      AS queue_count,
    fsum(queue_ms) / count(queue_ms)     AS queue_mean,
    max(queue_ms)                        AS queue_max,
    quantile_cont(queue_ms, $probs)      AS queue_quantiles
FROM requests
WHERE status = 'finished'
