-- Is the system keeping up? Median TTFT of finished requests that arrived in the first and in the
-- last fifth of the arrival window; a system falling behind has a growing queue, so the last fifth
-- waits much longer (and many requests are still unfinished when the run stops). The queue's share
-- of mean TTFT says how much of TTFT is waiting for the requests ahead (docs/timing.md, "Under
-- overload, TTFT magnifies step time").
WITH f AS (
    SELECT arrival_ms, ttft_ms, queue_ms FROM requests WHERE status = 'finished'
),
w AS (
    SELECT min(arrival_ms) AS lo, max(arrival_ms) AS hi FROM requests
)
SELECT
    quantile_cont(ttft_ms, 0.5) FILTER (WHERE arrival_ms <= lo + 0.2 * (hi - lo))  AS ttft_p50_first_fifth,
    quantile_cont(ttft_ms, 0.5) FILTER (WHERE arrival_ms >= hi - 0.2 * (hi - lo))  AS ttft_p50_last_fifth,
    fsum(queue_ms) / nullif(fsum(ttft_ms), 0)                                     AS queue_share_of_ttft
FROM f, w
