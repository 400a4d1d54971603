-- SLO attainment per window of arrivals: the fraction of the window's requests (rejected and
-- unfinished included: they did not get their answer in time) that finished within every given SLO
-- (ms; a NULL parameter means "no SLO"), and the window's arrivals, refusals and p99 TTFT.
SELECT
    floor(arrival_ms / $window_ms)::BIGINT                                  AS window_index,
    count(*)                                                                AS requests,
    count(*) FILTER (WHERE status = 'rejected')                             AS rejected,
    count(*) FILTER (WHERE status = 'finished'
                       AND ($ttft IS NULL OR ttft_ms <= $ttft)
                       AND ($tpot IS NULL OR coalesce(tpot_ms, 0) <= $tpot)
                       AND ($e2e IS NULL OR e2e_ms <= $e2e))                AS good,
    good / count(*)                                                         AS attainment,
    quantile_cont(ttft_ms, 0.99) FILTER (WHERE status = 'finished')        AS ttft_p99
FROM requests
GROUP BY ALL
ORDER BY window_index
