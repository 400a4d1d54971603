-- Is the system keeping up? Median TTFT of finished requests that arrived in the first and in the
-- last fifth of the arrival window; a system falling behind has a growing queue, so the last fifth
-- waits much longer (and many requests are still unfinished when the run stops).
WITH f AS (
    SELECT arrival_ms, ttft_ms FROM requests WHERE status = 'finished'
),
w AS (
    SELECT min(arrival_ms) AS lo, max(arrival_ms) AS hi FROM requests
)
SELECT
    quantile_cont(ttft_ms, 0.5) FILTER (WHERE arrival_ms <= lo + 0.2 * (hi - lo))  AS ttft_p50_first_fifth,
    quantile_cont(ttft_ms, 0.5) FILTER (WHERE arrival_ms >= hi - 0.2 * (hi - lo))  AS ttft_p50_last_fifth
FROM f, w
